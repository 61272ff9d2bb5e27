"""`specwire serve`: the flags that expose a service safely, and starting it.

The port opens before the target is loaded, so that `/healthz` answers 503 "loading" to
an orchestrator's probe; the line `listening on ws://HOST:PORT` (or `wss://`) is printed
on stdout only once sessions are taken, and the chat app, the demo and the tests wait
for it.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import ssl
from pathlib import Path

from app.model_paths import resolve_model
from app.token_file import read_token_file, read_token_line
from app.threads_flags import add_service_threads_argument
from app.user_error import UserError
from wire.limits import BATCH_TOKENS, FIRST_TOKEN_ROOM, FIRST_TOKEN_ROOM_MS, ServiceLimits

log = logging.getLogger(__name__)

DEFAULTS = ServiceLimits()
CLEARTEXT_WARNING = ("WARNING: listening on %s with a token but without TLS: every client sends the token in the "
                     "clear, and anyone on the path can read it and the conversations. Give --tls-cert and "
                     "--tls-key, or terminate TLS in front of the service (a proxy, a mesh)")


def register(sub: argparse._SubParsersAction) -> None:
    env = os.environ.get
    serve = sub.add_parser("serve", help="run the verification service")
    serve.add_argument("--target", help="target model: a GGUF file or a Hugging Face folder "
                       "(default: the target of --pair)")
    serve.add_argument("--pair", default=env("SPECWIRE_PAIR"), help="model pair (default: the default pair)")
    serve.add_argument("--backend", default=env("SPECWIRE_BACKEND", "auto"), choices=["auto", "torch", "llamacpp", "onnx"],
                       help="target engine; auto: torch when CUDA is available, llama.cpp otherwise")
    serve.add_argument("--device", default=env("SPECWIRE_DEVICE", "auto"), choices=["auto", "cpu", "cuda"])
    serve.add_argument("--host", default=env("SPECWIRE_HOST", "127.0.0.1"))
    serve.add_argument("--port", type=int, default=int(env("SPECWIRE_PORT", "8765")), help="0 picks a free port")
    serve.add_argument("--token-file", default=env("SPECWIRE_TOKEN_FILE"),
                       help="file holding the bearer token clients must send")
    serve.add_argument("--token-stdin", action="store_true",
                       help="read the bearer token from the first line of standard input (a program starting "
                            "the service keeps the token off the command line; with --exit-with-parent the pipe "
                            "then stays open)")
    serve.add_argument("--batch-invariant", action=argparse.BooleanOptionalAction, default=None,
                       help="score a verified block with the bits of its tokens decoded one at a time, so "
                       "greedy output equals the target alone even at near-ties (default: on for llamacpp, "
                       "whose invariant kernels cost a share of each pass; off for torch, where it means "
                       "one pass per token; onnx has no such mode)")
    serve.add_argument("--torch-static", action=argparse.BooleanOptionalAction,
                       default={"": None, "0": False}.get(env("SPECWIRE_TORCH_STATIC", ""), True),
                       help="torch backend: a static KV cache with a slot per session (--max-sessions slots of "
                       "--max-context positions, as many as a GPU's free memory holds), one forward for several "
                       "sessions' passes, CUDA graphs and bfloat16 on a GPU (default: on a GPU, for the Qwen2 "
                       "models it implements; off on the CPU)")
    serve.add_argument("--batch-tokens", type=int, default=int(env("SPECWIRE_BATCH_TOKENS", BATCH_TOKENS)),
                       metavar="N", help="run the waiting sessions' rounds (one each, in turn) as one forward "
                       "pass of up to N tokens, or 4 a member where that is more (over 64 members at the default); 0 runs "
                       "one session's round a pass (default: %(default)s)")
    serve.add_argument("--no-batch", dest="batch_tokens", action="store_const", const=0,
                       help="one session's round a pass: the same as --batch-tokens 0")
    serve.add_argument("--fair-passes", action=argparse.BooleanOptionalAction,
                       default=env("SPECWIRE_FAIR_PASSES", "1") != "0",
                       help="guesses fill a shared pass only as far as every member's ledger against a plain "
                       "stream allows (each at most about 5%% behind one; the default); --no-fair-passes: by the "
                       "pass's goodput alone (more in all, where round trips are long, and some users slower "
                       "than a plain stream)")
    serve.add_argument("--first-token-room", type=float, default=float(env("SPECWIRE_FIRST_TOKEN_ROOM", FIRST_TOKEN_ROOM)),
                       metavar="R", help="with --fair-passes: a pass that makes a reply's first token, or that a program's next "
                       "request is due to land in, may cost up to 1 + R times the plain pass (the members' own tokens, "
                       "no guesses); 0: no guess lengthens it, a "
                       "first token as soon as a plain stream's, at some throughput where replies begin in most "
                       "passes (default: %(default)s)")
    serve.add_argument("--first-token-room-ms", type=float,
                       default=float(env("SPECWIRE_FIRST_TOKEN_ROOM_MS", FIRST_TOKEN_ROOM_MS)), metavar="MS",
                       help="with --fair-passes: ... and at most MS milliseconds more than the plain pass, where "
                       "passes are long (a large target under load); inf: the share alone (default: %(default)s)")
    serve.add_argument("--trace-passes", type=Path, metavar="FILE",
                       help="write every shared pass to FILE, a JSON object a line (members, tokens, seconds, and "
                       "each reply's first token with when its request came), added to if it exists; "
                       "python -m benchmarks.pass_trace_report FILE says where first tokens waited")
    serve.add_argument("--max-draft", type=int, default=32, help="longest draft block per round (default: %(default)s)")
    serve.add_argument("--max-context", type=int, default=4096,
                       help="longest history per session (default: %(default)s)")
    add_service_threads_argument(serve)
    serve.add_argument("--device-nice", type=_device_nice_flag, default=env("SPECWIRE_DEVICE_NICE", "0"), metavar="N",
                       help="run the forward passes N nicer than the service's event loop (0 to 19; default: "
                       "$SPECWIRE_DEVICE_NICE, else 0): where the service has one core, 5 keeps every client's "
                       "round trip quick while another's long prompt is computed; it also yields to every other "
                       "program on the machine (Linux only)")
    serve.add_argument("--exit-with-parent", action="store_true",
                       help="stop when standard input closes (the program that started the service exited)")
    add_service_arguments(serve)
    serve.set_defaults(run=run_serve)


def _device_nice_flag(text: str) -> int:
    """--device-nice, for argparse: a whole number from 0 to 19, or argparse's error saying why not."""
    from remote_verify.device_priority import check_device_nice  # the service's side: not loaded by clients

    try:
        return check_device_nice(int(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc) if "niceness" in str(exc) else
                                         f"not a whole number: {text!r}") from None


