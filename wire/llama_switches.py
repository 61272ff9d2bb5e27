"""Switches llama.cpp reads once per process: set before it loads, by every module that imports it.

- `OMP_WAIT_POLICY=PASSIVE`: idle OpenMP threads sleep instead of spinning (the thread plan,
  wire/threads.py); libgomp reads it when it loads.
- `GGML_CPU_TILED_MM=0`: no tiled K-quant matrix product, whose rows come out differently by
  batch shape (remote_verify/backends/llamacpp_backend.py); ggml reads it at the process's
  first matrix product. A process may hold a drafter and a target (tests, benchmarks), and
  the drafter's first prefill would settle it for both, so the drafter sets it too: it costs
  a prefill a little on the few weights that are not repacked, nothing on a drafted token.
A value the user set stays.
"""

from __future__ import annotations

import os

from wire.threads import quiet_openmp


def prepare_llama_cpp() -> None:
    quiet_openmp()
    os.environ.setdefault("GGML_CPU_TILED_MM", "0")
