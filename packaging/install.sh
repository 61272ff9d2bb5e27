#!/usr/bin/env bash
# Install specwire into ./.venv: the client, the verification service (PyTorch and ONNX
# Runtime backends), the benchmark's plotting, and
# (with --dev) the test tools, tmux and haproxy. Safe to run again: what is installed is kept.
#
#   SPECWIRE_TORCH      the torch requirement (default torch==2.13.0). For a CPU-only build
#                       elsewhere: SPECWIRE_TORCH="torch --index-url https://download.pytorch.org/whl/cpu"
#   CMAKE_ARGS          passed to the llama.cpp build (-DGGML_LLAMAFILE=OFF is always added, and
#                       -DGGML_CUDA=on where nvidia-smi answers and nvcc is found)
#   CUDA_HOME           where the CUDA toolkit is when nvcc is not on PATH (default /usr/local/cuda)
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
# A CUDA drafter where an NVIDIA GPU answers and the CUDA compiler is here: llama.cpp is
# built with -DGGML_CUDA=on (below), and a CPU-only build already in .venv is rebuilt.
cuda_build=0
if nvidia-smi -L >/dev/null 2>&1; then
    nvcc_path="$(command -v nvcc || true)"
    cuda_home="${CUDA_HOME:-/usr/local/cuda}"
    [[ -z "$nvcc_path" && -x "$cuda_home/bin/nvcc" ]] && nvcc_path="$cuda_home/bin/nvcc"
    if [[ -n "$nvcc_path" ]]; then
        cuda_build=1
        export CUDACXX="${CUDACXX:-$nvcc_path}"
    else
        echo "an NVIDIA GPU answers but nvcc (the CUDA compiler) was not found on PATH or in $cuda_home/bin:" \
             "llama.cpp is built for the CPU (install the CUDA toolkit and run this again for a GPU drafter)" >&2
    fi
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
llama_ok="import llama_cpp, sys; sys.exit(llama_cpp.llama_cpp._lib.ggml_cpu_has_llamafile())"
case "$CMAKE_ARGS" in  # CMAKE_ARGS saying -DGGML_CUDA=off is the user's choice, kept
    *GGML_CUDA=[oO][fF][fF]*|*GGML_CUDA=0*) cuda_build=0 ;;
    *GGML_CUDA*) ;;
    *) (( cuda_build )) && export CMAKE_ARGS="$CMAKE_ARGS -DGGML_CUDA=on" ;;
esac
if (( cuda_build )); then
    # a build without GPU offload (made before the toolkit was here) is rebuilt too
    llama_ok="import llama_cpp, sys; sys.exit(llama_cpp.llama_cpp._lib.ggml_cpu_has_llamafile() or not llama_cpp.llama_supports_gpu_offload())"
fi
if ! .venv/bin/python -c "$llama_ok" 2>/dev/null; then
    # no wheel cache: a wheel built earlier with other CMAKE_ARGS must not be reused
    .venv/bin/python -m pip install --quiet --no-cache-dir --force-reinstall --no-deps "$llama_version"
    .venv/bin/python -m pip install --quiet "$llama_version"  # its dependencies, if new
fi
if (( cuda_build )); then
    if .venv/bin/python -c "import llama_cpp, sys; sys.exit(not llama_cpp.llama_supports_gpu_offload())"; then
        echo "llama.cpp is built with CUDA: llama_supports_gpu_offload() holds, the drafter runs on the GPU"
    else
        echo "llama.cpp was built with CMAKE_ARGS=\"$CMAKE_ARGS\" but llama_supports_gpu_offload() is false:" \
             "the drafter would run on the CPU. Check that $CUDACXX matches the driver (nvidia-smi) and run this again" >&2
        exit 1
    fi
fi
.venv/bin/python -m pip install --quiet -e ".[${extras}]"
# The tests' system programs: the chat app's end-to-end test drives the real terminal program in
# tmux; the replica tests and benchmarks.soak run `specwire serve` replicas behind a real HAProxy.
missing=()
if [[ "${1:-}" == "--dev" ]]; then
    command -v tmux >/dev/null || missing+=(tmux)
    command -v haproxy >/dev/null || [[ -x /usr/sbin/haproxy ]] || missing+=(haproxy)
fi
if (( ${#missing[@]} )); then
    if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
        apt-get install -y -qq "${missing[@]}" >/dev/null \
            || { apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null; }
    else
        echo "not installed: ${missing[*]} (the chat app's tmux test needs tmux, the replica tests haproxy):" \
             "those tests will fail; install them (apt-get install ${missing[*]})" >&2
    fi
fi
echo "specwire installed in $(pwd)/.venv (run .venv/bin/specwire --help)"
