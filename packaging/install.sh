#!/usr/bin/env bash
# Install specwire into ./.venv: the client, the PyTorch verification service, and
# (with --dev) the test tools. Safe to run again: what is installed is kept.
#
#   SPECWIRE_TORCH      the torch requirement (default torch==2.13.0). For a CPU-only build
#                       elsewhere: SPECWIRE_TORCH="torch --index-url https://download.pytorch.org/whl/cpu"
#   CMAKE_ARGS          passed to the llama.cpp build, e.g. "-DGGML_CUDA=on" for a CUDA drafter
set -euo pipefail
cd "$(dirname "$0")/.."

extras="server"
[[ "${1:-}" == "--dev" ]] && extras="server,dev"

python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
# torch first and pinned: an unpinned torch would pull the newest multi-GB CUDA build
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    # shellcheck disable=SC2086
    .venv/bin/python -m pip install --quiet ${SPECWIRE_TORCH:-torch==2.13.0}
fi
# llama-cpp-python compiles llama.cpp from source (several minutes on two cores)
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
.venv/bin/python -m pip install --quiet -e ".[${extras}]"
echo "specwire installed in $(pwd)/.venv (run .venv/bin/specwire --help)"
