"""The backend factory: load a target model with the backend a flag names (or the one that
fits the host). Each backend is imported only when it is chosen: torch and onnxruntime are
heavy, and a host has only the runtimes it serves with."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from models.onnx_manifest import is_onnx_export
from remote_verify.backends.target import TargetBackend

log = logging.getLogger(__name__)


def load_backend(kind: str, target: str | Path, device: str = "auto", threads: int | None = None,
                 batch_threads: int | None = None, batch_invariant: bool | None = None,
                 torch_static: bool | None = None, sessions: int = 32,
                 max_context: int = 4096) -> TargetBackend:
    """Load a target (GGUF file or Hugging Face folder) with the named backend.

    "auto" picks torch when CUDA is available and llama.cpp otherwise (a GGUF target is
    then verified by llama.cpp on the CPU, several times faster than de-quantized torch);
    with `device` "cpu" CUDA is not asked about.
    "onnx" (an export made by `specwire models export-onnx`) is only ever chosen by name.
    `threads`: llama.cpp's CPU threads for one-token steps (None: the physical cores,
    wire/threads.py), `batch_threads` for blocks (None: as many as `threads`); the torch
    and ONNX backends keep their runtimes' own thread settings.
    `batch_invariant` None keeps the backend's default: on for llama.cpp, whose invariant
    kernels cost a fraction of a pass, off for torch and ONNX Runtime, where it means
    decoding a block token by token.
    `torch_static`: the torch backend's static-cache path (torch_static.py), with a KV slot
    of `max_context` positions for each of `sessions` sessions (on a GPU as many as its free
    memory holds), batched passes, and CUDA graphs on a GPU. It has no batch-invariant mode.
    None: on where the torch backend runs on a GPU (measured on an H200: a one-token pass 1.7 to 7
    times quicker than eager, 32 sessions' blocks in one forward 86 to 120 times the same passes
    queued) and the model is one it implements (plain Qwen2; others are served eagerly, said in
    the log); off on the CPU, where one session is not clearly faster with it.
    """
    target = Path(target)
    if not target.exists():
        raise FileNotFoundError(f"no target model at {target}")
    if is_onnx_export(target) and kind != "onnx":
        raise ValueError(f"{target} is an ONNX export: serve it with --backend onnx")
    if kind == "auto":
        kind = "torch" if target.is_dir() or (device != "cpu" and _cuda_available()) else "llamacpp"
    if torch_static and kind != "torch":
        raise ValueError(f"--torch-static is a mode of the torch backend, not of {kind}: add --backend torch")
    if kind == "torch" and torch_static and batch_invariant:
        raise ValueError("the static torch path has no batch-invariant mode: drop --torch-static "
                         "or --batch-invariant")
    if kind == "torch" and torch_static is None:
        torch_static = not batch_invariant and (device == "cuda" or (device == "auto" and _cuda_available()))
        if torch_static:
            return _static_or_eager(target, device, sessions, max_context)
    if kind == "torch" and torch_static:
        from remote_verify.backends.torch_static import TorchStaticTarget

        return TorchStaticTarget(target, device=device, slots=sessions, context=max_context)
    if kind == "torch":
        from remote_verify.backends.torch_backend import TorchTarget

        return TorchTarget(target, device=device, batch_invariant=bool(batch_invariant))
    if kind == "llamacpp":
        from remote_verify.backends.llamacpp_backend import LlamaCppTarget

        return LlamaCppTarget(target, gpu_layers=0 if device == "cpu" else -1, n_threads=threads,
                              n_threads_batch=batch_threads, sessions=sessions,
                              batch_invariant=batch_invariant is not False)
    if kind == "onnx":
        if not is_onnx_export(target):
            raise ValueError(f"{target} is not an ONNX export: make one with "
                             f"`specwire models export-onnx {target} OUT` and serve OUT")
        from remote_verify.backends.onnx_backend import OnnxTarget

        if batch_invariant:
            raise ValueError("the onnx backend has no batch-invariant mode: serve the target "
                             "with --backend llamacpp or torch for it")
        return OnnxTarget(target, device=device)
    raise ValueError(f"unknown backend {kind!r}: choose auto, torch, llamacpp or onnx")


def _static_or_eager(target: Path, device: str, sessions: int, max_context: int) -> TargetBackend:
    """The static torch path where it implements the model; the eager path, said in the log, where not."""
    from remote_verify.backends.qwen2_static import NotPlainQwen2
    from remote_verify.backends.torch_static import TorchStaticTarget

    try:
        return TorchStaticTarget(target, device=device, slots=sessions, context=max_context)
    except NotPlainQwen2 as exc:
        log.warning("the static torch path implements plain Qwen2 only (%s): serving with the eager torch path",
                    "; ".join(exc.problems))
    from remote_verify.backends.torch_backend import TorchTarget

    return TorchTarget(target, device=device)


# A CUDA (or ROCm) device shows a driver's device node on Linux: NVIDIA's control device, AMD's
# compute interface, or WSL's GPU paravirtualisation.
GPU_DEVICE_NODES = ("/dev/nvidiactl", "/dev/kfd", "/dev/dxg")


def _cuda_available() -> bool:
    """Whether torch sees a CUDA device. On a Linux host with no GPU driver's device node, no:
    without asking torch, whose import alone takes seconds (most of a CPU service's start)."""
    if sys.platform.startswith("linux") and not any(os.path.exists(node) for node in GPU_DEVICE_NODES):
        return False
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()
