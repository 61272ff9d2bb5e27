"""The thread plan: physical cores from a CPU topology, thread counts, the sharing rule, the wait policy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from wire.threads import DRAFT_THREADS, physical_cores, shared_service_threads, thread_count

REPO = Path(__file__).resolve().parents[2]


def fake_topology(root: Path, siblings: dict[int, str]) -> str:
    for cpu, text in siblings.items():
        folder = root / f"cpu{cpu}" / "topology"
        folder.mkdir(parents=True)
        (folder / "thread_siblings_list").write_text(text + "\n")
    return str(root)


def test_hyper_threads_count_once(tmp_path):
    """Four logical CPUs on two cores with two threads each are two physical cores."""
    sysfs = fake_topology(tmp_path, {0: "0,2", 1: "1,3", 2: "0,2", 3: "1,3"})
    assert physical_cores({0, 1, 2, 3}, sysfs) == 2
    assert physical_cores({0, 2}, sysfs) == 1  # pinned to both threads of one core
    assert physical_cores({0, 1}, sysfs) == 2


def test_ranges_and_missing_topology(tmp_path):
    """A sibling range ("0-1") is read as its members; a CPU without topology counts as a core."""
    sysfs = fake_topology(tmp_path, {0: "0-1", 1: "0-1"})
    assert physical_cores({0, 1}, sysfs) == 1
    assert physical_cores({0, 1, 5}, sysfs) == 2


def test_this_machine_counts_cores_as_its_topology_does():
    """On the real sysfs the count equals the distinct (package, core id) pairs of the usable CPUs,
    read from other files than the sibling lists physical_cores reads (one per CPU where absent)."""
    root = Path("/sys/devices/system/cpu")
    cores = set()
    for cpu in os.sched_getaffinity(0):
        topology = root / f"cpu{cpu}" / "topology"
        try:
            cores.add(((topology / "physical_package_id").read_text(), (topology / "core_id").read_text()))
        except OSError:
            cores.add(("unknown", str(cpu)))
    assert physical_cores() == len(cores)


def test_sharing_rule_leaves_the_drafter_its_threads():
    """A service beside a drafter takes the physical cores less the drafter's, never fewer than 1."""
    assert shared_service_threads(DRAFT_THREADS) == max(1, physical_cores() - DRAFT_THREADS)
    assert shared_service_threads(10_000) == 1


@pytest.mark.parametrize("text, problem", [("0", "at least 1"), ("-2", "at least 1"), ("two", "whole number"),
                                            ("1.5", "whole number")])
def test_bad_thread_counts_say_why(text, problem):
    """Thread counts below 1 or not whole are refused with the reason."""
    with pytest.raises(ValueError, match=problem):
        thread_count(text)


def test_good_thread_count():
    """A positive whole number is taken as it is."""
    assert thread_count("3") == 3


WATCH_IMPORT = """
import importlib.abc, json, os, sys
seen = {}
class Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "llama_cpp" and "llama_cpp" not in seen:
            seen["llama_cpp"] = [os.environ.get("OMP_WAIT_POLICY"), os.environ.get("GGML_CPU_TILED_MM")]
        return None
sys.meta_path.insert(0, Watch())
import MODULE
print(json.dumps(seen))
"""


@pytest.mark.parametrize("module", ["local_draft.draft_model", "remote_verify.backends.llamacpp_backend"])
@pytest.mark.parametrize("preset, expected", [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_wait_policy_is_set_before_llama_cpp_loads(module, preset, expected):
    """In a fresh process, OMP_WAIT_POLICY is PASSIVE (or the user's own) when llama_cpp is first imported,
    and the tiled product is off (batch invariance: the drafter sets it too, for a process holding both)."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GGML_CPU_TILED_MM")}
    env["PYTHONPATH"] = str(REPO)
    if preset:
        env["OMP_WAIT_POLICY"] = preset
    out = subprocess.run([sys.executable, "-c", WATCH_IMPORT.replace("MODULE", module)], env=env, cwd=REPO,
                         capture_output=True, text=True, check=True, timeout=120).stdout
    assert json.loads(out.splitlines()[-1]) == {"llama_cpp": [expected, "0"]}
