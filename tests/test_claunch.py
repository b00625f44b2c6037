"""The C launcher (diyflash/kernels/_claunch.c, _claunch.py): parameters packed once as Triton's launcher
packs them, one C call a launch; and its fallback, Triton's launcher, wherever the C one is not used.

Everywhere: the module builds with the system compiler (the test says so where no compiler exists) and
packs each parameter type as Triton's launcher does; the kernels it does not pack are refused; with
DIYFLASH_C_LAUNCHER=0 nothing is built. On the GPU: the attention's bound launches take the C path, and
its results equal Triton's launcher's bit for bit (forward, backward, a decode step), with a launch hook
set the hook runs (Triton's path)."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("triton")

import diyflash  # noqa: E402
from diyflash.kernels import _claunch, _launch  # noqa: E402
from helpers import ON_GPU  # noqa: E402


@pytest.fixture(scope="module")
def built():
    try:
        return _claunch.build()
    except Exception as exc:  # the fallback serves such machines; tests/test_claunch checks it below
        pytest.skip(f"no C launcher on this machine (the fallback runs): {type(exc).__name__}: {exc}")


def test_parameters_packed_as_tritons_launcher_packs_them(built):
    # every code, constexprs skipped, the two scratch pointers last; ints as their C type (truncated as
    # Triton's PyArg formats convert), floats as fp32 / fp16 / bf16 (bf16 truncated, as Triton's pack_bf16)
    values = (0x1234_5678_9ABC, None, 0, -5, 1.5, 1.5, 1.1, 2**40, 1, 2.5, -3, 7, 65535, 2**63 + 1, -1, 255)
    packed = built.packed(built.make(0xF00, (3, 2, 1), 128, 1000, "pxpifeEqBdhbHQqB", values, 2, 3))
    want = [struct.pack("<Q", 0x1234_5678_9ABC), struct.pack("<Q", 0), struct.pack("<i", -5),
            struct.pack("<f", 1.5), struct.pack("<e", 1.5),
            struct.pack("<I", struct.unpack("<I", struct.pack("<f", 1.1))[0])[2:],  # bf16: fp32's high half
            struct.pack("<q", 2**40), struct.pack("<B", 1), struct.pack("<d", 2.5), struct.pack("<h", -3),
            struct.pack("<b", 7), struct.pack("<H", 65535), struct.pack("<Q", 2**63 + 1), struct.pack("<q", -1),
            struct.pack("<B", 255), b"", b""]
    assert len(packed) == 8 * len(want)
    for i, bytes_ in enumerate(want):
        assert packed[8 * i:8 * i + len(bytes_)] == bytes_, i
        assert packed[8 * i + len(bytes_):8 * i + 8] == bytes(8 - len(bytes_)), i  # the rest of the slot zero


def test_pointers_by_data_ptr_and_errors(built):
    t = torch.zeros(4)
    launch = built.make(1, (1, 1, 1), 32, 0, "pip", (t, 3, None), 1, 1)
    assert struct.unpack("<Q", built.packed(launch)[:8])[0] == t.data_ptr()
    with pytest.raises(TypeError, match="2 pointers given, the launch takes 1"):
        built.launch(launch, 0, None, t, t)
    with pytest.raises(TypeError, match="2 values given, the launch takes 1"):
        built.launch_with(launch, 0, None, (t,), (1, 2))
    with pytest.raises(ValueError, match="unknown parameter code"):
        built.make(1, (1, 1, 1), 32, 0, "pz", (t, 3), 1, 0)
    with pytest.raises(ValueError, match="disagree"):
        built.make(1, (1, 1, 1), 32, 0, "pi", (t,), 1, 0)
    with pytest.raises(TypeError):
        built.make(1, (1, 1, 1), 32, 0, "pi", (t, "three"), 1, 0)


def test_launch_with_leaves_the_bound_scalars(built):
    """launch_with's scalars serve its own launch only: a plain launch later runs with the bound ones. (An
    empty grid launches nothing, so this runs without a GPU.)"""
    t = torch.zeros(4)
    launch = built.make(1, (0, 1, 1), 32, 0, "pif", (t, 3, 0.5), 1, 2)
    before = built.packed(launch)
    assert built.launch_with(launch, 0, None, (t,), (17, 2.5)) is True
    assert built.packed(launch) == before
    with pytest.raises(TypeError):
        built.launch_with(launch, 0, None, (t,), (17, "x"))
    assert built.packed(launch) == before


class FakeC:
    """Stand-in for the built module: records launches; `no_context_at` answers False (no current CUDA
    context) from that launch on."""

    def __init__(self, no_context_at=None):
        self.log, self.no_context_at = [], no_context_at

    def launch(self, packed, stream, scratch, *pointers):
        return self._fire(("launch", packed, stream, scratch, pointers))

    def launch_with(self, packed, stream, scratch, pointers, args):
        return self._fire(("launch_with", packed, stream, scratch, pointers, args))

    def launch_seq(self, stream, scratch, values, *tail):  # logs each launch as launch() would
        self.seq_calls = getattr(self, "seq_calls", 0) + 1
        for i in range(0, len(tail), 3):
            packed, at, gets_scratch = tail[i:i + 3]
            if not self._fire(("launch", packed, stream, scratch if gets_scratch else None,
                               tuple(values[j] for j in at))):
                return i // 3
        return len(tail) // 3

    def _fire(self, entry):
        if self.no_context_at is not None and len(self.log) >= self.no_context_at:
            return False
        self.log.append(entry)
        return True


def _three_bound_launches(monkeypatch):
    """Three bound launches of a stand-in kernel (scratch 64, none, 128 bytes), with a stand-in driver and
    scratch (_launch._scratch; Triton's allocator, another library's, left alone): (bounds as plans keep them,
    env, the kernel, the scratch requests)."""
    from test_launch import FakeKernel

    monkeypatch.setattr(_launch, "active_driver", lambda: (lambda: 0, lambda device: 1234))
    asked = []
    monkeypatch.setattr(_launch, "_scratch",
                        lambda size, align, stream: asked.append((size, align, stream)) or "scratch")
    monkeypatch.setattr(_launch, "_allocation", SimpleNamespace(_allocator=SimpleNamespace(
        get=lambda: lambda size, align, stream: pytest.fail("a C launch asked Triton's allocator"))))
    kernel = FakeKernel()
    launcher = _launch.DirectLauncher(kernel)
    x, y = torch.zeros(8), torch.zeros(8)
    bounds = []
    for n, (scratch, align) in zip((16, 32, 48), ((64, 8), (0, 1), (128, 16))):
        launcher((4,), x, y, n, BLOCK=16, FLAG=True)
        bound = launcher.bind((4,), (x, y), (n,), dict(BLOCK=16, FLAG=True))
        bound.packed, bound.scratch, bound.align = f"L{n}", scratch, align
        bounds.append((bound, lambda env: (env["x"], env["y"])))
    kernel.log.clear()
    return bounds, {"x": y, "y": x}, kernel, asked


def test_a_plans_launches_share_one_scratch_and_fall_back_per_launch(monkeypatch):
    """_launch.run_bound (a plan's replay) on CPU, with a stand-in C module: one allocator call for the
    largest scratch, handed only to the launches that need it; a launch without a current context and the
    rest after it go through Triton's launcher; switched off, every launch does."""
    bounds, env, kernel, asked = _three_bound_launches(monkeypatch)
    x, y = env["y"], env["x"]
    fake = FakeC()
    monkeypatch.setattr(_launch, "c_launcher", lambda: fake)
    _launch.run_bound(bounds, env)
    assert asked == [(128, 16, 1234)] and kernel.log == []
    assert fake.log == [("launch", "L16", 1234, "scratch", (y, x)), ("launch", "L32", 1234, None, (y, x)),
                        ("launch", "L48", 1234, "scratch", (y, x))]
    _launch.run_bound(bounds, env, [(17,), (33,), (49,)])
    assert [entry[-1] for entry in fake.log[3:]] == [(17,), (33,), (49,)]
    fake = FakeC(no_context_at=1)
    monkeypatch.setattr(_launch, "c_launcher", lambda: fake)
    _launch.run_bound(bounds, env)
    assert len(fake.log) == 1 and [entry[0] for entry in kernel.log] == ["direct", "direct"]
    before = _launch.use_c_launcher(False)
    try:
        _launch.run_bound(bounds, env)
    finally:
        _launch.use_c_launcher(before)
    assert len(fake.log) == 1 and len(kernel.log) == 5


def test_a_plans_sequence_is_one_c_call_of_the_same_launches(monkeypatch):
    """With the plan's Sequence (_launch.sequence) run_bound makes one C call (launch_seq) that launches what
    the launch-by-launch path does: each launch's pointers by name, the largest scratch to those needing it;
    where a context is missing the rest go through Triton's launcher; with new arguments (a decode step),
    a pre-run hook added since binding, or the C launcher switched off, it goes launch by launch."""
    bounds, env, kernel, asked = _three_bound_launches(monkeypatch)
    x, y = env["y"], env["x"]
    seq = _launch.sequence([b for b, _ in bounds], [("x", "y"), ("y",), ("y", "x")])
    assert seq is not None and seq.need == 128 and seq.align == 16
    bounds = [(bounds[0][0], lambda env: (env["x"], env["y"])), (bounds[1][0], lambda env: (env["y"],)),
              (bounds[2][0], lambda env: (env["y"], env["x"]))]
    fake = FakeC()
    monkeypatch.setattr(_launch, "c_launcher", lambda: fake)
    _launch.run_bound(bounds, env, seq=seq)
    assert fake.seq_calls == 1 and asked == [(128, 16, 1234)] and kernel.log == []
    assert fake.log == [("launch", "L16", 1234, "scratch", (y, x)), ("launch", "L32", 1234, None, (x,)),
                        ("launch", "L48", 1234, "scratch", (x, y))]
    _launch.run_bound(bounds, env, [(17,), (33,), (49,)], seq=seq)
    assert fake.seq_calls == 1 and [entry[0] for entry in fake.log[3:]] == ["launch_with"] * 3
    fake = FakeC(no_context_at=1)
    monkeypatch.setattr(_launch, "c_launcher", lambda: fake)
    _launch.run_bound(bounds, env, seq=seq)
    assert len(fake.log) == 1 and [entry[0] for entry in kernel.log] == ["direct", "direct"]
    kernel.log.clear()
    fake = FakeC()
    monkeypatch.setattr(_launch, "c_launcher", lambda: fake)
    kernel.pre_run_hooks.append(lambda *a, **k: None)
    try:
        _launch.run_bound(bounds, env, seq=seq)
    finally:
        kernel.pre_run_hooks.clear()
    assert fake.log == [] and len(kernel.log) == 3
    before = _launch.use_c_launcher(False)
    try:
        _launch.run_bound(bounds, env, seq=seq)
    finally:
        _launch.use_c_launcher(before)
    assert fake.log == [] and len(kernel.log) == 6
    one = _launch.sequence([bounds[1][0]], [("y",)])
    assert one.values(env) == (x,) and one.tail == ("L32", (0,), False)
    assert _launch.sequence([bounds[1][0]], [()]).values(env) == ()  # a launch without open pointers
    bounds[1][0].packed = None
    assert _launch.sequence([b for b, _ in bounds], [("x", "y"), ("y",), ("y", "x")]) is None


def test_launch_seq_takes_each_launchs_pointers_by_index(built):
    """The built module's launch_seq: every launch's open pointers from the values at its indices, how many
    launched returned (empty grids launch nothing, so this runs without a GPU), bad indices refused."""
    t, u = torch.zeros(4), torch.ones(4)
    a = built.make(1, (0, 1, 1), 32, 0, "ppi", (t, t, 5), 2, 1)
    b = built.make(1, (0, 1, 1), 32, 0, "pf", (t, 0.5), 1, 1)
    assert built.launch_seq(0, None, (t, u), a, (1, 0), False, b, (1,), True) == 2
    assert struct.unpack("<QQq", built.packed(a)[:24]) == (u.data_ptr(), t.data_ptr(), 5)
    assert struct.unpack("<Q", built.packed(b)[:8])[0] == u.data_ptr()
    with pytest.raises(IndexError, match="launch 0 reads value 1 of 1"):
        built.launch_seq(0, None, (t,), a, (1, 0), False)
    with pytest.raises(TypeError, match="1 pointers given, the launch takes 2"):
        built.launch_seq(0, None, (t, u), a, (1,), False)
    with pytest.raises(TypeError, match="launch 0 is not"):
        built.launch_seq(0, None, (t, u), "a", (1,), False)


def compiled_like(signature, **metadata):
    meta = dict(num_ctas=1, launch_cooperative_grid=False, launch_pdl=False, profile_scratch_size=0, num_warps=4,
                shared=0, global_scratch_size=0, global_scratch_align=1)
    meta.update(metadata)
    return SimpleNamespace(src=SimpleNamespace(signature=signature), metadata=SimpleNamespace(**meta), function=1)


def test_codes_follow_tritons_signature_and_refuse_what_they_do_not_pack():
    sig = {"q": "*fp16", "n": "i32", "big": "i64", "scale": "fp32", "flag": "u1", "BLOCK": "constexpr", "x": "u64"}
    assert _claunch.codes(compiled_like(sig)) == "piqfBxQ"
    assert _claunch.codes(compiled_like({"d": "tensordesc<fp16[64, 64]>"})) is None  # host descriptors
    assert _claunch.codes(compiled_like({"d": "nvTmaDesc"})) is None
    assert _claunch.codes(compiled_like({"t": ("i32", "i32")})) is None  # tuple arguments
    for option in (dict(num_ctas=2), dict(launch_cooperative_grid=True), dict(launch_pdl=True),
                   dict(profile_scratch_size=64)):
        assert _claunch.codes(compiled_like({"q": "*fp16"}, **option)) is None, option
    assert _claunch.codes(SimpleNamespace()) is None  # a Triton whose compiled kernels look different
    assert _claunch.scratch_bytes(compiled_like({}, global_scratch_size=128, num_ctas=1), (3, 2)) == 768
    assert _claunch.scratch_bytes(compiled_like({}), (3, 2)) == 0


def test_host_descriptors_are_packed_as_tensor_maps_where_the_driver_has_them(monkeypatch):
    """A host TMA descriptor the kernel reads as a tensor map is code 'T', encoded with what Triton's launcher
    passes fill_tma_descriptor (swizzle, element size, the host's element type, block, NaN padding); one the
    kernel reads as a pointer (no tensordesc_meta), an fp4-padded one, or a driver without the tensor-map entry
    points keeps Triton's launcher."""
    spec = dict(swizzle=3, elem_size=2, elem_type=8, block_size=[1, 1, 64, 128], fp4_padded=False)
    sig = {"d": "tensordesc<bf16[1, 1, 64, 128]>", "o": "*bf16", "n": "i32", "e": "tensordesc<bf16[64]>"}
    compiled = compiled_like(sig, tensordesc_meta=[spec, dict(spec, elem_type=9, block_size=[64])])
    monkeypatch.setattr(_claunch, "_maps_here", lambda: True)
    assert _claunch.codes(compiled) == "TpiT"
    desc, flat = SimpleNamespace(padding="zero"), SimpleNamespace(padding="nan")
    assert _claunch.map_specs(compiled, "TpiT", (desc, None, 3, flat)) == (
        (3, 2, 10, (1, 1, 64, 128), 0), (3, 2, 8, (64,), 1))
    assert _claunch.codes(compiled_like(sig, tensordesc_meta=[None, None])) is None
    assert _claunch.codes(compiled_like(sig, tensordesc_meta=[dict(spec, fp4_padded=True), spec])) is None
    monkeypatch.setattr(_claunch, "_maps_here", lambda: False)
    assert _claunch.codes(compiled) is None


def test_descriptor_specs_checked(built):
    desc = SimpleNamespace(base=torch.zeros(8), shape=(8,), strides=(1,), padding="zero")
    with pytest.raises(ValueError, match="fewer specs"):
        built.make(1, (1, 1, 1), 32, 0, "Tp", (desc, None), 1, 0, ())
    with pytest.raises(ValueError, match="rank 1 to 5"):
        built.make(1, (1, 1, 1), 32, 0, "T", (desc,), 1, 0, ((0, 2, 6, (), 0),))
    if not built.tma():  # (load() not run or no libcuda here: nothing can be encoded)
        with pytest.raises(RuntimeError, match="cuTensorMapEncodeTiled"):
            built.make(1, (1, 1, 1), 32, 0, "T", (desc,), 1, 0, ((0, 2, 6, (8,), 0),))


def test_switched_off_nothing_is_built():
    code = ("from diyflash.kernels import _claunch; print(_claunch.module() is None, _claunch.reason())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=dict(os.environ, DIYFLASH_C_LAUNCHER="0")).stdout
    assert out.strip() == "True off (DIYFLASH_C_LAUNCHER=0 or DIYFLASH_PLAIN=1)"


gpu = pytest.mark.skipif(not ON_GPU, reason="the interpreter has no compiled kernels: nothing is launched in C")


def _calls(fn, c_launcher: bool):
    """fn() twice (the second replays plans), with the C launcher on or off for its bound launches."""
    before = _launch.use_c_launcher(c_launcher)
    try:
        fn()
        return fn()
    finally:
        _launch.use_c_launcher(before)


@gpu
def test_gpu_c_launcher_is_used_and_matches_tritons_launcher(monkeypatch):
    assert _claunch.module() is not None, _claunch.reason()
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, 4, 113, 80, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
               for _ in range(3))
    grad = torch.randn(2, 4, 113, 80, device="cuda", dtype=torch.bfloat16, generator=gen)
    kc, vc = (torch.randn(2, 2, 300, 64, device="cuda", dtype=torch.float16, generator=gen) for _ in range(2))
    qd = torch.randn(2, 4, 1, 64, device="cuda", dtype=torch.float16, generator=gen)
    lens = torch.tensor([300, 17], device="cuda", dtype=torch.int32)

    def train():
        out = diyflash.flash_attention(q, k, v, causal=True)
        return (out, *torch.autograd.grad(out, (q, k, v), grad))

    def decode():
        return (diyflash.flash_attention_with_kvcache(qd, kc, vc, lens),)

    train(), decode()  # (first calls make the plans whose bound launches later calls replay)
    used = []
    real, real_seq = _launch._c_fire, _launch._c_fire_seq  # (single launches, a plan's launches as one call)
    monkeypatch.setattr(_launch, "_c_fire", lambda *args: used.append(1) or real(*args))
    monkeypatch.setattr(_launch, "_c_fire_seq", lambda *args: used.append(2) or real_seq(*args))
    train(), decode()
    monkeypatch.undo()
    assert used, "no bound launch went through the C launcher"
    assert 2 in used, "no plan's launches went through the C launcher as one call"
    for fn in (train, decode):
        for c_path, triton_path in zip(_calls(fn, True), _calls(fn, False)):
            assert torch.equal(c_path, triton_path)


@gpu
def test_gpu_launch_hooks_run_through_tritons_launcher():
    from triton import knobs

    q = torch.randn(1, 2, 64, 64, device="cuda", dtype=torch.float16)
    diyflash.flash_attention(q, q, q)
    seen = []
    hook = lambda metadata: seen.append(metadata)  # noqa: E731
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        out = diyflash.flash_attention(q, q, q)
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    assert seen, "the launch hook did not run"
    torch.testing.assert_close(out, diyflash.flash_attention(q, q, q), rtol=0, atol=0)


@gpu
def test_gpu_hopper_launches_take_the_c_launcher_and_match_tritons():
    """The Hopper kernels' launches (host TMA descriptors) go through the C launcher, their maps' addresses
    replaced when a call brings other tensors, and compute what Triton's launcher computes: the forward and
    dk, dv bit for bit (dq's fp32 adds land in any order)."""
    from diyflash.kernels.attention import hopper

    if not hopper.status(torch.device("cuda"))[0]:
        pytest.skip("no Hopper kernels on this device")
    packed = []
    real = _launch.pack_launch

    def recording(compiled, grid, values, npointers, nargs):
        out = real(compiled, grid, values, npointers, nargs)
        packed.append((_claunch.codes(compiled), out is not None))
        return out

    before = hopper.backend()
    hopper.use("hopper")
    try:
        _launch.pack_launch = recording
        gen = torch.Generator(device="cuda").manual_seed(0)
        inputs = [[torch.randn(1, 4, 512, 128, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
                   for _ in range(3)] for _ in range(2)]
        grad = torch.randn(1, 4, 512, 128, device="cuda", dtype=torch.bfloat16, generator=gen)

        def train(q, k, v):
            out = diyflash.flash_attention(q, k, v, causal=True)
            return (out, *torch.autograd.grad(out, (q, k, v), grad))

        results = {}
        for c_on in (True, False):
            for i, (q, k, v) in enumerate(inputs):  # the second set: the same plan, other addresses
                results[c_on, i] = _calls(lambda: train(q, k, v), c_on)
        assert any(kinds and "T" in kinds and ok for kinds, ok in packed), packed
        for i in range(2):
            c_path, triton_path = results[True, i], results[False, i]
            for name, a, b in zip(("out", "dq", "dk", "dv"), c_path, triton_path):
                if name == "dq":
                    torch.testing.assert_close(a, b, rtol=0, atol=2e-2)
                else:
                    assert torch.equal(a, b), name
    finally:
        _launch.pack_launch = real
        hopper.use(before)
