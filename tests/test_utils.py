"""diyflash.utils and the selector: GPU detection, benchmark tools, validators, kernel selection.
CPU-only machines check the truthful "no GPU" answers; the GPU suite checks the real values."""

import pytest
import torch
from expecttest import TestCase

import diyflash
from diyflash.utils import (
    BenchmarkResult, BenchmarkRunner, GPUArch, benchmark_fn, check_hopper_features, detect_gpu, print_gpu_info,
    supports_fp8, validate_attention, validate_matmul,
)
from diyflash.utils.benchmark import format_comparison_table
from diyflash.utils.gpu import arch_of, capabilities_of
from helpers import ON_GPU


@pytest.mark.parametrize("cc, arch", [((7, 0), GPUArch.VOLTA), ((7, 5), GPUArch.TURING), ((8, 0), GPUArch.AMPERE),
                                      ((8, 6), GPUArch.AMPERE), ((8, 9), GPUArch.ADA), ((9, 0), GPUArch.HOPPER),
                                      ((10, 0), GPUArch.BLACKWELL), ((12, 0), GPUArch.BLACKWELL), ((6, 1), GPUArch.UNKNOWN)])
def test_arch_mapping(cc, arch):
    assert arch_of(cc) is arch


def test_feature_flags_by_architecture():
    assert capabilities_of((8, 0)) == {"has_tma": False, "has_fp8": False, "has_warpgroup_mma": False}
    assert capabilities_of((8, 9)) == {"has_tma": False, "has_fp8": True, "has_warpgroup_mma": False}
    assert capabilities_of((9, 0)) == {"has_tma": True, "has_fp8": True, "has_warpgroup_mma": True}
    assert capabilities_of((10, 0)) == {"has_tma": True, "has_fp8": True, "has_warpgroup_mma": False}


@pytest.mark.skipif(ON_GPU, reason="the CPU-only answers: checked where there is no GPU")
def test_cpu_only_answers(capsys):
    with pytest.raises(RuntimeError, match="detect_gpu needs a CUDA GPU"):
        detect_gpu()
    assert check_hopper_features() == {"tma_available": False, "fp8_available": False, "wgmma_available": False,
                                       "arch": "unknown", "compute_capability": (0, 0)}
    assert supports_fp8() is False
    print_gpu_info()
    assert "No CUDA GPU" in capsys.readouterr().out
    selector = diyflash.AdaptiveKernelSelector()
    assert selector.get_matmul_config()["device"] == "cpu"
    assert selector.get_attention_config()["backend"] == "triton-interpreter"  # the suite runs under it


@pytest.mark.skipif(not ON_GPU, reason="real device values: GPU suite only")
def test_detect_gpu_reads_the_device(capsys):
    caps = detect_gpu()
    props = torch.cuda.get_device_properties(0)
    assert caps.name == props.name and caps.num_sms == props.multi_processor_count
    assert caps.compute_capability == (props.major, props.minor)
    assert caps.sram_per_sm == props.shared_memory_per_multiprocessor
    assert abs(caps.total_memory_gb - props.total_memory / 2**30) < 1e-6
    feats = check_hopper_features()
    assert feats["tma_available"] == caps.has_tma and feats["arch"] == caps.arch.value
    print_gpu_info()
    assert caps.name in capsys.readouterr().out
    with pytest.raises(RuntimeError, match="does not exist"):
        detect_gpu(torch.cuda.device_count())


def test_selector_reports_what_the_kernels_use(device):
    from diyflash.kernels.attention_configs import bwd_config, fwd_config

    selector = diyflash.AdaptiveKernelSelector()
    interpret = device.type == "cpu"
    for causal in (False, True):
        cfg = selector.get_attention_config(head_dim=80, dtype=torch.float16, causal=causal)
        assert cfg["head_dim_pad"] == 128 and cfg["causal"] == causal
        where = device if ON_GPU else torch.device("cpu")
        assert cfg["forward"] == fwd_config(128, torch.float16, where, causal, interpret).as_dict()
        assert cfg["backward"] == bwd_config(128, torch.float16, where, causal, interpret).as_dict()
        assert set(cfg["backward"]) == {"dkdv", "dq"}
        kernels = [fwd_config(128, torch.float16, where, causal, interpret),
                   *bwd_config(128, torch.float16, where, causal, interpret).kernels()]
        assert cfg["tma"] == (selector.features["tma_available"] and any(c.tma for c in kernels))
    mm = selector.get_matmul_config(m=96, n=80, k=64)
    if ON_GPU:
        from diyflash.kernels import matmul as km

        tuned = [v for key, v in km.tuning_cache().items() if key[-3:] == (128, 128, 64) and key[1] == "torch.float16"]
        assert tuned and {k: mm[k] for k in ("block_m", "block_n", "block_k")} == \
            {k: tuned[0][k] for k in ("block_m", "block_n", "block_k")}
    else:
        from diyflash.kernels.matmul_configs import INTERPRETER_CONFIG

        assert mm["block_m"] == INTERPRETER_CONFIG.block_m and mm["backend"] == "triton-interpreter"
    assert selector.select_matmul_kernel() is diyflash.triton_matmul
    assert selector.select_attention_kernel() is diyflash.flash_attention
    assert diyflash.get_optimal_matmul() is diyflash.triton_matmul
    with pytest.raises(ValueError, match="Unsupported head_dim 12"):
        selector.get_attention_config(head_dim=12)


