"""verl 0.9's default trainer (v1, ``trainer.use_v1=True``): ``AgentLoopWorkerTQ`` traced like the
legacy ``AgentLoopWorker``, and one clear warning for a trainer or verl version otel_verl does not
know.

``AgentLoopWorkerTQ`` is verl's real class (built by its own ``__init__`` from verl's Hydra config);
its ``generate_sequences`` spawns background tasks that run ``ToolAgentLoop`` and put the results
into TransferQueue. Only TransferQueue's client calls are local stand-ins (no TQ controller, no
Ray), besides the harness's LLM server and reward worker.
"""

from __future__ import annotations

import asyncio
import logging
import types
from pathlib import Path
from typing import Any

import _harness as h
import numpy as np
import pytest

from otel_verl import TrajectorySampler, semconv
from otel_verl.integrations.verl import _agent_loop, _common
from otel_verl.store import group_trajectories, read_spans

tq_module = pytest.importorskip("verl.trainer.ppo.v1.agent_loop_tq",
                                reason="needs TransferQueue (requirements/verl.txt)")


class FakeTransferQueue:
    """The ``transfer_queue`` client calls AgentLoopWorkerTQ makes, recorded."""

    def __init__(self) -> None:
        self.status: dict[str, list[str]] = {}
        self.rows: list[dict[str, Any]] = []

    def init(self) -> None:
        return None

    async def async_kv_put(self, key: str, partition_id: str, tag: dict[str, Any]) -> None:
        self.status.setdefault(key, []).append(tag["status"])

    async def async_kv_batch_put(self, keys: list[str], fields: Any, tags: list[dict],
                                 partition_id: str) -> None:
        self.rows.extend({"key": k, **t} for k, t in zip(keys, tags, strict=True))


def _tq_batch(sample_indices: list[int], step: int) -> Any:
    """The chunk verl's v1 trainer hands a worker: one row per prompt (no repeat), a TensorDict."""
    from verl.utils import tensordict_utils as tu

    n = len(sample_indices)
    batch = tu.get_tensordict({
        "raw_prompt": [[{"role": "user", "content": f"What is 3+4? (q{i})"}]
                       for i in sample_indices],
        "index": np.array(sample_indices, dtype=object),
        "uid": np.array([f"uid-{i}" for i in sample_indices], dtype=object),
        "data_source": np.array(["arith"] * n, dtype=object),
        "reward_model": [{"ground_truth": "7"}] * n,
        "tools_kwargs": [{}] * n,
        "extra_info": [{"index": i} for i in sample_indices],
        "agent_name": np.array(["tool_agent"] * n, dtype=object),
    })
    tu.assign_non_tensor_data(batch, "global_steps", step)
    return batch


def _run_v1(tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, trace: dict,
            samples: list[int], step: int, n: int) -> tuple[list[dict], FakeTransferQueue]:
    fake = FakeTransferQueue()
    monkeypatch.setattr(tq_module, "tq", fake)
    overrides = [*h.base_overrides(tiny_model, h.write_tool_config(tmp_path), trace),
                 f"actor_rollout_ref.rollout.n={n}", "trainer.use_v1=True"]
    config = h.compose_config(overrides)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(config.actor_rollout_ref.model.path)
    cls = _agent_loop._actor_class(tq_module.AgentLoopWorkerTQ)
    worker = cls(config, h.make_client(config, h.FakeServer(tokenizer)),
                 reward_loop_worker_handles=[h.FakeRewardHandle(tokenizer)])

    async def drive() -> None:
        await worker.generate_sequences(_tq_batch(samples, step))  # returns at once
        while worker.background_tasks:
            await asyncio.gather(*list(worker.background_tasks))

    asyncio.run(drive())
    from verl.utils.rollout_trace import RolloutTraceConfig

    RolloutTraceConfig.flush()
    trace_dir = tmp_path / "traces"
    return (list(read_spans(trace_dir)) if trace_dir.exists() else []), fake


def test_v1_worker_class_is_patched():
    cls = _agent_loop._actor_class(tq_module.AgentLoopWorkerTQ)
    assert cls is not tq_module.AgentLoopWorkerTQ  # verl decorates it with @ray.remote
    assert vars(cls).get(_common.MARK)  # its own mark, not AgentLoopWorker's
    for name in ("generate_sequences", "_run_agent_loop"):
        method = cls.__dict__[name]
        assert getattr(method, _common.MARK, False)
        # named as the class's own method, so Ray's cloudpickle finds it by reference
        assert (method.__module__, method.__qualname__) == (
            tq_module.__name__, f"AgentLoopWorkerTQ.{name}")
        # Ray copied verl's methods onto its own subclass (the class the actor runs): ours too
        ray_class = tq_module.AgentLoopWorkerTQ.__ray_metadata__.modified_class
        ray_method = ray_class.__dict__[name]
        assert getattr(ray_method, _common.MARK, False) and ray_method is not method
    # Ray ships that class to the actor's process by value (cloudpickle), our wrappers with it:
    # they must pickle (no ContextVar, no lock in what their code names). Not loaded back here:
    # in the process that pickled it, cloudpickle would reset the live class from the copy.
    from ray import cloudpickle

    payload = cloudpickle.dumps(ray_class)
    assert b"tq_generate_sequences" in payload and b"otel_verl.integrations.verl._agent_loop" in payload


