"""The thread plan: how many llama.cpp threads the drafter and the service use, and how they wait.

Both sides run llama.cpp, and on one machine (the chat's embedded service, `demo`, `serve`
beside `generate`) they share its cores. The rule:
- the drafter uses DRAFT_THREADS (1): a small model gains little from more, and every
  thread it takes is one the service's larger model misses;
- a service alone uses the physical cores of its affinity mask (not the logical ones: two
  hyper-threads of one core share its arithmetic units, and llama.cpp's matrix kernels
  already fill them);
- a service started beside a drafter (`shared_service_threads`) decodes single tokens with
  the physical cores less the drafter's, at least 1, and runs blocks (a draft block's
  verification, a prompt) with every physical core (`shared_service_batch_threads`).
  Why the two differ: a one-token step of the target is bound by memory bandwidth, so a
  second thread barely helps it (default pair, two cores: 15.9 against 15.5 tokens/s) and
  would collide with the drafter's catch-up; verifying a block is arithmetic, which a
  second core nearly halves (a 5-token verify 1.46x faster), and the drafter idles during
  most of it: it has drafted its block and waits for the verdict. When it does draft
  ahead meanwhile, ggml hands out a matrix product in chunks that whichever thread runs
  takes, so the service loses a core for that while, not the pass.
And every llama.cpp thread sleeps while it waits: the default build runs its threads on
OpenMP, whose idle threads spin for a while at each barrier and between decodes; two such
pools on the same cores starve each other (201 ms per drafted token instead of 1 ms beside
one busy process, on two cores). `OMP_WAIT_POLICY=PASSIVE` makes them block instead;
libgomp reads it once, when it loads, so `quiet_openmp` must run before llama_cpp is first
imported (the two modules that import it call it first, through wire/llama_switches.py).
"""

from __future__ import annotations

import os

DRAFT_THREADS = 1  # the drafter's default; see above


def quiet_openmp() -> None:
    """Make OpenMP threads sleep while waiting, unless the user chose a policy (call before llama_cpp loads)."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def usable_cpus() -> set[int]:
    """Logical CPUs this process may run on (a container's cpuset or `taskset`), not all the host has."""
    if hasattr(os, "sched_getaffinity"):
        return set(os.sched_getaffinity(0))
    return set(range(max(1, os.cpu_count() or 1)))


def physical_cores(cpus: set[int] | None = None, sysfs: str = "/sys/devices/system/cpu") -> int:
    """Distinct physical cores among `cpus` (default: this process's): hyper-threads count once."""
    cpus = usable_cpus() if cpus is None else cpus
    cores: set[frozenset[int]] = set()
    for cpu in cpus:
        siblings = _read_siblings(f"{sysfs}/cpu{cpu}/topology/thread_siblings_list")
        cores.add(frozenset(siblings & cpus) or frozenset({cpu}))  # unknown topology: one core each
    return max(1, len(cores))


def _read_siblings(path: str) -> set[int]:
    """The CPUs of a sysfs list such as "0,4" or "0-1"; empty when it cannot be read."""
    try:
        with open(path) as file:
            text = file.read().strip()
    except OSError:
        return set()
    cpus: set[int] = set()
    for part in filter(None, text.split(",")):
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def service_threads() -> int:
    """A service's default: every physical core it may run on."""
    return physical_cores()


def shared_service_threads(draft_threads: int) -> int:
    """A service started beside a drafter on the same cores: its one-token steps get what the
    drafter leaves, at least 1."""
    return max(1, physical_cores() - draft_threads)


def shared_service_batch_threads() -> int:
    """A service started beside a drafter: its blocks (verification, prompts) get every physical core."""
    return physical_cores()


def thread_count(text: str) -> int:
    """A --threads value: a whole number of threads, at least 1 (ValueError saying what is wrong)."""
    try:
        count = int(text)
    except ValueError:
        raise ValueError(f"a thread count is a whole number, got {text!r}") from None
    if count < 1:
        raise ValueError(f"a thread count is at least 1, got {count}")
    return count
