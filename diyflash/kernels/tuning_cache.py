"""The matmul autotuner's choices, kept on disk so that a second process tunes nothing.

Before, every process timed every candidate tile again on its first product of each shape bucket: most
of a warm `python -m diyflash`'s 42 s on the H200. Now a choice, once made, is written to a
JSON file and read back by later processes.

Where: `$DIYFLASH_CACHE_DIR`, else `$XDG_CACHE_HOME/diyflash`, else `~/.cache/diyflash`; one file per
environment, `matmul-<hash>.json`, where the hash covers the GPU (name and compute capability) and the
torch, triton and diyflash versions: a new GPU or version starts a file of its own. Inside, an entry per
tuning key (dtype, TF32 or not, operand layout, power-of-two bucket of M, N and K) holds the chosen
config and its measured time. Users can move the directory (the variable) or delete it at any time.

Robustness: a file that does not parse, or an entry that does not describe a config the tuner would
try today for its key (a stale candidate list, a hand edit), is ignored, the key is tuned again and
the entry rewritten: never a crash, never a tile the kernel cannot run. Writes go to a temporary file
that replaces the old one, so a reader never sees half a file; two processes writing at once may
drop one of their new entries, which is then tuned again later.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import fields
from pathlib import Path

import torch

from .._version import __version__
from .matmul_configs import MatmulConfig

CACHE_DIR_ENV = "DIYFLASH_CACHE_DIR"
FORMAT = 1  # bump when the file's layout changes: older files are then ignored


def cache_dir() -> Path:
    """$DIYFLASH_CACHE_DIR (with ~ expanded), else $XDG_CACHE_HOME/diyflash where that is an absolute path
    (the XDG spec says to ignore a relative one), else ~/.cache/diyflash."""
    env = os.environ.get(CACHE_DIR_ENV)
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = xdg if xdg and os.path.isabs(xdg) else os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "diyflash"


def environment(device: torch.device) -> dict:
    """What a tuned choice is valid for besides its key: the GPU and the software versions."""
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    if device.type == "cuda":
        gpu = torch.cuda.get_device_name(device)
        cc = list(torch.cuda.get_device_capability(device))
    else:
        gpu, cc = device.type, None
    return {"format": FORMAT, "gpu": gpu, "capability": cc, "torch": torch.__version__, "triton": triton_version,
            "diyflash": __version__}


def cache_file(env: dict) -> Path:
    digest = hashlib.sha256(json.dumps(env, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / f"matmul-{digest}.json"


def key_text(key: tuple) -> str:
    """A tuning key (matmul.tuning_key without its device, which the file name stands for) as text."""
    return json.dumps([str(x) if isinstance(x, torch.dtype) else x for x in key])


def _read(path: Path, env: dict) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):
        return {}  # missing, unreadable, corrupt or absurdly nested: as if empty (rewritten on the next store)
    if not isinstance(data, dict) or data.get("environment") != env or not isinstance(data.get("entries"), dict):
        return {}
    return data["entries"]


def load(env: dict, key: tuple, valid: list[MatmulConfig]) -> tuple[MatmulConfig, float] | None:
    """The stored choice for `key`, if there is one and it is among `valid` (the candidates the tuner
    would time for this key today); else None."""
    entry = _read(cache_file(env), env).get(key_text(key))
    try:
        values = {f.name: entry["config"][f.name] for f in fields(MatmulConfig)}
        ms = float(entry["ms"])
    except (TypeError, KeyError, ValueError):
        return None
    # the candidate itself, each field of its type: a stored 256.0 equals 256, and returned as it was the
    # kernel refused its float tile on every call
    cfg = MatmulConfig(**values)
    same = [c for c in valid if c == cfg and all(type(getattr(c, n)) is type(x) for n, x in values.items())]
    return (same[0], ms) if same else None


def store(env: dict, key: tuple, cfg: MatmulConfig, ms: float) -> None:
    """Record a choice. A cache that cannot be written (read-only home, full disk) is skipped silently:
    the choice still serves this process."""
    path = cache_file(env)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        entries = _read(path, env)
        entries[key_text(key)] = {"config": cfg.as_dict(), "ms": ms}
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    except OSError:
        return
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({"environment": env, "entries": entries}, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError:  # e.g. a directory where the file goes: leave no temporary file behind
        try:
            os.unlink(tmp)
        except OSError:
            pass
