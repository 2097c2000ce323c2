"""One root call per trajectory in every arrangement otel_verl produces under verl, whatever the
export batches; every ``rollout.*`` attribute of the trajectory on that root; Weave threads
(thread_id = trajectory, turn_id on each LLM turn); run linkage; spool replay that drains past a
call the server refuses. Pure: a recording HTTP endpoint on 127.0.0.1, no weave package."""

from __future__ import annotations

import json

import pytest
from _common import API_KEY, PROJECT_ID
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

from otel_weave_exporter import STATS_KEYS, WeaveSpanExporter, replay

TRAJ = {"rollout.step": 4, "rollout.sample_index": 2, "rollout.rollout_n": 1,
        "rollout.validate": False, "rollout.experiment_name": "exp"}
LLM = {"openinference.span.kind": "LLM"}
CHAT = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "m",
        "gen_ai.usage.input_tokens": 3, "gen_ai.usage.output_tokens": 2}


def _traj(tracer, traj, body, name="agent_loop"):
    with tracer.start_as_current_span(name, attributes={**traj, "otel_verl.trajectory": True}) as t:
        body(tracer, traj, t)


def _op(tracer, name, traj, child=False, **attrs):
    if child:
        attrs["otel_verl.trajectory_child"] = True
    return tracer.start_as_current_span(name, attributes={**traj, **attrs})


def _turns(tracer, traj, n=2, chat=True):
    for _ in range(n):
        with _op(tracer, "AsyncLLMServerManager.generate", traj, **LLM):
            if chat:
                with _op(tracer, "chat m", traj, **CHAT):
                    pass
        with _op(tracer, "HermesToolParser.extract_tool_calls", traj):
            pass


def reward_after_run(tracer, traj, t):  # verl: AgentLoopWorker._compute_score after run
    with _op(tracer, "ToolAgentLoop.run", traj, child=True, **{"openinference.span.kind": "AGENT"}):
        _turns(tracer, traj)
    with _op(tracer, "AgentLoopWorker._compute_score", traj, child=True,
             **{"openinference.span.kind": "EVALUATOR"}):
        pass
    t.set_attribute("rollout.reward", 1.0)
    t.set_attribute("rollout.num_turns", 4)


def reward_inside_run(tracer, traj, t):  # the agent loop scores its own trajectory
    with _op(tracer, "ToolAgentLoop.run", traj, child=True):
        _turns(tracer, traj, chat=False)
        with _op(tracer, "compute_score", traj):
            pass
    t.set_attribute("rollout.reward", 0.5)


def tools_around_the_loop(tracer, traj, t):  # BaseTool.create / release beside run
    with _op(tracer, "CalcTool.create", traj, child=True):
        pass
    with _op(tracer, "ToolAgentLoop.run", traj, child=True):
        _turns(tracer, traj, n=1)
    with _op(tracer, "CalcTool.release", traj, child=True):
        pass
    with _op(tracer, "hand-made", traj):  # get_tracer() span right under the trajectory
        pass
    t.set_attribute("rollout.reward", 0.0)


def streaming_reward(tracer, traj, t):  # reward computed while later turns still run
    with _op(tracer, "ToolAgentLoop.run", traj, child=True):
        _turns(tracer, traj, n=1)
        reward = tracer.start_span("RewardLoopWorker.compute_score", attributes=dict(traj))
        _turns(tracer, traj, n=1)
    reward.end()  # ends after run
    t.set_attribute("rollout.reward", 2.0)


ARRANGEMENTS = [reward_after_run, reward_inside_run, tools_around_the_loop, streaming_reward]


def _export(recorder, build, processor="simple", **options):
    exporter = WeaveSpanExporter(project=PROJECT_ID, api_key=API_KEY, base_url=recorder.url,
                                 **options)
    provider = TracerProvider()
    # simple: every span is its own export batch (the worst case for batch-dependent logic)
    provider.add_span_processor(SimpleSpanProcessor(exporter) if processor == "simple"
                                else BatchSpanProcessor(exporter, schedule_delay_millis=60_000))
    tracer = provider.get_tracer("t")
    build(tracer)
    provider.shutdown()
    return exporter, recorder.calls()


def _two_trajectories(arrangement):
    def build(tracer):
        _traj(tracer, TRAJ, arrangement)
        _traj(tracer, {**TRAJ, "rollout.rollout_n": 2}, arrangement)
    return build


