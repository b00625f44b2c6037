"""Which device and stream the kernels run on (issue 23): the inputs' device, not the current one, on
every path (the ops, the eager shortcut, the backward, the matmul autotuner), ordered after the work
that wrote the inputs on that device's current stream; and Triton's interpreter, which keeps global
state, run by one thread at a time."""

import threading

import pytest
import torch

import diyflash
from helpers import make_qkv

TWO_GPUS = torch.cuda.is_available() and torch.cuda.device_count() >= 2


def _attention_fwd_bwd(q, k, v):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = diyflash.flash_attention(q, k, v, causal=True)
    out_op = torch.ops.diyflash.attention(q, k, v, causal=True)
    with torch.no_grad():
        out_eager = diyflash.flash_attention(q, k, v, causal=True)  # the eager shortcut
    grads = torch.autograd.grad((out.float() * out.float()).sum(), (q, k, v))
    return out, out_op, out_eager, *grads


def _matmul(a, b):
    a, b = a.detach().requires_grad_(), b.detach().requires_grad_()
    c = diyflash.triton_matmul(a, b)  # autotunes on first use (on the inputs' device)
    pinned = torch.ops.diyflash.matmul(a, b, [32, 32, 32])
    grads = torch.autograd.grad((c.float() * c.float()).sum(), (a, b))
    return c, pinned, *grads


@pytest.mark.skipif(not TWO_GPUS, reason="needs two GPUs (device kind nvidia-h200-x2)")
@pytest.mark.parametrize("current, tensors", [(0, 1), (1, 0)])
def test_kernels_run_on_the_inputs_device(current, tensors):
    """Both assignments of current device and tensor device, forward and backward: bitwise the result of
    the same call with the inputs' device current. The inputs are written on that device's current
    stream right before the call (a slow fill on a side stream made current), so a launch on another
    device or stream would race with it."""
    dev = torch.device("cuda", tensors)
    q0, k0, v0 = make_qkv(2, 4, 1000, 1100, 64, torch.float16, "cpu")
    a0, b0 = torch.randn(300, 520), torch.randn(520, 260)
    with torch.cuda.device(dev):  # the reference: inputs' device current
        expected = _attention_fwd_bwd(*(t.to(dev) for t in (q0, k0, v0)))
        expected_mm = _matmul(a0.to(dev, torch.float16), b0.to(dev, torch.float16))
        torch.cuda.synchronize(dev)
    side = torch.cuda.Stream(device=dev)
    before = torch.cuda.current_stream(dev)
    torch.cuda.set_stream(side)  # the inputs' device's current stream: a side stream (this also makes dev current)
    torch.cuda.set_device(current)  # ... and another device the current one
    try:
        assert torch.cuda.current_device() == current and torch.cuda.current_stream(dev) == side
        with torch.cuda.device(dev):
            torch.cuda._sleep(50_000_000)  # ~25 ms of GPU time on the side stream before the inputs are written
        q, k, v = (t.to(dev) for t in (q0, k0, v0))
        a, b = a0.to(dev, torch.float16), b0.to(dev, torch.float16)
        got = _attention_fwd_bwd(q, k, v)
        got_mm = _matmul(a, b)
        assert torch.cuda.current_device() == current
        torch.cuda.synchronize(dev)
    finally:
        torch.cuda.set_stream(before)
        torch.cuda.set_device(0)
    for g, e in zip((*got, *got_mm), (*expected, *expected_mm)):
        assert g.device == dev
        torch.testing.assert_close(g, e, rtol=0, atol=0)


def test_interpreted_launches_from_threads(device):
    """Three threads, six calls each: under the interpreter 14-17 of 18 calls raised
    InterpreterError('x >= grid_dim[0]') and one gave other bits; every call now equals the serial one."""
    q, k, v = make_qkv(1, 2, 40, 40, 16, torch.float16, device)
    a, b = torch.randn(40, 33, device=device), torch.randn(33, 24, device=device)
    expected = (torch.ops.diyflash.attention(q, k, v, causal=True), torch.ops.diyflash.matmul(a, b))
    results, errors = [], []

    def work():
        try:
            for _ in range(6):
                results.append((torch.ops.diyflash.attention(q, k, v, causal=True), torch.ops.diyflash.matmul(a, b)))
        except Exception as e:  # noqa: BLE001  (reported below)
            errors.append(repr(e))

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(results) == 18
    for out, c in results:
        torch.testing.assert_close(out, expected[0], rtol=0, atol=0)
        torch.testing.assert_close(c, expected[1], rtol=0, atol=0)
