"""A regular (non-editable) install ships the registry and every sub-package: build a wheel, import
diyflash from it alone."""

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(not (ROOT / "pyproject.toml").exists(), reason="needs the source tree (pyproject.toml)")
def test_wheel_carries_registry_and_registers_ops(tmp_path):
    # built from a copy of the sources alone: a build/ folder left in the tree by an earlier build would
    # lend the wheel packages that pyproject no longer (or never) lists
    src = tmp_path / "src"
    for name in ("diyflash", "csrc_registry"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(src)],
        capture_output=True, text=True, timeout=600,
    )
    assert build.returncode == 0, build.stderr
    wheel = next(tmp_path.glob("diyflash-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "diyflash/_registry/ops.txt" in names, names
    # every package of the source tree (pyproject lists them by hand: diyflash.distributed was missing)
    # (and the C launcher's source, compiled at first use)
    sources = sorted(str(f.relative_to(ROOT)) for pattern in ("*.py", "*.c") for f in (ROOT / "diyflash").rglob(pattern)
                     if "__pycache__" not in f.parts)
    assert [f for f in sources if f not in names] == []
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    probe = (
        "import diyflash, torch, pathlib;"
        "assert pathlib.Path(diyflash.__file__).parent.parent == pathlib.Path(r'%s'), diyflash.__file__;"
        "import diyflash.distributed, diyflash.integrations.sdpa;"
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
    assert commands == ["pip install -e . && python -m diyflash", 'pip install -e ".[test,transformers]" && python -m pytest -n auto']
    assert "(pip install -e . && python -m diyflash)" in ci and 'pip install -e ".[test,transformers]" && python -m pytest -n auto' in ci
    assert "python -m venv" in ci and "--system-site-packages" not in ci and "validation: PASSED" in ci


def test_auto_workers(monkeypatch):
    """`-n auto` (the README's test command) takes every CPU this process may run on, at most GPU_WORKERS on the
    GPU, and leaves the count to pytest-xdist's own rule where PYTEST_XDIST_AUTO_NUM_WORKERS is set."""
    import conftest

    monkeypatch.delenv("PYTEST_XDIST_AUTO_NUM_WORKERS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(40)), raising=False)
    monkeypatch.setattr(conftest, "DEVICE", "cpu")
    assert conftest.pytest_xdist_auto_num_workers(None) == 40
    monkeypatch.setattr(conftest, "DEVICE", "cuda")
    assert conftest.pytest_xdist_auto_num_workers(None) == conftest.GPU_WORKERS < 40
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert conftest.pytest_xdist_auto_num_workers(None) == 2
    monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", "3")
    assert conftest.pytest_xdist_auto_num_workers(None) is None


def test_test_session_leaves_no_cache_dir(tmp_path):
    # conftest makes a fresh tuner cache per session (DIYFLASH_CACHE_DIR); the session must remove it, or
    # every run of the suite leaves a directory in the temp folder
    env = {k: v for k, v in os.environ.items() if k != "DIYFLASH_CACHE_DIR"}
    env["TMPDIR"] = str(tmp_path)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only",
         str(ROOT / "tests" / "test_layering.py")],
        capture_output=True, text=True, timeout=600, env=env, cwd=ROOT,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert list(tmp_path.iterdir()) == []
