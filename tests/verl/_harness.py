"""Run verl's real AgentLoopWorker + ToolAgentLoop on CPU: a local tiny tokenizer, a fake LLM server
behind verl's real LLMServerClient, a fake reward worker handle, a real BaseTool subclass.

Nothing comes from a model hub: the tokenizer and config are built locally by
``otel_verl.demo.tiny_model.build_tiny_model`` (cached under ``OTEL_VERL_MODEL_CACHE``).
"""

from __future__ import annotations

import asyncio
import os
import textwrap
from pathlib import Path
from typing import Any

import numpy as np

TOOL_CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "3+4"}}</tool_call>'
ANSWER = "The answer is 7."


def model_dir() -> Path:
    from otel_verl.demo.tiny_model import build_tiny_model

    return Path(build_tiny_model())


def write_tool_config(directory: Path) -> Path:
    path = directory / "tools.yaml"
    path.write_text(textwrap.dedent("""\
        tools:
          - class_name: verl_test_tools.CalculatorTool
            config:
              type: native
            tool_schema:
              type: function
              function:
                name: calculator
                description: evaluate an arithmetic expression
                parameters:
                  type: object
                  properties:
                    expression:
                      type: string
                      description: the expression
                  required: [expression]
        """))
    return path


def compose_config(overrides: list[str]) -> Any:
    """verl's own ppo_trainer config (Hydra), with the given command-line overrides."""
    import verl
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


def base_overrides(model: Path, tool_config: Path, trace: dict[str, Any]) -> list[str]:
    out = [
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.prompt_length=256",
        "actor_rollout_ref.rollout.response_length=256",
        "actor_rollout_ref.rollout.multi_turn.format=hermes",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tool_config}",
        "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent",
        "trainer.project_name=verl_it",
        "trainer.experiment_name=exp_it",
    ]
    for key, value in trace.items():
        out.append(f"actor_rollout_ref.rollout.trace.{key}={'null' if value is None else value}")
    return out


class _Remote:
    def __init__(self, fn: Any) -> None:
        self._fn = fn

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        return self._fn(*args, **kwargs)


class FakeServer:
    """Stands in for verl's vLLM server actor: tool call on the first turn, answer on the second."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.calls: list[dict[str, Any]] = []
        self.generate = _Remote(self._generate)

    async def _generate(self, *, request_id: str, prompt_ids: list[int], sampling_params: dict,
                        **kwargs: Any) -> Any:
        from verl.workers.rollout.replica import TokenOutput

        self.calls.append({"request_id": request_id, "prompt_ids": list(prompt_ids),
                           "sampling_params": dict(sampling_params), **kwargs})
        text = self.tokenizer.decode(prompt_ids)
        reply = ANSWER if "<tool_response>" in text else TOOL_CALL
        ids = self.tokenizer.encode(reply, add_special_tokens=False)
        ids.append(self.tokenizer.convert_tokens_to_ids("<|im_end|>"))
        await asyncio.sleep(0)
        return TokenOutput(token_ids=ids, log_probs=[0.0] * len(ids), stop_reason="completed",
                           extra_fields={})


def make_client(config: Any, server: FakeServer) -> Any:
    """verl's real LLMServerClient (its traced ``generate`` runs), routed to the fake server."""
    from verl.workers.rollout.llm_server import LLMServerClient

    class LocalLLMServerClient(LLMServerClient):
        async def _acquire_server(self, request_id: str, **extra: Any) -> Any:
            return "local-0", server

        def _release_server(self, server_id: str, request_id: str | None = None) -> None:
            return None

    return LocalLLMServerClient(config=config, load_balancer_handle=None)


class FakeRewardHandle:
    """Stands in for verl's RewardLoopWorker actor handle: 1.0 when the answer says 7."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.compute_score = _Remote(self._compute_score)
        self.calls = 0

    async def _compute_score(self, data: Any) -> dict[str, Any]:
        self.calls += 1
        responses = data.batch["responses"][-1].tolist()
        text = self.tokenizer.decode(responses)
        score = 1.0 if ANSWER in text else 0.0
        return {"reward_score": score, "reward_extra_info": {"acc": score}}


def make_batch(sample_indices: list[int], step: int, n: int = 1, validate: bool = False) -> Any:
    """A DataProto like verl's RLHFDataset produces (raw_prompt, index, tools_kwargs, ...)."""
    from verl.protocol import DataProto

    rows = [i for i in sample_indices for _ in range(n)]
    raw_prompt = np.array([[{"role": "user", "content": f"What is 3+4? (q{i})"}] for i in rows],
                          dtype=object)
    non_tensor = {
        "raw_prompt": raw_prompt,
        "index": np.array(rows, dtype=object),
        "data_source": np.array(["arith"] * len(rows), dtype=object),
        "reward_model": np.array([{"ground_truth": "7"}] * len(rows), dtype=object),
        "tools_kwargs": np.array([{}] * len(rows), dtype=object),
        "extra_info": np.array([{"index": i} for i in rows], dtype=object),
        "agent_name": np.array(["tool_agent"] * len(rows), dtype=object),
    }
    batch = DataProto.from_dict(non_tensors=non_tensor)
    batch.meta_info = {"global_steps": step, "validate": validate}
    return batch


def make_worker(config: Any) -> tuple[Any, FakeServer, FakeRewardHandle]:
    """verl's AgentLoopWorker, built by its own __init__ (which calls RolloutTraceConfig.init)."""
    from transformers import AutoTokenizer
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    tokenizer = AutoTokenizer.from_pretrained(config.actor_rollout_ref.model.path)
    server = FakeServer(tokenizer)
    reward = FakeRewardHandle(tokenizer)
    worker = AgentLoopWorker(config, make_client(config, server),
                             reward_loop_worker_handles=[reward])
    return worker, server, reward