@pytest.mark.parametrize("processor", ["simple", "batch"])
@pytest.mark.parametrize("arrangement", ARRANGEMENTS, ids=lambda f: f.__name__)
def test_exactly_one_root_per_trajectory_with_all_its_attributes(recorder, arrangement, processor):
    exporter, calls = _export(recorder, _two_trajectories(arrangement), processor)
    roots = [c for c in calls if c["parent_id"] is None]
    assert len(roots) == 2, [(c["op_name"], c["parent_id"]) for c in calls]
    by_id = {c["id"]: c for c in calls}
    for c in calls:  # every call hangs under its trajectory's root
        top = c
        while top["parent_id"] is not None:
            top = by_id[top["parent_id"]]
        assert top["attributes"]["rollout_n"] == c["attributes"]["rollout_n"]
    for root in roots:
        assert root["op_name"] == "agent_loop"
        assert {"step", "sample_index", "rollout_n", "validate", "experiment_name",
                "reward"} <= set(root["attributes"])
        assert root["wb_run_step"] == 4
    if arrangement is reward_after_run:
        assert all(r["attributes"]["num_turns"] == 4 for r in roots)
    # verl's filters: the trajectory attributes on every call, under verl's names
    assert all(c["attributes"]["step"] == 4 and c["attributes"]["experiment_name"] == "exp"
               for c in calls)
    assert exporter.stats()["skipped"] == 0 and exporter.stats()["delivered"] == len(calls)


def test_verl_tree_shape_is_still_available_and_its_limit_is_known(recorder):
    """keep_trajectory_spans=False: verl's own shape (the agent loop is the root) for a
    trajectory whose only direct child is the agent loop; a reward span beside it is a second
    root (the reason the trajectory span is the root by default)."""
    _, calls = _export(recorder, _two_trajectories(reward_after_run),
                       keep_trajectory_spans=False)
    roots = sorted(c["op_name"] for c in calls if c["parent_id"] is None)
    assert roots == ["AgentLoopWorker._compute_score"] * 2 + ["ToolAgentLoop.run"] * 2


@pytest.mark.parametrize("processor", ["simple", "batch"])
def test_threads_one_per_trajectory_and_one_turn_per_llm_call(recorder, processor):
    _, calls = _export(recorder, _two_trajectories(reward_after_run), processor)
    threads = {c["thread_id"] for c in calls}
    assert threads == {"exp/step=4/sample=2/n=1", "exp/step=4/sample=2/n=2"}
    for thread in threads:
        mine = [c for c in calls if c["thread_id"] == thread]
        turns = [c for c in mine if c["turn_id"] is not None]
        # two LLM turns: the chat span inside each generate op is the turn, not both
        assert [t["op_name"] for t in turns] == ["chat m", "chat m"]
        assert all(t["turn_id"] == t["id"] for t in turns)
        assert not any(c["turn_id"] for c in mine if c["op_name"].endswith("generate"))


def test_a_generate_op_without_a_chat_span_is_the_turn(recorder):
    _, calls = _export(recorder, lambda tr: _traj(tr, TRAJ, reward_inside_run))
    turns = [c["op_name"] for c in calls if c["turn_id"]]
    assert turns == ["AsyncLLMServerManager.generate"] * 2


def test_threads_can_be_turned_off_and_plain_genai_spans_use_the_conversation(recorder):
    _, calls = _export(recorder, lambda tr: _traj(tr, TRAJ, reward_inside_run), threads=False)
    assert not any(c["thread_id"] or c["turn_id"] for c in calls)
    recorder.requests.clear()

    def plain(tracer):  # an OTel GenAI app, no otel_verl trajectory
        with tracer.start_as_current_span("chat m", attributes={
                **CHAT, "gen_ai.conversation.id": "conv-1"}):
            pass
    _, calls = _export(recorder, plain)
    assert calls[0]["thread_id"] == "conv-1" and calls[0]["turn_id"] == calls[0]["id"]


def test_stats_keys_are_the_core_vocabulary():
    # otel_verl's names where the meaning is the same (otel_verl.exporters' table)
    assert {"delivered", "spooled", "spool_failed", "quarantined", "truncated", "requests",
            "retries", "dropped_after_shutdown"} <= set(STATS_KEYS)
    # not the processor's: "exported"/"export_failed" count batches handed to an exporter
    assert not {"exported", "export_failed"} & set(STATS_KEYS)
    assert not any(k.startswith(("calls_", "spans_")) for k in STATS_KEYS)


