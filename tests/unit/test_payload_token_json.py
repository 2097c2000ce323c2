"""A prompt's delta is rendered into ``input.value`` from the bytes its hash was computed over
(``_payload.TokenJSON``, an orjson ``Fragment``), not checked and encoded a second time on the
loop (issue 18: each unique content handled once). The text is exactly what the list itself
renders to, on the fast path and through the walk (a payload over its cap), and a call's prompt
still rebuilds from the span."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

import otel_verl
from otel_verl import RolloutTraceConfig, _capture, _content, _payload, rollout_trace_attr, semconv
from otel_verl._payload import fast_json, to_payload, token_json, walk_payload
from otel_verl.testing import capture_spans

IDS = st.lists(st.integers(min_value=0, max_value=2**63 - 1), max_size=300)


@settings(max_examples=300, deadline=None)
@given(ids=IDS, limit=st.one_of(st.none(), st.integers(min_value=0, max_value=4000)),
       cap=st.sampled_from([256, 1024, 65536]))
def test_token_json_renders_as_its_ids(ids: list[int], limit: int | None, cap: int) -> None:
    encoded = _content.token_bytes(ids)
    assert encoded is not None
    token = token_json(ids, encoded, limit)
    expected = ids if limit is None else ids[: encoded.count(b",", 0, limit)]
    value = {"request_id": "r", "prompt_ids": token, "sampling_params": {"t": 1.0}}
    plain = {"request_id": "r", "prompt_ids": expected, "sampling_params": {"t": 1.0}}
    want = to_payload(plain, max_bytes=cap).json
    assert to_payload(value, max_bytes=cap).json == want
    assert walk_payload(value, cap, True).json == walk_payload(plain, cap, True).json
    fast = fast_json(value, cap, True)
    if fast is not None:
        assert json.loads(fast) == plain


def test_a_delta_is_not_checked_again_on_the_loop(monkeypatch) -> None:
    checked: list[int] = []
    only_ints = _payload._only_ints

    def counting(items: Any) -> bool:
        checked.append(len(items))
        return only_ints(items)

    monkeypatch.setattr(_payload, "_only_ints", counting)

    @otel_verl.rollout_trace_op
    async def generate(request_id: str, *, prompt_ids: list[int]) -> dict:
        await asyncio.sleep(0)
        return {"ok": True}

    sent: list[list[int]] = []
    with capture_spans() as exporter:

        async def main() -> None:
            prompt = list(range(5000, 8000))
            with rollout_trace_attr(step=1, sample_index=0):
                for turn in range(3):
                    sent.append(list(prompt))
                    await generate("r", prompt_ids=prompt)
                    prompt += list(range(100 * turn, 100 * turn + 250))

        asyncio.run(main())
        RolloutTraceConfig.flush(10.0)
        calls = sorted((s for s in exporter.get_finished_spans()
                        if s.name.endswith("generate")),
                       key=lambda s: s.start_time)
    assert not [n for n in checked if n >= 250], checked
    shown = [json.loads(s.attributes[semconv.INPUT_VALUE])["prompt_ids"] for s in calls]
    assert shown[0] == sent[0][: len(shown[0])] and len(shown[0]) > 100  # turn 1: its head
    for turn in (1, 2):  # then what each turn appended, as it was sent
        assert shown[turn] == sent[turn][len(sent[turn - 1]):]
        assert calls[turn].attributes[semconv.CONTENT_DELTA_LEN] == 250
    assert _capture.PLACEHOLDER_PREFIX not in "".join(
        str(s.attributes.get(semconv.INPUT_VALUE)) for s in calls)
