"""The Weave exporter's per-turn content on its own (no Weave): otel_verl's delta chains in,
object segments out, every prompt rebuilt exactly from what would be sent.

Property-based: random turn sequences (appends, edits, cut prompts, repeats, answers the output
does or does not show, deltas shown whole or by their head) through otel_verl's own
``DeltaChain``, with a memory too small to hold the chains (so bases come from the content
store), and a store that lost some nodes (those calls must say so, never invent content).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_weave_exporter import _conventions as c
from otel_weave_exporter._content_objects import (
    ContentCalls,
    ContentObjects,
    NodeReader,
    object_name,
    weave_digest,
)

_content = pytest.importorskip("otel_verl._content", reason="needs the otel_verl core")


class Store:
    """otel_verl's content store as the exporter reads it (a dict; ``lost`` ids are missing)."""

    def __init__(self) -> None:
        self.nodes: dict[str, dict[str, Any]] = {}
        self.lost: set[str] = set()

    def put(self, step: Any) -> None:
        self.nodes.setdefault(step.id, {"id": step.id, "kind": "tokens", "len": step.length,
                               "base": step.base_id, "base_len": step.base_len,
                               "delta": list(step.delta)})

    def node(self, node_id: str) -> dict[str, Any] | None:
        return None if node_id in self.lost else self.nodes.get(node_id)


def _sent(objects: ContentObjects) -> dict[str, Any]:
    """What the queued /obj/create bodies hold, by ref URI (and mark them published)."""
    out = {}
    for obj in objects.pending():
        body = json.loads(obj.body)["obj"]
        assert body["expected_digest"] == weave_digest(body["val"]) == obj.digest
        out[objects.uri(body["object_id"], obj.digest)] = body["val"]
        objects.done(obj)
    return out


def _rebuild(field: Any, values: dict[str, Any]) -> list[int]:
    if isinstance(field, list):
        return field
    out: list[int] = []
    for seg in field["segments"]:
        if isinstance(seg, list):
            out.extend(seg)
        elif isinstance(seg, str):
            out.extend(values[seg]["items"])
        else:
            first = seg.get("start", 0)
            out.extend(values[seg["ref"]]["items"][first:first + seg["len"]])
    return out


