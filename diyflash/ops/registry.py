"""Reads csrc_registry/ops.txt, the single source of truth for the diyflash:: schemas.

An installed wheel carries the file as the package `diyflash._registry` (pyproject's package-dir
mapping; an editable install maps it too); a bare source checkout on sys.path reads it from the
repository's top level.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

NAMESPACE = "diyflash"
REGISTRY_FILE = "ops.txt"


@dataclass(frozen=True)
class OpEntry:
    name: str  # e.g. "attention_fwd"
    schema: str  # e.g. "attention_fwd(Tensor q, ...) -> (Tensor out, Tensor lse)"
    doc: str

    @property
    def qualname(self) -> str:
        return f"{NAMESPACE}::{self.name}"

    @property
    def signature(self) -> str:
        """The schema without its name, as torch.library.custom_op(schema=...) takes it."""
        return self.schema[len(self.name):]


def registry_text() -> str:
    try:
        return resources.files(f"{NAMESPACE}._registry").joinpath(REGISTRY_FILE).read_text()
    except ModuleNotFoundError:
        source_tree = Path(__file__).resolve().parents[2] / "csrc_registry" / REGISTRY_FILE
        return source_tree.read_text()


def parse_registry(text: str) -> dict[str, OpEntry]:
    entries: dict[str, OpEntry] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        schema, sep, doc = line.partition("  # ")
        name = schema.split("(", 1)[0]
        if not sep or not doc.strip() or not name.isidentifier():
            raise ValueError(f"{REGISTRY_FILE}:{lineno}: expected '<name>(<args>) -> <ret>  # <doc>', got {raw!r}")
        if name in entries:
            raise ValueError(f"{REGISTRY_FILE}:{lineno}: operator {name!r} is listed twice")
        entries[name] = OpEntry(name, schema.strip(), doc.strip())
    return entries


@functools.cache
def registry() -> dict[str, OpEntry]:
    return parse_registry(registry_text())


def entry(name: str) -> OpEntry:
    return registry()[name]
