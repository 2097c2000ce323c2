"""Context-long free text (a trajectory's question at 128k tokens, a tool's long result) is
capped on the event loop in O(cap) and scanned for secrets once, on the export thread (issue 18:
nothing proportional to the context on the loop; redaction once per content). Its secrets still
never leave the process, a secret cut by the cap included, and the loop never scans it."""

from __future__ import annotations

import asyncio
import json
import pathlib
import threading

import pytest

import otel_verl
from otel_verl import RolloutTraceConfig, _payload, rollout_trace_attr, semconv
from otel_verl._capture import cap_text
from otel_verl.exporters import _scrub
from otel_verl.rollout.tools import BaseTool, ToolResponse
from otel_verl.testing import capture_spans

SECRET = "sk-" + "Zq8Xw7Vu6Ts5Rq4Po3Nm2Lk1Jh0Gf9"
CAP = 4096


class _Echo(BaseTool):
    name = "echo"

    async def _run(self, arguments: dict) -> ToolResponse:
        return ToolResponse(text=arguments["text"])


def _question() -> str:
    filler = "Consider the following worked examples of arithmetic carefully. " * 2100
    # one secret near the start, one that the cap cuts in two
    head = f"my key is {SECRET}. " + filler[: CAP - 40]
    return head + SECRET + filler + "\nWhat is 12*7?"


def _exported_bytes(root: pathlib.Path) -> bytes:
    return b"".join(p.read_bytes() for p in root.rglob("*") if p.is_file())


def test_a_context_long_question_is_capped_on_the_loop_and_scrubbed_at_export(
        tmp_path, monkeypatch) -> None:
    question = _question()
    assert len(question) > 30 * CAP
    scans: list[tuple[str, int]] = []
    real = _scrub.scrub

    def recording(text, extra=()):
        scans.append((threading.current_thread().name, len(text)))
        return real(text, extra)

    monkeypatch.setattr(_scrub, "scrub", recording)
    monkeypatch.setattr(_payload, "scrub", recording)
    tool = _Echo()
    with capture_spans(trace_dir=str(tmp_path), max_field_bytes=CAP, processor="batch",
                       schedule_delay_s=0.05) as exporter:

        async def main() -> None:
            with rollout_trace_attr(step=1, sample_index=0, name="agent_loop"):
                otel_verl.set_trajectory_input(question)
                await tool.execute("c1", {"text": question})

        loop_thread = threading.current_thread().name
        asyncio.run(main())
        RolloutTraceConfig.flush(10.0)
        spans = list(exporter.get_finished_spans())
    root = next(s for s in spans if s.name == "agent_loop")
    shown = root.attributes[semconv.INPUT_VALUE]
    call = next(s for s in spans if s.name == "BaseTool.execute")
    result = call.attributes[semconv.GEN_AI_TOOL_CALL_RESULT]
    for text in (shown, result):
        assert len(text) < CAP + 100 and "truncated" in text
        assert "[REDACTED]" in text  # the secret near the start
        assert SECRET[:6] not in text  # neither it nor the head of the one the cap cut
    # nothing context-long was scanned on the loop; the export thread scanned the capped text
    assert not [n for name, n in scans if name == loop_thread and n > 2 * CAP]
    assert [n for name, n in scans if name != loop_thread and n >= CAP // 2]
    data = _exported_bytes(tmp_path)
    assert SECRET[:6].encode() not in data


@pytest.mark.parametrize("text, limit", [
    ("a" * 10, 20),
    ("x" * 100, 50),  # one long run: cut where asked (a run longer than any secret)
    ("word " * 40 + SECRET + " tail", 210),  # a cut inside a secret: before the secret
])
def test_cap_text_cuts_before_a_secret_shaped_run(text: str, limit: int) -> None:
    out = cap_text(text, max_chars=limit)
    if len(text) <= limit:
        assert out == text
        return
    kept = out.split("...[truncated")[0]
    assert text.startswith(kept) and len(kept) <= limit
    assert SECRET[:6] not in kept
    assert json.loads(json.dumps(out)) == out
