"""A long response (a reasoning trace of thousands of tokens) is stored once (issue 18: store
bytes against the unique content). Its output's ``token_ids`` referred to a node of its own,
hashed on the loop and stored beside the response node that the next turn extends: the same
tokens twice. The response now joins the chain before the output is rendered, and the output
refers to that node; every turn's prompt and every output still resolve exactly."""

from __future__ import annotations

import asyncio
import json

import otel_verl
from otel_verl import RolloutTraceConfig, _content, rollout_trace_attr, semconv
from otel_verl.rollout.clients import TokenOutput
from otel_verl.store._content import ContentIndex, resolve_refs
from otel_verl.testing import capture_spans

ANSWERS = {0: list(range(100, 5100)), 1: list(range(7, 40)), 2: list(range(9000, 12000))}


@otel_verl.rollout_trace_op
async def generate(request_id: str, *, prompt_ids: list[int], sampling_params: dict
                   ) -> TokenOutput:
    await asyncio.sleep(0)
    return TokenOutput(token_ids=list(ANSWERS[sampling_params["turn"]]), finish_reason="stop")


def test_a_long_response_is_stored_once_and_resolves(tmp_path) -> None:
    sent: list[list[int]] = []
    with capture_spans(trace_dir=str(tmp_path)) as exporter:

        async def main() -> None:
            prompt = list(range(3000))
            with rollout_trace_attr(step=1, sample_index=0):
                for turn in range(3):
                    sent.append(list(prompt))
                    out = await generate("r", prompt_ids=prompt, sampling_params={"turn": turn})
                    prompt += out.token_ids + [1, 2, 3]  # the answer, then a tool's tokens

        asyncio.run(main())
        RolloutTraceConfig.flush(10.0)
        calls = sorted((s for s in exporter.get_finished_spans() if s.name == "generate"),
                       key=lambda s: s.start_time)
        outputs = [json.loads(s.attributes[semconv.OUTPUT_VALUE]) for s in calls]
    _content.flush_all(10.0)
    index = ContentIndex.load(str(tmp_path))
    for turn, output in enumerate(outputs):
        assert resolve_refs(output, index)["token_ids"] == ANSWERS[turn]
    assert outputs[1]["token_ids"] == ANSWERS[1]  # a short answer stays inline
    for turn in (0, 2):  # a long one refers to the response node the next prompt extends
        ref = outputs[turn]["token_ids"]
        assert ref["$content"] == calls[turn].attributes[semconv.CONTENT_OUTPUT_ID]
        assert ref["start"] == len(sent[turn]) and ref["len"] == len(ANSWERS[turn])
    # every long answer's tokens are in the store once: no node holds them apart from the
    # response nodes (the prompt nodes extend those)
    for answer in (ANSWERS[0], ANSWERS[2]):
        holders = [node for node in index.nodes.values()
                   if answer[:50] == list(node.delta[:50])]
        assert len(holders) == 1, [(node.id, node.base) for node in holders]
