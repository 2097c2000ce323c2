"""Per-turn content (issue 18, docs/content.md): every LLM call records what its prompt appends to
the trajectory's previous call, and every turn's whole prompt rebuilds from the store exactly as
the engine received it, token for token.

Real multi-turn trajectories: ``ToolAgentLoop`` -> ``VLLMCompletionsClient`` -> HTTP -> the engine
stub (scripted to call the calculator three times, then answer), 32k-token contexts, trajectories
interleaved on one event loop, the file backend writing a real store.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import logging

import pytest

import otel_verl
from otel_verl import RolloutTraceConfig, _content, rollout_trace_attr, semconv
from otel_verl.rollout.agent_loop import ToolAgentLoop
from otel_verl.rollout.clients import VLLMCompletionsClient
from otel_verl.rollout.reward import Gsm8kReward
from otel_verl.rollout.tools import CalculatorTool
from otel_verl.store import read_spans
from otel_verl.store._content import ContentError, ContentIndex, turn_prompts

from ._engine_stub import EngineStub
from ._scripted import CharTokenizer

CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "12*7"}}</tool_call>'
ANSWER = "The answer is #### 84"
CONTEXT = 32 * 1024


class ToolEngine(EngineStub):
    """The stub's ``/v1/completions``, scripted: a tool call until the prompt holds three tool
    responses, then the answer (decided from the prompt itself, so interleaving is harmless)."""

    def __init__(self, tokenizer: CharTokenizer, tool_turns: int = 3) -> None:
        super().__init__()
        self.tokenizer = tokenizer
        self.tool_turns = tool_turns

    def handle(self, path, headers, body):
        if path != "/v1/completions":
            return super().handle(path, headers, body)
        self.requests.append({"path": path, "headers": headers, "body": body,
                              "engine_traceparent": headers.get("traceparent")})
        done = self.tokenizer.decode(body["prompt"]).count("<tool_response>")
        text = CALL if done < self.tool_turns else ANSWER
        ids = self.tokenizer.encode(text) + [self.tokenizer.eos_token_id]
        return 200, {"id": "cmpl", "model": body["model"],
                     "choices": [{"index": 0, "text": text, "finish_reason": "stop",
                                  "token_ids": ids}],
                     "usage": {"prompt_tokens": len(body["prompt"]),
                               "completion_tokens": len(ids)}}


def _row(index: int, context: int = CONTEXT) -> dict:
    filler = ("Consider these worked examples of arithmetic. " * (context // 40 + 1))[:context]
    return {"raw_prompt": [{"role": "user", "content": f"{filler}\nWhat is 12*7? ({index})"}],
            "reward_model": {"ground_truth": "84"}}


async def _rollouts(engine: ToolEngine, rows: list[dict]) -> list:
    tokenizer = engine.tokenizer
    async with VLLMCompletionsClient(engine.url, model="stub") as client:
        loop = ToolAgentLoop(client, tokenizer, tools=[CalculatorTool()], reward_fn=Gsm8kReward(),
                             max_assistant_turns=4, max_user_turns=4,
                             max_response_length=4096)

        async def one(i: int, row: dict):
            with rollout_trace_attr(step=1, sample_index=i, rollout_n=0, name="agent_loop"):
                return await loop.run({"temperature": 1.0, "max_tokens": 256}, **row)

        return await asyncio.gather(*(one(i, row) for i, row in enumerate(rows)))


def _run(tmp_path, rows: list[dict], **options) -> tuple[ToolEngine, list[dict]]:
    RolloutTraceConfig.init("proj", "exp", "file", trace_dir=str(tmp_path), **options)
    with ToolEngine(CharTokenizer()) as engine:
        outs = asyncio.run(_rollouts(engine, rows))
    assert all(out.extra_fields["assistant_turns"] == 4 for out in outs)
    RolloutTraceConfig.shutdown(10.0)
    return engine, list(read_spans(str(tmp_path), warn=False))


def _sent_and_rebuilt(engine: ToolEngine, spans: list[dict], tmp_path) -> list[tuple]:
    """(what the engine received, what the store rebuilds) for every engine request, matched
    through the request's traceparent: the traced ``generate`` (or the chat span inside it)."""
    by_id = {s["span_id"]: s for s in spans}
    prompts = {p["span_id"]: p for p in turn_prompts(spans, ContentIndex.load(tmp_path))}
    pairs = []
    for request in engine.requests:
        span_id = request["engine_traceparent"].split("-")[2]
        if span_id not in prompts:  # the GenAI chat span inside the op: its parent is the op
            span_id = by_id[span_id]["parent_span_id"]
        pairs.append((request["body"]["prompt"], prompts.get(span_id, {}).get("prompt")))
    return pairs


