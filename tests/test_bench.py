"""bench/: JSONL rows with provenance, PNG plots and README tables, from fake rows (no GPU needed)."""

import subprocess
import sys

import pytest
import torch

pytest.importorskip("matplotlib", reason="plots need matplotlib (pip install -e '.[test]')")

from bench.attention import readme_table as attention_table  # noqa: E402
from bench.common import provenance  # noqa: E402
from bench.matmul import readme_table as matmul_table  # noqa: E402
from bench.plots import plot_attention, plot_matmul, read_jsonl, write_jsonl  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def fake_attention_rows():
    prov = provenance()
    rows = []
    for provider, scale in (("diyflash", 1.2), ("sdpa-flash", 1.0), ("sdpa-cudnn", 1.5), ("flex", 1.1)):
        for causal in (False, True):
            for mode in ("fwd", "bwd"):
                for n in (1024, 2048, 4096):
                    rows.append(dict(prov, provider=provider, b=4, h=16, d=64, n=n, dtype="fp16", causal=causal,
                                     mode=mode, ms=1.0, p20_ms=0.9, p80_ms=1.1, tflops=100 * scale * n / 1024))
    return rows


def fake_matmul_rows():
    prov = provenance()
    rows = []
    for m in (1024, 4096):
        for provider, tf in (("diyflash", 600.0), ("cublas", 640.0)):
            rows.append(dict(prov, provider=provider, kind="square", m=m, k=m, n=m, dtype="fp16", ms=1.0,
                             p20_ms=0.9, p80_ms=1.1, tflops=tf * m / 4096,
                             config={"block_m": 128, "block_n": 256, "block_k": 64, "num_warps": 8,
                                     "num_stages": 3, "use_tma": True, "persistent": False}))
    return rows


def test_provenance_fields():
    p = provenance()
    for key in ("gpu", "torch", "triton", "diyflash", "timestamp"):
        assert key in p
    assert p["torch"] == torch.__version__


def test_jsonl_roundtrip_and_plots(tmp_path):
    rows = fake_attention_rows()
    path = tmp_path / "att.jsonl"
    write_jsonl(path, rows[:5])
    write_jsonl(path, rows[5:])  # appends
    assert read_jsonl(path) == rows
    for plot, data, name in ((plot_attention, rows, "a.png"), (plot_matmul, fake_matmul_rows(), "m.png")):
        out = tmp_path / name
        plot(data, out)
        blob = out.read_bytes()
        assert blob.startswith(PNG_MAGIC) and len(blob) > 5_000


def test_every_provider_has_a_color_of_its_own():
    """The attention plot colors each provider bench.attention can run (a provider left to matplotlib's
    cycle took diyflash's blue: the tutorial's line looked like ours in the first plots with it)."""
    from bench.plots import COLORS

    providers = {"diyflash", "sdpa-flash", "sdpa-cudnn", "flex", "tutorial"}
    assert providers <= set(COLORS) and len({COLORS[p] for p in providers}) == len(providers)


def test_readme_tables():
    table = attention_table(fake_attention_rows())
    assert table.splitlines()[2] == "| 4 16 64 | fp16 | no | 1024 | 120 | 100 / 150 | 1.20x / 0.80x | 120 | 100 / 150 | 1.20x / 0.80x |"
    mm = matmul_table(fake_matmul_rows())
    assert "| fp16 | 4096 x 4096 x 4096 | 600 | 640 | 0.94x | 128x256x64 w8 s3 tma |" in mm
    assert "fp16: median ratio 0.94x, min 0.94x over 2 shapes" in mm