def add_service_arguments(serve: argparse.ArgumentParser) -> None:
    """Access, TLS, limits and logging flags of `specwire serve`."""
    env = os.environ.get
    access = serve.add_argument_group("access")
    access.add_argument("--tls-cert", default=env("SPECWIRE_TLS_CERT"), metavar="PEM",
                        help="certificate chain: serve wss:// (with --tls-key)")
    access.add_argument("--tls-key", default=env("SPECWIRE_TLS_KEY"), metavar="PEM",
                        help="the certificate's private key")
    access.add_argument("--insecure-no-auth", action="store_true",
                        help="allow a non-loopback --host without --token-file (another layer must authenticate)")
    access.add_argument("--public-metrics", action="store_true",
                        help="serve /metrics without the bearer token (default: behind it when --token-file is "
                             "given; for a scraper that cannot send one, on a network only it reaches)")
    limits = serve.add_argument_group("limits (a request or connection over a limit is refused, "
                                      "with a message and a retry hint)")
    limits.add_argument("--max-frame-bytes", type=int, default=DEFAULTS.max_frame_bytes,
                        help="largest WebSocket frame accepted (default: %(default)s)")
    limits.add_argument("--max-sessions", type=int, default=DEFAULTS.max_sessions,
                        help="concurrent sessions; more get HTTP 503 with Retry-After (default: %(default)s)")
    limits.add_argument("--idle-timeout", type=float, default=DEFAULTS.idle_timeout_s, metavar="SECONDS",
                        help="close a session when neither side has sent a frame for this long (default: %(default)s)")
    limits.add_argument("--rate", type=float, default=DEFAULTS.rate_per_s, metavar="PER_SECOND",
                        help="requests a second per connection, sustained; a frame counts one per 4 KiB "
                        "(default: %(default)s)")
    limits.add_argument("--rate-burst", type=int, default=DEFAULTS.rate_burst,
                        help="requests per connection in a burst (default: %(default)s)")
    limits.add_argument("--max-sessions-per-client", type=int, default=DEFAULTS.max_sessions_per_client,
                        metavar="N", help="sessions one client address may hold; 0: half of --max-sessions (behind a "
                        "proxy every client has its address: set --max-sessions); loopback clients are not counted "
                        "(default: %(default)s)")
    limits.add_argument("--handshake-rate", type=float, default=DEFAULTS.handshake_rate_per_s, metavar="PER_SECOND",
                        help="new sessions a second per client address, sustained (default: %(default)s)")
    limits.add_argument("--handshake-burst", type=int, default=DEFAULTS.handshake_burst,
                        help="new sessions per client address in a burst (default: %(default)s)")
    limits.add_argument("--retry-after", type=float, default=DEFAULTS.retry_after_s, metavar="SECONDS",
                        help="the retry hint sent with a refused connection (default: %(default)s)")
    limits.add_argument("--drain-timeout", type=float, default=DEFAULTS.drain_timeout_s, metavar="SECONDS",
                        help="on SIGTERM, how long rounds in flight may take to finish (default: %(default)s)")
    serve.add_argument("--log-format", default=env("SPECWIRE_LOG_FORMAT", "text"), choices=["text", "json"],
                       help="json: one JSON object per log line, with the session id as a field")


