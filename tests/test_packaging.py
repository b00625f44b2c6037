"""A regular (non-editable) install ships the registry: build a wheel, import diyflash from it alone."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(not (ROOT / "pyproject.toml").exists(), reason="needs the source tree (pyproject.toml)")
def test_wheel_carries_registry_and_registers_ops(tmp_path):
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(ROOT)],
        capture_output=True, text=True, timeout=600,
    )
    assert build.returncode == 0, build.stderr
    wheel = next(tmp_path.glob("diyflash-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "diyflash/_registry/ops.txt" in names, names
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    probe = (
        "import diyflash, torch, pathlib;"
        "assert pathlib.Path(diyflash.__file__).parent.parent == pathlib.Path(r'%s'), diyflash.__file__;"
        "print(torch.ops.diyflash.attention.default._schema)" % site
    )
    # run from an empty directory with only the unpacked wheel on the path: no source tree to fall back on
    env = {**os.environ, "PYTHONPATH": str(site)}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("diyflash::attention(Tensor q, Tensor k, Tensor v")


def test_ci_runs_the_readme_commands_verbatim():
    """Issue 22: .ci/run proves both README commands in a fresh venv; the two files must not drift."""
    root = Path(__file__).resolve().parents[1]
    readme = (root / "README.md").read_text()
    ci = (root / ".ci" / "run").read_text()
    block = readme.split("```bash", 1)[1].split("```", 1)[0]
    commands = [line.strip() for line in block.splitlines() if line.strip() and not line.strip().startswith("#")]
    assert commands == ["pip install -e . && python -m diyflash", 'pip install -e ".[test,transformers]" && python -m pytest']
    assert "(pip install -e . && python -m diyflash)" in ci and 'pip install -e ".[test,transformers]" && python -m pytest' in ci
    assert "python -m venv" in ci and "--system-site-packages" not in ci and "validation: PASSED" in ci