def test_benchmark_fn_counts_and_quantiles():
    calls = []
    x = torch.ones(4)
    med, p20, p80 = benchmark_fn(lambda t: calls.append(1) or t * 2, x, warmup=3, rep=20)
    assert len(calls) == 23  # warmup and rep are numbers of calls
    assert 0 <= p20 <= med <= p80
    q = benchmark_fn(lambda: None, warmup=0, rep=5, quantiles=[0.0, 1.0])
    assert len(q) == 2 and q[0] <= q[1]
    with pytest.raises(ValueError, match="rep must be at least 1"):
        benchmark_fn(lambda: None, rep=0)


class TestComparisonTable(TestCase):
    def test_format(self):
        results = [
            BenchmarkResult("PyTorch", (256, 256, 256), 0.5, 0.07),
            BenchmarkResult("Triton", (256, 256, 256), 0.25, 0.13, memory_mb=0.12,
                            block_config={"block_m": 64, "block_n": 64, "block_k": 32}),
        ]
        self.assertExpectedInline(format_comparison_table(results, "matmul"), """\
matmul
name     size         time (ms)  TFLOPS  peak MB  speedup  config
-------  -----------  ---------  ------  -------  -------  --------------------------------
PyTorch  256x256x256      0.500     0.1      0.0    1.00x
Triton   256x256x256      0.250     0.1      0.1    2.00x  block_m=64 block_n=64 block_k=32
median speedup vs PyTorch: 2.00x""")


def test_runner_end_to_end(device, capsys):
    runner = BenchmarkRunner(device=str(device), warmup=1, rep=2)
    mm = runner.benchmark_matmul(diyflash.triton_matmul, sizes=[(32, 48, 16)],
                                 block_configs=[{"block_m": 16, "block_n": 16, "block_k": 16}])
    att = runner.benchmark_attention(diyflash.flash_attention, seq_lengths=[24], batch_size=1, num_heads=2, head_dim=16)
    assert [r.name for r in mm] == ["PyTorch", "Triton"] and mm[1].block_config["block_m"] == 16
    assert [r.size for r in att] == [(1, 2, 24, 16)] * 2
    assert all(r.time_ms > 0 and r.tflops > 0 for r in mm + att)
    if ON_GPU:
        assert mm[1].memory_mb > 0  # at least the output was allocated
    runner.print_comparison_table(title="both")
    out = capsys.readouterr().out
    assert out.startswith("both\n") and out.count("x\n") + out.count("x  ") >= 4
    runner.clear_results()
    assert runner.results == []


def test_validators_pass_real_kernels_and_fail_wrong_ones(device):
    dev = str(device)
    ok, diff = validate_matmul(diyflash.triton_matmul, 48, 40, 56, device=dev)
    assert ok and diff < 1e-3
    ok, diff = validate_matmul(lambda a, b: diyflash.triton_matmul(a, b) * 1.01, 48, 40, 56, device=dev)
    assert not ok and diff > 1e-3
    ok, _ = validate_matmul(lambda a, b: diyflash.triton_matmul(a, b)[:, :-1], 48, 40, 56, device=dev)
    assert not ok  # wrong shape
    ok, diff = validate_attention(diyflash.flash_attention, 1, 2, 40, 32, causal=True, device=dev)
    assert ok and diff < 1e-3
    wrong = lambda q, k, v, causal: diyflash.flash_attention(q, k, v, causal=not causal)  # noqa: E731
    ok, diff = validate_attention(wrong, 1, 2, 40, 32, causal=True, device=dev)
    assert not ok and diff > 1e-2
    ok, _ = validate_attention(diyflash.flash_attention, 1, 2, 40, 32, dtype=torch.bfloat16, rtol=1e-2, atol=1e-2,
                               device=dev, verbose=True)
    assert ok


def test_clear_errors_for_bad_arguments(monkeypatch):
    """Issue 23: these gave unrelated errors (a modulo on a str, an index past the list, ZeroDivisionError)."""
    import diyflash.utils.benchmark as bm
    from diyflash.utils import BenchmarkRunner, benchmark_fn

    with pytest.raises(TypeError, match="head_dim must be an int, got str '64'"):
        diyflash.get_attention_config(head_dim="64")
    with pytest.raises(ValueError, match=r"quantiles must be numbers in \[0, 1\], got \[1.5\]"):
        benchmark_fn(lambda: None, quantiles=[1.5])
    monkeypatch.setattr(bm, "benchmark_fn", lambda fn, **kw: (0.0, 0.0, 0.0))  # a clock that reads 0 ms
    with pytest.raises(ValueError, match="too short for the clock to resolve"):
        BenchmarkRunner(device="cpu", warmup=0, rep=1)._measure("x", (1,), 1.0, lambda: None)


@pytest.mark.skipif(ON_GPU, reason="the CPU-only answer: on a GPU machine the selector returns the API functions themselves")
def test_optimal_attention_has_the_api_signature(torch_path):
    """Issue 23: on a CPU-only machine get_optimal_attention() returned the op, which takes `scale`, not the
    API's `sm_scale` (and get_optimal_matmul() the op, with other arguments than triton_matmul's)."""
    q = torch.randn(1, 2, 9, 16)
    attention = diyflash.get_optimal_attention()
    torch.testing.assert_close(attention(q, q, q, causal=True, sm_scale=0.5),
                               torch.ops.diyflash.attention(q, q, q, causal=True, scale=0.5), rtol=0, atol=0)
    matmul = diyflash.get_optimal_matmul()
    torch.testing.assert_close(matmul(q[0, 0], q[0, 0].mT, use_autotune=False), q[0, 0] @ q[0, 0].mT)
