"""The README is a manual (at most ~300 lines, the seven calls first) and its speed table is rendered from
its results file, not typed: the two cannot drift. Every docs/ page it links exists."""

import json
import re
from pathlib import Path

from bench.attention import readme_table

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_readme_is_a_manual():
    lines = README.splitlines()
    assert len(lines) <= 300, len(lines)
    head = "\n".join(lines[:150])
    for call in ("flash_attention(", "flash_attention_varlen(", "flash_attention_with_kvcache(",
                 "scaled_dot_product_attention(", "ATTN_IMPLEMENTATION", "ring_attention(", "triton_matmul("):
        assert call in head, call


def test_readme_speed_table_is_rendered_from_its_results_file():
    match = re.search(r"<!-- speed table: (\S+) -->\n(.*?)\n<!-- end speed table -->", README, re.S)
    assert match, "the README's speed table markers"
    rows = [json.loads(line) for line in (ROOT / match.group(1)).read_text().splitlines() if line.strip()]
    assert match.group(2) == readme_table(rows)


def test_linked_docs_exist():
    for link in re.findall(r"\]\(((?:docs/)?[\w./-]+\.md)\)", README):
        assert (ROOT / link).exists(), link


def test_performance_tables_are_rendered_from_their_results_files():
    """docs/performance.md's, docs/api.md's and docs/integrations.md's tables are python -m bench.docs's output:
    each marked table equals its results file's rendering (and there are tables to check)."""
    from bench.docs import DOC, DOCS, render

    assert DOC.read_text().count("<!-- table: ") >= 6
    assert "<!-- table: determinism -->" in (ROOT / "docs" / "api.md").read_text()
    assert "<!-- table: hf-model -->" in (ROOT / "docs" / "integrations.md").read_text()
    for doc in DOCS:
        text = doc.read_text()
        assert render(text) == text, f"{doc.name}: run python -m bench.docs"


def test_render_replaces_a_stale_table():
    from bench.docs import render

    stale = "intro\n<!-- table: coldstart -->\n| old | numbers |\n<!-- end table -->\nafter\n"
    fresh = render(stale)
    assert "| old | numbers |" not in fresh and "bench/results/coldstart_h200.jsonl" in fresh
    assert fresh.startswith("intro\n") and fresh.endswith("after\n") and render(fresh) == fresh
