"""torch.compile(fullgraph=True): zero graph breaks, compiled == eager (forward and backward), one
graph for several lengths with dynamic=True, and a training step made only of diyflash ops."""

import pytest
import torch
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.testing import CompileCounterWithBackend
from torch._functorch.aot_autograd import make_boxed_func

import diyflash
from helpers import random_like


class AttentionBlock(torch.nn.Module):
    """A transformer attention block: q, k, v are (B, H, N, D) views of the (B, N, 3, H, D) projection."""

    def __init__(self, dim: int = 32, heads: int = 2, use_api: bool = False):
        super().__init__()
        self.heads = heads
        self.use_api = use_api
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)

    def forward(self, x, seq_lens=None):
        b, n, c = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        if self.use_api:
            o = diyflash.flash_attention(q, k, v, causal=True, seq_lens=seq_lens)
        else:
            o = torch.ops.diyflash.attention(q, k, v, causal=True, seq_lens=seq_lens)
        return self.proj(o.transpose(1, 2).reshape(b, n, c))


def _make(device, n=24, use_api=False):
    torch.manual_seed(0)
    model = AttentionBlock(use_api=use_api).to(device)
    x = torch.randn(2, n, 32, device=device, requires_grad=True)
    return model, x


def _grads(model, x, out, g):
    params = [x, *model.parameters()]
    return torch.autograd.grad(out, params, g)


@pytest.mark.parametrize("use_api", [False, True], ids=["op", "flash_attention"])
def test_no_graph_breaks(device, use_api):
    model, x = _make(device, use_api=use_api)
    seq_lens = torch.tensor([24, 9], dtype=torch.int32, device=device)
    explanation = torch._dynamo.explain(model)(x, seq_lens)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


def test_compiled_matches_eager(device):
    model, x = _make(device)
    compiled = torch.compile(model, fullgraph=True)
    out_c = compiled(x)
    out_e = model(x)
    torch.testing.assert_close(out_c, out_e, rtol=1e-5, atol=1e-5)
    g = random_like(out_e)
    for a, b in zip(_grads(model, x, out_c, g), _grads(model, x, out_e, g)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_dynamic_lengths_compile_once(device):
    model, _ = _make(device)
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(model, fullgraph=True, dynamic=True, backend=counter)
    for n in (17, 33, 50):
        x = torch.randn(2, n, 32, device=device, requires_grad=True)
        out = compiled(x)
        torch.testing.assert_close(out, model(x), rtol=1e-5, atol=1e-5)
        out.sum().backward()
    assert counter.frame_count == 1, f"recompiled: {counter.frame_count} frames for 3 lengths"


def test_training_step_graph_holds_only_diyflash_attention(device):
    """The AOT forward graph calls diyflash.attention_fwd and the backward graph diyflash.attention_bwd,
    with the forward's lse passed between them (no recomputed softmax statistics)."""
    graphs = {}

    def capture(name):
        def compiler(gm, example_inputs):
            graphs[name] = str(gm.graph)
            return make_boxed_func(gm.forward)

        return compiler

    backend = aot_autograd(fw_compiler=capture("fw"), bw_compiler=capture("bw"))
    model, x = _make(device)
    torch.compile(model, fullgraph=True, backend=backend)(x).sum().backward()
    assert "diyflash.attention_fwd.default" in graphs["fw"]
    assert "diyflash.attention_bwd.default" in graphs["bw"]
    assert "diyflash.attention_fwd" not in graphs["bw"], "the backward must not rerun the forward"
    for forbidden in ("aten._softmax", "aten.exp.", "aten.logsumexp"):
        assert forbidden not in graphs["fw"] + graphs["bw"]


@pytest.mark.parametrize("deterministic", [None, True, False])
def test_deterministic_reaches_the_compiled_backward(device, deterministic):
    """flash_attention's deterministic argument is an argument of the ops in the compiled graphs (None stays
    None: the backward reads torch.use_deterministic_algorithms when it runs), with zero graph breaks, and
    the compiled gradients match eager's."""
    graphs = {}

    def capture(name):
        def compiler(gm, example_inputs):
            graphs[name] = gm
            return make_boxed_func(gm.forward)

        return compiler

    q, k, v = (torch.randn(1, 2, 40, 16, device=device, requires_grad=True) for _ in range(3))

    def f(q, k, v):
        return diyflash.flash_attention(q, k, v, causal=True, deterministic=deterministic)

    backend = aot_autograd(fw_compiler=capture("fw"), bw_compiler=capture("bw"))
    counter = CompileCounterWithBackend(backend)
    out = torch.compile(f, fullgraph=True, backend=counter)(q, k, v)
    g = random_like(out)
    got = torch.autograd.grad(out, (q, k, v), g)
    assert counter.frame_count == 1
    (node,) = [n for n in graphs["bw"].graph.nodes if n.target is torch.ops.diyflash.attention_bwd.default]
    schema_args = torch.ops.diyflash.attention_bwd.default._schema.arguments
    given = dict(zip((a.name for a in schema_args), node.args)) | dict(node.kwargs)
    assert given.get("deterministic") is deterministic
    want = torch.autograd.grad(f(q, k, v), (q, k, v), g)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
