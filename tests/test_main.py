"""`python -m diyflash`, the README's first command, runs and really validates."""

import os
import subprocess
import sys

import pytest
import torch

from helpers import ON_GPU


def test_main_job_runs_and_validates():
    env = dict(os.environ)
    if not ON_GPU:
        env.pop("TRITON_INTERPRET", None)  # it must switch the interpreter on by itself
    args = [sys.executable, "-m", "diyflash", "--seq-len", "33"] + (["--skip-bench"] if ON_GPU else [])
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    if not ON_GPU:
        assert "no GPU: running the Triton kernels through the interpreter on small shapes" in done.stdout
    assert "validation: PASSED" in done.stdout
    assert done.stdout.count(" ok\n") >= 4


def test_main_help():
    done = subprocess.run([sys.executable, "-m", "diyflash", "--help"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "--skip-bench" in done.stdout


def test_validation_fails_a_wrong_kernel(device):
    """The rule behind the main job's verdict catches a kernel that is slightly wrong (5% off in scale)."""
    from diyflash.utils.validation import attention_error_reports
    from helpers import make_qkv

    def wrong(q, k, v, causal, scale, seq_lens):
        return torch.ops.diyflash.attention(q, k, v, causal=causal, scale=0.95 / q.shape[-1] ** 0.5)

    q, k, v = make_qkv(1, 2, 40, 40, 32, torch.float16, device)
    _, _, reports = attention_error_reports(wrong, q, k, v, causal=True)
    assert not any(r.ok for r in reports), [str(r) for r in reports]


def test_main_exits_1_when_a_kernel_is_wrong(monkeypatch, capsys):
    import diyflash
    from diyflash.__main__ import main

    real = diyflash.triton_matmul
    monkeypatch.setattr(diyflash, "triton_matmul", lambda a, b, **kw: real(a, b, **kw) * 1.01)
    assert main(["--parts", "matmul", "--dtypes", "fp32", "--matmul-size", "20", "--skip-bench"]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "validation: FAILED" in out and "attention" not in out
    monkeypatch.setattr(diyflash, "triton_matmul", real)
    assert main(["--parts", "matmul", "--dtypes", "fp32", "--matmul-size", "20", "--skip-bench"]) == 0


@pytest.mark.skipif(not ON_GPU, reason="the backend line is printed for a GPU")
def test_main_says_which_attention_backend_runs(capsys):
    from diyflash.__main__ import main
    from diyflash.ops.runtime import attention_backend

    assert main(["--parts", "attention", "--dtypes", "fp16", "--head-dims", "32", "--seq-len", "64", "--causal", "true",
                 "--skip-bench"]) == 0
    out = capsys.readouterr().out
    assert f"attention forward: {attention_backend(torch.device('cuda'))}" in out
    assert f"attention backward: {attention_backend(torch.device('cuda'), backward=True)}" in out


def test_cli_rejects_bad_values():
    """Issue 23: --head-dims 12 printed PASSED for a head_dim the API rejects, --seq-len 0 and --head-dims 0
    fell back silently, --matmul-size 0/1 crashed. Each is now an argparse error naming the value."""
    from diyflash.__main__ import _parse

    for argv, phrase in ((["--head-dims", "12"], "Unsupported head_dim 12"), (["--head-dims", "0"], "at least 8"),
                         (["--seq-len", "0"], "at least 1"), (["--matmul-size", "1"], "at least 4"),
                         (["--matmul-size", "x"], "expected an integer")):
        done = subprocess.run([sys.executable, "-m", "diyflash", *argv], capture_output=True, text=True, timeout=300)
        assert done.returncode == 2 and phrase in done.stderr, (argv, done.stderr)
    assert _parse(["--head-dims", "80", "--seq-len", "1", "--matmul-size", "4"]).head_dims == [80]
