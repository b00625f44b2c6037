"""A launch plan replayed by one C++ call (`_cplan.cpp`): outputs and buffers allocated through ATen, the
launches fired through the C launcher (`_claunch.c`), no Python between them.

The API's fast path replays a known call's plan (attention/fast.py). From Python each replay allocates
its outputs through torch's argument parser (~4-8 us a tensor on an H200 host), builds the env of names
the plan's launches read, and hands their pointers to the C launcher; a backward allocates six or more
tensors so, on autograd's device thread. `program()` turns such a plan into a `Program`: which inputs
and which allocations each launch's pointers are, and `Program.__call__` runs it in one C++ call.

The C++ source is compiled once per torch and Python version with the system C++ compiler against the
headers torch ships (`torch/include`; no CUDA toolkit, nothing at install time) and kept in diyflash's
cache directory. The build takes seconds, so it runs on a background thread when the first plan asks for
it, and replays take Python's path until it is loaded (`ready()` waits for it). Where there is no
compiler, the build fails, or the C launcher is off (DIYFLASH_C_LAUNCHER=0, DIYFLASH_PLAIN=1),
`module()` stays None and every replay is Python's: the same launches with the same arguments, so the
same results (tests/test_cplan.py). The module also holds the fast path's autograd node (`Attention`), whose
backward runs a backward's Program without Python where one is kept for its layout (node_module).
"""

from __future__ import annotations

import atexit
import hashlib
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
from pathlib import Path

import torch

from ._claunch import ENABLED as C_LAUNCHER_ENABLED, module as c_launcher, reason as c_launcher_reason
from ._runtime import env_flag
from .tuning_cache import cache_dir

ENABLED = C_LAUNCHER_ENABLED and env_flag("DIYFLASH_C_PLANS", "1")
SOURCE = Path(__file__).with_name("_cplan.cpp")
NAME = "diyflash_cplan"

_state: dict = {}  # "module": the loaded module; "error": why there is none; "thread": the build under way
_lock = threading.Lock()


def module():
    """The loaded C++ module, or None: not built yet (this starts the build on a background thread), or it
    cannot be (`reason()` says why)."""
    mod = _state.get("module")
    if mod is not None or "error" in _state:
        return mod
    _start()
    return None


def ready(timeout: float | None = None):
    """The module, waiting for its build (started here where it was not); None where it cannot be built."""
    _start()
    thread = _state.get("thread")
    if thread is not None:
        thread.join(timeout)
    return _state.get("module")


def reason() -> str | None:
    """Why module() is None after its build finished, else None."""
    return _state.get("error")


def _start() -> None:
    with _lock:
        if "module" in _state or "error" in _state or "thread" in _state:
            return
        if not ENABLED:
            _state["error"] = "off (DIYFLASH_C_LAUNCHER=0, DIYFLASH_C_PLANS=0 or DIYFLASH_PLAIN=1)"
            return
        thread = threading.Thread(target=_load, name="diyflash-cplan-build", daemon=True)
        _state["thread"] = thread
        thread.start()


def _load() -> None:
    try:
        claunch = c_launcher()
        if claunch is None:
            raise RuntimeError(f"no C launcher ({c_launcher_reason()})")
        mod = _import(build())
        mod.bind(claunch._C_API)
        _state["module"] = mod
    except Exception as exc:  # no compiler, a failed build: Python's replay serves
        _state["error"] = f"{type(exc).__name__}: {exc}"


def _compiler() -> str:
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        path = name and shutil.which(name)
        if path:
            return path
    raise RuntimeError("no C++ compiler found (set CXX)")


def _command(cxx: str, source: Path, target: Path) -> list[str]:
    torch_dir = Path(torch.__file__).parent
    lib = torch_dir / "lib"
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    return [cxx, "-O2", "-std=c++17", "-fPIC", "-shared", "-w", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
            f"-I{torch_dir / 'include'}", f"-I{sysconfig.get_paths()['include']}", str(source), "-o", str(target),
            f"-L{lib}", "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python", f"-Wl,-rpath,{lib}"]


