"""The project's import graph, read from the source: no cycle, and the design's arrows hold.

Every import statement counts, the ones inside functions too (a lazy import still runs the
module it names), and importing `a.b.c` counts as importing `a` and `a.b` as well: Python
runs a package's `__init__` before any module in it, so an `__init__` that imports its own
modules closes a cycle with each of them that imports the package.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("app", "local_draft", "wire", "remote_verify", "models", "benchmarks")

# What each package may import of the others (design.md, "Layout"): app -> local_draft -> wire,
# remote_verify -> wire; models is read by both sides; benchmarks measure everything.
ALLOWED = {
    "wire": set(),
    "models": {"wire"},
    "local_draft": {"wire", "models"},
    "remote_verify": {"wire", "models"},
    "app": {"local_draft", "wire", "models"},
    "benchmarks": {"app", "local_draft", "wire", "models", "remote_verify"},
}
# The commands that run the service's code in their own process: `specwire serve`, the demo's
# divergence check (it loads the target) and `models export-onnx`'s check of an export.
RUN_THE_SERVICE = {"app.serve_command", "app.demo", "app.models_command"}


def project_modules(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> its file, for every module of the project's packages."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            modules[".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")] = path
    return modules


def _with_packages(name: str) -> list[str]:
    """`a.b.c` -> [a, a.b, a.b.c]: importing a module runs each package above it first."""
    parts = name.split(".")
    return [".".join(parts[:end]) for end in range(1, len(parts) + 1)]


def imported_names(module: str, path: Path) -> set[str]:
    """Every module name an import statement anywhere in the file can run."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                names.update(_with_packages(alias.name))
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the module's own package up
                package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module
            names.update(_with_packages(base))
            names.update(f"{base}.{alias.name}" for alias in node.names)  # `from pkg import module`
    return names


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the project modules it imports."""
    modules = project_modules(root)
    return {module: {name for name in imported_names(module, path) if name in modules and name != module}
            for module, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    lowest: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = lowest[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in sorted(graph[module]):
            if imported not in index:
                visit(imported)
                lowest[module] = min(lowest[module], lowest[imported])
            elif imported in on_stack:
                lowest[module] = min(lowest[module], index[imported])
        if lowest[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(found)


def wrong_way_arrows(graph: dict[str, set[str]]) -> list[str]:
    """Each import of another package that the design does not allow."""
    wrong = []
    for module, imported in sorted(graph.items()):
        package = module.split(".")[0]
        for name in sorted(imported):
            other = name.split(".")[0]
            allowed = ALLOWED[package] | ({"remote_verify"} if module in RUN_THE_SERVICE else set())
            if other != package and other not in allowed:
                wrong.append(f"{module} -> {name}")
    return wrong


def test_the_import_graph_has_no_cycle():
    """No module reaches itself through the imports of the project's packages."""
    graph = import_graph()
    assert {"app.chat.engine", "remote_verify.server", "benchmarks.load"} <= set(graph)
    assert cycles(graph) == []


def test_imports_point_the_way_the_design_says():
    """app -> local_draft -> wire and remote_verify -> wire: no import runs against those arrows."""
    assert wrong_way_arrows(import_graph()) == []


def test_the_check_sees_lazy_imports_and_package_inits(tmp_path):
    """A package `__init__` with a lazy import of a module that imports the package is a cycle."""
    package = tmp_path / "remote_verify" / "backends"
    package.mkdir(parents=True)
    (tmp_path / "remote_verify" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("def load():\n    from remote_verify.backends.one import One\n")
    (package / "one.py").write_text("from remote_verify.backends import Pass\n")
    (package / "two.py").write_text("from . import one\n")
    graph = import_graph(tmp_path)
    assert graph["remote_verify.backends.two"] == {"remote_verify", "remote_verify.backends",
                                                   "remote_verify.backends.one"}
    assert cycles(graph) == [["remote_verify.backends", "remote_verify.backends.one"]]


def test_the_arrows_check_names_a_wrong_way_import(tmp_path):
    """remote_verify importing local_draft, even inside a function, is reported by name."""
    for package in ("remote_verify", "local_draft"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "local_draft" / "speculator.py").write_text("")
    (tmp_path / "remote_verify" / "server.py").write_text("def f():\n    import local_draft.speculator\n")
    assert wrong_way_arrows(import_graph(tmp_path)) == ["remote_verify.server -> local_draft",
                                                        "remote_verify.server -> local_draft.speculator"]
