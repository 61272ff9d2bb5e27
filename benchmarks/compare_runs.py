"""Runs of one cell read side by side: each run's default-mode records against another run's server-only record.

    python -m benchmarks.compare_runs SERVER.json RUN.json [RUN.json ...]

`benchmarks.load --emulate ... --json FILE` writes a run's records. Server-only repeats itself run to run (the
same tok/s in every run of a cell), the default mode does not; so a cell's server-only run is kept once and each
default-mode run (`--modes default`, with the same flags otherwise) is read against it, as if the two had run
together: the table and the ratios `benchmarks.load` prints, on the same replies (benchmarks/capacity.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks.capacity import WaveRecord, print_records


def records(path: Path, mode: str | None = None) -> list[WaveRecord]:
    """The records of `path` (a `--json` file of benchmarks.load --emulate), those of `mode` where given."""
    found = []
    for fields in json.loads(path.read_text()):
        if mode is None or fields["mode"] == mode:
            for name in ("replies", "first_token_by_reply"):  # JSON gives lists; the comparisons key on tuples
                fields[name] = [tuple(each) for each in fields.get(name, [])]
            found.append(WaveRecord(**fields))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("server", type=Path, help="a run holding the cell's server-only record")
    parser.add_argument("runs", type=Path, nargs="+", help="runs whose other modes are read against it")
    args = parser.parse_args(argv)
    server = records(args.server, "server")
    if not server:
        print(f"{args.server} holds no server-only record: give the run made with --modes server", file=sys.stderr)
        return 2
    for path in args.runs:
        print(f"== {path}")
        print_records(server + [r for r in records(path) if r.mode != "server"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