def build() -> Path:
    """The compiled module's path in the cache directory, built there unless a build of this source, torch,
    Python and compiler is already kept (processes building at once each write their own file and rename it)."""
    cxx = _compiler()
    text = SOURCE.read_bytes()
    key = hashlib.sha256(b"\0".join([text, torch.__version__.encode(), sys.version.encode(), cxx.encode(),
                                     " ".join(_command(cxx, SOURCE, Path("x"))).encode()])).hexdigest()[:20]
    where = cache_dir() / "cplan"
    target = where / f"{NAME}_{key}{sysconfig.get_config_var('EXT_SUFFIX') or '.so'}"
    if target.exists():
        return target
    where.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=where) as tmp:
        built = Path(tmp) / target.name
        proc = subprocess.Popen(_command(cxx, SOURCE, built), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)  # (its own group: the driver and cc1plus stop)
        _BUILDS.add(proc)
        try:
            stderr = proc.communicate()[1]
        finally:
            _BUILDS.discard(proc)
        if proc.returncode != 0:
            raise RuntimeError(f"{cxx} failed ({proc.returncode}): {stderr.strip()[-2000:]}")
        os.replace(built, target)
    return target


_BUILDS: set = set()  # compiler processes running (a background build the process exits during is stopped)


@atexit.register
def _stop_builds() -> None:
    for proc in list(_BUILDS):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass


def _import(path: Path):
    spec = importlib.util.spec_from_file_location(NAME, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_USE = [True]


def use(on: bool) -> bool:
    """Let Programs run (True) or send every replay through Python's path (False): the benchmarks compare
    both in one process. Returns the previous setting."""
    before, _USE[0] = _USE[0], bool(on)
    return before


class Program:
    """A plan as one C++ call: `program(stream, inputs)` allocates, launches, and returns the allocations named
    `returned`, or None where nothing ran (no CUDA context current on this thread, an allocation not 16-byte
    aligned): the caller then replays the plan from Python."""

    __slots__ = ("capsule", "run")

    def __init__(self, capsule, run):
        self.capsule, self.run = capsule, run

    def __call__(self, stream: int, inputs: tuple, values: tuple | None = None):
        """values: each launch's scalars instead of those the Program was made with (a call of the same plan
        with other strides and lengths)."""
        return self.run(self.capsule, stream, inputs, values) if _USE[0] else None


def programs_on() -> bool:
    """Whether Programs run (use())."""
    return _USE[0]


def node_module(backward):
    """The loaded module with `backward` set as its autograd nodes' Python backward (set once), or None while it
    is not loaded (module()). backward(dout, dlse, q, k, v, out, lse, cache, causal, scale, left, right, softcap,
    deterministic) -> (dq, dk, dv): what a node runs where it runs no kept Program (_cplan.cpp `Attention`)."""
    mod = module()
    if mod is not None and _state.get("backward") is not backward:
        mod.set_backward(backward)
        _state["backward"] = backward
    return mod


def program(seq, inputs: tuple[str, ...], allocs: dict, returned: tuple[str, ...], sources: dict | None = None,
            args: tuple | None = None) -> Program | None:
    """The Program of a plan's Sequence (`seq`, whose launches read the env entries `seq.names`), or None where
    the module is not loaded yet or a name is neither an input, an allocation nor None-valued (`allocs` also lists
    the names whose env value is None, as None). inputs: the names passed to the call, in order. allocs: name ->
    ("like", input), ("rows", input) (fp32, the input's shape but the last), ("new", shape, dtype) or None.
    sources: env names read through another's memory (a descriptor's name -> its tensor's, the caller having
    checked that the descriptor's address is the tensor's; a kernel's output that is the call's out). args: each
    launch's scalars after its pointers (replay_with's), where they are not the ones the launches were bound
    with."""
    mod = module()
    if mod is None:
        return None
    sources = sources or {}
    alloc_names = [name for name, spec in allocs.items() if spec is not None]
    specs = []
    for name in alloc_names:
        kind, *rest = allocs[name]
        if kind == "new":
            specs.append((2, tuple(rest[0]), rest[1]))
        else:
            specs.append((0 if kind == "like" else 1, inputs.index(rest[0])))
    names = seq.names
    index = {}
    for name in names:
        name_of = sources.get(name, name)
        if name_of in inputs:
            index[name] = inputs.index(name_of)
        elif name_of in alloc_names:
            index[name] = -1 - alloc_names.index(name_of)
        elif name_of in allocs:
            index[name] = None
        else:
            return None
    tail = seq.tail
    launches = tuple((tail[i], tuple(index[names[j]] for j in tail[i + 1]), tail[i + 2])
                     + (() if args is None else (tuple(args[i // 3]),)) for i in range(0, len(tail), 3))
    capsule = mod.make(len(inputs), tuple(specs), launches, tuple(alloc_names.index(n) for n in returned),
                       seq.need, seq.align)
    return Program(capsule, mod.run)
