"""The content store under SIGKILL: a node put more than one write interval before the kill is on
disk (each batch is flushed to the OS), and the next reader rebuilds every such node exactly."""

from __future__ import annotations

import textwrap
from pathlib import Path

from _killed_child import run_killed

from otel_verl import _content
from otel_verl.store._content import ContentIndex

CHILD = textwrap.dedent("""
    import os, signal, sys, time
    from otel_verl import _content
    store = _content.store_for(sys.argv[1], max_bytes=1 << 30, redact=False)
    for i in range(200):
        ids = list(range(i * 1000, i * 1000 + 512))
        step = _content.root_step(_content.KIND_TOKENS, ids)
        store.put(_content.KIND_TOKENS, step)
    time.sleep(4 * _content.WRITE_EVERY_S + 0.5)  # well past one write interval
    print("put", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
""")


def test_nodes_written_before_a_sigkill_survive_it(tmp_path: Path) -> None:
    run_killed(CHILD, tmp_path, "put")
    index = ContentIndex.load(tmp_path)
    assert index.bad_lines == 0
    for i in range(200):
        ids = list(range(i * 1000, i * 1000 + 512))
        content_id = _content.token_content_id(ids)
        assert content_id in index.nodes, f"node {i} lost to the SIGKILL"
    assert len(index.nodes) == 200