def test_every_turn_rebuilds_token_for_token_at_32k_interleaved(tmp_path):
    rows = [_row(i) for i in range(3)]
    engine, spans = _run(tmp_path, rows)
    assert len(engine.requests) == 12  # 3 trajectories x 4 turns, interleaved on one loop
    for sent, rebuilt in _sent_and_rebuilt(engine, spans, tmp_path):
        assert len(sent) > CONTEXT
        assert rebuilt == sent  # token for token, whole (no cap cut in the middle)
    calls = [s for s in spans if semconv.CONTENT_ID in s["attributes"]]
    assert len(calls) == 12
    later = [s for s in calls if semconv.CONTENT_BASE_ID in s["attributes"]]
    assert len(later) == 9  # every call but each trajectory's first extends its previous one
    by_id = {s["span_id"]: s for s in spans}
    for span in later:
        attrs = span["attributes"]
        # the span carries what the turn added (the tool turn), never the 32k context again
        shown = json.loads(attrs[semconv.INPUT_VALUE])["prompt_ids"]
        assert attrs[semconv.CONTENT_INLINE] is True
        assert len(shown) == attrs[semconv.CONTENT_DELTA_LEN] < 200
        assert len(attrs[semconv.INPUT_VALUE]) < 2000
        base = by_id[attrs[semconv.CONTENT_BASE_SPAN_ID]]["attributes"]
        assert base[semconv.CONTENT_OUTPUT_ID] == attrs[semconv.CONTENT_BASE_ID]
        assert base[semconv.CONTENT_OUTPUT_LEN] == attrs[semconv.CONTENT_BASE_LEN]
        # the trajectory is the same one (the chain does not cross interleaved trajectories)
        assert base[semconv.ROLLOUT_SAMPLE_INDEX] == attrs[semconv.ROLLOUT_SAMPLE_INDEX]
    # the ids are the content's: what a trainer computes from the tokens it holds
    for sent, _ in _sent_and_rebuilt(engine, spans, tmp_path):
        assert _content.token_content_id(sent) in {s["attributes"][semconv.CONTENT_ID]
                                                   for s in calls}
    roots = [s for s in spans if s["attributes"].get(semconv.OTEL_VERL_TRAJECTORY)]
    assert all(semconv.CONTENT_PROMPT_ID in r["attributes"] for r in roots)


def test_shared_prompt_is_stored_once_and_edits_are_recorded_whole(tmp_path):
    """A GRPO group: n rollouts of one prompt store its content once; a prompt edited (not
    appended to) between turns is recorded whole, and both rebuild exactly."""
    RolloutTraceConfig.init("proj", "exp", "file", trace_dir=str(tmp_path))

    @otel_verl.rollout_trace_op
    def generate(request_id, *, prompt_ids, sampling_params):
        return {"token_ids": [7, 8, 9]}

    prompt = list(range(1000, 21000))
    sent = []
    for n in range(4):  # four rollouts of one prompt
        with rollout_trace_attr(step=1, sample_index=0, rollout_n=n):
            ids = list(prompt)
            sent.append(ids)
            generate("r", prompt_ids=ids, sampling_params={})
            ids = ids + [7, 8, 9] + [n, n]
            sent.append(ids)
            generate("r", prompt_ids=ids, sampling_params={})
            edited = list(ids)
            edited[10] = -1  # an edit inside the context, then an append
            edited += [5]
            sent.append(edited)
            generate("r", prompt_ids=edited, sampling_params={})
    stats = RolloutTraceConfig.stats()
    RolloutTraceConfig.shutdown(10.0)
    assert stats["content_dedup_hits"] >= 3  # the shared prompt (and its answer) once
    spans = list(read_spans(str(tmp_path), warn=False))
    prompts = turn_prompts(spans, ContentIndex.load(tmp_path))
    assert [p["prompt"] for p in prompts] == sent
    edits = [s for s in spans if semconv.CONTENT_ID in s["attributes"]
             and s["attributes"][semconv.CONTENT_LEN] == len(prompt) + 6]
    assert len(edits) == 4
    assert all(semconv.CONTENT_BASE_ID not in s["attributes"] for s in edits)
    store_bytes = sum(len(gzip.decompress(p.read_bytes()))  # inflated: gzip members
                      for p in (tmp_path / "content").iterdir())
    whole = len(json.dumps(prompt, separators=(",", ":")))
    # the shared prompt once (not 4 times), each rollout's edited prompt whole: 5 copies
    assert 5 * whole < store_bytes < 5.2 * whole


