"""The target's tokenizer for a client with no model file: fetched from the service once, then cached.

A verification service offers its target's vocabulary as a GGUF file with no tensors
(`GET /vocab.json` describes it, `GET /vocab.gguf` is the file; remote_verify/vocab_offer.py),
behind its bearer token. `fetch_vocab` reads the description, and downloads the file only
when the cache lacks it: `$XDG_CACHE_HOME/specwire/vocab/FINGERPRINT-SHA256.gguf` (default
`~/.cache/specwire/vocab/`), keyed by the vocabulary fingerprint and the file's own hash, so
services with one vocabulary share one file and a file is never half-written under its name
(written beside it, then renamed). A download is checked twice: its sha256 against the one
the service states, and the file itself in Python before llama.cpp ever parses it
(vocab_file_check.py: only what a tokenizer needs, every length bounded), its fingerprint
computed from the token list validated there and compared with the one the service checks
every Hello against. A cached file is validated again before it is handed out.

    path = fetch_vocab("wss://gpu-host:8765", token, "ca.pem")
    tokenizer = DraftModel(path, vocab_only=True)   # tokenize, detokenize, chat template, Hello
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

from local_draft.service_trust import said_by_service
from local_draft.verify_client import VerifyError, tls_context, warn_if_cleartext
from local_draft.vocab_file_check import VocabFileRefused, checked_vocab_file

log = logging.getLogger(__name__)

INFO_PATH = "/vocab.json"
FILE_PATH = "/vocab.gguf"
SHA256_HEADER = "X-Specwire-Vocab-Sha256"
MAX_VOCAB_BYTES = 256 * 1024 * 1024  # a 256k-token vocabulary with its merges is ~20 MB: more is not a vocabulary
TIMEOUT_S = 30.0
_SHA256 = re.compile(r"[0-9a-f]{64}")
_FINGERPRINT = re.compile(r"[0-9a-f]{32}")  # wire.protocol.vocab_fingerprint: 32 hex digits


class RemoteVocabError(RuntimeError):
    """The service's vocabulary could not be had; the message says why and what to do (the service's
    own words in it escaped, as everything a service says)."""

    def __init__(self, message: str):
        super().__init__(said_by_service(message))


def vocab_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "specwire" / "vocab"


def fetch_vocab(server_url: str, token: str | None = None, ca_file: str | None = None,
                cache_dir: Path | None = None) -> Path:
    """The path of the service's vocabulary GGUF in the local cache, downloaded first if it is not there.

    `server_url` is the service's ws:// or wss:// address (as for `--server`), `token` its bearer
    token, `ca_file` the CA to trust for wss:// (None: the system's). Load the result with
    `DraftModel(path, vocab_only=True)` to tokenize with the target's tokenizer. Raises
    RemoteVocabError for a service that does not offer its vocabulary, a refused token, an
    unreachable service, and a download that is not the file the service describes.
    """
    base = _http_base(server_url)
    try:
        context = tls_context(server_url, ca_file) if server_url.startswith("wss://") else None
    except VerifyError as exc:  # an unreadable CA file
        raise RemoteVocabError(str(exc)) from exc
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    warn_if_cleartext(server_url, token)
    info = _checked_info(_get(base + INFO_PATH, headers, context, server_url), server_url)
    folder = Path(cache_dir) if cache_dir is not None else vocab_cache_dir()
    path = folder / f"{info['vocab_fingerprint']}-{info['sha256']}.gguf"
    if path.is_file() and _sha256_of(path) == info["sha256"] and _cached_is_valid(path, info["vocab_fingerprint"]):
        log.info("the service's vocabulary is cached at %s", path)
        return path
    data, stated = _download(base + FILE_PATH, headers, context, server_url, info["bytes"])
    digest = hashlib.sha256(data).hexdigest()
    if digest != info["sha256"] or stated not in ("", info["sha256"]):
        raise RemoteVocabError(f"the vocabulary file from {server_url} is corrupt: its sha256 is {digest}, the "
                               f"service stated {info['sha256']}; fetch it again")
    _store(data, path, info["vocab_fingerprint"], server_url)
    log.info("fetched the service's vocabulary (%d bytes) into %s", len(data), path)
    return path


def _http_base(server_url: str) -> str:
    parts = urlsplit(server_url)
    scheme = {"ws": "http", "wss": "https", "http": "http", "https": "https"}.get(parts.scheme)
    if scheme is None or not parts.netloc:
        raise RemoteVocabError(f"not a service address: {server_url!r} (give ws://HOST:PORT or wss://HOST:PORT)")
    return f"{scheme}://{parts.netloc}{parts.path.rstrip('/')}"  # a path: a proxy's prefix for the service


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """Follows no redirect: urllib would send the bearer token on to the new host (https to http too)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        raise urllib.error.HTTPError(req.full_url, code, f"redirected to {newurl}", headers, fp)


