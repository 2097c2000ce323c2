"""Run linkage across processes: calls made in a worker process carry the trainer's W&B run
(``wb_run_id``) and step (``wb_run_step``), also when the run starts after the workers exist.

verl's shape: the driver (trainer) configures tracing and hands the configuration to its workers
with ``RolloutTraceConfig.export_env()`` before ``fit()`` calls ``wandb.init``. ``export_env``
fixes the run id up front (``WANDB_RUN_ID``, which wandb honours); the worker's calls carry it.
Here: a real second process, wandb 0.31 in offline mode, Weave's own server code.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from _common import API_KEY

WORKER = textwrap.dedent("""
    import os, sys
    assert "WANDB_RUN_ID" not in os.environ  # the id travels in the trace configuration
    from otel_verl import RolloutTraceConfig, SpanKindName, record_reward, rollout_trace_attr
    from otel_verl import rollout_trace_op

    class Server:
        @rollout_trace_op(kind=SpanKindName.LLM)
        def generate(self, request_id, *, prompt_ids):
            return {"token_ids": [1, 2]}

    class ToolAgentLoop:
        @rollout_trace_op(kind=SpanKindName.AGENT)
        def run(self, sampling_params, **kwargs):
            Server().generate("r", prompt_ids=[1, 2, 3])
            return {"num_turns": 2}

    assert RolloutTraceConfig.init_from_env()
    for step, index in ((3, 0), (3, 1), (4, 0)):
        with rollout_trace_attr(sample_index=index, step=step, rollout_n=0, name="agent_loop"):
            ToolAgentLoop().run({"temperature": 1.0}, index=index)
            record_reward(1.0)
    assert RolloutTraceConfig.shutdown(timeout_s=10)
    print("worker pid", os.getpid(), RolloutTraceConfig.stats() or "done")
""")


def test_worker_calls_carry_the_trainers_run_started_later(weave_server, monkeypatch, tmp_path):
    # skips inside the test: a module-level skip would fire in tiers that deselect it
    wandb = pytest.importorskip("wandb", reason="needs wandb (requirements/weave.txt)")
    pytest.importorskip("otel_verl", reason="needs the otel_verl core")

    monkeypatch.setenv("WANDB_API_KEY", API_KEY)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_RUN_ID", "placeholder")  # restored (removed) after the test
    monkeypatch.delenv("WANDB_RUN_ID")
    from otel_verl import RolloutTraceConfig

    # the driver: tracing configured, workers created, no W&B run yet (verl: before fit())
    RolloutTraceConfig.init("proj", "exp-link", backend="weave", weave_entity="ent",
                            weave_base_url=weave_server.url, trace_dir=str(tmp_path / "traces"))
    env = RolloutTraceConfig.export_env()
    run_id = json.loads(env["OTEL_VERL_CONFIG"])["wandb_run_id"]
    assert run_id and os.environ["WANDB_RUN_ID"] == run_id
    assert RolloutTraceConfig.export_env() == env  # stable: the same id for every worker

    worker_env = {k: v for k, v in os.environ.items() if k != "WANDB_RUN_ID"}
    worker_env.update(env)
    done = subprocess.run([sys.executable, "-c", WORKER], env=worker_env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]

    # the trainer starts its run only now (verl: Tracking() in fit()); wandb takes the fixed id
    run = wandb.init(project="proj", entity="ent")
    try:
        assert run.id == run_id
    finally:
        wandb.finish()
    RolloutTraceConfig.reset()

    calls = weave_server.calls("ent/proj")
    assert len(calls) == 3 * 3  # trajectory + run + generate, three trajectories
    expected = f"ent/proj/{run_id}"
    print(f"\nworker calls: {len(calls)}, wb_run_id {sorted({c.wb_run_id for c in calls})}, "
          f"wb_run_step {sorted({c.wb_run_step for c in calls})}")
    assert {c.wb_run_id for c in calls} == {expected}
    assert all(c.wb_run_step == c.attributes["step"] for c in calls)
    # Weave's run filter (what the W&B run page uses) finds them
    linked = weave_server.calls("ent/proj", wb_run_ids=[expected])
    assert len(linked) == len(calls)
    assert {c.attributes["step"] for c in linked} == {3, 4}
