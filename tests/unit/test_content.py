"""Per-turn content ids, delta chains and the store reader (otel_verl._content,
otel_verl.store._content; docs/content.md), property-based: random sequences of appended,
edited, cut and repeated prompts, alone and in trajectories interleaved on one event loop."""

from __future__ import annotations

import asyncio
import hashlib
import json
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import otel_verl
from otel_verl import RolloutTraceConfig, _content, rollout_trace_attr, semconv
from otel_verl.store._content import ContentError, ContentIndex, turn_prompts
from otel_verl.testing import capture_spans

tokens = st.lists(st.integers(min_value=-(2**40), max_value=2**40), max_size=40)
#: one call's prompt from the previous one: append, edit inside, cut, or a new prompt
operation = st.one_of(
    st.tuples(st.just("append"), tokens),
    st.tuples(st.just("edit"), st.integers(min_value=0, max_value=10_000),
              st.integers(min_value=-5, max_value=5)),
    st.tuples(st.just("cut"), st.integers(min_value=0, max_value=10_000)),
    st.tuples(st.just("same"), st.just(None)),
    st.tuples(st.just("new"), tokens),
)


def _next(prompt: list[int], response: list[int], op: tuple) -> list[int]:
    kind, arg = op[0], op[1]
    full = prompt + response
    if kind == "append":
        return full + list(arg)
    if kind == "edit":
        if not full:
            return [op[2]]
        out = list(full)
        out[arg % len(out)] = out[arg % len(out)] + op[2] + 1  # always a change
        return out
    if kind == "cut":
        return full[: arg % (len(full) + 1)]
    if kind == "same":
        return list(prompt)
    return list(arg)


def test_ids_are_the_documented_hash_of_the_content():
    ids = [1, 22, -3, 2**40]
    expected = hashlib.sha256("".join(f"{t}," for t in ids).encode()).hexdigest()
    assert _content.token_content_id(ids) == "tok:sha256:" + expected
    assert _content.token_content_id([]) == "tok:sha256:" + hashlib.sha256(b"").hexdigest()
    # not plain ints: not delta-coded (a float, a bool, a big int, a string)
    for odd in ([1.0], [True], [2**70], ["1"], [[1]]):
        assert _content.token_bytes(odd) is None
    message = [{"role": "user", "content": "hi", "b": 1}]
    assert _content.message_content_id(message) == "msg:sha256:" + hashlib.sha256(
        b'{"b":1,"content":"hi","role":"user"}\n').hexdigest()


@settings(max_examples=200, deadline=None)
@given(first=tokens, ops=st.lists(st.tuples(operation, tokens), max_size=8))
def test_chain_steps_rebuild_exactly_and_extend_only_real_prefixes(first, ops):
    chain = _content.DeltaChain(_content.KIND_TOKENS)
    index = ContentIndex()
    prompt, response = list(first), []
    previous: list[int] | None = None
    previous_prompt: list[int] = []
    for op, answer in [(("new", first), [])] + ops:
        prompt = _next(prompt, response, op) if previous is not None else list(first)
        response = list(answer)
        step = chain.begin(prompt)
        assert step is not None
        assert step.id == _content.token_content_id(prompt)
        assert step.length == len(prompt)
        if step.base_id is not None:  # an extension is one: its base is a real prefix
            assert prompt[: step.base_len] in (previous, previous_prompt)
            assert step.delta == prompt[step.base_len:]
        else:
            assert step.delta == prompt
        if previous is not None and len(prompt) >= len(previous) and \
                prompt[: len(previous)] == previous:
            assert step.base_id is not None  # a real extension is always found
        _add(index, step)
        node = chain.finish(step.id, step.length, response, "00000000000000aa")
        if node is not None:
            assert node.id == _content.token_content_id(prompt + response)
            _add(index, node)
        assert index.rebuild(step.id) == prompt
        previous_prompt, previous = list(prompt), prompt + response


def _add(index: ContentIndex, step: _content.Step) -> None:
    """Through the store's own line format (what a reader finds on disk)."""
    if step.id == step.base_id:  # appends nothing: the base's node is this content's
        return
    index.nodes.pop(step.id, None)
    line = _content.node_line(_content.KIND_TOKENS, step)
    with tempfile.NamedTemporaryFile("wb", suffix=".nodes", delete=False) as f:
        f.write(line)
    index.read_file(f.name)
    assert step.id in index.nodes


def test_a_damaged_store_line_is_counted_and_a_broken_chain_is_an_error(tmp_path):
    folder = tmp_path / "content"
    folder.mkdir()
    good = {"id": "tok:sha256:" + "0" * 64, "kind": "tokens", "len": 2,
            "base": "tok:sha256:" + "1" * 64, "base_len": 1, "delta": [5]}
    (folder / "1-1.nodes").write_text(json.dumps(good) + "\n{half a line\n[1]\n")
    index = ContentIndex.load(tmp_path)
    assert index.bad_lines == 2
    try:
        index.rebuild(good["id"])
    except ContentError as exc:
        assert "missing" in str(exc)
    else:
        raise AssertionError("a chain without its base rebuilt")


@otel_verl.rollout_trace_op
async def generate(request_id, *, prompt_ids, sampling_params):
    await asyncio.sleep(0)
    return {"token_ids": sampling_params["answer"]}


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.lists(st.tuples(operation, tokens), min_size=1, max_size=5), min_size=1,
                max_size=3),
       st.lists(st.integers(min_value=0, max_value=3), max_size=20))
def test_interleaved_trajectories_rebuild_every_call_as_sent(scripts, yields):
    """Several trajectories on one loop, their calls interleaved by random yields; every
    recorded call's prompt rebuilds from the store exactly as it was passed."""
    with tempfile.TemporaryDirectory() as trace_dir:
        sent: dict[str, list[int]] = {}
        with capture_spans(trace_dir=trace_dir) as exporter:

            async def one(i: int, script: list) -> None:
                prompt: list[int] = [i]
                response: list[int] = []
                with rollout_trace_attr(step=1, sample_index=i):
                    for n, (op, answer) in enumerate(script):
                        prompt = _next(prompt, response, op) if n else list(prompt)
                        for _ in range(yields[(i + n) % len(yields)] if yields else 0):
                            await asyncio.sleep(0)
                        if not prompt:
                            prompt = [i]  # an empty prompt is not a prompt
                        sent[f"{i}/{n}"] = list(prompt)
                        out = await generate("r", prompt_ids=prompt,
                                             sampling_params={"answer": answer, "n": f"{i}/{n}"})
                        response = out["token_ids"]

            async def main() -> None:
                await asyncio.gather(*(one(i, s) for i, s in enumerate(scripts)))

            asyncio.run(main())
            RolloutTraceConfig.flush(10.0)
            spans = [_as_record(s) for s in exporter.get_finished_spans()]
        index = ContentIndex.load(trace_dir)
        prompts = {p["span_id"]: p for p in turn_prompts(spans, index)}
        calls = [s for s in spans if s["name"].endswith("generate")]
        assert len(calls) == len(sent)
        for span in calls:
            key = json.loads(span["attributes"][semconv.INPUT_VALUE])["sampling_params"]["n"]
            assert prompts[span["span_id"]]["prompt"] == sent[key]


def _as_record(span) -> dict:
    """An SDK span as the store's reader shapes it (what turn_prompts reads)."""
    parent = span.parent
    return {"span_id": format(span.context.span_id, "016x"), "name": span.name,
            "trace_id": format(span.context.trace_id, "032x"),
            "parent_span_id": format(parent.span_id, "016x") if parent else None,
            "start_ns": span.start_time, "attributes": dict(span.attributes)}
