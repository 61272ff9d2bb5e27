"""The target's vocabulary, offered over plain HTTP to clients that have no model file.

A client that drafts without a model (n-gram drafts) or lets the service generate still
tokenizes with the target's tokenizer. The service makes a GGUF file of the target's
metadata alone (models/vocab_gguf.py) once, when the target is loaded, and serves it on the
WebSocket's port, behind the same bearer token:

    GET /vocab.json   {"sha256", "vocab_fingerprint", "vocab_size", "bytes", "path", "source"}
    GET /vocab.gguf   the file; its sha256 and vocabulary fingerprint in X-Specwire-Vocab-*
                      headers, the sha256 as its ETag

A client reads the small JSON first and downloads the file only when its cache lacks it.
The file is offered only when its token texts hash to the fingerprint sessions are checked
against; otherwise both paths answer 404 with the reason.
"""

from __future__ import annotations

import hashlib
import http
import json
import logging
import tempfile
from dataclasses import dataclass
from email.utils import formatdate
from pathlib import Path

from websockets.datastructures import Headers
from websockets.http11 import Response

from models.vocab_gguf import NoVocabFile, write_target_vocab_gguf
from wire.protocol import vocab_fingerprint

log = logging.getLogger(__name__)

INFO_PATH = "/vocab.json"
FILE_PATH = "/vocab.gguf"
CAPABILITY = "vocab"  # in Welcome.capabilities when the file is offered
SHA256_HEADER = "X-Specwire-Vocab-Sha256"
FINGERPRINT_HEADER = "X-Specwire-Vocab-Fingerprint"


@dataclass(frozen=True)
class VocabOffer:
    """The vocabulary file, or why there is none (`data` empty, `reason` set)."""

    data: bytes = b""
    sha256: str = ""
    vocab_fingerprint: str = ""
    vocab_size: int = 0
    source: str = ""  # the GGUF file (or Hugging Face folder) it was made from
    reason: str = ""

    @property
    def available(self) -> bool:
        return bool(self.data)

    def info(self) -> dict:
        return {"sha256": self.sha256, "vocab_fingerprint": self.vocab_fingerprint, "vocab_size": self.vocab_size,
                "bytes": len(self.data), "path": FILE_PATH, "source": self.source}


def make_vocab_offer(backend, fingerprint: str) -> VocabOffer:
    """The offer for a loaded target whose token texts hash to `fingerprint`; never raises."""
    target = getattr(backend, "path", None)
    if target is None:
        return VocabOffer(reason="this backend does not say which model file it runs, so the service has no "
                                 "vocabulary file to send")
    try:
        with tempfile.TemporaryDirectory(prefix="specwire-vocab-") as folder:
            out = Path(folder) / "vocab.gguf"
            source, texts = write_target_vocab_gguf(Path(target), out)
            data = out.read_bytes()
    except NoVocabFile as exc:
        log.info("no vocabulary file for clients: %s", exc)
        return VocabOffer(reason=str(exc))
    except (OSError, ValueError, KeyError) as exc:  # an unreadable or unusual file: serve without the offer
        log.warning("could not make the vocabulary file for clients from %s: %s", target, exc)
        return VocabOffer(reason=f"the service could not make its vocabulary file ({type(exc).__name__}: {exc})")
    made = vocab_fingerprint(texts)
    if made != fingerprint:
        log.warning("the vocabulary of %s (fingerprint %s) is not the target's (%s): not offered", source, made,
                    fingerprint)
        return VocabOffer(reason=f"the GGUF vocabulary of {source.name} (fingerprint {made}) differs from the "
                                 f"vocabulary the target verifies with ({fingerprint}), so it is not offered")
    offer = VocabOffer(data=data, sha256=hashlib.sha256(data).hexdigest(), vocab_fingerprint=fingerprint,
                       vocab_size=len(texts), source=source.name)
    log.info("offering the vocabulary of %s at %s (%d bytes, sha256 %s)", source.name, FILE_PATH, len(data),
             offer.sha256[:16])
    return offer


def offer_response(offer: VocabOffer, path: str) -> Response:
    """The answer to GET /vocab.json or /vocab.gguf (once the target is loaded)."""
    if not offer.available:
        return _response(http.HTTPStatus.NOT_FOUND, (offer.reason + "\n").encode(), "text/plain; charset=utf-8")
    if path == INFO_PATH:
        return _response(http.HTTPStatus.OK, json.dumps(offer.info()).encode(), "application/json")
    response = _response(http.HTTPStatus.OK, offer.data, "application/octet-stream")
    response.headers[SHA256_HEADER] = offer.sha256
    response.headers[FINGERPRINT_HEADER] = offer.vocab_fingerprint
    response.headers["ETag"] = f'"{offer.sha256}"'
    response.headers["Content-Disposition"] = f'attachment; filename="vocab-{offer.vocab_fingerprint}.gguf"'
    return response


def _response(status: http.HTTPStatus, body: bytes, content_type: str) -> Response:
    # as websockets' own connection.respond() does, but with a body that need not be text
    headers = Headers([("Date", formatdate(usegmt=True)), ("Connection", "close"),
                       ("Content-Length", str(len(body))), ("Content-Type", content_type)])
    return Response(status.value, status.phrase, headers, body)
