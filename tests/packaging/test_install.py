"""packaging/install.sh picks a CUDA build of llama.cpp where a GPU and nvcc are, and checks it.

The script runs for real, but in a scratch copy of the repository and with stand-ins for
what cannot run here: `nvidia-smi`, `nvcc`, and the Python of the virtual environment
(pip installs and llama.cpp builds are recorded, not done; the stand-in's llama.cpp
offloads to the GPU when it was "built" with -DGGML_CUDA=on and the test says the toolkit
works). There is no GPU on this machine: the CUDA build itself is not exercised.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

INSTALL = Path(__file__).resolve().parents[2] / "packaging" / "install.sh"
TOOLS = ["bash", "dirname", "grep", "nproc", "id", "cat", "touch", "rm", "mkdir", "cp", "chmod"]

VENV_PYTHON = r"""#!/bin/bash
# records every call; answers the install script's llama.cpp checks from files in $STUB_STATE
echo "python $* | CMAKE_ARGS=${CMAKE_ARGS:-}" >> "$STUB_STATE/log"
if [[ "$1" == "-c" ]]; then
    case "$2" in
        *ggml_cpu_has_llamafile*)  # the "is the installed llama.cpp good enough" check
            [[ -f "$STUB_STATE/llama" ]] || exit 1
            [[ "$2" != *llama_supports_gpu_offload* || -f "$STUB_STATE/offload" ]] || exit 1
            exit 0 ;;
        *llama_supports_gpu_offload*) [[ -f "$STUB_STATE/offload" ]]; exit ;;
        *) exit 0 ;;
    esac
fi
if [[ "$*" == *--force-reinstall*llama-cpp-python* ]]; then
    echo "build CMAKE_ARGS=$CMAKE_ARGS" >> "$STUB_STATE/builds"
    touch "$STUB_STATE/llama"
    rm -f "$STUB_STATE/offload"
    [[ "$CMAKE_ARGS" == *-DGGML_CUDA=on* && -f "$STUB_STATE/toolkit_works" ]] && touch "$STUB_STATE/offload"
fi
exit 0
"""
SYSTEM_PYTHON = """#!/bin/bash
# `python3 -m venv .venv`: a virtual environment whose python is the recording stand-in
mkdir -p .venv/bin && cp "$STUB_STATE/venv-python" .venv/bin/python && chmod +x .venv/bin/python
"""


def run_install(tmp_path: Path, gpu: bool, nvcc: bool, toolkit_works: bool = True,
                llama_before: str | None = None,
                dev: bool = False) -> tuple[subprocess.CompletedProcess, list[str], str]:
    """Run install.sh in a scratch repository; returns the result, the llama.cpp builds, the call log."""
    repo, bin_dir, state = tmp_path / "repo", tmp_path / "bin", tmp_path / "state"
    for folder in (repo / "packaging", bin_dir, state):
        folder.mkdir(parents=True)
    shutil.copy(INSTALL, repo / "packaging" / "install.sh")
    for tool in TOOLS:  # only these: a real nvcc or nvidia-smi elsewhere on PATH must not be found
        (bin_dir / tool).symlink_to(shutil.which(tool))
    scripts = {"python3": SYSTEM_PYTHON, "nvidia-smi": f"#!/bin/bash\nexit {0 if gpu else 9}\n"}
    if nvcc:
        scripts["nvcc"] = "#!/bin/bash\nexit 0\n"
    if dev:  # as root with apt-get (CI's fresh Debian): the system packages it installs are recorded
        (bin_dir / "id").unlink()
        scripts["id"] = "#!/bin/bash\necho 0\n"
        scripts["apt-get"] = '#!/bin/bash\necho "apt-get $*" >> "$STUB_STATE/log"\n'
    for name, text in scripts.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    (state / "venv-python").write_text(VENV_PYTHON)
    if toolkit_works:
        (state / "toolkit_works").touch()
    if llama_before:  # an existing .venv with llama.cpp built before: "cpu" or "cuda"
        (repo / ".venv" / "bin").mkdir(parents=True)
        shutil.copy(state / "venv-python", repo / ".venv" / "bin" / "python")
        (repo / ".venv" / "bin" / "python").chmod(0o755)
        (state / "llama").touch()
        if llama_before == "cuda":
            (state / "offload").touch()
    env = {"PATH": str(bin_dir), "STUB_STATE": str(state), "CUDA_HOME": str(tmp_path / "no-cuda"),
           "HOME": str(tmp_path)}
    command = [str(bin_dir / "bash"), str(repo / "packaging" / "install.sh"), *(["--dev"] if dev else [])]
    result = subprocess.run(command, env=env,
                            capture_output=True, text=True, timeout=60)
    builds = (state / "builds").read_text().splitlines() if (state / "builds").exists() else []
    return result, builds, (state / "log").read_text()


def test_without_a_gpu_llama_cpp_is_built_for_the_cpu_as_before(tmp_path):
    """No nvidia-smi answer: one build without GGML_CUDA (llamafile off), and the only llama.cpp
    check is the CPU path's own (no GPU offload question asked)."""
    result, builds, log = run_install(tmp_path, gpu=False, nvcc=True)
    assert result.returncode == 0, result.stderr
    assert len(builds) == 1 and "-DGGML_LLAMAFILE=OFF" in builds[0] and "GGML_CUDA" not in builds[0]
    assert "llama_supports_gpu_offload" not in log and "GPU" not in result.stdout + result.stderr


