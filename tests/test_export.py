"""torch.export with a symbolic sequence length: diyflash.attention stays in the graph, and a saved
program reloads in a fresh process that imports diyflash (and fails clearly in one that does not)."""

import subprocess
import sys
import textwrap

import torch
from torch.export import Dim

from helpers import child_env
from test_compile import AttentionBlock

LOADER = textwrap.dedent(
    """
    import sys, torch
    {imports}
    ep = torch.export.load(sys.argv[1])
    x = torch.load(sys.argv[2])
    torch.save(ep.module()(x), sys.argv[3])
    """
)


def _export(device):
    torch.manual_seed(0)
    model = AttentionBlock().to(device).eval()
    x = torch.randn(2, 24, 32, device=device)
    ep = torch.export.export(model, (x,), dynamic_shapes={"x": {1: Dim("seq", min=2, max=4096)}})
    return model, ep


def test_export_keeps_op_and_lowers_to_fwd(device):
    model, ep = _export(device)
    graph = str(ep.graph)
    assert "torch.ops.diyflash.attention.default" in graph
    assert "diyflash.attention_fwd" not in graph
    lowered = str(ep.run_decompositions().graph)
    assert "torch.ops.diyflash.attention_fwd.default" in lowered
    x = torch.randn(2, 41, 32, device=device)  # another length than the one traced
    with torch.no_grad():
        torch.testing.assert_close(ep.module()(x), model(x), rtol=1e-5, atol=1e-5)


def _run_loader(tmp_path, imports: str, pt2, x_path, out_path):
    script = tmp_path / "load.py"
    script.write_text(LOADER.format(imports=imports))
    return subprocess.run(
        [sys.executable, str(script), str(pt2), str(x_path), str(out_path)],
        capture_output=True, text=True, env=child_env(), timeout=600,
    )


def test_save_load_in_fresh_process(device, tmp_path):
    model, ep = _export(device)
    pt2 = tmp_path / "attention_block.pt2"
    torch.export.save(ep, str(pt2))
    x = torch.randn(2, 57, 32, device=device)
    x_path, out_path = tmp_path / "x.pt", tmp_path / "out.pt"
    torch.save(x, x_path)

    done = _run_loader(tmp_path, "import diyflash", pt2, x_path, out_path)
    assert done.returncode == 0, done.stderr
    with torch.no_grad():
        torch.testing.assert_close(torch.load(out_path), model(x), rtol=1e-5, atol=1e-5)

    # without `import diyflash` the op is unknown: PyTorch's error names it
    failed = _run_loader(tmp_path, "", pt2, x_path, tmp_path / "never.pt")
    assert failed.returncode != 0
    assert "diyflash" in failed.stderr and "attention" in failed.stderr, failed.stderr[-2000:]


def test_export_keeps_deterministic(device):
    """An exported program keeps the op's deterministic argument."""

    class Block(torch.nn.Module):
        def forward(self, q, k, v):
            return torch.ops.diyflash.attention(q, k, v, causal=True, deterministic=True)

    q, k, v = (torch.randn(1, 2, 24, 16, device=device) for _ in range(3))
    ep = torch.export.export(Block(), (q, k, v))
    (node,) = [n for n in ep.graph.nodes if n.target is torch.ops.diyflash.attention.default]
    names = (a.name for a in torch.ops.diyflash.attention.default._schema.arguments)
    assert (dict(zip(names, node.args)) | dict(node.kwargs)).get("deterministic") is True
    torch.testing.assert_close(ep.module()(q, k, v), torch.ops.diyflash.attention(q, k, v, causal=True))
