"""Live rollouts (issue 20, docs/live.md): a stuck tool and a held engine request inside the
project's agent loop are visible in the live files and ``otel-verl traces live --json`` while they
hang, with the right trajectory and op, and gone when they finish; a step with one planted
straggler gets a straggler report naming it and its dominant op.

Real components: ``ToolAgentLoop`` -> ``VLLMCompletionsClient`` -> HTTP -> the engine stub, the
file backend writing a real store; the rollouts run on an event loop in a thread while the test
reads the store as a user would (the files, the CLI).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import threading
import time

from otel_verl import RolloutTraceConfig, rollout_trace_attr, semconv
from otel_verl.cli import main
from otel_verl.rollout.agent_loop import ToolAgentLoop
from otel_verl.rollout.clients import VLLMCompletionsClient
from otel_verl.rollout.reward import Gsm8kReward
from otel_verl.rollout.tools import CalculatorTool, ToolResponse
from otel_verl.store import read_spans
from otel_verl.store._live import live_ops, straggler_reports

from ._scripted import CharTokenizer
from .test_content_turns import ToolEngine

THRESHOLD_S = 1.0
#: the brief: visible within 2 s of the threshold
SEEN_WITHIN_S = 2.0


class HangingTool(CalculatorTool):
    """The calculator, but its call sleeps until ``release`` is set (or ``sleep_s`` passed)."""

    def __init__(self, release: threading.Event | None = None, sleep_s: float = 60.0) -> None:
        super().__init__()
        self.release = release or threading.Event()
        self.sleep_s = sleep_s
        self.started = threading.Event()
        self.started_at = 0.0

    async def _run(self, arguments):
        self.started_at = time.time()
        self.started.set()
        deadline = time.monotonic() + self.sleep_s
        while not self.release.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        return ToolResponse(text="84")


class HoldingEngine(ToolEngine):
    """The scripted engine; a request whose prompt names ``held`` waits until ``release``."""

    def __init__(self, tokenizer, held: str, tool_turns: int = 1) -> None:
        super().__init__(tokenizer, tool_turns=tool_turns)
        self.held = held
        self.release = threading.Event()
        self.holding = threading.Event()
        self.held_at = 0.0

    def handle(self, path, headers, body):
        if path == "/v1/completions" and self.held in self.tokenizer.decode(body["prompt"]) \
                and not self.release.is_set():
            self.held_at = time.time()
            self.holding.set()
            self.release.wait(60)
        return super().handle(path, headers, body)


def _row(index: int) -> dict:
    return {"raw_prompt": [{"role": "user", "content": f"What is 12*7? (row {index})"}],
            "reward_model": {"ground_truth": "84"}}


def _start_rollouts(engine, tools_by_sample: dict[int, list], step: int = 1) -> threading.Thread:
    async def run() -> None:
        async with VLLMCompletionsClient(engine.url, model="stub") as client:
            async def one(i: int, tools: list):
                loop = ToolAgentLoop(client, engine.tokenizer, tools=tools,
                                     reward_fn=Gsm8kReward(), max_assistant_turns=3,
                                     max_user_turns=3, max_response_length=2048)
                with rollout_trace_attr(step=step, sample_index=i, rollout_n=0,
                                        name="agent_loop"):
                    return await loop.run({"temperature": 1.0, "max_tokens": 64}, **_row(i))

            await asyncio.gather(*(one(i, t) for i, t in tools_by_sample.items()))

    thread = threading.Thread(target=asyncio.run, args=(run(),), daemon=True)
    thread.start()
    return thread


def _cli_live(trace_dir) -> list[dict]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["traces", "live", "--dir", str(trace_dir), "--json"]) == 0
    return [json.loads(line) for line in out.getvalue().splitlines() if line.strip()]


def _wait_for(predicate, deadline: float, poll_s: float = 0.05):
    while True:
        found = predicate()
        if found or time.time() > deadline:
            return found
        time.sleep(poll_s)


def _sent(trace_dir, span_id: str) -> bool:
    for path in (trace_dir / "live").glob("*.json"):
        with contextlib.suppress(ValueError, OSError):
            for op in json.loads(path.read_text())["ops"]:
                if op["span_id"] == span_id and op["in_flight_sent"]:
                    return True
    return False


def _stuck(ops: list[dict], kind: str) -> list[dict]:
    return [op for op in ops if op.get("kind") == kind and op["stuck"]]


def test_stuck_tool_is_live_within_2s_of_its_threshold_and_gone_when_it_ends(tmp_path):
    RolloutTraceConfig.init("proj", "exp", "file", trace_dir=str(tmp_path), live=True,
                            stuck_after_s=THRESHOLD_S)
    tok = CharTokenizer()
    hanging = HangingTool()
    with ToolEngine(tok, tool_turns=1) as engine:
        thread = _start_rollouts(engine, {0: [CalculatorTool()], 1: [hanging]})
        assert hanging.started.wait(20)
        deadline = hanging.started_at + THRESHOLD_S + SEEN_WITHIN_S
        stuck = _wait_for(lambda: _stuck(live_ops(str(tmp_path)), semconv.SpanKindName.TOOL),
                          deadline)
        cli = _cli_live(tmp_path)
        assert stuck, "the hanging tool is not flagged stuck in the live files in time"
        op = stuck[0]
        assert (op["step"], op["sample_index"], op["rollout_n"]) == (1, 1, 0)
        assert op["name"] == "BaseTool.execute" and op["elapsed_s"] >= THRESHOLD_S
        assert not op["lost"]
        # the CLI: the same op, and its trajectory flagged stuck, waiting on the tool
        cli_tool = [o for o in cli if o.get("span_id") == op["span_id"]]
        assert cli_tool and cli_tool[0]["stuck"] is True
        trajectories = [o for o in cli if o.get("trajectory") and o["sample_index"] == 1]
        assert trajectories and trajectories[0]["stuck"] is True
        assert trajectories[0]["waiting_on"]["span_id"] == op["span_id"]
        # the healthy trajectory (sample 0) is not stuck
        assert not [o for o in cli if o.get("sample_index") == 0 and o["stuck"]]
        # the writer sent it to the receivers as it became stuck (before it is released)
        assert _wait_for(lambda: _sent(tmp_path, op["span_id"]), time.time() + 5)
        hanging.release.set()
        thread.join(30)
        assert not thread.is_alive()
        gone = _wait_for(lambda: not [o for o in live_ops(str(tmp_path))
                                      if o["span_id"] == op["span_id"]], time.time() + 5)
        assert gone, "the finished tool is still shown in flight"
    RolloutTraceConfig.shutdown(10.0)
    assert not list((tmp_path / "live").glob("*.json"))  # clean shutdown: no live file left
    # receivers: the stuck op was sent as an otel_verl.in_flight span while it hung
    spans = list(read_spans(str(tmp_path), warn=False))
    # (a generate call slower than the threshold on a loaded machine is sent as one too)
    in_flight = [s for s in spans if s["name"] == semconv.IN_FLIGHT_SPAN
                 and s["attributes"][semconv.OTEL_VERL_LIVE_OP] == "BaseTool.execute"]
    assert len(in_flight) == 1
    attrs = in_flight[0]["attributes"]
    assert attrs[semconv.OTEL_VERL_LIVE_SPAN_ID] == op["span_id"]
    assert attrs[semconv.ROLLOUT_SAMPLE_INDEX] == 1
    assert in_flight[0]["parent_span_id"] == op["span_id"]


def test_held_engine_request_is_live_with_its_request_id(tmp_path):
    RolloutTraceConfig.init("proj", "exp", "file", trace_dir=str(tmp_path), live=True,
                            stuck_after_s=THRESHOLD_S)
    tok = CharTokenizer()
    with HoldingEngine(tok, held="(row 2)") as engine:
        thread = _start_rollouts(engine, {2: [CalculatorTool()], 3: [CalculatorTool()]})
        assert engine.holding.wait(20)
        deadline = engine.held_at + THRESHOLD_S + SEEN_WITHIN_S
        stuck = _wait_for(lambda: _stuck(_cli_live(tmp_path), semconv.SpanKindName.LLM),
                          deadline)
        assert stuck, "the held engine request is not flagged stuck in time"
        op = stuck[0]
        assert (op["step"], op["sample_index"]) == (1, 2)
        assert op["request_id"]  # the request id the agent loop sent with the call
        assert op["name"].endswith("generate")
        assert not [o for o in live_ops(str(tmp_path)) if o.get("sample_index") == 3
                    and o["stuck"]]
        engine.release.set()
        thread.join(30)
        assert not thread.is_alive()
        gone = _wait_for(lambda: not [o for o in _cli_live(tmp_path)
                                      if o.get("span_id") == op["span_id"]], time.time() + 5)
        assert gone
    RolloutTraceConfig.shutdown(10.0)


def test_straggler_report_names_the_planted_straggler_and_its_dominant_op(tmp_path):
    RolloutTraceConfig.init("proj", "exp", "file", trace_dir=str(tmp_path), live=True)
    tok = CharTokenizer()
    slow = HangingTool()
    with ToolEngine(tok, tool_turns=1) as engine:
        tools = {i: [CalculatorTool()] for i in range(5)}
        tools[3] = [slow]
        thread = _start_rollouts(engine, tools, step=7)
        # the straggler's tool holds until the engine answered the other four twice (their
        # last call) and for 2 s at least: slower than the rest, its tool the longest of its ops,
        # however loaded the machine (a fixed 0.6 s was outlasted by a healthy one under load)
        assert slow.started.wait(20)
        assert _wait_for(lambda: len(engine.requests) >= 9, time.time() + 30)
        time.sleep(max(0.0, slow.started_at + 2.0 - time.time()))
        slow.release.set()
        thread.join(30)
        assert not thread.is_alive()
    RolloutTraceConfig.shutdown(10.0)
    spans = list(read_spans(str(tmp_path), warn=False))
    reports = [r for r in straggler_reports(spans) if r["step"] == 7]
    assert len(reports) == 1
    report = reports[0]
    assert report["trajectories"] == 5
    slowest = report["slowest"][0]
    assert slowest["sample_index"] == 3
    tool_ops = {s["name"] for s in spans if s["attributes"].get(semconv.GEN_AI_TOOL_NAME)
                == "calculator" and s["attributes"].get(semconv.ROLLOUT_SAMPLE_INDEX) == 3}
    assert slowest["dominant_op"] in tool_ops
    assert report["dominant_op"] == slowest["dominant_op"]
    assert report["tail_wait_s"] > 0  # the step waited on its one straggler
    # the report is inside the straggler's trace (no reader takes it for a trajectory)
    from otel_verl.store import group_trajectories

    trajectories = group_trajectories(spans)
    assert len(trajectories) == 5
    [span] = [s for s in spans if s["name"] == semconv.STRAGGLER_REPORT_SPAN]
    assert span["parent_span_id"] == slowest["span_id"]


def test_otlp_receiver_gets_the_stuck_op_while_it_hangs(tmp_path):
    """backend=otlp (OTLP/HTTP, the durable log in front) to a real OTLP receiver: the stuck
    tool's ``otel_verl.in_flight`` span arrives while the tool still hangs, in its trace, naming
    the op and its trajectory; nothing of the hanging tool's own span has arrived yet."""
    from otel_verl.demo.otlp_receiver import OTLPReceiver

    tok = CharTokenizer()
    hanging = HangingTool()
    with OTLPReceiver() as receiver, ToolEngine(tok, tool_turns=1) as engine:
        RolloutTraceConfig.init("proj", "exp", "otlp", trace_dir=str(tmp_path), live=True,
                                stuck_after_s=THRESHOLD_S, otlp_endpoint=receiver.endpoint,
                                otlp_protocol="http/protobuf", schedule_delay_s=0.2,
                                export_delay_s=0.2)
        thread = _start_rollouts(engine, {4: [hanging]})
        try:
            assert hanging.started.wait(20)

            # the tool's (a generate call slower than the threshold under load is sent as well)
            def tool_in_flight(spans):
                return [x for x in spans if x["name"] == semconv.IN_FLIGHT_SPAN
                        and x["attributes"][semconv.OTEL_VERL_LIVE_OP] == "BaseTool.execute"]

            spans = receiver.wait_for(tool_in_flight, timeout_s=20)
            assert not hanging.release.is_set() and thread.is_alive()  # still hanging
            [record] = tool_in_flight(spans)
            attrs = record["attributes"]
            assert attrs[semconv.OTEL_VERL_LIVE_OP] == "BaseTool.execute"
            assert attrs[semconv.ROLLOUT_SAMPLE_INDEX] == 4
            assert attrs[semconv.OTEL_VERL_LIVE_ELAPSED_S] >= THRESHOLD_S
            assert record["parent_span_id"] == attrs[semconv.OTEL_VERL_LIVE_SPAN_ID]
            assert not [s for s in spans if s["span_id"] == record["parent_span_id"]]
        finally:
            hanging.release.set()
            thread.join(30)
            RolloutTraceConfig.shutdown(10.0)
        # once it ended, the tool's own span joins the same trace
        done = receiver.wait_for(lambda s: any(x["span_id"] == record["parent_span_id"]
                                               for x in s), timeout_s=20)
        [tool] = [s for s in done if s["span_id"] == record["parent_span_id"]]
        assert tool["trace_id"] == record["trace_id"]
