"""The shipped container file, systemd unit and Kubernetes manifests pass their linters.

What runs here: hadolint on the Dockerfile, yamllint and kubernetes-validate (the API
schemas of Kubernetes 1.37, strict) on the manifests, and `systemd-analyze verify` on the
unit. Nothing is built, started or applied: there is no Docker engine or cluster here.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

PACKAGING = Path(__file__).resolve().parents[2] / "packaging"
BIN = Path(sys.executable).parent
YAMLLINT_CONFIG = "{extends: default, rules: {line-length: {max: 120}, document-start: disable}}"


def run(*command: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in command], capture_output=True, text=True, timeout=120)


def test_the_dockerfile_passes_hadolint():
    """hadolint finds nothing (two documented ignores: unpinned apt packages of the base image)."""
    result = run(BIN / "hadolint", PACKAGING / "Dockerfile")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_kubernetes_manifests_pass_yamllint_and_the_api_schemas():
    """yamllint and kubernetes-validate --strict pass; the Deployment is probed on /healthz and
    reads the token from the Secret that secret.yaml defines; the Service selects its pods."""
    manifests = sorted((PACKAGING / "kubernetes").glob("*.yaml"))
    assert [m.name for m in manifests] == ["deployment.yaml", "secret.yaml", "service.yaml"]
    lint = run(BIN / "yamllint", "-d", YAMLLINT_CONFIG, *manifests)
    assert lint.returncode == 0, lint.stdout
    schema = run(BIN / "kubernetes-validate", "--strict", *manifests)
    assert schema.returncode == 0 and schema.stdout.count("passed") == 3, schema.stdout + schema.stderr

    docs = {path.stem: yaml.safe_load(path.read_text()) for path in manifests}
    pod = docs["deployment"]["spec"]["template"]
    serve = pod["spec"]["containers"][0]
    assert serve["readinessProbe"]["httpGet"]["path"] == "/healthz"
    token_volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "token")
    assert token_volume["secret"]["secretName"] == docs["secret"]["metadata"]["name"]
    mount = next(m for m in serve["volumeMounts"] if m["name"] == "token")["mountPath"]
    assert serve["args"][serve["args"].index("--token-file") + 1] == f"{mount}/token"
    assert docs["service"]["spec"]["selector"].items() <= pod["metadata"]["labels"].items()


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_the_systemd_unit_verifies(tmp_path):
    """`systemd-analyze verify` prints no warning. The ExecStart binary is pointed at a stand-in
    executable in a temporary folder, because the unit's install prefix (/opt/specwire) is not here."""
    stand_in = tmp_path / "specwire"
    stand_in.write_text("#!/bin/sh\n")
    stand_in.chmod(0o755)
    unit = (PACKAGING / "specwire.service").read_text()
    assert "/opt/specwire/.venv/bin/specwire" in unit
    (tmp_path / "specwire.service").write_text(unit.replace("/opt/specwire/.venv/bin/specwire", str(stand_in)))
    result = run("systemd-analyze", "verify", tmp_path / "specwire.service")
    assert result.returncode == 0 and result.stderr.strip() == "", result.stderr
