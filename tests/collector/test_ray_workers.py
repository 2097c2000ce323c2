"""A real Ray cluster (local, 2 CPUs): trajectories whose reward runs in a Ray task and whose tool
runs in a Ray actor stay one trace, with the right parents and the trajectory attributes on the
worker spans, and nothing is lost when Ray shuts its workers down.

Worker spans go to backend=file in a temp dir (each worker process writes its own file) and are
read back with otel_verl's store reader.
"""

from __future__ import annotations

import os
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import ray

from otel_verl import (
    RolloutTraceConfig,
    SpanKindName,
    rollout_trace_attr,
    rollout_trace_op,
    semconv,
)
from otel_verl.integrations.ray import CARRIER_KWARG, call_with_context, runtime_env, traced_remote
from otel_verl.store import list_files, read_spans


@ray.remote
@traced_remote
@rollout_trace_op(kind=SpanKindName.EVALUATOR)
def compute_reward(solution: str, ground_truth: str) -> dict[str, Any]:
    return {"score": float(solution.strip() == ground_truth), "pid": os.getpid()}


@ray.remote
@traced_remote
class CalculatorTool:
    """A tool with state, as verl's sandbox tools are: one actor serves many trajectories."""

    def __init__(self) -> None:
        self.calls = 0

    @rollout_trace_op(kind=SpanKindName.TOOL)
    def execute(self, expression: str) -> dict[str, Any]:
        self.calls += 1
        return {"stdout": str(eval(expression, {"__builtins__": {}})), "pid": os.getpid()}

    @rollout_trace_op(kind=SpanKindName.TOOL)
    async def aexecute(self, expression: str) -> dict[str, Any]:
        return {"stdout": str(eval(expression, {"__builtins__": {}})), "pid": os.getpid()}

    def count(self) -> int:
        return self.calls


class ToyAgentLoop:
    @rollout_trace_op
    def run(self, tool: Any, expression: str, answer: str) -> dict[str, Any]:
        out = ray.get(call_with_context(tool.execute, expression))
        out2 = ray.get(call_with_context(tool.aexecute, expression))
        reward = ray.get(call_with_context(compute_reward, out["stdout"], answer))
        return {"tool_pids": [out["pid"], out2["pid"]], "reward": reward}


SAMPLES = {3: ("6 * 7", "42"), 5: ("2 + 2", "5")}


@pytest.fixture
def ray_cluster(tmp_path: Path):
    # The test module is not importable inside Ray's workers: ship its functions by value.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    RolloutTraceConfig.init("proj-ray", "exp-ray", backend="file", trace_dir=str(tmp_path),
                            processor="batch", service_name="ray-test")
    ray.init(num_cpus=2, runtime_env=runtime_env(), include_dashboard=False,
             log_to_driver=False, configure_logging=False)
    try:
        yield tmp_path
    finally:
        ray.shutdown()
        ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def test_ray_task_and_actor_spans_join_the_trajectory(ray_cluster: Path) -> None:
    trace_dir = ray_cluster
    tool = CalculatorTool.remote()
    results = {}
    for sample_index, (expression, answer) in SAMPLES.items():
        with rollout_trace_attr(sample_index=sample_index, step=1, rollout_n=0):
            results[sample_index] = ToyAgentLoop().run(tool, expression, answer)
    # a call without the carrier still works (its spans start their own trace)
    assert ray.get(tool.execute.remote("1 + 1"))["stdout"] == "2"
    assert ray.get(tool.count.remote()) == 3
    ray.shutdown()
    assert RolloutTraceConfig.shutdown()

    driver_pid = os.getpid()
    actor_pids = {pid for r in results.values() for pid in r["tool_pids"]}
    task_pids = {r["reward"]["pid"] for r in results.values()}
    assert len(actor_pids) == 1  # one actor served every call
    assert driver_pid not in actor_pids | task_pids
    assert not actor_pids & task_pids  # tasks ran in pooled workers, not in the actor
    assert results[3]["reward"]["score"] == 1.0 and results[5]["reward"]["score"] == 0.0
    assert len(list_files(trace_dir)) >= 3  # one store file per process

    spans = list(read_spans(trace_dir))
    by_trace: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for span in spans:
        by_trace[span["trace_id"]].append(span)
    untraced = [t for t, ss in by_trace.items()
                if not any(s["attributes"].get(semconv.OTEL_VERL_TRAJECTORY) for s in ss)]
    trajectories = {t: ss for t, ss in by_trace.items() if t not in untraced}
    assert len(trajectories) == 2

    for tspans in trajectories.values():
        names = sorted(s["name"] for s in tspans)
        # exactly these, once each: nothing lost, nothing duplicated
        assert names == sorted(["rollout_trace", "ToyAgentLoop.run", "CalculatorTool.execute",
                                "CalculatorTool.aexecute", "compute_reward"]), names
        by_name = {s["name"]: s for s in tspans}
        root = by_name["rollout_trace"]
        run = by_name["ToyAgentLoop.run"]
        assert root["parent_span_id"] is None
        assert run["parent_span_id"] == root["span_id"]
        sample_index = root["attributes"][semconv.ROLLOUT_SAMPLE_INDEX]
        for name in ("CalculatorTool.execute", "CalculatorTool.aexecute", "compute_reward"):
            worker_span = by_name[name]
            assert worker_span["parent_span_id"] == run["span_id"], name
            attrs = worker_span["attributes"]
            assert attrs[semconv.ROLLOUT_STEP] == 1, name
            assert attrs[semconv.ROLLOUT_SAMPLE_INDEX] == sample_index, name
            assert attrs[semconv.ROLLOUT_ROLLOUT_N] == 0, name
            assert attrs[semconv.ROLLOUT_EXPERIMENT_NAME] == "exp-ray", name
            # the worker built its provider from the driver's configuration
            assert worker_span["resource"]["service.name"] == "ray-test", name
            # the carrier is transport, not an argument of the traced function
            assert CARRIER_KWARG not in attrs.get(semconv.INPUT_VALUE, ""), name
            # children end before their parent
            assert worker_span["end_ns"] <= run["end_ns"], name
        assert by_name["compute_reward"]["attributes"][semconv.OPENINFERENCE_SPAN_KIND] == (
            SpanKindName.EVALUATOR)
        assert by_name["CalculatorTool.execute"]["attributes"][semconv.OPENINFERENCE_SPAN_KIND] == (
            SpanKindName.TOOL)
    expected_roots = {3, 5}
    assert {next(s for s in ss if s["name"] == "rollout_trace")["attributes"][
        semconv.ROLLOUT_SAMPLE_INDEX] for ss in trajectories.values()} == expected_roots


