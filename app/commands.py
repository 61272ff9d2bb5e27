"""What each `specwire` subcommand does, given its parsed arguments.

Heavy modules (torch, transformers) are imported inside the commands that need them, so
`specwire generate` starts without them.
"""

from __future__ import annotations

import argparse
import asyncio
import codecs
import json
import logging
import stat
import subprocess
import sys
from pathlib import Path

log = logging.getLogger(__name__)


class UserError(Exception):
    """A problem the user can fix; printed as one line, exit status 2."""


def read_token_file(path: str | None) -> str | None:
    if not path:
        return None
    file = Path(path)
    try:
        token = file.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise UserError(f"cannot read the token file {path}: {exc.strerror}") from exc
    if not token:
        raise UserError(f"the token file {path} is empty")
    if file.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("token file %s can be read by other users: chmod 600 %s", path, path)
    return token


def models_tiny(args: argparse.Namespace) -> int:
    from models.tiny import build_tiny_models

    paths = build_tiny_models(Path(args.dir), seed=args.seed)
    for label, path in (("target", paths.target), ("target-gguf", paths.target_gguf), ("draft", paths.draft),
                        ("draft-far", paths.draft_far)):
        print(f"{label:12s} {path}")
    return 0


def models_fetch(args: argparse.Namespace) -> int:
    from app.progress import ProgressBar
    from models.fetch import FetchError, fetch_chunks
    from models.registry import RegistryError, file_path, get_pair

    try:
        pair = get_pair(args.pair)
    except RegistryError as exc:
        raise UserError(str(exc)) from exc
    for role, model in (("draft", pair.draft), ("target", pair.target)):
        path = file_path(pair, model)
        if model.chunks is None:
            print(f"{role:6s} {path} (a local file: nothing to fetch)")
            continue
        try:
            fetched = fetch_chunks(model.chunks, path, ProgressBar(f"{role:6s} {model.filename}"))
        except FetchError as exc:
            raise UserError(str(exc)) from exc
        print(f"{role:6s} {path} ({'assembled, sha256 verified' if fetched else 'already present'})")
    return 0


def models_list(args: argparse.Namespace) -> int:
    from models.registry import RegistryError, file_path, load_pairs

    try:
        pairs, default = load_pairs()
    except RegistryError as exc:
        raise UserError(str(exc)) from exc
    for name, pair in pairs.items():
        print(f"{name}{' (default)' if name == default else ''}: {pair.description}")
        for role, model in (("draft", pair.draft), ("target", pair.target)):
            path = file_path(pair, model)
            if path.exists():
                size = sum(f.stat().st_size for f in path.rglob("*")) if path.is_dir() else path.stat().st_size
                state = f"present, {size / 1e6:,.0f} MB"
            else:
                expected = f", {model.chunks.size / 1e6:,.0f} MB" if model.chunks else ""
                state = f"missing{expected}"
            print(f"  {role:6s} {state:24s} {path}")
    return 0


