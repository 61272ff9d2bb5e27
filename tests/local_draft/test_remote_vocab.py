"""fetch_vocab: a client with no model file gets the target's tokenizer from a real service, once,
cached by fingerprint, and clear errors for a refused token, a service without it, a corrupt file."""

from __future__ import annotations

import dataclasses
import hashlib
import socket

import pytest

from local_draft.draft_model import DraftModel
from local_draft.remote_vocab import RemoteVocabError, fetch_vocab, vocab_cache_dir
from local_draft.server_only import ServerOnlyGenerator
from local_draft.verify_client import VerifyClient
from models.vocab_gguf import write_vocab_gguf
from tests.conftest import RunningService, hello_for
from tests.models.test_vocab_gguf import assert_tokenizes_alike, folder_with_unknown_pre_tokenizer
from tests.remote_verify.test_access import tls_files  # noqa: F401  (a fixture: a CA and a certificate it signed)

TOKEN = "t0ken"


@pytest.fixture(scope="module")
def service(new_llamacpp_target):
    running = RunningService(new_llamacpp_target(), token=TOKEN)
    yield running
    running.close()


def downloads(running: RunningService) -> float:
    """Vocabulary files the service has sent (its /metrics counter, read in process)."""
    return running.service.metrics.vocab_downloads._value.get()


def test_a_thin_client_tokenizes_and_generates_with_the_fetched_vocabulary(service, tiny, close_draft, tmp_path,
                                                                            monkeypatch):
    """The file lands in $XDG_CACHE_HOME/specwire/vocab/, tokenizes like the target GGUF, and its
    Hello opens a session whose server-only output equals the drafter-owning client's."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = fetch_vocab(service.url, TOKEN, None)
    assert path.parent == vocab_cache_dir() == tmp_path / "specwire" / "vocab"
    assert path.name.startswith(service.service.fingerprint) and path.suffix == ".gguf"
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no partial file left behind
    thin = DraftModel(path, vocab_only=True)
    assert_tokenizes_alike(thin, DraftModel(tiny.target_gguf, n_ctx=256, n_threads=1))
    ids = thin.tokenize("def quicksort(arr):")
    with_file = VerifyClient(service.url, hello_for(close_draft), token=TOKEN)
    thin_client = VerifyClient(service.url, hello_for(thin), token=TOKEN)  # the service accepts its Hello
    try:
        expected = ServerOnlyGenerator(with_file, close_draft.end_ids).generate(ids, 24).token_ids
        assert ServerOnlyGenerator(thin_client, thin.end_ids).generate(ids, 24).token_ids == expected
    finally:
        with_file.close()
        thin_client.close()


def test_a_second_fetch_downloads_nothing_and_a_damaged_cache_is_fetched_again(service, tmp_path):
    """Counted by the service: one download for two fetches; a cached file whose bytes changed is
    not trusted, downloaded again and replaced."""
    before = downloads(service)
    first = fetch_vocab(service.url, TOKEN, None, cache_dir=tmp_path)
    assert downloads(service) == before + 1
    original = first.read_bytes()
    assert fetch_vocab(service.url, TOKEN, None, cache_dir=tmp_path) == first
    assert downloads(service) == before + 1  # the description was read, the file was not sent again
    first.write_bytes(original[:-10] + b"0123456789")  # same size, other bytes
    assert fetch_vocab(service.url, TOKEN, None, cache_dir=tmp_path) == first
    assert downloads(service) == before + 2 and first.read_bytes() == original


def test_refusals_say_what_went_wrong(service, tiny, tmp_path):
    """A wrong or missing token, a service with no vocabulary file, no service at all and a bad
    address each raise RemoteVocabError naming the cause; nothing is written to the cache."""
    with pytest.raises(RemoteVocabError, match="refused the token: wrong bearer token"):
        fetch_vocab(service.url, "wrong", None, cache_dir=tmp_path)
    with pytest.raises(RemoteVocabError, match="refused the token: missing bearer token"):
        fetch_vocab(service.url, None, None, cache_dir=tmp_path)
    from remote_verify.backends.torch_backend import TorchTarget

    folder = folder_with_unknown_pre_tokenizer(tiny, tmp_path.parent / "whitespace")
    hf_service = RunningService(TorchTarget(folder, device="cpu"))  # a tokenizer it cannot write for llama.cpp
    try:
        with pytest.raises(RemoteVocabError, match="has no vocabulary file to send.*serve the target as a GGUF"):
            fetch_vocab(hf_service.url, None, None, cache_dir=tmp_path)
    finally:
        hf_service.close()
    with socket.socket() as unused:  # a port nothing listens on
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    with pytest.raises(RemoteVocabError, match="cannot reach the service"):
        fetch_vocab(f"ws://127.0.0.1:{port}", TOKEN, None, cache_dir=tmp_path)
    with pytest.raises(RemoteVocabError, match="not a service address"):
        fetch_vocab("gpu-host:8765", TOKEN, None, cache_dir=tmp_path)
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


def default_target():
    """The default pair's target GGUF (fetched once, as the default-pair tests do)."""
    from models.fetch import fetch_chunks
    from models.registry import QWEN_CODER, file_path

    target = file_path(QWEN_CODER, QWEN_CODER.target)
    fetch_chunks(QWEN_CODER.target.chunks, target)
    return target