def test_untraced_trajectory_stays_silent_in_workers(ray_cluster: Path) -> None:
    """trace=False on the driver travels in the carrier: workers record nothing for it."""
    trace_dir = ray_cluster
    tool = CalculatorTool.remote()
    with rollout_trace_attr(sample_index=1, step=2, trace=False):
        ToyAgentLoop().run(tool, "3 * 3", "9")
    with rollout_trace_attr(sample_index=2, step=2):
        ToyAgentLoop().run(tool, "3 * 4", "12")
    ray.shutdown()
    RolloutTraceConfig.shutdown()
    spans = list(read_spans(trace_dir))
    assert {s["attributes"].get(semconv.ROLLOUT_SAMPLE_INDEX) for s in spans} == {2}
    assert len(spans) == 5


def test_ray_workers_export_through_a_collector(tmp_path: Path) -> None:
    """The production path: driver and Ray workers all use backend=otlp to a node-local collector
    (rotel here, the otelcol sidecar in production), which forwards to the backend (a receiver)."""
    from _collector_otlp import otlp_receiver, rotel_collector

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    with otlp_receiver() as receiver, rotel_collector(
            tmp_path, forward_to=f"http://127.0.0.1:{receiver.grpc_port}",
            forward_protocol="grpc") as rotel:
        RolloutTraceConfig.init("proj-ray", "exp-ray-otlp", backend="otlp",
                                otlp_endpoint=rotel.grpc_endpoint, otlp_protocol="grpc",
                                service_name="ray-otlp")
        ray.init(num_cpus=2, runtime_env=runtime_env(), include_dashboard=False,
                 log_to_driver=False, configure_logging=False)
        try:
            tool = CalculatorTool.remote()
            with rollout_trace_attr(sample_index=7, step=4, rollout_n=1):
                ToyAgentLoop().run(tool, "5 * 5", "25")
        finally:
            ray.shutdown()
            ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
        assert RolloutTraceConfig.shutdown()
        spans = receiver.wait_for(5, timeout_s=20.0)
    assert sorted(s.name for s in spans) == sorted([
        "rollout_trace", "ToyAgentLoop.run", "CalculatorTool.execute", "CalculatorTool.aexecute",
        "compute_reward"])
    assert len({s.trace_id for s in spans}) == 1
    by_name = {s.name: s for s in spans}
    for name in ("CalculatorTool.execute", "CalculatorTool.aexecute", "compute_reward"):
        assert by_name[name].parent_span_id == by_name["ToyAgentLoop.run"].span_id, name
        assert by_name[name].attributes[semconv.ROLLOUT_SAMPLE_INDEX] == 7, name
        assert by_name[name].attributes[semconv.ROLLOUT_STEP] == 4, name
        assert by_name[name].resource["service.name"] == "ray-otlp", name
