"""The seed's utilities: GPU detection, benchmark tools, validators (and the shared error rule)."""

from .benchmark import BenchmarkResult, BenchmarkRunner, benchmark_fn
from .gpu import GPUArch, GPUCapabilities, check_hopper_features, detect_gpu, print_gpu_info, supports_fp8
from .validation import ErrorReport, attention_error_reports, error_report, validate_attention, validate_matmul

__all__ = [
    "BenchmarkResult", "BenchmarkRunner", "benchmark_fn",
    "GPUArch", "GPUCapabilities", "check_hopper_features", "detect_gpu", "print_gpu_info", "supports_fp8",
    "ErrorReport", "attention_error_reports", "error_report", "validate_attention", "validate_matmul",
]