def models_export_onnx(args: argparse.Namespace) -> int:
    from models.onnx_export import ExportError, export_onnx

    def show(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        result = export_onnx(Path(args.target), Path(args.out), progress=show)
    except ExportError as exc:
        raise UserError(str(exc)) from exc
    print(result.out)
    return 0


def resolve_model(args: argparse.Namespace, role: str) -> str:
    """--draft / --target if given, else that model of --pair (or of the default pair)."""
    from models.registry import RegistryError, check_vocabularies, get_pair, require_file

    explicit = getattr(args, role)
    if explicit:
        return explicit
    try:
        pair = get_pair(args.pair)
        path = require_file(pair, getattr(pair, role))
        if pair.draft.is_local or pair.target.is_local:
            check_vocabularies(pair)  # a user's pair is accepted only with one vocabulary
        return str(path)
    except RegistryError as exc:
        raise UserError(str(exc)) from exc


def serve(args: argparse.Namespace) -> int:
    from app.serve_command import run_serve

    return run_serve(args)


def generate(args: argparse.Namespace) -> int:
    from local_draft.draft_model import DraftModel, DraftModelError
    from local_draft.service_link import LinkState, ServiceLink
    from local_draft.server_only import ServerOnlyGenerator
    from local_draft.speculator import Speculator
    from local_draft.verify_client import ServiceUnreachable, VerifyError
    from remote_verify.protocol import Hello, SamplingParams

    params = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    problems = params.problems()
    if problems:
        raise UserError("; ".join(problems))
    mode = "offline" if args.offline else args.mode
    try:  # server mode runs no draft model: its vocabulary is enough to tokenize
        draft = DraftModel(resolve_model(args, "draft"), gpu_layers=args.draft_gpu_layers,
                           vocab_only=mode == "server")
    except DraftModelError as exc:
        raise UserError(str(exc)) from exc

    def report_link(state: LinkState) -> None:
        print(f"[{state.detail}]", file=sys.stderr, flush=True)

    link = None
    if mode != "offline":
        hello = Hello(vocab_fingerprint=draft.vocab_fingerprint, vocab_size=draft.vocab_size,
                      bos_id=draft.bos_id, eos_id=draft.eos_id, sampling=params, seed=args.seed,
                      client="specwire generate")
        try:
            link = ServiceLink(args.server, hello, token=read_token_file(args.token_file),
                               ca_file=args.ca_file, on_state=report_link)
        except (ServiceUnreachable, VerifyError) as exc:
            raise UserError(f"{exc} (or run with --offline)") from exc

    prompt = draft.tokenize(args.prompt)
    if mode == "server":
        generator = ServerOnlyGenerator(link, draft.end_ids)
    else:
        generator = Speculator(draft, link, params, k=args.k, seed=args.seed, pipeline=args.pipeline)
    provenance_runs: list[list] = []  # [provenance, count] runs: which tokens were verified
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def stream(tokens: list[int], provenance: list[str]) -> None:
        for mark in provenance:
            if provenance_runs and provenance_runs[-1][0] == mark:
                provenance_runs[-1][1] += 1
            else:
                provenance_runs.append([mark, 1])
        if not args.json:
            sys.stdout.write(decoder.decode(b"".join(draft.token_bytes(t) for t in tokens)))
            sys.stdout.flush()

    try:
        result = generator.generate(prompt, args.max_tokens, on_commit=stream)
    except (ServiceUnreachable, VerifyError) as exc:
        raise UserError(str(exc)) from exc
    finally:
        if link is not None:
            link.close()

    text = b"".join(draft.token_bytes(t) for t in result.token_ids).decode("utf-8", errors="replace")
    stats = result.stats
    if args.json:
        print(json.dumps({
            "text": text, "token_ids": result.token_ids, "prompt_tokens": len(prompt),
            "stop_reason": result.stop_reason, "mode": mode,
            "k": "auto" if args.k is None else args.k, "provenance": provenance_runs, "stats": stats.as_dict(),
        }))
    else:
        sys.stdout.write(decoder.decode(b"", final=True) + "\n")
        print(f"[stopped at {result.stop_reason}: {stats.generated} tokens in {stats.wall_s:.2f} s, "
              f"{stats.rounds} rounds, {stats.verified_rounds} target passes, acceptance {stats.acceptance_rate:.2f}, "
              f"{stats.tokens_per_round:.2f} tokens/round, {stats.tokens_per_s:.1f} tokens/s"
              + (f", {stats.offline} unverified (offline)" if stats.offline else "") + "]", file=sys.stderr)
        print(f"[time: draft {stats.draft_s:.2f} s (+{stats.ahead_s:.2f} s drafted ahead), wire {stats.wire_s:.2f} s, "
              f"service {stats.service_s:.2f} s (queue {stats.queue_s:.2f}, forward {stats.forward_s:.2f})]",
              file=sys.stderr)
    return 0


def proxy(args: argparse.Namespace) -> int:
    from app.latency_proxy import LatencyProxy

    try:
        relay = LatencyProxy(args.upstream, rtt_ms=args.rtt_ms, jitter_ms=args.jitter_ms, host=args.host,
                             port=args.port)
    except ValueError as exc:
        raise UserError(str(exc)) from exc

    async def run() -> None:
        await relay.start()
        print(f"relaying {relay.url} -> {relay.upstream_host}:{relay.upstream_port} with {args.rtt_ms:g} ms "
              f"round trip (jitter {args.jitter_ms:g} ms)", flush=True)
        await relay.serve_forever_started()

    try:
        asyncio.run(run())
    except OSError as exc:
        raise UserError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from exc
    return 0


def bench(args: argparse.Namespace) -> int:
    from app.bench import command

    draft, target = resolve_model(args, "draft"), resolve_model(args, "target")
    try:
        config = command.parse(args, draft, target)
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    command.run(config, Path(args.out) if args.out else command.default_out_dir())
    return 0


def demo(args: argparse.Namespace) -> int:
    from app.demo import run_demo

    try:
        return run_demo(k=args.k, max_tokens=args.max_tokens, tiny=args.tiny)
    except subprocess.CalledProcessError as exc:
        raise UserError(f"the demo could not prepare its models ({exc})") from exc


def chat(args: argparse.Namespace) -> int:
    from app.chat.launch import run_chat

    return run_chat(args)
