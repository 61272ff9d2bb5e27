"""Shared fixtures: tiny models built once, a real verification service on port 0."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import threading

import pytest

from models.tiny import TinyModels, build_tiny_models
from tests import cpu_slots

# The tiny models run on one llama.cpp thread each: the drafter and the service share this
# process and a two-core machine, and two spinning thread pools per model would thrash
# (a sampled generation took 9 ms with two threads each, 5.7 ms with one).
TINY_THREADS = 1

# The suite runs on one pytest-xdist worker per core (pyproject.toml, `--dist worksteal`): each worker
# is handed an equal, consecutive share of the collected tests, runs it from the front, and when it
# runs out takes the back half of another's. The longest files (seconds on two cores, measured) are
# dealt out so that every worker starts on its share of them at once, and the run ends on short
# tests instead of one worker finishing a statistical case alone; the statistical cases also run
# beside each other rather than beside the tests that time a drafter. Whole files move together,
# so their module fixtures stay together.
LONGEST_FILES = {
    "local_draft/test_sampling_exactness.py": 360,
    "local_draft/test_stream_sampling.py": 120,
    "models/test_default_pair.py": 73,
    "remote_verify/test_batch_invariance.py": 69,
    "remote_verify/test_fuzz.py": 61,
    "local_draft/test_ngram_exactness.py": 32,
    "local_draft/test_stream_tree_sampling.py": 23,
    "local_draft/test_grammar_sampling.py": 16,
    "remote_verify/test_server_only.py": 29,
}


def worker_threads() -> int | None:
    """Threads for a model a test loads at its full size (the default pair's target): one per CPU
    slot a test holds (tests/cpu_slots.py), that is one under pytest-xdist; None (the backend's
    default, every physical core) in a run of one process. llama.cpp's threads wait for each other
    at every step, spinning: two of them beside the other worker's busy process lose whole time
    slices, each waiting for the one descheduled."""
    return 1 if os.environ.get("PYTEST_XDIST_TESTRUNUID") else None


def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto`: one worker per core this process may run on (not per physical core, as xdist
    would count them with psutil: two logical cores are two workers)."""
    return len(os.sched_getaffinity(0))


def pytest_collection_modifyitems(items):
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    file_of = {id(item): item.nodeid.split("::")[0].removeprefix("tests/") for item in items}
    heavy_files = sorted({f for f in file_of.values() if f in LONGEST_FILES}, key=lambda f: -LONGEST_FILES[f])
    dealt: list[list] = [[] for _ in range(workers)]
    load = [0] * workers
    group_of = {}
    for path in heavy_files:  # the longest file to the least loaded share
        least = load.index(min(load))
        group_of[path] = least
        load[least] += LONGEST_FILES[path]
    light = []
    for item in items:  # collection order within each group
        path = file_of[id(item)]
        (dealt[group_of[path]] if path in group_of else light).append(item)
    ordered, remaining = [], len(items)
    for share in range(workers):  # the shares xdist's worksteal scheduler hands out, in order
        size = remaining // (workers - share)
        remaining -= size
        take = max(0, size - len(dealt[share]))
        ordered += dealt[share] + light[:take]
        light = light[take:]
    items[:] = ordered + light


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Each test runs in one of the run's CPU slots (tests/cpu_slots.py): with the processes a
    statistical case forks, never more busy processes than cores."""
    cpu_slots.take()
    try:
        return (yield)
    finally:
        cpu_slots.give_up()


@pytest.fixture(autouse=True)
def fresh_adaptive_state(tmp_path, monkeypatch):
    """Each test's clients (and the processes it starts) learn adaptive k from scratch, in a file of its own."""
    monkeypatch.setenv("SPECWIRE_ADAPTIVE_STATE", str(tmp_path / "adaptive-k.json"))


@pytest.fixture(scope="session")
def tiny(tmp_path_factory) -> TinyModels:
    return build_tiny_models(tmp_path_factory.mktemp("tiny"), seed=0)


@pytest.fixture(scope="session")
def torch_target(tiny):
    import torch

    from remote_verify.backends.torch_backend import TorchTarget

    # torch's intra-op pool is process-wide and as wide as the cores: on a tiny model two
    # OpenMP threads wait on each other while the drafter and the event loop hold the cores
    # (a pass of 4 tokens took 27 to 42 ms with two threads on a busy machine, 4 to 8 ms with one).
    torch.set_num_threads(TINY_THREADS)
    return TorchTarget(tiny.target, device="cpu")


@pytest.fixture(scope="session")
def llamacpp_target(tiny):
    from remote_verify.backends.llamacpp_backend import LlamaCppTarget

    return LlamaCppTarget(tiny.target_gguf, gpu_layers=0, n_threads=TINY_THREADS)


@pytest.fixture(scope="session")
def new_llamacpp_target(tiny):
    """new_llamacpp_target(): another tiny target on llama.cpp (a few ms), for a service of a test's
    own: a loaded backend is served by one service at a time (remote_verify/backends/device_owner.py),
    and `llamacpp_target` is the session's `service_on("llamacpp")`'s."""
    from remote_verify.backends.llamacpp_backend import LlamaCppTarget

    return lambda **options: LlamaCppTarget(tiny.target_gguf, gpu_layers=0, n_threads=TINY_THREADS, **options)


@pytest.fixture
def own_llamacpp_target(new_llamacpp_target):
    """The tiny target on llama.cpp, for one test's own service."""
    return new_llamacpp_target()


@pytest.fixture(scope="session")
def onnx_export_dir(tiny, tmp_path_factory):
    """The tiny target exported by `models.onnx_export` (20 s of CPU), once a run: under pytest-xdist
    the first worker to ask exports it into the run's own temporary folder, which every worker
    shares, and the others wait for it and load it (the tiny models are the same from the same seed)."""
    from models.onnx_export import export_onnx
    from models.onnx_manifest import is_onnx_export
    from remote_verify.backends.onnx_check import logit_difference

    base = tmp_path_factory.getbasetemp()
    run_folder = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # this run's, not an earlier one's
    out = run_folder / "tiny-target-onnx"
    with open(run_folder / "tiny-target-onnx.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the worker dies
        if not is_onnx_export(out):
            staging = tmp_path_factory.mktemp("onnx") / "target-onnx"
            export_onnx(tiny.target, staging, check=logit_difference)
            staging.rename(out)  # whole, or not there: a worker that died mid-export leaves nothing half-made
    return out


@pytest.fixture(scope="session")
def onnx_target(onnx_export_dir):
    from remote_verify.backends.onnx_backend import OnnxTarget

    return OnnxTarget(onnx_export_dir, device="cpu", threads=TINY_THREADS)


BACKENDS = ["torch", "llamacpp", "onnx"]


@pytest.fixture(scope="session", params=BACKENDS)
def backend_kind(request) -> str:
    """Each target backend in turn (tests using `target` or `service` run once per backend)."""
    return request.param


@pytest.fixture(scope="session")
def target(request, backend_kind):
    """The tiny target on each backend in turn."""
    return request.getfixturevalue(f"{backend_kind}_target")


class RunningService:
    """A VerifyService on its own event loop in a background thread."""

    def __init__(self, backend, **config):
        from remote_verify.server import ServiceConfig, VerifyService

        self.backend = backend
        self.service = VerifyService(backend, ServiceConfig(port=0, **config))
        ready = threading.Event()
        self.url = ""

        def on_ready(url: str) -> None:
            self.url = url
            ready.set()

        self.error: BaseException | None = None

        def serve() -> None:
            try:
                asyncio.run(self.service.run(on_ready, handle_signals=False))
            except BaseException as exc:  # a refused target: the test says why at once, not after 30 s
                self.error = exc
                ready.set()

        self.thread = threading.Thread(target=serve, daemon=True)
        self.thread.start()
        assert ready.wait(30), "the service did not start"
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        self.service.stop()
        self.thread.join(10)


@pytest.fixture(scope="session")
def service_on(request):
    """service_on(kind): one service on port 0 per backend, started when first asked for."""
    running: dict[str, RunningService] = {}

    def get(kind: str) -> RunningService:
        if kind not in running:
            running[kind] = RunningService(request.getfixturevalue(f"{kind}_target"))
        return running[kind]

    yield get
    for each in running.values():
        each.close()


@pytest.fixture(scope="session")
def service(backend_kind, service_on) -> RunningService:
    """The service on each backend in turn."""
    return service_on(backend_kind)


PACED_PASS_MS = 4.0  # a GPU-like pass: about the same for 1 or 64 tokens


def paced_running_service(tiny, pass_ms: float) -> RunningService:
    """The tiny target on llama.cpp with every pass held to about `pass_ms` (the emulated device,
    benchmarks/emulation/target.py); the caller closes it."""
    from benchmarks.emulation.profiles import TargetProfile
    from benchmarks.emulation.target import EmulatedTarget
    from remote_verify.backends.llamacpp_backend import LlamaCppTarget

    # A backend of its own: `llamacpp_target` is served by `service_on("llamacpp")`, and a loaded
    # backend belongs to one service (remote_verify/backends/device_owner.py).
    own = LlamaCppTarget(tiny.target_gguf, gpu_layers=0, n_threads=TINY_THREADS)
    profile = TargetProfile(name=f"tests-gpu-{pass_ms:g}ms", pass_points=((1, pass_ms), (64, pass_ms * 1.1)))
    return RunningService(EmulatedTarget(own, profile))


@pytest.fixture(scope="session")
def paced_service(tiny):
    """The tiny target with every pass held to about PACED_PASS_MS: the tiny target alone outruns
    any drafter, a GPU target does not, and the default mode's guesses are kept only where the
    drafter keeps ahead."""
    running = paced_running_service(tiny, PACED_PASS_MS)
    yield running
    running.close()


@pytest.fixture(scope="session")
def close_draft(tiny):
    from local_draft.draft_model import DraftModel

    return DraftModel(tiny.draft, n_ctx=2048, n_threads=TINY_THREADS)


@pytest.fixture(scope="session")
def far_draft(tiny):
    from local_draft.draft_model import DraftModel

    return DraftModel(tiny.draft_far, n_ctx=2048, n_threads=TINY_THREADS)


@contextlib.contextmanager
def behind_round_trip(url: str, rtt_ms: float):
    """`url` behind the latency proxy's round trip (on a thread); yields the proxy's URL."""
    from app.latency_proxy import LatencyProxy

    proxy = LatencyProxy(url, rtt_ms=rtt_ms)
    proxy.start_in_thread()
    try:
        yield proxy.url
    finally:
        proxy.stop()


def hello_for(draft, sampling=None, seed=None):
    from wire.protocol import SamplingParams

    return draft.hello(sampling or SamplingParams(), seed=seed, client="tests")
