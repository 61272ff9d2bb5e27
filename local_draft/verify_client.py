"""The client end of the wire: a blocking WebSocket connection to a verification service.

Blocking on purpose: the speculation loop alternates draft and verify on one thread,
and a synchronous socket keeps that loop a plain loop. A round can also be split in two
(`send_verify`, then `receive_verdict`) so that the loop drafts ahead while the verdict is
in flight; websockets reads frames on its own thread meanwhile. One reader at a time: while the
default mode's loop waits for a reply's first frame, a thread of its own does the reading
(`wait_ready`; local_draft/first_frame.py) and the loop reads nothing until it ends. Byte counts are
payload bytes.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import ssl
import time
from urllib.parse import urlsplit

import msgspec
from websockets.exceptions import ConnectionClosed, InvalidStatus, InvalidHandshake
from websockets.protocol import State
from websockets.sync.client import ClientConnection, connect

from local_draft.ping_watch import PingWatch
from local_draft.service_trust import frame_token_ids, said_by_service, token_id_problem, with_words_escaped
from wire.service_proof import CHALLENGE_HEADER, PROOF_HEADER, new_challenge, proves
from wire.protocol import (
    SUBPROTOCOL,
    Cancel,
    Draft,
    Error,
    Generate,
    Generated,
    Hello,
    Sync,
    Synced,
    Verdict,
    Verify,
    Welcome,
    decode_server_message,
    encode,
)

log = logging.getLogger(__name__)

SECONDS_PER_NEW_TOKEN = 0.05  # a generous CPU prefill rate for a 1.5B target
# Past that, a service that answers pings is working (a long prompt, other sessions ahead in its
# queue): it is waited for up to this rate, slower than any target we run, so that a hung forward
# pass is still found out in the end.
SLOWEST_SECONDS_PER_NEW_TOKEN = 1.0
# And whatever its own tokens, a reply can wait behind other sessions' work (their prompts, a KV
# pool growing for newcomers: sixteen clients arriving together on a 2-core CPU wait 15 s and more
# between two frames). A client that took that for a lost service reconnected, opening a second
# session beside the one still queued, and each such session made the queue longer still: the
# service's memory grew until the kernel killed it. So a service that answers pings gets this much
# more, once per request.
SLOWEST_QUEUE_S = 120.0
# A Welcome is waited for like a verdict: past the stall timeout the service is asked whether it is
# alive, and waited for up to this long while it answers (many clients arriving together, a loaded host).
SLOWEST_WELCOME_S = 120.0
CLOSE_TIMEOUT_S = 2.0  # a live service answers a close at once; do not wait on a dead one
# A link that stalls (no byte moves, nothing is closed) is found out by WebSocket pings
# (local_draft/ping_watch.py): one a second, and a pong missing for this long cuts the connection,
# so a stall is noticed within PING_INTERVAL_S + PING_TIMEOUT_S (the bound is 5 s). A busy
# service still answers: its event loop answers pings while the device thread computes.
PING_INTERVAL_S = 1.0
PING_TIMEOUT_S = 3.0
RATE_LIMIT_RETRIES = 3  # a rate-limited request is sent again after the service's hint, this often
MAX_RETRY_WAIT_S = 5.0  # and never after more than this
BUSY_STATUSES = (429, 503)  # full, loading or draining: worth retrying, unlike 401 or 403
LOOPBACK = {"127.0.0.1", "localhost", "::1"}  # a service at these addresses runs on this machine


class VerifyError(RuntimeError):
    """The service refused a request; `code` says why, `fatal` whether the session is over.

    Its words may be the service's: they are escaped (service_trust.py) before anyone reads them."""

    def __init__(self, code: str, message: str, fatal: bool = False, retry_after_s: float = 0.0):
        super().__init__(said_by_service(message))
        self.code = said_by_service(code)
        self.fatal = fatal
        self.retry_after_s = retry_after_s  # > 0: the request was not run and may be sent again


class ServiceUnreachable(RuntimeError):
    """The service could not be reached, or the connection dropped (the message may quote the
    service's close reason: escaped, as everything it says)."""

    def __init__(self, message: str):
        super().__init__(said_by_service(message))


class ServiceBusy(ServiceUnreachable):
    """The service turned the connection away for now (sessions full, loading, draining)."""

    def __init__(self, message: str, retry_after_s: float | None):
        super().__init__(message)
        self.retry_after_s = retry_after_s


