"""The rollout the phoenix tier sends: one GRPO step (two prompts x n rollouts) and one
validation rollout, each scripted turn by turn, with what Phoenix must show for each."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from _scripted import CharTokenizer, ScriptedClient

import otel_verl
from otel_verl.rollout.agent_loop import ToolAgentLoop
from otel_verl.rollout.reward import Gsm8kReward
from otel_verl.rollout.tools import CalculatorTool

PROJECT = "otel-verl-phoenix-tier"
EXPERIMENT = "grpo-demo"
#: the Phoenix project of the drop-in API rollout (tests/rollout/_dropin_agent.py)
DROPIN_PROJECT = "otel-verl-phoenix-dropin"


def call(expression: str) -> str:
    return ('<tool_call>{"name": "calculator", "arguments": {"expression": "'
            + expression + '"}}</tool_call>')


@dataclass(frozen=True)
class Trajectory:
    """One scripted trajectory and what Phoenix must show for it."""

    sample_index: int
    rollout_n: int
    prompt: str
    ground_truth: str
    script: tuple[str, ...]
    answer: str
    reward: float
    label: str
    validate: bool = False

    @property
    def tool_calls(self) -> int:
        return sum("<tool_call>" in turn for turn in self.script)

    @property
    def span_kinds(self) -> dict[str, int]:
        """Spans per OpenInference kind: per turn generate (LLM, with the GenAI attributes) +
        parser (CHAIN); per tool call one TOOL; the run (CHAIN), the reward, the trajectory."""
        turns = len(self.script)
        return {"AGENT": 1, "CHAIN": 1 + turns, "LLM": turns, "TOOL": self.tool_calls,
                "EVALUATOR": 1}

    @property
    def session(self) -> str:
        sid = f"{EXPERIMENT}/step-1/sample-{self.sample_index}"
        return sid + "/validate" if self.validate else sid


Q0, Q1 = "What is 2 + 3?", "What is 12 * 7?"
TRAJECTORIES = (  # one GRPO step: two prompts x n rollouts, then one validation rollout
    Trajectory(0, 0, Q0, "5", (call("2+3"), "The answer is 5."), "The answer is 5.", 1.0,
               "correct"),
    Trajectory(0, 1, Q0, "5", (call("2+3"), "The answer is 6."), "The answer is 6.", 0.0,
               "incorrect"),
    Trajectory(0, 2, Q0, "5", ("#### 5",), "#### 5", 1.0, "correct"),
    Trajectory(1, 0, Q1, "84", (call("12*7"), "The answer is 84."), "The answer is 84.", 1.0,
               "correct"),
    Trajectory(1, 1, Q1, "84", ("I do not know.",), "I do not know.", 0.0, "no_answer"),
    Trajectory(0, 0, Q0, "5", (call("2+3"), "The answer is 5."), "The answer is 5.", 1.0,
               "correct", validate=True),
)


@dataclass
class Rollout:
    """What was sent: the trajectories, otel_verl's delivery counts, the wall time."""

    trajectories: tuple[Trajectory, ...]
    stats: dict[str, int]
    seconds: float
    outputs: list[Any] = field(default_factory=list)


async def run_all() -> list[Any]:
    tokenizer = CharTokenizer()

    async def one(t: Trajectory) -> Any:
        loop = ToolAgentLoop(ScriptedClient(tokenizer, list(t.script)), tokenizer,
                             tools=[CalculatorTool()], reward_fn=Gsm8kReward())
        with otel_verl.rollout_trace_attr(step=1, sample_index=t.sample_index,
                                          rollout_n=t.rollout_n, validate=t.validate,
                                          name="agent_loop"):
            return await loop.run({"temperature": 1.0, "max_tokens": 256},
                                  raw_prompt=[{"role": "user", "content": t.prompt}],
                                  reward_model={"ground_truth": t.ground_truth})

    return list(await asyncio.gather(*(one(t) for t in TRAJECTORIES)))