def test_with_a_gpu_and_nvcc_llama_cpp_is_built_with_cuda_and_the_offload_is_checked(tmp_path):
    """nvidia-smi answers and nvcc is there: the build gets -DGGML_CUDA=on, and the script says
    that llama_supports_gpu_offload() holds."""
    result, builds, _ = run_install(tmp_path, gpu=True, nvcc=True)
    assert result.returncode == 0, result.stderr
    assert len(builds) == 1 and "-DGGML_CUDA=on" in builds[0] and "-DGGML_LLAMAFILE=OFF" in builds[0]
    assert "llama_supports_gpu_offload() holds" in result.stdout


@pytest.mark.parametrize("before, rebuilt", [("cpu", True), ("cuda", False)])
def test_a_cpu_only_llama_cpp_in_an_existing_venv_is_rebuilt_on_a_gpu_machine(tmp_path, before, rebuilt):
    """An existing .venv: a CPU-only llama.cpp is rebuilt with CUDA, a CUDA one is kept."""
    result, builds, _ = run_install(tmp_path, gpu=True, nvcc=True, llama_before=before)
    assert result.returncode == 0, result.stderr
    assert len(builds) == (1 if rebuilt else 0)
    assert all("-DGGML_CUDA=on" in build for build in builds)
    assert "llama_supports_gpu_offload() holds" in result.stdout


def test_a_gpu_without_nvcc_builds_for_the_cpu_and_says_why(tmp_path):
    """nvidia-smi answers but no nvcc: a CPU build, and a message naming the missing compiler."""
    result, builds, _ = run_install(tmp_path, gpu=True, nvcc=False)
    assert result.returncode == 0, result.stderr
    assert len(builds) == 1 and "GGML_CUDA" not in builds[0]
    assert "nvcc (the CUDA compiler) was not found" in result.stderr


def test_a_cuda_build_without_gpu_offload_fails_the_install_with_a_message(tmp_path):
    """The build ran with -DGGML_CUDA=on but llama.cpp still cannot offload: exit 1, saying so."""
    result, builds, _ = run_install(tmp_path, gpu=True, nvcc=True, toolkit_works=False)
    assert result.returncode == 1
    assert len(builds) == 1 and "-DGGML_CUDA=on" in builds[0]
    assert "llama_supports_gpu_offload() is false" in result.stderr


def test_the_declared_llama_cpp_floor_is_the_version_install_sh_builds():
    """pyproject.toml may not accept an older llama-cpp-python than the one install.sh pins: older
    builds lack fixes of the vocabulary loader that parses files a service sends."""
    import re
    import tomllib

    pinned = re.search(r'llama_version="llama-cpp-python==([0-9.]+)"', INSTALL.read_text()).group(1)
    project = tomllib.loads((INSTALL.parents[1] / "pyproject.toml").read_text())["project"]["dependencies"]
    floors = [re.fullmatch(r"llama-cpp-python>=([0-9.]+)", each.split(";")[0].strip()) for each in project]
    assert [floor.group(1) for floor in floors if floor] == [pinned]


def test_dev_installs_the_tests_system_programs_with_apt(tmp_path):
    """--dev as root on Debian: tmux (the chat app's test) and haproxy (the replica tests) come from
    apt-get, in one call (haproxy only where it is not already in /usr/sbin)."""
    result, _, log = run_install(tmp_path, gpu=False, nvcc=False, dev=True)
    assert result.returncode == 0, result.stderr
    installs = [line for line in log.splitlines() if line.startswith("apt-get install")]
    wanted = "tmux" + ("" if Path("/usr/sbin/haproxy").exists() else " haproxy")
    assert installs and installs[0].endswith(f"-y -qq {wanted}"), log
