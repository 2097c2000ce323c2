"""verl's own ToolAgentLoop turns, per-turn content: each ``LLMServerClient.generate`` records only
what it appends (verl unchanged), and every turn's whole prompt rebuilds, token for token, from the
local store and from what the Weave exporter sent, equal to what verl's server received.

verl builds the worker, the agent loop, the hermes parser, the tool and ``LLMServerClient`` from its
own Hydra config; only the server actor is a local stand-in (``_harness.FakeServer``), which here
also notes the span each request arrived under. ``content_inline_bytes`` is small, so most deltas
are shown by their head and reach readers through the content store.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import _harness as h
import pytest
from opentelemetry import trace as otel_trace

from otel_verl import semconv
from otel_verl.store import read_spans
from otel_verl.store._content import ContentIndex, turn_prompts

GENERATE = "LLMServerClient.generate"


def _noting_spans(server: h.FakeServer) -> dict[str, list[int]]:
    """The prompt each request brought, by the (generate) span it was sent under."""
    received: dict[str, list[int]] = {}
    original = server.generate._fn

    async def generate(**kwargs: Any) -> Any:
        span_id = format(otel_trace.get_current_span().get_span_context().span_id, "016x")
        assert span_id not in received
        received[span_id] = list(kwargs["prompt_ids"])
        return await original(**kwargs)

    server.generate = h._Remote(generate)
    return received


def _run(tiny_model: Path, tmp_path: Path, **init: Any) -> dict[str, list[int]]:
    """verl's worker over samples 0-1, n=2, step 7 (all traced); otel_verl initialised first
    (verl's own init call then keeps it), with a small inline size."""
    import otel_verl

    otel_verl.RolloutTraceConfig.init("verl_it", "exp_it", content_inline_bytes=64,
                                      token2text=True, **init)
    config = h.compose_config(h.base_overrides(tiny_model, h.write_tool_config(tmp_path),
                                               {"backend": init["backend"], "token2text": True}))
    worker, server, _ = h.make_worker(config)
    received = _noting_spans(server)
    asyncio.run(worker.generate_sequences(h.make_batch([0, 1], step=7, n=2)))
    assert otel_verl.RolloutTraceConfig.shutdown(timeout_s=20)
    assert len(received) == len(server.calls) >= 8  # 4 trajectories, 2 turns each
    return received


def test_verl_turns_rebuild_from_the_store(tiny_model, tmp_path):
    trace_dir = tmp_path / "traces"
    received = _run(tiny_model, tmp_path, backend="file", trace_dir=str(trace_dir))
    spans = list(read_spans(trace_dir))
    generates = {s["span_id"]: s for s in spans if s["name"] == GENERATE}
    assert generates.keys() == received.keys()
    records = turn_prompts(spans, ContentIndex.load(trace_dir))
    assert {r["span_id"] for r in records} == generates.keys()
    for record in records:
        assert "error" not in record, record
        assert record["prompt"] == received[record["span_id"]], record["span_id"]
    attrs = [s["attributes"] for s in generates.values()]
    # every later turn extends the previous turn's prompt + answer, and records only the rest
    later = [a for a in attrs if semconv.CONTENT_BASE_ID in a]
    assert len(later) == len(attrs) // 2
    assert all(a[semconv.CONTENT_DELTA_LEN] < a[semconv.CONTENT_LEN] for a in later)
    assert any(a[semconv.CONTENT_INLINE] is False for a in attrs)  # the store has the rest
    # token2text (verl hands its tokenizer to the client) decodes what the turn appended only
    assert all("prompt_delta_text" in a[semconv.OUTPUT_VALUE] for a in later)
    assert not any("prompt_text" in a[semconv.OUTPUT_VALUE] for a in later)


def test_verl_turns_rebuild_from_weave(tiny_model, tmp_path, monkeypatch):
    pytest.importorskip("otel_weave_exporter", reason="needs exporters/weave")
    pytest.importorskip("weave.trace_server.sqlite_trace_server",
                        reason="needs weave[trace-server]==0.52.42 (requirements/verl.txt)")
    sys.path.insert(0, str(Path(__file__).parents[1] / "weave"))
    from _common import API_KEY
    from _weave_objects import WeaveObjectsShim

    monkeypatch.setenv("WANDB_API_KEY", API_KEY)
    monkeypatch.setenv("OTEL_EXPORTER_WEAVE_CONTENT_INLINE_BYTES", "64")  # objects, not inline
    with WeaveObjectsShim(str(tmp_path / "weave.sqlite"), API_KEY) as shim:
        received = _run(tiny_model, tmp_path, backend="weave", weave_entity="ent",
                        weave_base_url=shim.url, trace_dir=str(tmp_path / "traces"))
        calls = [c for c in shim.calls("ent/verl_it") if c.op_name == GENERATE]
        assert {c.id for c in calls} == received.keys()
        for c in calls:
            assert shim.prompt(c.inputs["prompt_ids"]) == received[c.id], c.id
        assert all(isinstance(c.inputs["prompt_ids"], dict) for c in calls)
        assert shim.object_rows() == len(shim.objects("ent/verl_it")) > 0
        assert all(r["status"] == 200 for r in shim.requests)


def test_the_content_store_is_written_out_after_each_chunk_of_rollouts(tiny_model, tmp_path):
    """verl's Ray actors end without exit hooks: the nodes must reach the file while the worker
    lives, without anyone calling flush (here: nobody does; the file is polled)."""
    import time

    import otel_verl
    from otel_verl._content import token_content_id

    trace_dir = tmp_path / "traces"
    otel_verl.RolloutTraceConfig.init("verl_it", "exp_it", backend="file",
                                      trace_dir=str(trace_dir))
    config = h.compose_config(h.base_overrides(tiny_model, h.write_tool_config(tmp_path),
                                               {"backend": "file"}))
    worker, server, _ = h.make_worker(config)
    received = _noting_spans(server)
    asyncio.run(worker.generate_sequences(h.make_batch([0, 1], step=7, n=2)))
    wanted = {token_content_id(p) for p in received.values()}
    deadline = time.monotonic() + 20
    while not wanted <= ContentIndex.load(trace_dir).nodes.keys():
        assert time.monotonic() < deadline, wanted - ContentIndex.load(trace_dir).nodes.keys()
        time.sleep(0.2)
