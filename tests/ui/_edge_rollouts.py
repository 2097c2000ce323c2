"""Real traced rollouts (otel_verl's ToolAgentLoop, file backend) that the demo never produces:
an engine that refuses connections (a real closed port), a tool that fails, and a prompt with a
planted ``<script>``. Run as a script: ``python _edge_rollouts.py TRACE_DIR [EXPERIMENT]``."""

from __future__ import annotations

import asyncio
import socket
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "rollout"))

from _scripted import CharTokenizer, ScriptedClient

from otel_verl import RolloutTraceConfig, rollout_trace_attr
from otel_verl.rollout.agent_loop import ToolAgentLoop
from otel_verl.rollout.clients import VLLMCompletionsClient
from otel_verl.rollout.reward import Gsm8kReward
from otel_verl.rollout.tools import CalculatorTool

PLANTED = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=2"> What is 2+3?'


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed when the block ends: connections are refused


def _call(expression: str) -> str:
    return ('<tool_call>{"name": "calculator", "arguments": {"expression": "'
            + expression + '"}}</tool_call>')


async def main(trace_dir: str, experiment: str) -> None:
    RolloutTraceConfig.init("ui-tests", experiment, "file", trace_dir=trace_dir)
    tok = CharTokenizer()
    row = {"raw_prompt": [{"role": "user", "content": "What is 6 * 7?"}],
           "reward_model": {"ground_truth": "42"}}
    sampling = {"temperature": 1.0, "max_tokens": 200}
    down = VLLMCompletionsClient(f"http://127.0.0.1:{_closed_port()}", "tiny", tokenizer=tok)
    loop = ToolAgentLoop(down, tok, tools=[CalculatorTool()], reward_fn=Gsm8kReward())
    try:
        with rollout_trace_attr(step=1, sample_index=0, rollout_n=0, name="agent_loop"):
            await loop.run(dict(sampling), **row)
    except Exception as error:  # noqa: BLE001 - the engine is down: recorded on the spans, reported here
        print(f"engine down as planned: {type(error).__name__}: {error}")
    finally:
        await down.aclose()
    failing = ScriptedClient(tok, [_call("1/0"), "The answer is 0."])
    loop = ToolAgentLoop(failing, tok, tools=[CalculatorTool()], reward_fn=Gsm8kReward())
    with rollout_trace_attr(step=1, sample_index=1, rollout_n=0, name="agent_loop"):
        await loop.run(dict(sampling), **row)
    planted = ScriptedClient(tok, [_call("2+3"), "The answer is 5."])
    loop = ToolAgentLoop(planted, tok, tools=[CalculatorTool()], reward_fn=Gsm8kReward())
    with rollout_trace_attr(step=1, sample_index=2, rollout_n=0, name="agent_loop"):
        await loop.run(dict(sampling), raw_prompt=[{"role": "user", "content": PLANTED}],
                       reward_model={"ground_truth": "5"})
    RolloutTraceConfig.shutdown()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "ui-edge-cases"))
