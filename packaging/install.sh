#!/usr/bin/env bash
# Install specwire into ./.venv: the client, the verification service (PyTorch and ONNX
# Runtime backends), the benchmark's plotting, and
# (with --dev) the test tools and tmux. Safe to run again: what is installed is kept.
#
#   SPECWIRE_TORCH      the torch requirement (default torch==2.13.0). For a CPU-only build
#                       elsewhere: SPECWIRE_TORCH="torch --index-url https://download.pytorch.org/whl/cpu"
#   CMAKE_ARGS          passed to the llama.cpp build, e.g. "-DGGML_CUDA=on" for a CUDA drafter
#                       (-DGGML_LLAMAFILE=OFF is always added)
set -euo pipefail
cd "$(dirname "$0")/.."

# ONNX Runtime's CUDA build where an NVIDIA GPU answers (it replaces the CPU build)
onnx="onnx"
nvidia-smi -L >/dev/null 2>&1 && onnx="onnx-gpu"
extras="server,${onnx},bench"
[[ "${1:-}" == "--dev" ]] && extras="server,${onnx},bench,dev"

python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
# torch first and pinned: an unpinned torch would pull the newest multi-GB CUDA build
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    # shellcheck disable=SC2086
    .venv/bin/python -m pip install --quiet ${SPECWIRE_TORCH:-torch==2.13.0}
fi
# llama-cpp-python compiles llama.cpp from source (several minutes on two cores).
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
if [[ -z "${CMAKE_ARGS:-}" ]] && grep -qw amx_int8 /proc/cpuinfo 2>/dev/null; then
    # A native build on a CPU with AMX uses ggml's AMX matrix kernels, which crash on
    # Q4_0/Q4_K/Q8_0 weights where the kernel does not grant AMX state (VMs, sandboxes).
    # Build for AVX-512 explicitly instead; the repacked AVX kernels stay.
    export CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
-DGGML_BMI2=ON -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON"
fi
# Without llamafile's tinyBLAS, whose float products of 2+ rows sum in another order than
# one row's: the target's verified blocks then score like tokens decoded one at a time
# (remote_verify/backends/llamacpp_backend.py). An older build that has it is rebuilt. The
# version is the one whose kernels were read for batch shape; a new one is read again first.
llama_version="llama-cpp-python==0.3.36"
export CMAKE_ARGS="${CMAKE_ARGS:-} -DGGML_LLAMAFILE=OFF"
if ! .venv/bin/python -c "import llama_cpp, sys; sys.exit(llama_cpp.llama_cpp._lib.ggml_cpu_has_llamafile())" 2>/dev/null; then
    # no wheel cache: a wheel built earlier with other CMAKE_ARGS must not be reused
    .venv/bin/python -m pip install --quiet --no-cache-dir --force-reinstall --no-deps "$llama_version"
    .venv/bin/python -m pip install --quiet "$llama_version"  # its dependencies, if new
fi
.venv/bin/python -m pip install --quiet -e ".[${extras}]"
if [[ "${1:-}" == "--dev" ]] && ! command -v tmux >/dev/null; then
    # The chat app's end-to-end test drives the real terminal program in tmux.
    if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
        apt-get install -y -qq tmux >/dev/null || { apt-get update -qq && apt-get install -y -qq tmux >/dev/null; }
    else
        echo "tmux is not installed: the chat app's tmux test will fail (install tmux to run it)" >&2
    fi
fi
echo "specwire installed in $(pwd)/.venv (run .venv/bin/specwire --help)"
