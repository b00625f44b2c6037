"""The API's eager shortcut (diyflash/ops/eager.py): taken only where nothing can tell it from the op,
and then bit-identical to the op; every tracer, mode, subclass and autograd case goes through the op."""

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import diyflash
from diyflash.ops.eager import DIRECT, DIRECT_WITH_AUTOGRAD, DISPATCH, dispatcher_free, eager_route
from helpers import make_qkv


class _Noop(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class _NoopDispatch(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class _Sub(torch.Tensor):
    pass


def test_dispatcher_free_only_when_unobservable(device):
    x = torch.randn(4, 4, device=device)
    w = torch.randn(4, 4, device=device, requires_grad=True)
    assert dispatcher_free(x, x, None)
    assert dispatcher_free(torch.nn.Parameter(x, requires_grad=False))
    assert not dispatcher_free(x, w)  # autograd must record the op's formula
    assert dispatcher_free(x, w, autograd=True)  # (a caller that runs that formula itself)
    assert eager_route(x, None) == DIRECT and eager_route(x, w) == DIRECT_WITH_AUTOGRAD
    assert eager_route(w, x.as_subclass(_Sub)) == DISPATCH  # a subclass after a tensor needing grad
    assert not dispatcher_free(w, x.as_subclass(_Sub), autograd=True)
    with torch.no_grad():
        assert dispatcher_free(x, w) and eager_route(x, w) == DIRECT
    with torch.inference_mode():
        assert dispatcher_free(x, w)
    assert not dispatcher_free(x.as_subclass(_Sub))
    with _Noop():
        assert not dispatcher_free(x) and eager_route(x) == DISPATCH
    with _NoopDispatch():
        assert not dispatcher_free(x)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        assert not dispatcher_free(x)
    seen = []
    torch.vmap(lambda t: seen.append(dispatcher_free(t)) or t)(x)
    assert seen == [False]
    compiled = torch.compile(lambda t: t + 1 if dispatcher_free(t) else t - 1, fullgraph=True, backend="eager")
    assert torch.equal(compiled(x), x - 1)  # traced code always records the op


@pytest.fixture
def op_calls(monkeypatch):
    """Counts calls that went through torch.ops.diyflash.* (the dispatcher)."""
    calls = []
    for name in ("matmul", "attention", "attention_fwd", "attention_bwd", "attention_varlen", "attention_varlen_fwd",
                 "attention_varlen_bwd"):
        op = getattr(torch.ops.diyflash, name)

        def spy(*args, _op=op, _name=name, **kwargs):
            calls.append(_name)
            return _op(*args, **kwargs)

        monkeypatch.setattr(torch.ops.diyflash, name, spy)
    return calls


def test_matmul_shortcut_is_bit_identical(device, op_calls):
    a = torch.randn(33, 40, device=device, dtype=torch.float16)
    b = torch.randn(24, 40, device=device, dtype=torch.float16).mT
    fast = diyflash.triton_matmul(a, b)
    assert op_calls == []
    via_op = torch.ops.diyflash.matmul(a, b)
    assert op_calls == ["matmul"]
    assert torch.equal(fast, via_op) and fast.stride() == via_op.stride()


def test_attention_shortcut_is_bit_identical(device, op_calls):
    q, k, v = make_qkv(2, 2, 17, 24, 32, layout="bnhd", device=device)
    lens = torch.tensor([24, 9], dtype=torch.int32, device=device)
    fast = diyflash.flash_attention(q, k, v, causal=True, seq_lens=lens)
    assert op_calls == []
    via_op = torch.ops.diyflash.attention(q, k, v, causal=True, seq_lens=lens)
    assert torch.equal(fast, via_op) and fast.stride() == via_op.stride()


@pytest.mark.parametrize("with_lens", [False, True])
def test_eager_autograd_skips_the_ops_and_is_bit_identical(device, op_calls, with_lens):
    """With autograd the API runs attention_fwd's autograd formula in a plain autograd.Function (no
    dispatcher, no generated wrapper): forward and backward call the implementations, bit-identical to
    the op path, which a profiler (or any mode) forces. Only the inputs that require grad get one
    (v here does not). A double backward still meets the op's refusal."""
    from diyflash.ops.attention import _EagerAttention

    q, k, v = make_qkv(2, 2, 17, 24, 32, layout="bnhd", device=device, requires_grad=True)
    v = v.detach()
    lens = torch.tensor([24, 9], dtype=torch.int32, device=device) if with_lens else None
    g = torch.randn(2, 17, 2, 32, device=device).transpose(1, 2)
    out = diyflash.flash_attention(q, k, v, causal=True, seq_lens=lens)
    assert type(out.grad_fn).__name__ == _EagerAttention.__name__ + "Backward"
    fast = torch.autograd.grad(out, (q, k), g)
    assert op_calls == []
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        out_op = diyflash.flash_attention(q, k, v, causal=True, seq_lens=lens)
        via_op = torch.autograd.grad(out_op, (q, k), g)
    assert op_calls == ["attention", "attention_fwd", "attention_bwd"]
    assert torch.equal(out, out_op) and out.stride() == out_op.stride()
    for a, b in zip(fast, via_op):
        assert torch.equal(a, b) and a.stride() == b.stride()
    dq = torch.autograd.grad(diyflash.flash_attention(q, k, v).sum(), q, create_graph=True)[0]
    assert op_calls[-1] == "attention_bwd"  # building a double backward: the op, which has no formula
    with pytest.raises(RuntimeError, match="no autograd formula"):
        dq.sum().backward()


def test_eager_varlen_autograd_skips_the_ops_and_is_bit_identical(device, op_calls):
    """flash_attention_varlen with autograd runs attention_varlen_fwd's autograd formula in a plain
    autograd.Function, as the dense call does: no dispatcher, bit-identical to the op path (which a profiler
    forces), sinks' gradient too; v, which does not require grad, gets none. A double backward meets the op's
    refusal."""
    from diyflash.ops.attention_varlen import _EagerAttentionVarlen

    gen = torch.Generator(device=device).manual_seed(0)
    lens = (24, 9)
    cu = torch.tensor([0, 24, 33], dtype=torch.int32, device=device)
    q = torch.randn(33, 4, 32, device=device, generator=gen).requires_grad_()
    k = torch.randn(33, 2, 32, device=device, generator=gen).requires_grad_()
    v = torch.randn(33, 2, 32, device=device, generator=gen)
    sinks = torch.randn(4, device=device, generator=gen).requires_grad_()
    g = torch.randn(4, 33, 32, device=device, generator=gen).transpose(0, 1)  # strided

    def call():
        return diyflash.flash_attention_varlen(q, k, v, cu, cu, max(lens), max(lens), causal=True, sinks=sinks)
    out = call()
    assert type(out.grad_fn).__name__ == _EagerAttentionVarlen.__name__ + "Backward"
    fast = torch.autograd.grad(out, (q, k, sinks), g)
    assert op_calls == []
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        out_op = call()
        via_op = torch.autograd.grad(out_op, (q, k, sinks), g)
    assert op_calls == ["attention_varlen", "attention_varlen_fwd", "attention_varlen_bwd"]
    assert torch.equal(out, out_op) and out.stride() == out_op.stride()
    for a, b in zip(fast, via_op):
        assert torch.equal(a, b) and a.stride() == b.stride()
    dq = torch.autograd.grad(call().sum(), q, create_graph=True)[0]
    assert op_calls[-1] == "attention_varlen_bwd"  # building a double backward: the op, which has no formula
    with pytest.raises(RuntimeError, match="no autograd formula"):
        dq.sum().backward()


def test_profiler_goes_through_the_op(device, op_calls):
    a = torch.randn(8, 8, device=device)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        diyflash.triton_matmul(a, a)
    assert op_calls == ["matmul"]
    assert "diyflash::matmul" in {e.name for e in prof.events()}
