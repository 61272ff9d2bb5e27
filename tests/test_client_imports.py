"""The client loads light: no module it runs imports the service's code, torch or onnxruntime."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLIENT_PACKAGES = ("app", "local_draft", "wire")
SERVICE_COMMANDS = {"app.serve_command"}  # `specwire serve` runs the service: it may load it
HEAVY = ("torch", "onnxruntime", "transformers", "remote_verify")


def client_modules() -> list[str]:
    """Every module of the client's packages, less the commands that run the service."""
    names = []
    for package in CLIENT_PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            if name not in SERVICE_COMMANDS:
                names.append(name)
    return names


def test_every_client_module_loads_without_the_service_torch_or_onnxruntime():
    """Import each client module in a fresh interpreter; report every heavy module it pulled in."""
    modules = client_modules()
    assert {"app.cli", "app.chat.engine", "local_draft.speculator", "wire.protocol"} <= set(modules)
    code = f"""
import importlib, json, sys
heavy = {HEAVY!r}
found = {{}}
for name in {modules!r}:
    before = set(sys.modules)
    importlib.import_module(name)
    pulled = sorted(m for m in set(sys.modules) - before if m.split('.')[0] in heavy)
    if pulled:
        found[name] = pulled[:5]
print(json.dumps(found))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {}, done.stdout