def _spool_with(tmp_path, recorder, n_good, bad=True):
    """Spool n_good calls (+ one the server will refuse) by exporting while the server is down."""
    recorder.statuses = [503] * 1000

    def build(tracer):
        for i in range(n_good):
            tracer.start_span(f"op{i}", attributes={"rollout.step": i}).end()
        if bad:
            tracer.start_span("refuse-me").end()
    exporter, _ = _export(recorder, build, "batch", spool_dir=str(tmp_path), timeout_s=0.3,
                          backoff_initial_s=0.05)
    assert exporter.stats()["spooled"] == n_good + bad
    recorder.statuses = []
    recorder.requests.clear()


def test_replay_drains_past_a_call_the_server_refuses(recorder, tmp_path):
    _spool_with(tmp_path, recorder, 6)
    recorder.reject_marker = b"refuse-me"
    counts = replay(tmp_path, api_key=API_KEY, base_url=recorder.url, timeout_s=5)
    assert counts == {"files": 1, "files_sent": 1, "delivered": 6, "undelivered": 0,
                      "quarantined": 1}
    accepted = [json.loads(r["body"]) for r in recorder.requests if b"refuse-me" not in r["body"]]
    assert sorted(c["op_name"] for b in accepted for c in b["batch"]) == [f"op{i}" for i in range(6)]
    (quarantine,) = tmp_path.glob("weave-rejected-*.jsonl")
    doc = json.loads(quarantine.read_text())
    assert doc["call"]["op_name"] == "refuse-me" and doc["error"].startswith("HTTP 400")
    assert not list(tmp_path.glob("weave-spool-*.jsonl"))  # drained (renamed *.sent)
    again = replay(tmp_path, api_key=API_KEY, base_url=recorder.url, timeout_s=5)
    assert again["files"] == 0  # nothing left to retry forever


def test_replay_keeps_what_the_server_could_not_take_yet(recorder, tmp_path):
    _spool_with(tmp_path, recorder, 4, bad=False)
    recorder.statuses = [503] * 1000
    counts = replay(tmp_path, api_key=API_KEY, base_url=recorder.url, timeout_s=0.3)
    assert counts["undelivered"] == 4 and counts["files_sent"] == 0
    (spool,) = tmp_path.glob("weave-spool-*.jsonl")
    assert len(spool.read_bytes().splitlines()) == 4
    recorder.statuses = []
    counts = replay(tmp_path, api_key=API_KEY, base_url=recorder.url, timeout_s=5)
    assert counts["delivered"] == 4 and counts["files_sent"] == 1


def dropin_agent_loop(tracer, traj, t):  # verl's drop-in API: nothing but the ops, then reward
    with _op(tracer, "ToolAgentLoop.run", traj, child=True, **{"openinference.span.kind": "AGENT"}):
        _turns(tracer, traj, chat=False)
    t.set_attribute("rollout.reward", 1.0)
    t.set_attribute("otel_verl.trajectory_op", "ToolAgentLoop.run")  # otel_verl sets it at end


@pytest.mark.parametrize("otel_attributes", [True, False])
def test_a_trajectory_only_its_ops_describe_is_named_after_its_agent_loop(recorder,
                                                                          otel_attributes):
    """A roots-only filter on the agent loop's op finds each trajectory once (verl's backend:
    ``ToolAgentLoop.run`` is the root); the trajectory's own name and attributes stay."""
    _, calls = _export(recorder, _two_trajectories(dropin_agent_loop),
                       include_otel_attributes=otel_attributes)
    roots = [c for c in calls if c["parent_id"] is None]
    assert [r["op_name"] for r in roots] == ["ToolAgentLoop.run"] * 2
    assert all(r["display_name"] is None and r["attributes"]["reward"] == 1.0 for r in roots)
    if otel_attributes:
        assert {r["attributes"]["otel"]["span_name"] for r in roots} == {"agent_loop"}
    by_id = {c["id"]: c for c in calls}
    runs = [c for c in calls if c["op_name"] == "ToolAgentLoop.run" and c["parent_id"]]
    assert len(runs) == 2 and all(by_id[r["parent_id"]] in roots for r in runs)
    # verl's shape (trajectory dropped) is unchanged: the agent loop itself is the root
    recorder.requests.clear()
    _, calls = _export(recorder, _two_trajectories(dropin_agent_loop), keep_trajectory_spans=False)
    assert sorted(c["op_name"] for c in calls if c["parent_id"] is None) == \
        ["ToolAgentLoop.run"] * 2