def test_a_full_content_store_is_counted_said_and_never_silently_wrong(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="otel_verl")
    rows = [_row(0, 4096)]
    engine, spans = _run(tmp_path, rows, content_store_bytes=2048)
    calls = [s for s in spans if semconv.CONTENT_ID in s["attributes"]]
    assert calls[0]["attributes"][semconv.CONTENT_STORED] == "missing"
    assert "content store is full" in caplog.text
    assert RolloutTraceConfig.stats()["content_dropped"] >= 1
    # and the shutdown's loss report sums it up, with the spans' delivery losses
    assert "not all payload content reached the content store" in caplog.text
    assert "'content_dropped': " in caplog.text
    index = ContentIndex.load(tmp_path)
    with pytest.raises(ContentError, match="missing"):
        index.rebuild(calls[0]["attributes"][semconv.CONTENT_ID])
    prompts = turn_prompts(spans, index)
    assert all("error" in p for p in prompts)  # every turn says why, none rebuilds wrong
    assert all("prompt" not in p for p in prompts)


def test_content_dedup_off_records_whole_prompts_as_before(tmp_path):
    engine, spans = _run(tmp_path, [_row(0, 2048)], content_dedup=False)
    assert not any(semconv.CONTENT_ID in s["attributes"] for s in spans)
    assert not (tmp_path / "content").exists()
    ops = [s for s in spans if s["name"].endswith("generate")]
    last = json.loads(ops[-1]["attributes"][semconv.INPUT_VALUE])["prompt_ids"]
    assert last == engine.requests[-1]["body"]["prompt"]


def test_token2text_decodes_only_what_each_turn_added(tmp_path):
    RolloutTraceConfig.init("proj", "exp", "file", trace_dir=str(tmp_path), token2text=True)
    tokenizer = CharTokenizer()
    with ToolEngine(tokenizer) as engine:

        async def go():
            async with VLLMCompletionsClient(engine.url, model="stub",
                                             tokenizer=tokenizer) as client:
                loop = ToolAgentLoop(client, tokenizer, tools=[CalculatorTool()],
                                     max_response_length=4096)
                with rollout_trace_attr(step=1, sample_index=0):
                    await loop.run({"max_tokens": 256}, **_row(0, 8192))

        asyncio.run(go())
    RolloutTraceConfig.shutdown(10.0)
    spans = list(read_spans(str(tmp_path), warn=False))
    calls = sorted((s for s in spans if semconv.CONTENT_ID in s["attributes"]),
                   key=lambda s: s["start_ns"])
    assert len(calls) == 4
    for span, request in zip(calls[1:], engine.requests[1:], strict=True):
        output = json.loads(span["attributes"][semconv.OUTPUT_VALUE])
        base_len = span["attributes"][semconv.CONTENT_BASE_LEN]
        assert "prompt_text" not in output
        assert output["prompt_delta_text"] == tokenizer.decode(request["body"]["prompt"][base_len:])
        assert len(output["prompt_delta_text"]) < 200
