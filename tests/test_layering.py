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
    "ops": ("diyflash.api", "diyflash.reference", "diyflash.utils"),
    # integrations sit on the public API (diyflash.api, torch.ops.diyflash.*), never on its insides
    "integrations": ("diyflash.kernels", "diyflash.ops", "diyflash.reference", "diyflash.distributed"),
    "distributed": ("diyflash.kernels", "diyflash.ops", "diyflash.reference", "diyflash.integrations"),
}


@pytest.mark.parametrize("layer", sorted(RULES))
def test_layer_imports(layer):
    files = sorted((PKG / layer).rglob("*.py"))
    assert files, layer
    for f in files:
        for name in imported_modules(f):
            for banned in RULES[layer]:
                assert not (name == banned or name.startswith(banned + ".")), f"{f.name} imports {name}"


def test_kernels_package_does_not_import_triton():
    """Importing diyflash must work without triton (CPU machines without it use the PyTorch path)."""
    for f in ("__init__.py", "_runtime.py", "attention_torch.py", "attention_configs.py"):
        assert not any(n.split(".")[0] == "triton" for n in imported_modules(PKG / "kernels" / f)), f


def test_checker_sees_relative_imports():
    names = imported_modules(PKG / "ops" / "attention.py")
    assert "diyflash.kernels.attention_torch" in names and "torch.library" in names
