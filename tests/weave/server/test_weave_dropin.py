"""verl's drop-in API (``rollout_trace_attr`` + bare ``rollout_trace_op`` + ``record_reward``, no
``set_trajectory_*``) with backend="weave", beside verl's own weave backend on the same rollout,
both into Weave's own server code (weave 0.52.42 SqliteTraceServer): what a verl user filters and
reads in Weave must be there (issue 24, items 2 and 3).

* The Traces view's roots-only op filter on the agent loop (``ToolAgentLoop.run``) finds the same
  trajectories in both projects; every root has the prompt as input and the agent loop's output
  (plus the reward) as output.
* Pydantic outputs keep their class as Weave's client records it (``ToolResponse``,
  ``FunctionCall``, ``AgentLoopOutput``): the agent loop's subtree is the same call for call.
* LLM calls are turns (``turn_id``): the Threads view has one thread per trajectory.
* A worker started from ``export_env()`` under ``OTEL_TRACES_EXPORTER=none`` delivers.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from _common import API_KEY

ROLLOUT_DIR = Path(__file__).resolve().parents[2] / "rollout"
sys.path.insert(0, str(ROLLOUT_DIR))

otel_verl = pytest.importorskip("otel_verl", reason="needs the otel_verl core")

import _dropin_agent as d  # noqa: E402 -- after the path insert

AGENT_OP = "ToolAgentLoop.run"
TRAJ_KEYS = ("step", "sample_index", "rollout_n", "validate", "experiment_name")


def _canon(call, children_of):
    """A call and its subtree as comparable values (op, trajectory attrs, payloads, kids)."""
    kids = sorted((_canon(k, children_of) for k in children_of.get(call.id, [])), key=repr)
    name = call.op_name.split("/op/", 1)[1].rsplit(":", 1)[0] if call.op_name.startswith(
        "weave:///") else call.op_name
    return (name, tuple((k, call.attributes.get(k)) for k in TRAJ_KEYS),
            json.dumps(call.inputs, sort_keys=True), json.dumps(call.output, sort_keys=True),
            tuple(kids))


def _children(calls):
    children_of: dict[str, list] = {}
    for c in calls:
        if c.parent_id is not None:
            children_of.setdefault(c.parent_id, []).append(c)
    return children_of


def _trace_with_verls_backend(server) -> None:
    from weave.trace import weave_client
    from weave.trace.context import weave_client_context

    client = weave_client.WeaveClient("ent", "verl", server, ensure_project_exists=False)
    weave_client_context.set_weave_client_global(client)
    token = d.MODE.set("verl")
    try:
        asyncio.run(d.run_all())
        client.flush()
    finally:
        d.MODE.reset(token)
        weave_client_context.set_weave_client_global(None)


def _trace_with_otel_verl(url: str, tmp_path) -> None:
    from otel_verl import RolloutTraceConfig

    RolloutTraceConfig.reset()
    RolloutTraceConfig.init("dropin", d.EXPERIMENT, backend="weave", weave_entity="ent",
                            weave_base_url=url, trace_dir=str(tmp_path / "traces"))
    try:
        asyncio.run(d.run_all())
        assert RolloutTraceConfig.shutdown(timeout_s=20)
    finally:
        RolloutTraceConfig.reset()


def _key(call):
    return tuple(call.attributes[k] for k in ("step", "sample_index", "rollout_n"))


def test_dropin_rollout_reads_in_weave_as_verls_backend_writes_it(weave_server, monkeypatch,
                                                                 tmp_path):
    monkeypatch.setenv("WEAVE_DISABLED", "false")  # the weave client is verl's backend here
    monkeypatch.setenv("WEAVE_CLIENT_PARALLELISM", "0")  # see test_weave_parity.py
    monkeypatch.setenv("WANDB_API_KEY", API_KEY)
    _trace_with_verls_backend(weave_server.server)
    _trace_with_otel_verl(weave_server.url, tmp_path)
    n = len(d.SAMPLES)

    # the Traces view, roots only, op filter = the agent loop: the same trajectories
    verl_roots = weave_server.calls("ent/verl", trace_roots_only=True)
    ours_filtered = weave_server.calls("ent/dropin", trace_roots_only=True, op_names=[AGENT_OP])
    ours_roots = weave_server.calls("ent/dropin", trace_roots_only=True)
    assert len(verl_roots) == n and {_canon(r, {})[0] for r in verl_roots} == {AGENT_OP}
    assert sorted(map(_key, ours_filtered)) == sorted(map(_key, verl_roots))
    assert len(ours_roots) == len(ours_filtered) == n  # nothing else is a root
    shown = [r for r in ours_roots if r.inputs and r.output]
    print(f"\nroots-only filter {AGENT_OP!r}: verl {len(verl_roots)}, otel_verl "
          f"{len(ours_filtered)}; otel_verl root rows with input and output: {len(shown)} of "
          f"{len(ours_roots)}")
    assert len(shown) == n

    verl_by_key = {_key(r): r for r in verl_roots}
    ours_calls = weave_server.calls("ent/dropin")
    verl_calls = weave_server.calls("ent/verl")
    ours_children, verl_children = _children(ours_calls), _children(verl_calls)
    rewards = {(s.step, s.sample_index, s.rollout_n): s.reward for s in d.SAMPLES}
    for root in ours_roots:
        verl_root = verl_by_key[_key(root)]
        # the root row: verl's input (the prompt), verl's output plus the reward
        assert root.inputs == verl_root.inputs
        assert root.inputs["kwargs"]["raw_prompt"][0]["content"].startswith("What is")
        assert root.output == {**verl_root.output, "reward": rewards[_key(root)]}
        assert root.output["_type"] == "AgentLoopOutput"
        # otel_verl's extras stay: the reward attribute and the trajectory span's own name
        assert root.attributes["reward"] == rewards[_key(root)]
        assert root.attributes["otel"]["span_name"] == "agent_loop"
        # under the root, the agent loop's own call: verl's root call, call for call (pydantic
        # outputs with Weave's class records included)
        (run,) = ours_children[root.id]
        assert _canon(run, ours_children) == _canon(verl_root, verl_children)
    tool_outputs = [c.output for c in ours_calls if c.op_name == "CalcTool.execute"]
    assert tool_outputs and all(o[0]["_type"] == "ToolResponse" for o in tool_outputs)
    parsed = [c.output for c in ours_calls if c.op_name == "HermesToolParser.extract_tool_calls"]
    assert any(o[1] and o[1][0]["_class_name"] == "FunctionCall" for o in parsed)

    # the Threads view: one thread per trajectory, one turn per LLM call
    threads = {c.thread_id for c in ours_calls}
    assert len(threads) == n and None not in threads
    turns = [c for c in ours_calls if c.turn_id]
    assert {c.op_name for c in turns} == {"LLMServerClient.generate"}
    assert len(turns) == sum(s.llm_turns for s in d.SAMPLES)
    assert all(c.turn_id == c.id for c in turns)


WORKER = textwrap.dedent("""
    import asyncio, os, sys
    sys.path.insert(0, sys.argv[1])
    assert os.environ["OTEL_TRACES_EXPORTER"] == "none"  # the README's launcher setting
    import _dropin_agent as d
    from otel_verl import RolloutTraceConfig
    assert RolloutTraceConfig.init_from_env(), "the worker traces nothing"
    assert RolloutTraceConfig.get_backend() == "weave", RolloutTraceConfig.get_backend()
    asyncio.run(d.run_all())
    assert RolloutTraceConfig.shutdown(timeout_s=20)