@pytest.mark.parametrize("module, rows", [("bench.attention", fake_attention_rows), ("bench.matmul", fake_matmul_rows)])
def test_cli_replots_saved_rows_without_gpu(tmp_path, module, rows):
    src, png = tmp_path / "rows.jsonl", tmp_path / "plot.png"
    write_jsonl(src, rows())
    done = subprocess.run([sys.executable, "-m", module, "--from-jsonl", str(src), "--plot", str(png)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert png.read_bytes().startswith(PNG_MAGIC) and "|" in done.stdout


def test_cells_table_and_flops(tmp_path):
    """bench.cells: the window cell's FLOPs count its visible pairs; its table puts Flex where a cell has no
    cuDNN peer, and the deterministic backward against the default; --from-jsonl re-tabulates without a GPU;
    docs/api.md's determinism table reads its backward rows (the forward's left out)."""
    from bench.cells import CELLS, cell_flops, table
    from bench.docs import _determinism_table

    window = "window4096 GQA32/8 D128 causal bf16 B1 N16384"
    assert cell_flops(window, "fwd") == 4 * 32 * 128 * (16384 * 4097 - 4096 * 4097 / 2)
    assert cell_flops(window, "bwd") == 2.5 * cell_flops(window, "fwd")
    dense = "MHA D64 full fp16 B2 H16 N8192"
    assert cell_flops(dense, "fwd") == 4 * 2 * 16 * 8192 * 8192 * 64 and set(CELLS) >= {window, dense}
    rows = []
    for cell, peer in ((dense, "cudnn"), (window, "flex")):
        for mode in ("fwd", "bwd"):
            tfs = {peer: 400.0, "diyflash": 440.0} | ({"fa2": 250.0} if peer == "cudnn" else {})
            if mode == "bwd":
                tfs["diyflash-det"] = 330.0
            for provider, tf in tfs.items():
                rows.append(dict(cell=cell, mode=mode, provider=provider, tflops=tf, vs_peer=tf / 400.0, peer=peer,
                                 **({"dq_spread": 6.1e-05} if provider == "diyflash" and mode == "bwd" else {})))
    lines = table(rows).splitlines()
    assert lines[2] == f"| {dense} | 400 | 250 | 440 | 1.100x | 400 | 250 | 440 | 1.100x | 330 | 0.75x |"
    assert lines[3] == f"| {window} | (400) | - | 440 | 1.100x | (400) | - | 440 | 1.100x | 330 | 0.75x |"
    det = _determinism_table([r for r in rows if r["mode"] == "bwd"]).splitlines()
    assert det[2] == f"| {dense} | 440 | 330 | 400 | 0.75x | 6.1e-05 |" and det[3].endswith("| (400) | 0.75x | 6.1e-05 |")
    src = tmp_path / "cells.jsonl"
    write_jsonl(src, rows)
    done = subprocess.run([sys.executable, "-m", "bench.cells", "--from-jsonl", str(src)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and lines[2] in done.stdout, done.stderr


def test_tuned_table_covers_every_kernel_and_round_trips():
    """attention_tuned.py (written by `python -m bench.attention_configs --write`) has tiles for every
    kernel, causal setting and padded head_dim (the dv pass: where it was tuned), each one the sweep
    could have chosen; rendering the table back gives the same table."""
    from bench.attention_configs import render_tuned
    from diyflash.kernels.attention_tuned import TUNED

    assert set(TUNED) - {"dv"} == {"fwd", "dkdv", "dq"}
    for kind, modes in TUNED.items():
        assert set(modes) == {"plain", "causal"}
        for dims in modes.values():
            if kind == "dv":  # optional: the dv pass of a split dk/dv has the dk/dv tiles where not tuned
                assert set(dims) <= {16, 32, 64, 128, 256}, sorted(dims)
            else:
                assert set(dims) >= {16, 32, 64, 128, 256}, (kind, sorted(dims))
            for entry in dims.values():
                buckets = entry if isinstance(entry, dict) else {None: entry}
                assert None in buckets and all(n is None or n > 0 for n in buckets), (kind, entry)
                for tiles in buckets.values():
                    check_tiles(kind, tiles)
    namespace: dict = {}
    bucketed = {**TUNED, "fwd": {**TUNED["fwd"], "plain": {**TUNED["fwd"]["plain"], 64: {
        4096: (64, 64, 4, 3), 1024: (64, 32, 4, 3), None: (128, 64, 8, 3, "tma")}}}}
    with_dv = {**TUNED, "dv": {"plain": {256: (16, 64, 4, 4, "tma")}, "causal": {}}}
    for table in (TUNED, bucketed, with_dv):
        exec(render_tuned(table), namespace)
        assert namespace["TUNED"] == table


def check_tiles(kind, tiles):
    """tiles as the table records them, and a candidate the sweep could have chosen."""
    from diyflash.kernels.attention_configs import CANDIDATES, AttnConfig

    cfg = AttnConfig.from_tiles(tiles)
    assert cfg.as_tiles() == tiles
    assert any((c.block_m, c.block_n, c.num_warps, c.split, c.tma, c.ws, c.rowoff, c.row64)
               == (cfg.block_m, cfg.block_n, cfg.num_warps, cfg.split, cfg.tma, cfg.ws, cfg.rowoff, cfg.row64)
               for c in CANDIDATES[kind]), (kind, tiles)


def test_length_buckets():
    """An entry's tiles for a sequence length, and how a sweep's winner enters an entry."""
    from bench.attention_configs import with_winner
    from diyflash.kernels.attention_configs import tiles_for

    a, b, c = (64, 64, 4, 3), (128, 64, 8, 3), (128, 32, 4, 2, "tma")
    assert tiles_for(a, 100) == tiles_for(a, None) == a
    entry = {1024: a, 4096: b, None: c}
    assert [tiles_for(entry, n) for n in (1, 1024, 1025, 4096, 4097, None)] == [a, a, b, b, c, c]
    assert with_winner(None, a, None) == with_winner(b, a, None) == a  # an unbucketed sweep: every length
    assert with_winner(b, a, 2048) == {2048: a, None: b}  # a bucket beside what served before
    assert with_winner({2048: a, None: b}, c, None) == {2048: a, None: c}
    assert with_winner({2048: a, None: b}, c, 2048) == {2048: c, None: b}
    assert with_winner(b, b, 2048) == b  # no bucket for the tiles longer sequences have anyway
    assert with_winner({1024: a, 2048: c, None: b}, b, 2048) == {1024: a, None: b}
    assert with_winner({2048: a, None: b}, a, None) == a


def test_tutorial_baseline_source_is_found_and_complete():
    """bench.attention's "tutorial" provider reads the seed's tutorial code: the extracted source parses
    and defines the kernels and the autograd entry point the provider calls."""
    import ast

    from bench.tutorial import seed_path, tutorial_source

    path = seed_path()
    if not path.is_file():  # CI has ../shared; the GPU machine gets the working tree only
        pytest.skip(f"the seed documents are not on this machine ({path}); set DIYFLASH_TUTORIAL_SEED")
    tree = ast.parse(tutorial_source(path.read_text(encoding="utf-8")))
    names = {getattr(node, "name", None) for node in tree.body}
    names |= {t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets
              if isinstance(t, ast.Name)}
    assert {"_attn_fwd", "_attn_bwd", "_attention", "attention"} <= names


def test_sweep_ranks_by_the_interleaved_retiming():
    """A sweep's winner is the fastest of the leaders re-timed in turns, whatever their first pass said;
    rows without a re-timing follow, and wrong results never rank."""
    from bench.attention_configs import ranked
    from bench.common import quantiles

    rows = [dict(name="a", ok=True, ms=1.0, confirm_ms=1.3), dict(name="b", ok=True, ms=1.1, confirm_ms=1.2),
            dict(name="c", ok=True, ms=1.05), dict(name="d", ok=False, ms=0.5, confirm_ms=0.5)]
    assert [r["name"] for r in ranked(rows)] == ["b", "a", "c"]
    assert quantiles([4.0, 1.0, 3.0, 2.0, 5.0]) == pytest.approx((3.0, 1.8, 4.2))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA events need a GPU")
def test_interleaved_times_gives_every_callable_its_rounds():
    from bench.common import interleaved_times

    x = torch.randn(256, 256, device="cuda")
    calls = {"mm": 0, "add": 0}

    def mm():
        calls["mm"] += 1
        return x @ x

    def add():
        calls["add"] += 1
        return x + x

    times = interleaved_times({"mm": mm, "add": add}, rounds=3, round_ms=5, warmup_ms=1)
    assert set(times) == {"mm", "add"} and all(len(t) >= 3 and min(t) > 0 for t in times.values())
    assert calls["mm"] > 3 and calls["add"] > 3


def test_interleaved_times_takes_each_callable_right_after_the_anchor(monkeypatch):
    """With an anchor, each other callable is timed right after it, their order reversed every other round, and
    the anchor's own samples are kept; without one, one fixed order a round. An anchor that is not among the
    callables is refused by name."""
    triton = pytest.importorskip("triton")
    import triton.testing

    from bench.common import interleaved_times

    order = []

    def fake_do_bench(fn, warmup, rep, return_mode):
        order.append(fn())
        return [float(len(order))]

    monkeypatch.setattr(triton.testing, "do_bench", fake_do_bench)
    fns = {name: (lambda name=name: name) for name in ("a", "cudnn", "b", "c")}
    times = interleaved_times(fns, rounds=2, round_ms=1, anchor="cudnn")
    assert order == ["cudnn", "a", "cudnn", "b", "cudnn", "c", "cudnn", "c", "cudnn", "b", "cudnn", "a"]
    assert {name: len(t) for name, t in times.items()} == {"a": 2, "b": 2, "c": 2, "cudnn": 6}
    order.clear()
    interleaved_times(fns, rounds=2, round_ms=1)
    assert order == ["a", "cudnn", "b", "c"] * 2
    with pytest.raises(ValueError, match="'flex' is not one of"):
        interleaved_times(fns, rounds=1, anchor="flex")


def test_interleaved_tflops_is_flops_over_the_median_time(monkeypatch):
    """The probes' TFLOPS: the callable's FLOPs over the median of its samples taken in turns."""
    import bench.common as common

    samples = {"a": [1.0, 3.0, 2.0], "b": [0.5, 0.5, 4.0]}  # ms
    monkeypatch.setattr(common, "interleaved_times", lambda fns, rounds, round_ms: {n: samples[n] for n in fns})
    res = common.interleaved_tflops({"a": None, "b": None}, flops=4e12, rounds=3)
    assert res == pytest.approx({"a": 4e12 / 2.0 / 1e9, "b": 4e12 / 0.5 / 1e9})


def test_dv_pass_tiles_apply_only_to_a_split_backward(monkeypatch):
    """A 'dv' entry of attention_tuned.py tiles the dv pass where the dk/dv tiles are split, and is
    ignored where dk and dv are one pass; without one, the dv pass runs on the dk/dv tiles."""
    from diyflash.kernels import attention_configs as ac

    cpu = torch.device("cpu")
    split, one_pass = (32, 64, 4, 3, "split", "tma"), (64, 128, 8, 3, "tma")
    table = {**ac.TUNED, "dkdv": {"plain": {**ac.TUNED["dkdv"]["plain"], 256: split, 128: one_pass},
                                  "causal": {**ac.TUNED["dkdv"]["causal"], 256: split}},
             "dv": {"plain": {256: (16, 64, 4, 4, "tma"), 128: (16, 64, 4, 4)}, "causal": {}}}
    monkeypatch.setattr(ac, "TUNED", table)
    ac.bwd_config.cache_clear()
    try:
        tuned = ac.bwd_config(256, torch.float16, cpu, False, False)
        assert tuned.dv == ac.AttnConfig(16, 64, 4, 4, tma=True) and tuned.dv_pass == tuned.dv
        assert tuned.dkdv_passes() == ((tuned.dv, False, True), (tuned.dkdv, True, False))
        assert tuned.kernels() == (tuned.dv, tuned.dkdv, tuned.dq)
        assert tuned.as_dict()["dv"] == {"block_m": 16, "block_n": 64, "num_warps": 4, "num_stages": 4, "tma": True}
        untuned = ac.bwd_config(256, torch.float16, cpu, True, False)  # split, no dv entry
        assert untuned.dv is None and untuned.dv_pass == ac.AttnConfig(32, 64, 4, 3, tma=True)
        whole = ac.bwd_config(128, torch.float16, cpu, False, False)  # one pass: the dv entry is unused
        assert whole.dv is None and whole.dv_pass is None and whole.kernels() == (whole.dkdv, whole.dq)
        assert whole.dkdv_passes() == ((whole.dkdv, True, True),)
    finally:
        ac.bwd_config.cache_clear()


def test_ncu_parses_tiles():
    """bench.ncu reads KIND=tiles runners."""
    from bench.ncu import parse_tiles
    from diyflash.kernels.attention_configs import AttnConfig

    assert parse_tiles("dv=32,128,8,4,tma") == ("dv", AttnConfig(32, 128, 8, 4, tma=True))
    assert parse_tiles("fwd=64,64,4,3,rowoff") == ("fwd", AttnConfig(64, 64, 4, 3, rowoff=True))
    with pytest.raises(ValueError, match="KIND="):
        parse_tiles("bwd=32,64,4,3")


def test_overhead_launch_rows_take_every_tuned_forward_entry():
    """bench.overhead times one forward's tiles through TMA and through pointers. Its first version kept
    a pointer-only flag on the TMA copy, and the whole run raised at the first tuned entry with that flag:
    every tuned forward tile (each head_dim, causal or not, each length bucket) must give both copies."""
    from bench.overhead import tma_and_pointer_tiles
    from diyflash.kernels.attention_configs import TUNED, AttnConfig

    for dims in TUNED["fwd"].values():
        for entry in dims.values():
            for tiles in (entry.values() if isinstance(entry, dict) else [entry]):
                cfg = AttnConfig.from_tiles(tiles)
                both = tma_and_pointer_tiles(cfg)
                assert both["TMA"].tma and not both["TMA"].rowoff
                assert not both["pointer"].tma and not both["pointer"].ws
                assert (both["pointer"].block_m, both["pointer"].block_n, both["pointer"].num_warps) == (
                    cfg.block_m, cfg.block_n, cfg.num_warps)


def test_hf_model_steps_in_turns_alternate_the_implementations(device):
    """bench.hf_model's decode steps in turns: the prefill runs the generate's first implementation, the decode
    steps then alternate, each generate starts with the other, every pair is an adjacent (diyattention, sdpa)
    pair, and the model's config is back on diyattention afterwards."""
    transformers = pytest.importorskip("transformers", reason="the transformers extra")
    import bench.hf_model as hf_model
    import diyflash.integrations.transformers as dt

    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=dt.ATTN_IMPLEMENTATION)
    model = model.to(device).eval()
    seen = []
    model.model.layers[0].self_attn.register_forward_pre_hook(
        lambda mod, args, kwargs: seen.append((kwargs["hidden_states"].shape[1], mod.config._attn_implementation)),
        with_kwargs=True)
    prompt = torch.randint(1, 128, (1, 8), device=device)
    rows = hf_model._step_turn_rows(model, prompt, torch.ones_like(prompt), new=5, repeats=2, task="t")
    assert model.config._attn_implementation == dt.ATTN_IMPLEMENTATION
    impls = (dt.ATTN_IMPLEMENTATION, "sdpa")
    generates = [seen[i:i + 5] for i in range(0, len(seen), 5)]  # a prefill and four decode steps each
    assert len(generates) == 3 and all(g[0][0] == 8 and all(n == 1 for n, _ in g[1:]) for g in generates)
    for r, g in enumerate(generates):
        first = impls[r % 2]
        order = [first, impls[1 - r % 2]]
        assert [impl for _, impl in g] == [first] + [order[i % 2] for i in range(4)]
    assert [r["impl"] for r in rows] == list(impls) and all(r["pairs"] == 2 * 2 for r in rows)
    mine = rows[0]
    assert rows[1]["step_vs_sdpa"] == 1.0 and mine["step_vs_sdpa_q1"] <= mine["step_vs_sdpa"] <= mine["step_vs_sdpa_q3"]
    low, high = mine["step_vs_sdpa_ci95"]
    assert mine["step_vs_sdpa_min"] <= low <= mine["step_vs_sdpa"] <= high <= mine["step_vs_sdpa_max"]
    assert "median's 95 %" in hf_model.table(rows)