def _retry_after(response) -> float | None:
    try:
        return float(response.headers.get("Retry-After", ""))
    except ValueError:
        return None  # absent, or an HTTP date: let the caller's backoff decide


def tls_context(url: str, ca_file: str | None) -> ssl.SSLContext | None:
    """The TLS settings for a wss:// URL: the system's CAs, or only those in ca_file."""
    if not url.startswith("wss://"):
        if ca_file:
            log.warning("--ca-file is ignored for %s: it is not a wss:// URL", url)
        return None
    try:
        return ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise VerifyError("bad_ca_file", f"cannot use the CA file {ca_file}: {exc}", fatal=True) from exc


def on_this_machine(url: str) -> bool:
    """Whether a service at `url` listens on a loopback address, so shares this machine's cores."""
    return (urlsplit(url).hostname or "") in LOOPBACK


def cleartext_token_problem(url: str, token: str | None) -> str | None:
    """Why sending `token` to `url` exposes it (plain ws:// or http:// to another machine), or None."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if not token or parts.scheme not in ("ws", "http") or host in LOOPBACK:
        return None
    try:
        address = ipaddress.ip_address(host)
        if address.is_loopback or address.is_unspecified:  # 0.0.0.0 reaches this machine
            return None
    except ValueError:  # a name: only "localhost" is known to stay on this machine
        pass
    return (f"the bearer token goes to {parts.scheme}://{parts.netloc} in the clear: anyone on the way can read "
            "it, and every conversation. Use a wss:// address (serve --tls-cert/--tls-key, or TLS in front of "
            "the service), or a tunnel to a loopback address")


_warned_cleartext: set[str] = set()


def warn_if_cleartext(url: str, token: str | None) -> str | None:
    """Log (once per address) a loud warning when the token would travel in the clear; the warning, or None."""
    problem = cleartext_token_problem(url, token)
    if problem and url not in _warned_cleartext:
        _warned_cleartext.add(url)
        log.warning("WARNING: %s", problem)
    return problem


class VerifyClient:
    def __init__(self, url: str, hello: Hello, token: str | None = None, ca_file: str | None = None,
                 open_timeout_s: float = 10.0, stall_timeout_s: float = 10.0,
                 max_frame_bytes: int = 4 * 1024 * 1024, prove_service: bool = False):
        """`prove_service`: before the Hello, the service must prove it holds `token`
        (wire/service_proof.py); one that does not is refused, and hears nothing more."""
        self.url = url
        self.hello_seed = hello.seed  # what the service's draws are keyed by (None: a seed of its own)
        self.vocab_size = hello.vocab_size  # every id the service sends must be one of ours
        self.stall_timeout_s = stall_timeout_s
        self.bytes_sent = 0
        self.bytes_received = 0
        self._early_reply: bytes | None = None  # a reply read by reply_ready(), not yet consumed
        self._reply_timeout = stall_timeout_s
        self._longest_wait = stall_timeout_s  # with pings answered
        self._sent_at = 0.0
        self._in_flight: tuple = (None, 0)  # the last request sent and its new tokens, to resend
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        challenge = new_challenge() if prove_service and token else None
        if challenge:
            headers[CHALLENGE_HEADER] = challenge
        warn_if_cleartext(url, token)
        self._exit = contextlib.ExitStack()  # websockets wants connect() used as a context
        try:
            self._ws: ClientConnection = self._exit.enter_context(connect(
                url, subprotocols=[SUBPROTOCOL], additional_headers=headers, ssl=tls_context(url, ca_file),
                open_timeout=open_timeout_s, close_timeout=CLOSE_TIMEOUT_S, max_size=max_frame_bytes,
                compression=None, ping_interval=None))
        except InvalidStatus as exc:
            body = exc.response.body.decode("utf-8", "replace").strip() if exc.response.body else ""
            if exc.response.status_code in BUSY_STATUSES:
                raise ServiceBusy(f"the service at {url} is not taking sessions now "
                                  f"(HTTP {exc.response.status_code}): {body}", _retry_after(exc.response)) from exc
            raise VerifyError("http_" + str(exc.response.status_code),
                              f"the service at {url} refused the connection "
                              f"(HTTP {exc.response.status_code}): {body}", fatal=True) from exc
        except ssl.SSLCertVerificationError as exc:
            raise VerifyError("tls_untrusted", f"the certificate of the service at {url} is not trusted "
                              f"({exc.verify_message}): give the CA that signed it with --ca-file",
                              fatal=True) from exc
        except (OSError, TimeoutError, InvalidHandshake, ConnectionClosed) as exc:
            # ConnectionClosed: dropped mid-handshake, as by a proxy in front of a dead service
            raise ServiceUnreachable(
                f"cannot reach the verification service at {url}: {exc} (is `specwire serve` running?)") from exc
        self._watch = PingWatch(self._ws, PING_INTERVAL_S, PING_TIMEOUT_S)
        if challenge and not proves(token, challenge, self._ws.response.headers.get(PROOF_HEADER)):
            self.close()
            raise VerifyError("service_unproven", f"the program at {url} did not prove it holds the service's token: "
                              "it is not the verification service this client started (another program took "
                              "its port?); nothing was sent to it", fatal=True)
        self._send(hello, 0)
        self._longest_wait = self.stall_timeout_s + SLOWEST_WELCOME_S
        self.welcome = self._receive_retrying(Welcome)

    def verify(self, request: Verify) -> Verdict:
        self.send_verify(request)
        return self.receive_verdict()

    def send_verify(self, request: Verify) -> None:
        """Send a round without waiting: the caller may draft ahead, then receive_verdict()."""
        self._send(request, len(request.append) + len(request.draft))

    @property
    def on_this_machine(self) -> bool:
        return on_this_machine(self.url)

    def reply_ready(self) -> bool:
        """Whether the answer to the request in flight has arrived (never blocks)."""
        if self._early_reply is None:
            try:
                self._early_reply = self._ws.recv(timeout=0)
            except TimeoutError:
                return False
            except (ConnectionClosed, OSError):
                return True  # receive_verdict() reports the loss
        return True

    def receive_verdict(self) -> Verdict:
        return self._receive_retrying(Verdict)

    def send_generate(self, request: Generate) -> None:
        """Start a server-only generation; its tokens come back through receive_generated()."""
        self._send(request, len(request.append))

    def receive_generated(self, first: bool = False) -> Generated:
        """The next frame of the stream; only the first may be a refusal worth retrying."""
        frame = self._receive_retrying(Generated) if first else self._receive(Generated)
        # the next frame is one more token away
        self._sent_at = time.monotonic()
        self._set_deadlines(1)
        return frame

    def next_generated(self, wait: bool) -> Generated | None:
        """The stream's next frame: waited for (as receive_generated does), or, with wait=False, only
        if it has already arrived (None if not)."""
        if not wait and not self.reply_ready():
            return None
        return self.receive_generated()

    def wait_ready(self, timeout_s: float) -> bool:
        """Whether a frame arrives within timeout_s (it is then read by the next receive)."""
        if self._early_reply is None:
            try:
                self._early_reply = self._ws.recv(timeout=timeout_s)
            except TimeoutError:
                return False
            except (ConnectionClosed, OSError):
                return True  # the next receive reports the loss
        return True

    def send_draft(self, draft: Draft) -> None:
        """Guesses for a running stream; no reply (the stream's frames say what was kept)."""
        self._send_unanswered(draft)

    def send_cancel(self, request: Cancel) -> None:
        self._send_unanswered(request)

    def _send_unanswered(self, request: Cancel | Draft) -> None:
        """A message the service answers with no frame of its own: no deadline is set for it."""
        frame = encode(request)
        try:
            self._ws.send(frame)
        except (ConnectionClosed, OSError) as exc:
            raise ServiceUnreachable(f"lost the verification service at {self.url}: {exc}") from exc
        self.bytes_sent += len(frame)

    def sync(self, request: Sync) -> Synced:
        return self._request(request, Synced, len(request.tokens))

    @property
    def close_reason(self) -> str | None:
        return self._ws.close_reason

    @property
    def closed(self) -> bool:
        """The connection is closed: the service ended an idle session or is shutting down."""
        return self._ws.state is State.CLOSED

    def close(self) -> None:
        self._watch.stop()
        self._exit.close()

    def _request(self, message, expected: type, new_tokens: int = 0):
        self._send(message, new_tokens)
        return self._receive_retrying(expected)

    def _receive_retrying(self, expected: type):
        """The reply to the request in flight; a rate-limited request is sent again after the hint."""
        for _ in range(RATE_LIMIT_RETRIES):
            try:
                return self._receive(expected)
            except VerifyError as exc:
                if not exc.retry_after_s > 0:
                    raise
                time.sleep(min(exc.retry_after_s, MAX_RETRY_WAIT_S))  # the service did not run it: resend
                self._send(*self._in_flight)
        return self._receive(expected)

    def _send(self, message, new_tokens: int) -> None:
        self._in_flight = (message, new_tokens)
        frame = encode(message)
        self._set_deadlines(new_tokens)
        self._sent_at = time.monotonic()
        try:
            self._ws.send(frame)
        except (ConnectionClosed, OSError) as exc:
            raise ServiceUnreachable(f"lost the verification service at {self.url}: {exc}") from exc
        self.bytes_sent += len(frame)

    def _set_deadlines(self, new_tokens: int) -> None:
        # A stalled link looks like a slow service: allow the service time for the tokens it
        # must run (a long prompt on a CPU takes seconds), then ask it whether it is alive.
        self._reply_timeout = self.stall_timeout_s + SECONDS_PER_NEW_TOKEN * new_tokens
        self._longest_wait = self.stall_timeout_s + SLOWEST_QUEUE_S + SLOWEST_SECONDS_PER_NEW_TOKEN * new_tokens

    def _wait_for_reply(self) -> bytes:
        """The next frame. Past the expected time, wait on while the service answers pings: a long
        prompt is work, not a lost service; a stalled or frozen one answers no ping."""
        while True:
            # the deadline counts from the send: time spent drafting ahead is not extra slack
            remaining = self._reply_timeout - (time.monotonic() - self._sent_at)
            try:
                return self._ws.recv(timeout=max(remaining, 0.0))
            except TimeoutError:
                pass
            except (ConnectionClosed, OSError) as exc:
                why = (f"the link stalled (no answer to a ping for {PING_TIMEOUT_S:g} s)" if self._watch.stalled
                       else str(exc))
                raise ServiceUnreachable(f"lost the verification service at {self.url}: {why}") from exc
            waited = time.monotonic() - self._sent_at
            if waited >= self._longest_wait:
                raise ServiceUnreachable(f"the verification service at {self.url} did not answer "
                                         f"within {waited:.0f} s")
            if not self._answers_ping():
                raise ServiceUnreachable(f"the verification service at {self.url} did not answer "
                                         f"within {waited:.0f} s, nor a ping")
            log.info("the service is still working after %.0f s: waiting on", waited)
            self._reply_timeout = min(waited + self.stall_timeout_s, self._longest_wait)

    def _answers_ping(self) -> bool:
        try:
            pong = self._ws.ping()
        except (ConnectionClosed, OSError):
            return False
        return pong.wait(self.stall_timeout_s)

    def _receive(self, expected: type):
        reply_frame, self._early_reply = self._early_reply, None
        if reply_frame is None:
            reply_frame = self._wait_for_reply()
        self.bytes_received += len(reply_frame)
        try:
            reply = decode_server_message(reply_frame)
        except (msgspec.DecodeError, msgspec.ValidationError, TypeError, ValueError) as exc:
            raise VerifyError("bad_frame_from_service", f"the verification service at {self.url} sent a frame "
                              f"this client cannot read ({exc}): it is broken, or not a specwire service",
                              fatal=True) from exc
        if isinstance(reply, Error):
            raise VerifyError(reply.code, reply.message, reply.fatal, reply.retry_after_s)
        if not isinstance(reply, expected):
            raise VerifyError("unexpected_reply", f"expected {expected.__name__}, got {type(reply).__name__}", True)
        self.check_token_ids(frame_token_ids(reply), type(reply).__name__)
        if isinstance(reply, Verdict):
            self._check_accepted(reply)
        return with_words_escaped(reply)

    def check_token_ids(self, ids, frame: str) -> None:
        """Refuse a frame whose ids are not all in this client's vocabulary (before llama.cpp sees one):
        a fatal VerifyError naming the service. Every frame type with ids comes through here."""
        problem = token_id_problem(ids, self.vocab_size)
        if problem:
            log.warning("the service at %s sent a %s with a bad id: %s", self.url, frame, said_by_service(problem))
            raise VerifyError("bad_token_from_service",
                              f"the verification service at {self.url} sent a {frame} with {problem}: it is "
                              "not a service this client can use (its target's vocabulary differs, or it is "
                              "broken); the conversation so far is kept", fatal=True)

    def _check_accepted(self, verdict: Verdict) -> None:
        request = self._in_flight[0]
        drafted = len(request.draft) if isinstance(request, Verify) else 0
        if not 0 <= verdict.accepted <= drafted:
            raise VerifyError("bad_verdict_from_service",
                              f"the verification service at {self.url} accepted {verdict.accepted} of "
                              f"{drafted} draft tokens: it is broken; the conversation so far is kept", fatal=True)
