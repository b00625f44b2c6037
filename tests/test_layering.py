"""The dependency direction of STYLE.md, enforced: api -> ops -> kernels -> (triton, torch), with
integrations and distributed on top of the public API.

kernels never import torch.library, diyflash.ops or diyflash.api; ops never import diyflash.api;
neither imports the oracle (diyflash.reference); integrations and distributed import neither ops nor
kernels. Parsed from the source, so it cannot rot.
"""

import ast
from pathlib import Path

import pytest

import diyflash

PKG = Path(diyflash.__file__).parent


def imported_modules(path: Path) -> set[str]:
    """Absolute names of everything a module imports (relative imports resolved)."""
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    package = parts[:-1] if parts[-1] != "__init__" else parts[:-1]
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(package[: len(package) - node.level + 1])
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            names.add(mod)
            names.update(f"{mod}.{a.name}" for a in node.names)
    return names


RULES = {
    "kernels": ("torch.library", "diyflash.ops", "diyflash.api", "diyflash.reference", "diyflash.utils"),
    # the tools (selector, precompile, python -m diyflash, utils) stand on the API and the ops
    # (diyflash.ops.runtime answers what they ask of the kernels)
    "tools": ("diyflash.kernels",),
    "api": ("diyflash.kernels",),
    "ops": ("diyflash.api", "diyflash.reference", "diyflash.utils"),
    # integrations sit on the public API (diyflash.api, torch.ops.diyflash.*), never on its insides
    "integrations": ("diyflash.kernels", "diyflash.ops", "diyflash.reference", "diyflash.distributed"),
    "distributed": ("diyflash.kernels", "diyflash.ops", "diyflash.reference", "diyflash.integrations"),
}


TOOLS = ("selector.py", "precompile.py", "__main__.py", "utils")


def _layer_files(layer: str) -> list[Path]:
    if layer == "tools":
        return sorted(f for name in TOOLS for f in ([PKG / name] if name.endswith(".py") else (PKG / name).rglob("*.py")))
    if layer == "api":
        return [PKG / "api.py"]
    return sorted((PKG / layer).rglob("*.py"))


@pytest.mark.parametrize("layer", sorted(RULES))
def test_layer_imports(layer):
    files = _layer_files(layer)
    assert files, layer
    for f in files:
        for name in imported_modules(f):
            for banned in RULES[layer]:
                assert not (name == banned or name.startswith(banned + ".")), f"{f.name} imports {name}"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph() -> dict[str, set[str]]:
    """Each diyflash module -> the diyflash modules it imports (anywhere in it, function-level imports too),
    a `from package import name` counted as the module package.name where that is one; a module's own
    ancestor packages left out (importing a submodule runs them first: no cycle)."""
    modules = {_module_name(f) for f in PKG.rglob("*.py")}
    graph = {}
    for f in PKG.rglob("*.py"):
        me = _module_name(f)
        edges = set()
        for name in imported_modules(f):
            while name and name not in modules:  # a name imported from a module: that module
                name = name.rpartition(".")[0]
            if name and name != me and not me.startswith(name + "."):
                edges.add(name)
        graph[me] = edges
    # `from pkg import sub` names both pkg and pkg.sub: keep the submodule only
    for me, edges in graph.items():
        graph[me] = {e for e in edges if not any(o.startswith(e + ".") for o in edges)}
    return graph


def test_no_import_cycles():
    graph = _graph()
    done, path = set(), []

    def visit(m):
        if m in path:
            raise AssertionError("import cycle: " + " -> ".join(path[path.index(m):] + [m]))
        if m in done:
            return
        path.append(m)
        for n in sorted(graph.get(m, ())):
            visit(n)
        path.pop()
        done.add(m)

    for m in sorted(graph):
        visit(m)


def test_every_module_has_a_layer():
    """A new package or top-level module under diyflash/ must be placed in the layering (RULES, TOOLS) or
    declared here: the package's entry (__init__), its version and the float64 oracle import no diyflash
    layer below the API."""
    placed = set(RULES) | set(TOOLS) | {"api.py", "__init__.py", "_version.py", "reference.py"}
    found = {p.parent.name for p in PKG.glob("*/__init__.py")} | {p.name for p in PKG.glob("*.py")}
    assert found <= placed, found - placed


def _jit_functions(path: Path) -> set[str]:
    """Names a module defines under a @triton.jit decorator."""
    def jit(dec):
        dec = dec.func if isinstance(dec, ast.Call) else dec
        return isinstance(dec, ast.Attribute) and dec.attr == "jit" or isinstance(dec, ast.Name) and dec.id == "jit"
    return {n.name for n in ast.parse(path.read_text()).body
            if isinstance(n, ast.FunctionDef) and any(jit(d) for d in n.decorator_list)}


def test_no_private_names_across_modules():
    """A module imports another diyflash module's public names only; Triton jit helpers and kernels
    (private by convention, called from other kernels' files) are the exception."""
    modules = {_module_name(f): f for f in PKG.rglob("*.py")}
    for f in PKG.rglob("*.py"):
        parts = f.relative_to(PKG.parent).with_suffix("").parts
        package = parts[:-1]
        for node in ast.walk(ast.parse(f.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = list(package[: len(package) - node.level + 1]) if node.level else []
            source = ".".join(base + ([node.module] if node.module else []))
            if source not in modules:
                continue
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    assert alias.name in _jit_functions(modules[source]), f"{f.name} imports {source}.{alias.name}"


def test_kernels_package_does_not_import_triton():
    """Importing diyflash must work without triton (CPU machines without it use the PyTorch path) and
    without numpy (a venv with torch and triton only gets an error naming numpy at the first Triton call:
    tests/test_api.py)."""
    for f in ("__init__.py", "_runtime.py", "attention_torch.py", "attention_configs.py", "contract.py"):
        assert not any(n.split(".")[0] in ("triton", "numpy") for n in imported_modules(PKG / "kernels" / f)), f


def test_checker_sees_relative_imports():
    names = imported_modules(PKG / "ops" / "attention.py")
    assert "diyflash.kernels.attention_torch" in names and "torch.library" in names
