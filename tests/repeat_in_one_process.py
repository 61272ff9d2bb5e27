"""Run test files again and again in one Python process, as a crash check.

    .venv/bin/python -m tests.repeat_in_one_process [--runs 20] [FILE ...]

Every run makes its own session fixtures: the tiny models, the services, and the llama.cpp
backends they own. So services start and stop on backends many times in one process. A
segmentation fault once ended such a process, in `LlamaCppBackend.new_cache`, while the paced
service started. The default files are the ones that crashed then, plus the guard on a
backend's one device thread. Exit status: the worst of the runs' pytest exit codes.
"""

from __future__ import annotations

import argparse
import sys
import time

import pytest

DEFAULT_FILES = ["tests/wire/test_randomness.py", "tests/local_draft/test_stream_speculator.py",
                 "tests/remote_verify/test_device_owner.py"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.repeat_in_one_process", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("files", nargs="*", default=DEFAULT_FILES)
    args = parser.parse_args(argv)
    codes = []
    for run in range(1, args.runs + 1):
        began = time.monotonic()
        codes.append(int(pytest.main(["-q", "-n", "0", "-p", "no:cacheprovider", "-x", *args.files])))
        sys.stdout.write(f"run {run}: exit {codes[-1]} in {time.monotonic() - began:.1f} s\n")
        sys.stdout.flush()
    sys.stdout.write(f"exit codes: {codes}\n")
    return max(codes)


if __name__ == "__main__":
    sys.exit(main())