def _get(url: str, headers: dict, context, server_url: str):
    """An open HTTP response for `url`, or a RemoteVocabError saying why there is none."""
    request = urllib.request.Request(url, headers=headers)
    opener = urllib.request.build_opener(_NoRedirects(), urllib.request.HTTPSHandler(context=context))
    try:
        return opener.open(request, timeout=TIMEOUT_S)
    except urllib.error.HTTPError as exc:
        if 300 <= exc.code < 400:
            raise RemoteVocabError(f"the service at {server_url} redirected {urlsplit(url).path} to "
                                   f"{said_by_service(exc.headers.get('Location', '?'))} (HTTP {exc.code}): refused, "
                                   "the token is sent to the service's own address only; give that address "
                                   "with --server if it is the service") from exc
        body = said_by_service(exc.read(2000).decode("utf-8", "replace").strip())
        if exc.code == 401:
            raise RemoteVocabError(f"the service at {server_url} refused the token: {body} "
                                   "(give the service's token with --token-file)") from exc
        if exc.code == 404 and body:
            raise RemoteVocabError(f"the service at {server_url} has no vocabulary file to send: {body}") from exc
        if exc.code == 503:
            raise RemoteVocabError(f"the service at {server_url} is not ready ({body}): try again in "
                                   f"{exc.headers.get('Retry-After', 'a few')} s") from exc
        # an older service answers a plain GET on its WebSocket port with 400 or 426
        raise RemoteVocabError(f"the service at {server_url} does not offer its vocabulary (HTTP {exc.code} for "
                               f"{INFO_PATH}; a service older than this client?): use a local model file "
                               "instead (--draft MODEL.gguf)") from exc
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise RemoteVocabError(f"cannot reach the service at {server_url}: {reason} "
                               "(is `specwire serve` running? for wss://, is --ca-file the CA that signed it?)") from exc


def _checked_info(response, server_url: str) -> dict:
    """The service's description of its vocabulary file, every field checked (two go into a file name)."""
    with response:
        raw = response.read(64 * 1024)
    try:
        info = json.loads(raw)
        checked = {"sha256": str(info["sha256"]), "vocab_fingerprint": str(info["vocab_fingerprint"]),
                   "bytes": int(info["bytes"])}
    except (ValueError, KeyError, TypeError) as exc:
        raise RemoteVocabError(f"the service at {server_url} described its vocabulary in a form this client "
                               f"does not read ({type(exc).__name__}: {exc})") from exc
    if not (_SHA256.fullmatch(checked["sha256"]) and _FINGERPRINT.fullmatch(checked["vocab_fingerprint"])
            and 0 < checked["bytes"] <= MAX_VOCAB_BYTES):
        raise RemoteVocabError(f"the service at {server_url} described its vocabulary with values this client "
                               f"refuses: {json.dumps(checked)[:300]}")
    return checked


def _download(url: str, headers: dict, context, server_url: str, size: int) -> tuple[bytes, str]:
    """The file's bytes and the sha256 its response states (the description's when it states none)."""
    with _get(url, headers, context, server_url) as response:
        data = response.read(size + 1)  # one byte more than stated: a longer file is caught
        stated = response.headers.get(SHA256_HEADER, "")
    if len(data) != size:
        raise RemoteVocabError(f"the vocabulary file from {server_url} is corrupt: {len(data)} bytes arrived, "
                               f"the service stated {size}; fetch it again")
    return data, stated


def _store(data: bytes, path: Path, fingerprint: str, server_url: str) -> None:
    """Write the file beside `path`, validate it (its token list must be the stated vocabulary), then rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, partial = tempfile.mkstemp(prefix=path.name + ".", suffix=".partial", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        found = _fingerprint_of(Path(partial), server_url)
        if found != fingerprint:
            raise RemoteVocabError(f"the vocabulary file from {server_url} holds the vocabulary {found}, not the "
                                   f"{fingerprint} the service verifies with: the service is misconfigured")
        os.replace(partial, path)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)


def _fingerprint_of(path: Path, server_url: str) -> str:
    """The fingerprint of the token list the file holds, once the file is validated (llama.cpp is not involved)."""
    try:
        return checked_vocab_file(path)
    except VocabFileRefused as exc:
        raise RemoteVocabError(f"the vocabulary file from {server_url} is refused: {exc}; it is not given to "
                               "llama.cpp (use a local model file instead: --tokenizer MODEL.gguf)") from exc


def _cached_is_valid(path: Path, fingerprint: str) -> bool:
    try:
        return checked_vocab_file(path) == fingerprint
    except VocabFileRefused as exc:
        log.warning("the cached vocabulary %s is refused (%s): fetching it again", path, exc)
        return False


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
