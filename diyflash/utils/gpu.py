"""GPU detection (the seed's utils.detect_gpu and friends), read from the device's own properties."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import torch


class GPUArch(Enum):
    """NVIDIA architectures by their base SM. sm_86/sm_87 map to AMPERE; sm_120 (consumer Blackwell) and
    sm_10x map to BLACKWELL; anything else (or no GPU) is UNKNOWN."""

    VOLTA = "sm_70"
    TURING = "sm_75"
    AMPERE = "sm_80"
    ADA = "sm_89"
    HOPPER = "sm_90"
    BLACKWELL = "sm_100"
    UNKNOWN = "unknown"


def arch_of(compute_capability: tuple[int, int]) -> GPUArch:
    major, minor = compute_capability
    if major == 7:
        return GPUArch.TURING if minor >= 5 else GPUArch.VOLTA
    if major == 8:
        return GPUArch.ADA if minor >= 9 else GPUArch.AMPERE
    if major == 9:
        return GPUArch.HOPPER
    if major in (10, 11, 12):
        return GPUArch.BLACKWELL
    return GPUArch.UNKNOWN


@dataclass
class GPUCapabilities:
    name: str
    arch: GPUArch
    compute_capability: tuple[int, int]
    has_tma: bool  # tensor memory accelerator (bulk tensor copies): sm_90 and newer
    has_fp8: bool  # fp8 tensor-core math: sm_89 (Ada) and newer
    has_warpgroup_mma: bool  # wgmma: Hopper (sm_90) only; Blackwell has its own tcgen05 MMA
    sram_per_sm: int  # bytes of shared memory per SM, from the device properties
    num_sms: int
    total_memory_gb: float


def capabilities_of(compute_capability: tuple[int, int]) -> dict:
    """The feature flags an architecture has (used for any device, CPU included)."""
    cc = tuple(compute_capability)
    return {
        "has_tma": cc >= (9, 0),
        "has_fp8": cc >= (8, 9),
        "has_warpgroup_mma": cc[0] == 9,
    }


def detect_gpu(device_id: int = 0) -> GPUCapabilities:
    """Capabilities of CUDA device `device_id`. RuntimeError when CUDA is not available."""
    if not torch.cuda.is_available():
        raise RuntimeError("detect_gpu needs a CUDA GPU, but torch.cuda.is_available() is False "
                           f"(torch {torch.__version__}, CUDA build: {torch.version.cuda})")
    count = torch.cuda.device_count()
    if not 0 <= device_id < count:
        raise RuntimeError(f"device_id {device_id} does not exist: this machine has {count} CUDA device(s)")
    props = torch.cuda.get_device_properties(device_id)
    cc = (props.major, props.minor)
    return GPUCapabilities(
        name=props.name,
        arch=arch_of(cc),
        compute_capability=cc,
        sram_per_sm=int(props.shared_memory_per_multiprocessor),
        num_sms=props.multi_processor_count,
        total_memory_gb=props.total_memory / 2**30,
        **capabilities_of(cc),
    )


def describe(caps: GPUCapabilities) -> str:
    return (f"GPU: {caps.name} ({caps.arch.value}, compute capability {caps.compute_capability[0]}."
            f"{caps.compute_capability[1]}), {caps.num_sms} SMs, {caps.sram_per_sm // 1024} KiB shared memory "
            f"per SM, {caps.total_memory_gb:.1f} GiB; TMA {caps.has_tma}, FP8 {caps.has_fp8}, "
            f"wgmma {caps.has_warpgroup_mma}")


def print_gpu_info(device_id: int = 0) -> None:
    """Print the GPU's capabilities, or say that there is none (no exception on a CPU-only machine)."""
    if not torch.cuda.is_available():
        print("No CUDA GPU: diyflash runs its Triton kernels through the interpreter (TRITON_INTERPRET=1) "
              "or its PyTorch path on this machine.")
        return
    print(describe(detect_gpu(device_id)))


def check_hopper_features(device_id: int = 0) -> dict:
    """{tma_available, fp8_available, wgmma_available, arch, compute_capability}; all False on CPU."""
    if not torch.cuda.is_available():
        return {"tma_available": False, "fp8_available": False, "wgmma_available": False,
                "arch": GPUArch.UNKNOWN.value, "compute_capability": (0, 0)}
    caps = detect_gpu(device_id)
    return {"tma_available": caps.has_tma, "fp8_available": caps.has_fp8, "wgmma_available": caps.has_warpgroup_mma,
            "arch": caps.arch.value, "compute_capability": caps.compute_capability}


def supports_fp8(device_id: int = 0) -> bool:
    return check_hopper_features(device_id)["fp8_available"]