tokens = st.lists(st.integers(0, 200_000), max_size=40)
turn = st.tuples(
    st.sampled_from(["append", "append", "append", "edit", "cut", "repeat", "fresh"]),
    tokens,                      # what the turn appends (or the fresh prompt)
    tokens,                      # the engine's answer
    st.booleans(),               # the output shows the answer
    st.booleans(),               # the delta is shown whole (else by its head)
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(first=st.lists(st.integers(0, 200_000), min_size=1, max_size=600),
       turns=st.lists(turn, min_size=1, max_size=8), memory=st.integers(1, 6),
       inline_max=st.sampled_from([16, 256, 2048]))
def test_every_prompt_rebuilds_from_what_would_be_sent(first, turns, memory, inline_max):
    store = Store()
    objects = ContentObjects("ent", "proj")
    calls = ContentCalls(objects, store, inline_max_bytes=inline_max, max_nodes=memory)  # type: ignore[arg-type]
    chain = _content.DeltaChain(_content.KIND_TOKENS)
    prompt = list(first)
    values: dict[str, Any] = {}
    for index, (how, added, answer, shows_answer, whole) in enumerate(turns):
        step = chain.begin(prompt)
        store.put(step)
        attrs: dict[str, Any] = {
            c.CONTENT_ID: step.id, c.CONTENT_LEN: step.length, c.CONTENT_KIND: "tokens",
            c.CONTENT_FIELD: "prompt_ids", c.CONTENT_DELTA_LEN: len(step.delta),
            c.CONTENT_INLINE: whole,
        }
        if step.base_id is not None:
            attrs.update({c.CONTENT_BASE_ID: step.base_id, c.CONTENT_BASE_LEN: step.base_len,
                          c.CONTENT_BASE_SPAN_ID: f"{index:016x}"})
        node = chain.finish(step.id, step.length, answer, f"{index + 1:016x}")
        if node is not None:
            store.put(node)
            attrs.update({c.CONTENT_OUTPUT_ID: node.id, c.CONTENT_OUTPUT_LEN: node.length})
        inputs = {"request_id": "r", "prompt_ids": list(step.delta) if whole
                  else list(step.delta[:3])}
        output = {"token_ids": answer} if shows_answer else {"text": "?"}
        assert calls.rewrite(inputs, output, attrs)
        values.update(_sent(objects))
        assert _rebuild(inputs["prompt_ids"], values) == prompt, (index, inputs)
        field = inputs["prompt_ids"]
        if isinstance(field, dict):  # a large prompt: only its own delta may be inline
            inline = sum(len(s) for s in field["segments"] if isinstance(s, list))
            assert inline <= len(step.delta)
        else:
            assert len(json.dumps(prompt, separators=(",", ":"))) <= inline_max
        full = prompt + answer
        if how == "append":
            prompt = full + added
        elif how == "edit" and full:
            prompt = [full[0] + 1, *full[1:], *added]
        elif how == "cut":
            prompt = prompt + added  # drops the answer: extends the prompt only
        elif how == "repeat":
            prompt = list(prompt)
        else:
            prompt = list(added) or [1]


def test_a_lost_base_is_said_never_invented():
    store = Store()
    calls = ContentCalls(ContentObjects("ent", "proj"), store,  # type: ignore[arg-type]
                         inline_max_bytes=16, max_nodes=1)
    chain = _content.DeltaChain(_content.KIND_TOKENS)
    prompts = [list(range(100)), list(range(100)) + [7, 8] + [9]]
    results = []
    for i, prompt in enumerate(prompts):
        step = chain.begin(prompt)
        store.put(step)
        node = chain.finish(step.id, step.length, [7, 8], f"{i:016x}")
        store.put(node)
        if i == 0:
            store.lost.update({step.id, node.id})  # over the store's budget: never written
            calls._nodes.clear()
        attrs = {c.CONTENT_ID: step.id, c.CONTENT_LEN: step.length, c.CONTENT_KIND: "tokens",
                 c.CONTENT_FIELD: "prompt_ids", c.CONTENT_DELTA_LEN: len(step.delta),
                 c.CONTENT_INLINE: True}
        if step.base_id:
            attrs.update({c.CONTENT_BASE_ID: step.base_id, c.CONTENT_BASE_LEN: step.base_len})
        inputs = {"prompt_ids": list(step.delta)}
        results.append((calls.rewrite(inputs, {}, attrs), inputs["prompt_ids"]))
    ok, field = results[1]
    assert not ok and field["complete"] is False and field["delta"] == [9]
    assert field["extends"]["length"] == 102
    assert calls.stats["incomplete"] == 1


def test_object_queue_is_bounded_and_names_are_valid():
    objects = ContentObjects("ent", "proj", max_pending_bytes=300)
    assert objects.ref("tok:blake2b-128:ab", {"items": [1]}) is not None
    assert objects.ref("tok:blake2b-128:cd", {"items": list(range(200))}) is None  # full
    assert object_name("tok:blake2b-128:ab/ c") == "otel_verl_content-tok_blake2b-128_ab__c"
    assert len(object_name("x" * 500)) == 128


def test_node_reader_reads_whole_lines_as_the_store_grows(tmp_path):
    flushed = []
    path = tmp_path / "1-2.nodes"
    reader = NodeReader(str(tmp_path), flush=lambda: flushed.append(1))
    line = json.dumps({"base": None, "base_len": 0, "id": "tok:blake2b-128:aa", "kind": "tokens",
                       "len": 2, "delta": [1, 2]}, separators=(",", ":"))
    path.write_text(line[:30])  # a line still being written
    assert reader.node("tok:blake2b-128:aa") is None and flushed == [1]
    path.write_text(line + "\n" + "not json\n")
    assert reader.node("tok:blake2b-128:aa")["delta"] == [1, 2]


@settings(max_examples=80, deadline=None)
@given(prompt=st.lists(st.integers(0, 9), min_size=1, max_size=400),
       answers=st.lists(st.lists(st.integers(0, 9), min_size=1, max_size=60), min_size=1,
                        max_size=4),
       extra=st.lists(st.integers(0, 9), max_size=30), inline_max=st.sampled_from([16, 4096]))
def test_payload_references_resolve_to_the_lists_they_stand_for(prompt, answers, extra,
                                                               inline_max):
    """The agent loop's returned prompt_ids/response_ids as otel_verl codes them (references
    into the trajectory's chain: a prefix plus a delta, or a slice) come back exactly."""
    store = Store()
    objects = ContentObjects("ent", "proj")
    calls = ContentCalls(objects, store, inline_max_bytes=inline_max,  # type: ignore[arg-type]
                         max_nodes=2)
    chain = _content.DeltaChain(_content.KIND_TOKENS)
    ids = list(prompt)
    for index, answer in enumerate(answers):
        step = chain.begin(ids)
        store.put(step)
        node = chain.finish(step.id, step.length, answer, f"{index:016x}")
        if node is not None:
            store.put(node)
        ids = ids + answer
    values: dict[str, Any] = {}
    for whole in (ids + extra, ids[len(prompt):]):
        ref = chain.reference(whole)
        if ref is None:
            continue
        shown = calls.resolve({"response_ids": ref, "n": 1})
        values.update(_sent(objects))
        field = shown["response_ids"]
        assert shown["n"] == 1
        assert _rebuild(field, values) == whole, (ref, field)
        if isinstance(field, dict):
            assert field["length"] == len(whole)
    store.lost.update(store.nodes)
    calls._nodes.clear()
    ref = chain.reference(ids)
    assert ref is None or calls.resolve(ref) == ref  # unknown: kept as it is, counted


def _calls(recorder: Any) -> list[dict[str, Any]]:
    return [call for r in recorder.requests if r["path"].endswith("/calls/complete")
            for call in json.loads(r["body"])["batch"]]


def _llm_span(tracer: Any, prompt: list[int], node_id: str) -> None:
    attrs = {c.CONTENT_ID: node_id, c.CONTENT_LEN: len(prompt), c.CONTENT_KIND: "tokens",
             c.CONTENT_FIELD: "prompt_ids", c.CONTENT_DELTA_LEN: len(prompt),
             c.CONTENT_INLINE: True, "input.value": json.dumps({"prompt_ids": prompt}),
             "input.mime_type": "application/json"}
    with tracer.start_as_current_span("Server.generate", attributes=attrs):
        pass


def test_objects_go_before_their_calls_and_a_failed_one_is_sent_with_the_next_export(
        recorder, monkeypatch):
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    from otel_weave_exporter import WeaveSpanExporter

    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    exporter = WeaveSpanExporter(project="ent/proj", base_url=recorder.url, timeout_s=2,
                                 backoff_initial_s=0.01)
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("t")
    recorder.statuses = [401]  # the first object request is refused (not as invalid)
    _llm_span(tracer, list(range(2000)), "tok:blake2b-128:aa")
    paths = [r["path"] for r in recorder.requests]
    assert paths == ["/obj/create", "/v2/ent/proj/calls/complete"]  # the call still goes
    (call,) = _calls(recorder)
    (ref,) = call["inputs"]["prompt_ids"]["segments"]
    assert exporter.content_stats()["object_rounds_failed"] == 1
    _llm_span(tracer, [1, 2, 3], "tok:blake2b-128:bb")  # small: inline, no object of its own
    paths = [r["path"] for r in recorder.requests]
    assert paths[2:] == ["/obj/create", "/v2/ent/proj/calls/complete"]  # the queued one first
    sent = json.loads(recorder.requests[2]["body"])["obj"]
    assert ref.endswith(f"/object/{sent['object_id']}:{sent['expected_digest']}")
    assert sent["val"]["items"] == list(range(2000))
    assert _calls(recorder)[1]["inputs"]["prompt_ids"] == [1, 2, 3]
    assert exporter.content_stats()["objects_sent"] == 1
    provider.shutdown()