def run_serve(args: argparse.Namespace) -> int:
    from remote_verify.access import exposure_problem, is_loopback, server_tls_context
    from remote_verify.backends.factory import load_backend
    from remote_verify.logs import escape_log_messages, use_json_logs
    from remote_verify.server import ServiceConfig, SettingsRefused, TargetLoadError, VerifyService
    from remote_verify.session import SessionLimits

    if args.token_stdin and args.token_file:
        raise UserError("--token-stdin and --token-file both give the token: give one")
    token = read_token_line() if args.token_stdin else read_token_file(args.token_file)  # before the watcher reads stdin
    if args.exit_with_parent:
        from app.exit_with_parent import exit_with_parent

        exit_with_parent()
    if args.log_format == "json":
        use_json_logs()
    escape_log_messages()  # a client's text never starts a line of its own in the log
    problem = exposure_problem(args.host, token, args.insecure_no_auth)
    if problem:
        raise UserError(problem)
    if token is None and not is_loopback(args.host):
        log.warning("listening on %s with no token (--insecure-no-auth): every client is accepted", args.host)
    if token is not None and not is_loopback(args.host) and not (args.tls_cert or args.tls_key):
        log.warning(CLEARTEXT_WARNING, args.host or "every interface")
    limits = ServiceLimits(max_frame_bytes=args.max_frame_bytes, max_sessions=args.max_sessions,
                           idle_timeout_s=args.idle_timeout, rate_per_s=args.rate, rate_burst=args.rate_burst,
                           retry_after_s=args.retry_after, drain_timeout_s=args.drain_timeout,
                           max_sessions_per_client=args.max_sessions_per_client,
                           handshake_rate_per_s=args.handshake_rate, handshake_burst=args.handshake_burst)
    problems = limits.problems()
    if problems:
        raise UserError("; ".join(problems))
    tls = None
    if args.tls_cert or args.tls_key:
        if not (args.tls_cert and args.tls_key):
            raise UserError("--tls-cert and --tls-key go together: give both PEM files")
        try:
            tls = server_tls_context(args.tls_cert, args.tls_key)
        except (OSError, ssl.SSLError) as exc:
            raise UserError(f"cannot use the TLS certificate {args.tls_cert} with the key {args.tls_key}: "
                            f"{exc.strerror or exc}") from exc
    if not args.first_token_room >= 0:  # NaN too
        raise UserError(f"--first-token-room must be 0 or more (how much a first token's pass may exceed the "
                        f"plain pass, 1 = twice it), got {args.first_token_room}")
    if not args.first_token_room_ms >= 0:  # NaN too
        raise UserError(f"--first-token-room-ms must be 0 or more (the ms a first token's pass may exceed the "
                        f"plain pass by; inf for no bound but --first-token-room's), got {args.first_token_room_ms}")
    if args.batch_tokens < 0:
        raise UserError(f"--batch-tokens must be 0 (one session a pass) or more, got {args.batch_tokens}")
    if args.trace_passes is not None:
        try:  # opened here, before the model loads: a path that cannot be written is said at once
            args.trace_passes.open("a").close()
        except OSError as exc:
            raise UserError(f"cannot write the pass trace {args.trace_passes}: {exc.strerror or exc}; give "
                            f"--trace-passes a file in a folder that exists and can be written") from exc
    target = resolve_model(args.target, args.pair, "target")
    if not Path(target).exists():
        raise UserError(f"no target model at {target}")
    config = ServiceConfig(host=args.host, port=args.port, token=token, tls=tls,
                           limits=SessionLimits(max_draft=args.max_draft, max_context=args.max_context),
                           service_limits=limits, batch_tokens=args.batch_tokens, fair_passes=args.fair_passes,
                           first_token_room=args.first_token_room, first_token_room_ms=args.first_token_room_ms,
                           trace_passes=args.trace_passes,
                           public_metrics=args.public_metrics, device_nice=args.device_nice)
    service = VerifyService(lambda: load_backend(args.backend, target, device=args.device, threads=args.threads,
                                                 batch_threads=args.batch_threads,
                                                 batch_invariant=args.batch_invariant, torch_static=args.torch_static,
                                                 sessions=args.max_sessions, max_context=args.max_context), config)

    def announce(url: str) -> None:
        print(f"listening on {url}", flush=True)

    log.info("loading the target %s (/healthz answers 503 until it is ready)", target)
    try:
        asyncio.run(service.run(announce))
    except SettingsRefused as exc:
        raise UserError(f"refusing to start: {exc}") from exc
    except TargetLoadError as exc:
        raise UserError(f"cannot load the target {target}: {exc}") from exc
    except OSError as exc:
        raise UserError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from exc
    return 0
