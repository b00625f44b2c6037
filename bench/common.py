"""What every benchmark row records: where and with what it was measured."""

from __future__ import annotations

import datetime
import platform

import torch


def provenance() -> dict:
    import diyflash

    try:
        import triton

        triton_version = triton.__version__
    except ModuleNotFoundError:
        triton_version = None
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return {
        "gpu": gpu,
        "torch": torch.__version__,
        "triton": triton_version,
        "diyflash": diyflash.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