""")


def test_worker_under_otel_traces_exporter_none_delivers_to_the_drivers_weave(
        weave_server, monkeypatch, tmp_path):
    """issue 24 item 2: driver init -> export_env -> a real worker process whose environment
    has OTEL_TRACES_EXPORTER=none -> its trajectories are in Weave."""
    from otel_verl import RolloutTraceConfig

    monkeypatch.setenv("WANDB_API_KEY", API_KEY)
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    RolloutTraceConfig.init("worker", d.EXPERIMENT, backend="weave", weave_entity="ent",
                            weave_base_url=weave_server.url, trace_dir=str(tmp_path / "traces"),
                            wandb_run_id="run1")
    env = {**os.environ, **RolloutTraceConfig.export_env()}
    RolloutTraceConfig.reset()
    done = subprocess.run([sys.executable, "-c", WORKER, str(ROLLOUT_DIR)], env=env,
                          capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    roots = weave_server.calls("ent/worker", trace_roots_only=True)
    calls = weave_server.calls("ent/worker")
    print(f"\ntrajectories in Weave from the worker under OTEL_TRACES_EXPORTER=none: "
          f"{len(roots)} of {len(d.SAMPLES)} ({len(calls)} calls)")
    assert sorted(map(_key, roots)) == sorted((s.step, s.sample_index, s.rollout_n)
                                              for s in d.SAMPLES)
    assert len(calls) == sum(s.spans for s in d.SAMPLES)