def test_a_corrupt_download_is_refused_and_not_cached(own_llamacpp_target, tmp_path):
    """A file whose bytes are not those the service describes, one llama.cpp cannot load and one of
    another vocabulary are each refused and never cached (the service's offer is altered after it was
    made: it stands for damage on the way and for a misconfigured service)."""
    running = RunningService(own_llamacpp_target)
    try:
        offer = running.service.vocab
        damaged = bytearray(offer.data)
        damaged[len(damaged) // 2] ^= 0xFF
        running.service.vocab = dataclasses.replace(offer, data=bytes(damaged))
        with pytest.raises(RemoteVocabError, match="is corrupt: its sha256 is"):
            fetch_vocab(running.url, None, None, cache_dir=tmp_path)
        assert not any(tmp_path.iterdir())
        # a service that sends a broken file with its right hash: caught before llama.cpp reads it
        truncated = offer.data[: len(offer.data) // 2]
        running.service.vocab = dataclasses.replace(offer, data=truncated,
                                                    sha256=hashlib.sha256(truncated).hexdigest())
        with pytest.raises(RemoteVocabError, match="is refused: it ends inside .*not given to llama.cpp"):
            fetch_vocab(running.url, None, None, cache_dir=tmp_path)
        assert not any(tmp_path.iterdir())
        # a crafted file (a 100 KB token: the kind of input llama.cpp's loader has overflowed on), hashed
        # right: refused by the Python check, never given to llama.cpp
        from tests.local_draft.test_vocab_file_check import rewritten

        source = tmp_path.parent / "offered.gguf"
        source.write_bytes(offer.data)
        crafted = rewritten(source, tmp_path.parent / "crafted.gguf", lambda item: (
            item[0], item[1], [b"x" * 100_000] + item[2][1:], item[3]) if item[0] == "tokenizer.ggml.tokens" else item)
        crafted_data = crafted.read_bytes()
        running.service.vocab = dataclasses.replace(offer, data=crafted_data,
                                                    sha256=hashlib.sha256(crafted_data).hexdigest())
        with pytest.raises(RemoteVocabError, match="is refused: item 0 of tokenizer.ggml.tokens is 100000 bytes"):
            fetch_vocab(running.url, None, None, cache_dir=tmp_path)
        assert not any(tmp_path.iterdir())
        # and one of another vocabulary (the default pair's) than the one the service checks Hellos against
        other = tmp_path.parent / "other-vocab.gguf"
        write_vocab_gguf(default_target(), other)
        other_data = other.read_bytes()
        running.service.vocab = dataclasses.replace(offer, data=other_data,
                                                    sha256=hashlib.sha256(other_data).hexdigest())
        with pytest.raises(RemoteVocabError, match="holds the vocabulary [0-9a-f]{32}, not the"):
            fetch_vocab(running.url, None, None, cache_dir=tmp_path)
        assert not any(tmp_path.iterdir())
    finally:
        running.close()


def test_over_wss_the_ca_file_is_trusted_and_nothing_else(own_llamacpp_target, tls_files, tmp_path):
    """A wss:// service: fetched over https with the CA file given; without it, the certificate is
    not trusted and the error points at the CA file."""
    from remote_verify.access import server_tls_context

    running = RunningService(own_llamacpp_target, token=TOKEN,
                             tls=server_tls_context(str(tls_files["cert"]), str(tls_files["key"])))
    try:
        assert running.url.startswith("wss://")
        path = fetch_vocab(running.url, TOKEN, str(tls_files["ca"]), cache_dir=tmp_path)
        assert DraftModel(path, vocab_only=True).vocab_fingerprint == running.service.fingerprint
        with pytest.raises(RemoteVocabError, match="CERTIFICATE_VERIFY_FAILED.*--ca-file"):
            fetch_vocab(running.url, TOKEN, None, cache_dir=tmp_path / "other")
    finally:
        running.close()


def test_a_redirect_is_refused_and_the_token_goes_nowhere_else(tmp_path):
    """A service answering /vocab.json with a redirect to another host (http, as from https) is
    refused with a message; the other host never sees the request, nor the bearer token."""
    import http.server
    import threading

    seen = []

    class Elsewhere(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(self.headers.get("Authorization"))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args):
            pass

    elsewhere = http.server.HTTPServer(("127.0.0.1", 0), Elsewhere)

    class Redirecting(Elsewhere):
        def do_GET(self):
            self.send_response(302)
            self.send_header("Location", f"http://127.0.0.1:{elsewhere.server_port}/steal\x1b[2J")
            self.end_headers()

    service = http.server.HTTPServer(("127.0.0.1", 0), Redirecting)
    for server in (elsewhere, service):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(RemoteVocabError, match="redirected /vocab.json to http://127.0.0.1:[0-9]+/steal"
                                                   r"\\x1b\[2J \(HTTP 302\): refused") as error:
            fetch_vocab(f"ws://127.0.0.1:{service.server_port}", TOKEN, None, cache_dir=tmp_path)
        assert "\x1b" not in str(error.value)
    finally:
        service.shutdown()
        elsewhere.shutdown()
    assert seen == []
