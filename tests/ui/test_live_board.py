"""The Live board (issue 20, docs/live.md) in real Chromium: a tool stuck inside the project's agent
loop, and an engine request held past the threshold, show on the board, stuck and first, with
their trajectory and op, within 2 s of the threshold; once they finish the board drops them by
itself (it refreshes every second). Screenshot:
the artifacts folder (docs/img/ui-live.png too, with OTEL_VERL_UPDATE_DOCS_IMAGES=1).

The store is this test's own: ``ToolAgentLoop`` -> ``VLLMCompletionsClient`` -> HTTP -> a stub
engine, the file backend with ``live=true``, rollouts on an event loop in a thread of this process;
the viewer is ``otel-verl ui`` in a subprocess reading the same directory.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from uihelpers import ROOT, UIProcess, goto, leave, shot

from otel_verl import RolloutTraceConfig, rollout_trace_attr
from otel_verl.rollout.agent_loop import ToolAgentLoop
from otel_verl.rollout.clients import VLLMCompletionsClient
from otel_verl.rollout.reward import Gsm8kReward
from otel_verl.rollout.tools import CalculatorTool, ToolResponse

sys.path.insert(0, str(ROOT / "tests" / "rollout"))
from _scripted import CharTokenizer  # noqa: E402

THRESHOLD_S = 1.0
CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "12*7"}}</tool_call>'
ANSWER = "The answer is #### 84"


class _Engine(BaseHTTPRequestHandler):
    """``/v1/completions``: a tool call until the prompt holds a tool response, then the answer."""

    tokenizer = CharTokenizer()
    #: a request whose prompt holds "HOLD" waits until ``release`` is set (a held engine request)
    release = threading.Event()
    holding = threading.Event()
    held_at = 0.0

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if "HOLD" in self.tokenizer.decode(body["prompt"]) and not _Engine.release.is_set():
            _Engine.held_at = time.time()
            _Engine.holding.set()
            _Engine.release.wait(60)
        text = ANSWER if "<tool_response>" in self.tokenizer.decode(body["prompt"]) else CALL
        ids = self.tokenizer.encode(text) + [self.tokenizer.eos_token_id]
        data = json.dumps({"id": "cmpl", "model": body["model"], "choices": [
            {"index": 0, "text": text, "finish_reason": "stop", "token_ids": ids}],
            "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": len(ids)}})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data.encode())


class HangingTool(CalculatorTool):
    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.started = threading.Event()
        self.started_at = 0.0

    async def _run(self, arguments):
        self.started_at = time.time()
        self.started.set()
        while not self.release.is_set():
            await asyncio.sleep(0.02)
        return ToolResponse(text="84")


def test_live_board_shows_the_stuck_tool_first_and_drops_it_when_done(page, tmp_path, artifacts):
    from playwright.sync_api import expect

    store = tmp_path / "traces"
    engine = ThreadingHTTPServer(("127.0.0.1", 0), _Engine)
    threading.Thread(target=engine.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{engine.server_address[1]}"
    RolloutTraceConfig.init("proj", "exp", "file", trace_dir=str(store), live=True,
                            stuck_after_s=THRESHOLD_S)
    hanging = HangingTool()
    tok = CharTokenizer()

    async def rollouts() -> None:
        async with VLLMCompletionsClient(url, model="stub") as client:
            async def one(i: int, tool):
                loop = ToolAgentLoop(client, tok, tools=[tool], reward_fn=Gsm8kReward(),
                                     max_assistant_turns=3, max_user_turns=3,
                                     max_response_length=2048)
                with rollout_trace_attr(step=5, sample_index=i, rollout_n=0, name="agent_loop"):
                    row = {"raw_prompt": [{"role": "user", "content": f"What is 12*7? ({i})"}],
                           "reward_model": {"ground_truth": "84"}}
                    return await loop.run({"temperature": 1.0, "max_tokens": 64}, **row)

            await asyncio.gather(one(0, CalculatorTool()), one(1, hanging))
            with rollout_trace_attr(step=5, sample_index=2, trace=False):  # an unsampled one
                await asyncio.sleep(0)

    _Engine.release.set()  # nothing is held here
    ui = UIProcess(store)
    thread = threading.Thread(target=asyncio.run, args=(rollouts(),), daemon=True)
    try:
        goto(page, ui.url, "#/live")  # the board is open before anything runs
        expect(page.locator('[data-testid="live-summary"]')).to_be_visible()
        thread.start()
        assert hanging.started.wait(30)
        stuck = page.locator('[data-testid="live-stuck"]')
        # within 2 s of the threshold, counted from the tool's start
        deadline = hanging.started_at + THRESHOLD_S + 2.0
        expect(stuck.first).to_be_visible(timeout=max(0.0, deadline - time.time()) * 1000)
        seen_after = time.time() - hanging.started_at
        # the first row is the stuck tool (stuck first), with its trajectory (step 5, sample 1)
        first = page.locator('[data-testid="live-ops"] tr').nth(1)
        cells = first.locator("td").all_inner_texts()
        assert "STUCK" in cells[0]
        assert cells[2:6] == ["5", "1", "0", "BaseTool.execute"], cells  # the op that waits
        # its callers (the agent loop's run, the trajectory) are stuck too, waiting on it
        waits = [row.locator("td").nth(8).inner_text() for row in stuck.all()[1:]]
        assert waits and all(w == "BaseTool.execute" for w in waits), waits
        assert "stuck" in page.locator('[data-testid="live-summary"]').inner_text()
        # the header's counts are the rows' (read in one go: the board redraws every second):
        # the trajectory's own row (in italics) and its ops, each counted apart, and the
        # worker's row the same two counts
        board = page.evaluate("""() => {
            const q = (s) => [...document.querySelectorAll(s)];
            const stuck = q('[data-testid="live-stuck"]');
            return {summary: document.querySelector('[data-testid="live-summary"]').textContent,
                    trajectories: stuck.filter((r) => r.children[5].querySelector('em')).length,
                    ops: stuck.filter((r) => !r.children[5].querySelector('em')).length,
                    worker: q('[data-testid="live-workers"] tr').slice(1).map(
                        (r) => [...r.children].map((c) => c.textContent))};
        }""")
        found = re.search(r"in flight: (\d+) trajector(?:y|ies) \((\d+) stuck\), (\d+) ops? "
                          r"\((\d+) stuck\)", board["summary"])
        assert found, board["summary"]
        assert (int(found[2]), int(found[4])) == (board["trajectories"], board["ops"]), board
        assert board["trajectories"] >= 1 and board["ops"] >= 1, board
        ((*_, stuck_trajectories, stuck_ops),) = board["worker"]
        assert (int(stuck_trajectories), int(stuck_ops)) == (
            board["trajectories"], board["ops"]), board
        shot(page, artifacts, "ui-live")
        if os.environ.get("OTEL_VERL_UPDATE_DOCS_IMAGES") == "1":  # a run leaves the tree clean
            (ROOT / "docs" / "img").mkdir(exist_ok=True)
            shutil.copy(artifacts / "ui-live.png", ROOT / "docs" / "img" / "ui-live.png")
        print(f"\nstuck tool on the board {seen_after:.1f}s after it started "
              f"(threshold {THRESHOLD_S}s)")
        hanging.release.set()
        thread.join(30)
        # the board refreshes by itself: the tool is gone without a reload
        expect(page.locator('[data-testid="live-stuck"]')).to_have_count(0, timeout=10_000)
        expect(page.locator('[data-testid="live-op"]')).to_have_count(0, timeout=10_000)
    finally:
        leave(page)
        hanging.release.set()
        ui.stop()
        RolloutTraceConfig.shutdown(10.0)
        engine.shutdown()
    assert not list(Path(store, "live").glob("*.json"))


def test_live_board_shows_a_held_engine_request_with_its_request_id(page, tmp_path, artifacts):
    """An engine request held past the threshold: on the board, stuck and first, within 2 s, with
    its trajectory, the LLM call's op and the request id the call sent; gone once answered."""
    from playwright.sync_api import expect

    store = tmp_path / "traces"
    _Engine.release.clear()
    _Engine.holding.clear()
    engine = ThreadingHTTPServer(("127.0.0.1", 0), _Engine)
    threading.Thread(target=engine.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{engine.server_address[1]}"
    RolloutTraceConfig.init("proj", "exp", "file", trace_dir=str(store), live=True,
                            stuck_after_s=THRESHOLD_S)
    tok = CharTokenizer()

    async def rollouts() -> None:
        async with VLLMCompletionsClient(url, model="stub") as client:
            loop = ToolAgentLoop(client, tok, tools=[CalculatorTool()], reward_fn=Gsm8kReward(),
                                 max_assistant_turns=3, max_user_turns=3,
                                 max_response_length=2048)
            with rollout_trace_attr(step=7, sample_index=3, rollout_n=1, name="agent_loop"):
                row = {"raw_prompt": [{"role": "user", "content": "HOLD: what is 12*7?"}],
                       "reward_model": {"ground_truth": "84"}}
                await loop.run({"temperature": 1.0, "max_tokens": 64}, **row)

    ui = UIProcess(store)
    thread = threading.Thread(target=asyncio.run, args=(rollouts(),), daemon=True)
    try:
        goto(page, ui.url, "#/live")
        expect(page.locator('[data-testid="live-summary"]')).to_be_visible()
        thread.start()
        assert _Engine.holding.wait(30)
        deadline = _Engine.held_at + THRESHOLD_S + 2.0
        stuck = page.locator('[data-testid="live-stuck"]')
        expect(stuck.first).to_be_visible(timeout=max(0.0, deadline - time.time()) * 1000)
        first = page.locator('[data-testid="live-ops"] tr').nth(1)
        cells = first.locator("td").all_inner_texts()
        assert "STUCK" in cells[0]
        assert cells[2:5] == ["7", "3", "1"], cells
        assert cells[5].endswith("generate"), cells  # the LLM call's op waits on the engine
        assert cells[9] not in ("", "—"), cells  # the request id the call sent to the engine
        shot(page, artifacts, "ui-live-held-request")
        _Engine.release.set()
        thread.join(30)
        expect(page.locator('[data-testid="live-stuck"]')).to_have_count(0, timeout=10_000)
        expect(page.locator('[data-testid="live-op"]')).to_have_count(0, timeout=10_000)
    finally:
        leave(page)
        _Engine.release.set()
        ui.stop()
        RolloutTraceConfig.shutdown(10.0)
        engine.shutdown()
