"""Shared test setup: which device the suite runs on, and Triton's interpreter on CPU.

DIYFLASH_TEST_DEVICE=cpu (default, CI): CPU tensors, with TRITON_INTERPRET=1 set here, before any
kernel module is imported, so the real Triton kernels run through Triton's interpreter.
DIYFLASH_TEST_DEVICE=cuda (the GPU machine): the same test files on CUDA tensors, compiled kernels.
"""

import atexit
import os
import shutil
import tempfile

# The matmul tuner's disk cache (kernels/tuning_cache.py): a fresh one per test session, so that no test
# reads choices a user's earlier runs left in ~/.cache/diyflash (subprocesses inherit it). The process that
# made it removes it at exit (tests/test_packaging.py checks that a session leaves nothing behind).
if "DIYFLASH_CACHE_DIR" not in os.environ:
    os.environ["DIYFLASH_CACHE_DIR"] = tempfile.mkdtemp(prefix="diyflash-test-cache-")
    atexit.register(shutil.rmtree, os.environ["DIYFLASH_CACHE_DIR"], ignore_errors=True)

DEVICE = os.environ.get("DIYFLASH_TEST_DEVICE", "cpu")
if DEVICE not in ("cpu", "cuda"):
    raise RuntimeError(f"DIYFLASH_TEST_DEVICE must be 'cpu' or 'cuda', got {DEVICE!r}")
if DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        # Triton decorates its own standard library (tl.max's combine function, tl.cdiv, ...) when
        # triton.language is first imported, in the mode TRITON_INTERPRET has then. Import it now, so a
        # test that later flips the variable for the PyTorch path cannot leave it in compiled mode.
        import triton.language  # noqa: F401
    except ModuleNotFoundError:
        pass

import pytest  # noqa: E402
import torch  # noqa: E402

if DEVICE == "cuda" and not torch.cuda.is_available():
    raise RuntimeError("DIYFLASH_TEST_DEVICE=cuda but torch.cuda.is_available() is False")


@pytest.fixture(scope="session", autouse=True)
def c_plans_built():
    """On the GPU, the C++ replay of plans (kernels/_cplan.py) is built before the first test, so that every
    test meets the replay it would meet in a long-running process (its build otherwise runs in the background
    and would switch replays over at a time that depends on the compiler's speed)."""
    if DEVICE == "cuda":
        from diyflash.kernels import _cplan

        _cplan.ready(timeout=600)
    yield


@pytest.fixture
def device() -> torch.device:
    return torch.device(DEVICE)


@pytest.fixture
def torch_path(monkeypatch):
    """Run CPU tensors through the PyTorch blocked implementation instead of the interpreter."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    return torch.device("cpu")


@pytest.fixture
def fresh_caches():
    """diyflash.clear_caches() before and after the test: plans made while a test patches how they are
    made (a split, a layout) must not be replayed by the tests after it."""
    import diyflash

    diyflash.clear_caches()
    yield
    diyflash.clear_caches()


_SLOW = frozenset(line.strip() for line in open(os.path.join(os.path.dirname(__file__), "slow_tests.txt"))
                  if line.strip() and not line.startswith("#"))


@pytest.fixture
def fake_driver(monkeypatch):
    """DirectLauncher's view of Triton's driver, faked (device 0, stream 1234): its logic tested on stand-in
    kernels without a GPU (tests/test_launch.py, tests/test_compile_ahead.py)."""
    from diyflash.kernels import _launch

    monkeypatch.setattr(_launch, "active_driver", lambda: (lambda: 0, lambda device: 1234))


def pytest_collection_modifyitems(config, items):
    """Mark the slow tier (slow_tests.txt): `pytest -m "not slow"` runs the rest in a few minutes on a CPU."""
    for item in items:
        if item.nodeid in _SLOW:
            item.add_marker(pytest.mark.slow)


GPU_WORKERS = 14  # the GPU suite's workers on a 16-core H200 host (docs/testing.md)


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_auto_num_workers(config):
    """The workers of `-n auto` (the README's test command): every CPU this process may run on, since Triton's
    interpreter is CPU-bound (on a 2-core machine the full suite took 14 min on two workers against 24 min
    serially), and at most GPU_WORKERS on the GPU, where every worker holds a CUDA context on the one device.
    PYTEST_XDIST_AUTO_NUM_WORKERS, where set, decides (pytest-xdist's own rule); `-n 0` runs serially."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return min(cpus, GPU_WORKERS) if DEVICE == "cuda" else cpus


def pytest_report_header(config):
    interp = os.environ.get("TRITON_INTERPRET", "0")
    gpu = torch.cuda.get_device_name() if DEVICE == "cuda" else "none"
    return f"diyflash tests: device={DEVICE} TRITON_INTERPRET={interp} gpu={gpu} torch={torch.__version__}"


@pytest.fixture(params=["hopper", "portable"])
def backend(request):
    """The attention kernels' backend for one test (the Hopper tests run each case on both), restored after."""
    from diyflash.kernels.attention import hopper

    before = hopper.backend()
    hopper.use(request.param)
    yield request.param
    hopper.use(before)