def test_v1_trainer_traces_like_the_legacy_one(tiny_model, tmp_path, monkeypatch):
    spans, fake = _run_v1(tiny_model, tmp_path, monkeypatch,
                          {"backend": "file", "max_samples_per_step_per_worker": 1,
                           "token2text": True}, samples=[0, 1, 2], step=5, n=2)
    # verl's GRPO group size reached otel_verl (group_size's verl key: actor_rollout_ref.rollout.n)
    from otel_verl import RolloutTraceConfig as Core

    assert Core.get_instance().config.group_size == 2
    # verl's own v1 flow is unchanged: every session of every prompt reached TransferQueue
    assert sorted(r["key"] for r in fake.rows) == sorted(
        f"uid-{i}_{s}_0" for i in (0, 1, 2) for s in (0, 1))
    assert all(v == ["running", "finished"] for v in fake.status.values()), fake.status

    trajectories = [t for t in group_trajectories(spans) if t.root is not None]
    (chosen,) = TrajectorySampler(1, "exp_it").select([0, 1, 2])
    # max_samples_per_step_per_worker=1: one sample, all of its n sessions, one trace each
    assert sorted((t.sample_index, t.rollout_n) for t in trajectories) == [(chosen, 0), (chosen, 1)]
    assert len({t.trace_id for t in trajectories}) == 2
    for t in trajectories:
        assert t.step == 5 and t.validate is False and t.experiment == "exp_it"
        assert t.reward == 1.0 and t.num_turns == 4
        names = {s["name"] for _, s in t.walk()}
        assert {"ToolAgentLoop.run", "LLMServerClient.generate", "CalculatorTool.execute",
                "CalculatorTool.create", "AgentLoopWorker._compute_score"} <= names
        for _, span in t.walk():
            attrs = span["attributes"]
            assert attrs[semconv.ROLLOUT_STEP] == 5
            assert attrs[semconv.ROLLOUT_SAMPLE_INDEX] == chosen
            assert attrs[semconv.ROLLOUT_ROLLOUT_N] == t.rollout_n
            assert attrs[semconv.ROLLOUT_EXPERIMENT_NAME] == "exp_it"
        generate = next(s for _, s in t.walk() if s["name"] == "LLMServerClient.generate")
        assert "prompt_text" in generate["attributes"]["output.value"]  # token2text


def test_v1_trainer_without_a_limit_traces_every_session(tiny_model, tmp_path, monkeypatch):
    spans, _ = _run_v1(tiny_model, tmp_path, monkeypatch, {"backend": "file"},
                       samples=[3, 4], step=1, n=3)
    keys = sorted((t.sample_index, t.rollout_n)
                  for t in group_trajectories(spans) if t.root is not None)
    assert keys == [(i, r) for i in (3, 4) for r in range(3)]


def test_v1_trainer_with_tracing_off_writes_nothing(tiny_model, tmp_path, monkeypatch):
    spans, fake = _run_v1(tiny_model, tmp_path, monkeypatch, {"backend": None},
                          samples=[0], step=1, n=2)
    assert spans == [] and len(fake.rows) == 2


@pytest.fixture
def warnings_reset():
    _common.S.warned.clear()
    yield
    _common.S.warned.clear()


def test_unknown_trainer_worker_logs_one_warning(caplog, warnings_reset):
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    with caplog.at_level(logging.WARNING, logger="otel_verl"):
        class MyAsyncWorker(AgentLoopWorker):
            async def generate_sequences(self, batch: Any) -> None:
                return None

        class MyOtherWorker(MyAsyncWorker):  # same override inherited: its own class, one line
            async def generate_sequences(self, batch: Any) -> None:
                return None

        class Harmless(AgentLoopWorker):  # overrides nothing that runs samples
            pass

    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert "MyAsyncWorker overrides AgentLoopWorker.generate_sequences" in lines[0]
    assert "rollouts are traced only where" in lines[0]
    assert not any("Harmless" in line for line in lines)


def test_v1_worker_of_another_shape_is_named_in_one_warning(caplog, warnings_reset):
    class Changed:  # a future verl whose v1 worker runs samples differently
        async def generate_sequences(self, batch: Any) -> None:
            return None

        async def _run_agent_loop(self, prompt: Any, **kwargs: Any) -> None:
            return None

    module = types.ModuleType(_agent_loop.AGENT_LOOP_TQ_MODULE)
    module.AgentLoopWorkerTQ = Changed
    with caplog.at_level(logging.WARNING, logger="otel_verl"):
        _agent_loop.patch_agent_loop_tq(module)
        _agent_loop.patch_agent_loop_tq(module)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "trainer.use_v1=True are NOT traced" in lines[0], lines
    assert not vars(Changed).get(_common.MARK)


@pytest.mark.parametrize(("version", "supported"), [
    ("0.9.1", True), ("0.9.2.post1", True), ("0.9.1+local", True), ("0.9.0", False),
    ("0.10.0", False), ("1.0.0rc1", False), (None, False)])
def test_verl_version_range(version, supported, caplog, warnings_reset):
    with caplog.at_level(logging.WARNING, logger="otel_verl"):
        assert _common.check_verl_version(version) is supported
        _common.check_verl_version(version)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == (0 if supported else 1), lines
    if not supported:
        assert f"verl {version or '(unknown)'} is not a version" in lines[0]
        assert _common.SUPPORTED_VERL in lines[0]
