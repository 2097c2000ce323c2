"""Per-turn content of messages and of the agent loop's own output (docs/content.md): each
turn's ``gen_ai.input.messages`` holds the messages it appended, and the loop's returned lists
point into the trajectory's content instead of repeating it; all of it resolves exactly."""

from __future__ import annotations

import asyncio
import gzip
import json

from otel_verl import RolloutTraceConfig, semconv
from otel_verl.store import read_spans
from otel_verl.store._content import ContentIndex, resolve_refs

from ._scripted import CharTokenizer
from .test_content_turns import ToolEngine, _rollouts, _row, _run


def test_agent_output_and_messages_refer_to_the_store_and_resolve_exactly(tmp_path):
    """The agent loop's own output (prompt_ids, response_ids, the message list) points into the
    trajectory's content instead of repeating it; each turn's ``gen_ai.input.messages`` holds the
    messages it appended; every reference resolves to exactly what the loop returned."""
    RolloutTraceConfig.init("proj", "exp", "file", trace_dir=str(tmp_path))
    with ToolEngine(CharTokenizer()) as engine:
        [out] = asyncio.run(_rollouts(engine, [_row(0, 8192)]))
    RolloutTraceConfig.shutdown(10.0)
    spans = list(read_spans(str(tmp_path), warn=False))
    index = ContentIndex.load(tmp_path)
    [run] = [s for s in spans if s["name"] == "ToolAgentLoop.run"]
    assert run["attributes"][semconv.CONTENT_REFS] >= 3
    recorded = json.loads(run["attributes"][semconv.OUTPUT_VALUE])
    assert "$content" in recorded["prompt_ids"] and "$content" in recorded["response_ids"]
    assert len(run["attributes"][semconv.OUTPUT_VALUE]) < 4096  # not the 8k context again
    resolved = resolve_refs(recorded, index)
    assert resolved["prompt_ids"] == out.prompt_ids
    assert resolved["response_ids"] == out.response_ids
    assert resolved["extra_fields"]["messages"] == out.extra_fields["messages"]
    calls = sorted((s for s in spans if semconv.CONTENT_MESSAGES_ID in s["attributes"]),
                   key=lambda s: s["start_ns"])
    assert len(calls) == 4
    for n, span in enumerate(calls):
        attrs = span["attributes"]
        shown = json.loads(attrs[semconv.GEN_AI_INPUT_MESSAGES])
        sent = out.extra_fields["messages"][: attrs[semconv.CONTENT_MESSAGES_LEN]]
        assert index.rebuild(attrs[semconv.CONTENT_MESSAGES_ID]) == sent
        if n:  # an assistant turn and a tool turn appended, not the whole history again
            assert attrs[semconv.CONTENT_MESSAGES_BASE_LEN] == len(sent) - 2
            assert [m["role"] for m in shown] == ["assistant", "tool"]


def test_the_content_store_is_scrubbed_once_per_unique_content(tmp_path):
    """Redaction before anything leaves the process, the content store included: a secret in
    the user's message is in no store line and no span, and it is scrubbed once per unique
    node (the store's counter), not once per turn that repeats it."""
    secret = "sk-" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4"
    row = _row(0, 2048)
    row["raw_prompt"][0]["content"] += f" my key is {secret}"
    engine, spans = _run(tmp_path, [row])
    stats = RolloutTraceConfig.stats()
    store = b"".join(gzip.decompress(p.read_bytes()) if p.name.endswith(".gz") else p.read_bytes()
                     for p in (tmp_path / "content").iterdir())  # inflated: gzip members
    assert secret.encode() not in store and b"[REDACTED]" in store
    assert stats["content_redacted"] == 1  # the message, once (4 turns carry it)
    assert all(secret not in json.dumps(s["attributes"]) for s in spans)
