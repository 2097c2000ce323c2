"""A content index fed node by node, as a reader sees the store (for the delta-chain tests)."""

from __future__ import annotations

import tempfile

from otel_verl import _content
from otel_verl._content import KIND_TOKENS
from otel_verl.store._content import ContentIndex


def add_node(index: ContentIndex, step: _content.Step, kind: str = KIND_TOKENS) -> None:
    """Write ``step``'s node line and read it into ``index`` (a step that appends nothing is its
    base: nothing to add)."""
    if step.id == step.base_id:
        return
    index.nodes.pop(step.id, None)
    with tempfile.NamedTemporaryFile("wb", suffix=".nodes", delete=False) as f:
        f.write(_content.node_line(kind, step))
    index.read_file(f.name)
