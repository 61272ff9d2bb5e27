"""GET /vocab.json and /vocab.gguf: the target's vocabulary behind the bearer token, made once per
service, advertised in Welcome, and a clear 404 for a target with no GGUF vocabulary."""

from __future__ import annotations

import hashlib
import http.client
import json
import urllib.error
import urllib.request

import pytest
from websockets.sync.client import connect

from local_draft.draft_model import DraftModel
from remote_verify.vocab_offer import CAPABILITY, FINGERPRINT_HEADER, SHA256_HEADER
from tests.conftest import RunningService, hello_for
from tests.models.test_vocab_gguf import assert_tokenizes_alike, folder_with_unknown_pre_tokenizer
from tests.remote_verify.test_metrics import scrape
from wire.protocol import SUBPROTOCOL, Welcome, decode_server_message, encode

TOKEN = "s3cret"


def get(url: str, path: str, token: str | None = None):
    """(status, headers, body) of a plain GET on the service's port."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(url.replace("ws://", "http://") + path, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read()


def welcome_of(url: str, draft, token: str | None = None) -> Welcome:
    headers = {"Authorization": f"Bearer {token}"} if token else None
    with connect(url, subprotocols=[SUBPROTOCOL], additional_headers=headers) as ws:
        ws.send(encode(hello_for(draft)))
        return decode_server_message(ws.recv())


@pytest.fixture(scope="module")
def guarded(new_llamacpp_target):
    running = RunningService(new_llamacpp_target(), token=TOKEN)
    yield running
    running.close()


def test_the_vocabulary_needs_the_token(guarded):
    """No token, a wrong token and two Authorization headers are refused as on the WebSocket; none
    of them is sent the file or counted as a download."""
    for path in ("/vocab.json", "/vocab.gguf"):
        status, headers, body = get(guarded.url, path)
        assert status == 401 and b"missing bearer token" in body and headers["WWW-Authenticate"]
        status, _, body = get(guarded.url, path, token="wrong")
        assert status == 401 and body == b"wrong bearer token\n"
    connection = http.client.HTTPConnection("127.0.0.1", guarded.service.port, timeout=10)
    connection.putrequest("GET", "/vocab.gguf")
    connection.putheader("Authorization", f"Bearer {TOKEN}")
    connection.putheader("Authorization", "Bearer other")
    connection.endheaders()
    response = connection.getresponse()
    assert response.status == 400 and b"2 Authorization headers" in response.read()
    connection.close()
    _, samples = scrape(guarded.url, TOKEN)
    assert samples.get(("specwire_vocab_downloads_total", ()), 0) == 0


def test_the_vocabulary_file_is_the_targets_and_says_its_hashes(guarded, tiny, close_draft, tmp_path):
    """With the token: the JSON names the file's sha256, size and fingerprint; the file has them, loads
    vocabulary-only in llama.cpp with the target's fingerprint, and each download is counted."""
    status, headers, body = get(guarded.url, "/vocab.json", TOKEN)
    assert status == 200 and headers["Content-Type"] == "application/json"
    info = json.loads(body)
    status, headers, data = get(guarded.url, "/vocab.gguf", TOKEN)
    assert status == 200 and headers["Content-Type"] == "application/octet-stream"
    assert hashlib.sha256(data).hexdigest() == info["sha256"] == headers[SHA256_HEADER]
    assert headers["ETag"] == f'"{info["sha256"]}"' and len(data) == info["bytes"]
    assert info["vocab_fingerprint"] == headers[FINGERPRINT_HEADER] == guarded.service.fingerprint
    assert info["vocab_fingerprint"] == close_draft.vocab_fingerprint and info["source"] == tiny.target_gguf.name
    (tmp_path / "vocab.gguf").write_bytes(data)
    vocab = DraftModel(tmp_path / "vocab.gguf", vocab_only=True)
    assert vocab.vocab_fingerprint == info["vocab_fingerprint"] and vocab.vocab_size == info["vocab_size"]
    assert get(guarded.url, "/vocab.gguf", TOKEN)[2] == data  # made once: the same bytes every time
    _, samples = scrape(guarded.url, TOKEN)
    assert samples[("specwire_vocab_downloads_total", ())] == 2
    assert CAPABILITY in welcome_of(guarded.url, close_draft, TOKEN).capabilities


def test_a_hugging_face_target_offers_its_tokenizer_json_as_a_vocabulary(close_draft, tiny, tmp_path):
    """The tiny target as a Hugging Face folder (torch backend): the file is written from its
    tokenizer.json, has the target's fingerprint, tokenizes like the target GGUF, and is advertised."""
    from remote_verify.backends.torch_backend import TorchTarget

    running = RunningService(TorchTarget(tiny.target, device="cpu"))  # its own: `torch_target` is the session service's
    try:
        status, _, data = get(running.url, "/vocab.gguf")
        assert status == 200 and CAPABILITY in welcome_of(running.url, close_draft).capabilities
        (tmp_path / "vocab.gguf").write_bytes(data)
        assert_tokenizes_alike(DraftModel(tmp_path / "vocab.gguf", vocab_only=True),
                               DraftModel(tiny.target_gguf, n_ctx=256, n_threads=1))
        assert json.loads(get(running.url, "/vocab.json")[2])["source"] == tiny.target.name
    finally:
        running.close()


def test_a_target_with_an_unknown_tokenizer_answers_404_saying_what_to_do(tiny, close_draft, tmp_path):
    """A Hugging Face folder whose pre-tokenizer has no known llama.cpp name: 404 with the reason and
    what to serve instead, no capability in Welcome, and sessions work as before."""
    from remote_verify.backends.torch_backend import TorchTarget

    folder = folder_with_unknown_pre_tokenizer(tiny, tmp_path / "whitespace")
    running = RunningService(TorchTarget(folder, device="cpu"))
    try:
        for path in ("/vocab.json", "/vocab.gguf"):
            status, _, body = get(running.url, path)
            assert status == 404 and b"serve the target as a GGUF file" in body
        welcome = welcome_of(running.url, close_draft)
        assert isinstance(welcome, Welcome) and CAPABILITY not in welcome.capabilities
        assert "generate" in welcome.capabilities
    finally:
        running.close()
