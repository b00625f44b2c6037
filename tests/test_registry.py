"""The live diyflash:: schemas are exactly csrc_registry/ops.txt, and that file is pinned.

To change a schema: edit csrc_registry/ops.txt (and the op), then accept the new expectation with
EXPECTTEST_ACCEPT=1 python -m pytest tests/test_registry.py, and review both diffs together.
"""

import pytest
import torch
from expecttest import TestCase

import diyflash  # noqa: F401  (registers the ops)
from diyflash.ops.registry import NAMESPACE, parse_registry, registry


def live_schemas() -> dict[str, str]:
    prefix = f"{NAMESPACE}::"
    return {
        str(s).split("(", 1)[0][len(prefix):]: str(s)[len(prefix):]
        for s in torch._C._jit_get_all_schemas()
        if str(s).startswith(prefix)
    }


class TestRegistry(TestCase):
    def test_live_schemas_equal_registry(self):
        live = live_schemas()
        want = {name: e.schema for name, e in registry().items()}
        self.assertEqual(sorted(live), sorted(want), "ops registered vs listed in csrc_registry/ops.txt")
        for name in want:
            self.assertEqual(live[name], want[name], f"live schema of diyflash::{name} differs from the registry")

    def test_registry_is_pinned(self):
        table = "\n".join(f"{e.schema}" for e in registry().values())
        self.assertExpectedInline(table, """\
attention(Tensor q, Tensor k, Tensor v, bool causal=False, float? scale=None, Tensor? seq_lens=None, int window_left=-1, int window_right=-1, float softcap=0., Tensor? alibi_slopes=None, Tensor? sinks=None, int diagonal_offset=0, bool? deterministic=None) -> Tensor
attention_fwd(Tensor q, Tensor k, Tensor v, bool causal, float? scale, Tensor? seq_lens, int window_left=-1, int window_right=-1, float softcap=0., Tensor? alibi_slopes=None, Tensor? sinks=None, int diagonal_offset=0, bool? deterministic=None) -> (Tensor out, Tensor lse)
attention_bwd(Tensor dout, Tensor? dlse, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, bool causal, float? scale, Tensor? seq_lens, int window_left=-1, int window_right=-1, float softcap=0., Tensor? alibi_slopes=None, Tensor? sinks=None, int diagonal_offset=0, bool? deterministic=None) -> (Tensor dq, Tensor dk, Tensor dv, Tensor dsinks)
matmul(Tensor a, Tensor b, int[]? block_sizes=None, bool autotune=True, bool allow_tf32=False) -> Tensor
attention_varlen(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, SymInt max_seqlen_q, SymInt max_seqlen_k, bool causal=False, float? scale=None, int window_left=-1, int window_right=-1, float softcap=0., Tensor? alibi_slopes=None, Tensor? sinks=None, bool? deterministic=None) -> Tensor
attention_varlen_fwd(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, SymInt max_seqlen_q, SymInt max_seqlen_k, bool causal, float? scale, int window_left=-1, int window_right=-1, float softcap=0., Tensor? alibi_slopes=None, Tensor? sinks=None, bool? deterministic=None) -> (Tensor out, Tensor lse)
attention_varlen_bwd(Tensor dout, Tensor? dlse, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor cu_seqlens_q, Tensor cu_seqlens_k, SymInt max_seqlen_q, SymInt max_seqlen_k, bool causal, float? scale, int window_left=-1, int window_right=-1, float softcap=0., Tensor? alibi_slopes=None, Tensor? sinks=None, bool? deterministic=None) -> (Tensor dq, Tensor dk, Tensor dv, Tensor dsinks)
attention_with_kvcache(Tensor q, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor cache_seqlens, Tensor? k=None, Tensor? v=None, Tensor? block_table=None, bool causal=False, float? scale=None, int window_left=-1, int window_right=-1, float softcap=0., Tensor? alibi_slopes=None, Tensor? sinks=None, int num_splits=0, Tensor? cache_leftpad=None) -> (Tensor out, Tensor lse)""")

    def test_every_op_is_documented(self):
        for e in registry().values():
            self.assertGreater(len(e.doc.split()), 5, f"{e.name} needs a line of documentation")

    def test_the_users_op_keeps_trailing_defaults(self):
        """torch.ops.diyflash.attention(q, k, v) must keep working as the schema grows."""
        args = torch.ops.diyflash.attention.default._schema.arguments
        self.assertEqual([a.name for a in args[:3]], ["q", "k", "v"])
        for a in args[3:]:
            self.assertTrue(a.has_default_value(), f"argument {a.name} of diyflash::attention needs a default")


@pytest.mark.parametrize(
    "bad",
    [
        "attention(Tensor q) -> Tensor",  # no documentation
        "attention(Tensor q) -> Tensor  # doc\nattention(Tensor q) -> Tensor  # doc",  # listed twice
        "not an op  # doc",
    ],
)
def test_parse_rejects_malformed_registry(bad):
    with pytest.raises(ValueError, match="ops.txt"):
        parse_registry(bad)
