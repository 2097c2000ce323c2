"""Rewards with components and detector flags, backend=otlp -> a real Phoenix server: each
trajectory's root span carries the components (``rollout.reward.<name>``) and the flags with their
evidence (``rl.flag.<name>``), read back and filtered through Phoenix's GraphQL API (the UI's
filter box)."""

from __future__ import annotations

import json
import time

from _phoenix_server import PhoenixServer

from otel_verl import (
    RolloutTraceConfig,
    get_tracer,
    record_reward,
    rollout_trace_attr,
    rollout_trace_op,
    semconv,
)
from otel_verl.integrations.phoenix import annotate_rewards

PROJECT = "otel-verl-signals"
ROOTS = """query($n: String!, $f: String!) { getProjectByName(name: $n) {
  spans(first: 100, filterCondition: $f) { edges { node { name metadata attributes } } } } }"""


@rollout_trace_op
def generate(request_id: str, *, finish: str) -> dict:
    with get_tracer().start_as_current_span("chat tiny", attributes={
            semconv.GEN_AI_OPERATION_NAME: "chat", semconv.GEN_AI_REQUEST_MODEL: "tiny",
            semconv.GEN_AI_REQUEST_MAX_TOKENS: 8,
            semconv.GEN_AI_USAGE_OUTPUT_TOKENS: 8 if finish == "length" else 5,
            semconv.GEN_AI_RESPONSE_FINISH_REASONS: (finish,)}):
        return {"token_ids": [7] * 8}


def test_reward_components_and_flags_are_filterable_in_phoenix(phoenix: PhoenixServer, tmp_path):
    RolloutTraceConfig.reset()
    RolloutTraceConfig.init(PROJECT, "exp", "otlp", otlp_endpoint=phoenix.url,
                            otlp_protocol="http/protobuf", schedule_delay_s=0.2,
                            trace_dir=str(tmp_path), detect_flags=["length_cap"])
    for n, finish in enumerate(("length", "stop", "stop")):
        with rollout_trace_attr(step=1, sample_index=0, rollout_n=n):
            generate(f"r{n}", finish=finish)
            fmt = 0.0 if n == 2 else 0.2
            record_reward(1.0 + fmt, name="verifier", components={
                "correctness": 1.0, "format": {"score": fmt,
                                               "label": "ok" if fmt else "format_error"}})
    assert RolloutTraceConfig.shutdown(30)
    RolloutTraceConfig.reset()
    deadline = time.monotonic() + 120
    roots: list[dict] = []
    while time.monotonic() < deadline and len(roots) < 3:
        data = phoenix.graphql(ROOTS, n=PROJECT, f="parent_id is None")["getProjectByName"]
        roots = [e["node"] for e in (data or {"spans": {"edges": []}})["spans"]["edges"]]
        time.sleep(0.5)
    assert len(roots) == 3
    by_n = {}
    for root in roots:
        attrs = json.loads(root["attributes"])
        by_n[attrs["rollout"]["rollout_n"]] = attrs
    # Phoenix nests dotted keys; a key that is both a value and a prefix keeps the rest flat
    for attrs in by_n.values():
        assert attrs["rollout"]["reward.correctness"] == 1.0
    assert by_n[0]["rl"]["flags"] == ["length_cap"]
    assert by_n[0]["rl"]["flag"]["length_cap"] is True
    evidence = json.loads(by_n[0]["rl"]["flag"]["length_cap.evidence"])
    assert evidence["finish_reason"] == "length"
    assert "rl" not in by_n[1]
    for condition, expected in {
            "attributes['rl']['flag']['length_cap'] == True": [0],
            "attributes['rollout']['reward.format.label'] == 'format_error'": [2]}.items():
        data = phoenix.graphql(ROOTS, n=PROJECT, f=condition)["getProjectByName"]
        found = sorted(json.loads(e["node"]["attributes"])["rollout"]["rollout_n"]
                       for e in data["spans"]["edges"])
        assert found == expected, condition


ANNOTATED = """query($n: String!) { getProjectByName(name: $n) {
  spans(first: 100, filterCondition: "parent_id is None") { edges { node {
    attributes spanAnnotations { name score label explanation annotatorKind } } } } } }"""


def test_reward_components_become_phoenix_evaluations(phoenix: PhoenixServer, tmp_path):
    """annotate-rewards posts the reward and each of its components as its own evaluation
    (span annotation) of the trajectory, read back through Phoenix's GraphQL API and found by its
    evaluation filter."""
    project = "otel-verl-components"
    RolloutTraceConfig.reset()
    RolloutTraceConfig.init(project, "exp", "otlp", otlp_endpoint=phoenix.url,
                            otlp_protocol="http/protobuf", schedule_delay_s=0.2,
                            trace_dir=str(tmp_path))
    for n in range(3):
        with rollout_trace_attr(step=1, sample_index=0, rollout_n=n):
            generate(f"c{n}", finish="stop")
            fmt = 0.0 if n == 2 else 0.2
            record_reward(1.0 + fmt, name="verifier", label="correct", components={
                "correctness": 1.0,
                "format": {"score": fmt, "label": "ok" if fmt else "format_error",
                           "explanation": "#### answer found" if fmt else "no #### answer"}})
    assert RolloutTraceConfig.shutdown(30)
    RolloutTraceConfig.reset()
    deadline = time.monotonic() + 120
    roots: list[dict] = []
    while time.monotonic() < deadline and len(roots) < 3:
        data = phoenix.graphql(ANNOTATED, n=project)["getProjectByName"]
        roots = [e["node"] for e in (data or {"spans": {"edges": []}})["spans"]["edges"]]
        time.sleep(0.5)
    assert len(roots) == 3
    assert annotate_rewards(phoenix.url, project) == 3 * 3
    assert annotate_rewards(phoenix.url, project) == 3 * 3  # again: updated, not duplicated
    data = phoenix.graphql(ANNOTATED, n=project)["getProjectByName"]
    for edge in data["spans"]["edges"]:
        n = json.loads(edge["node"]["attributes"])["rollout"]["rollout_n"]
        fmt = 0.0 if n == 2 else 0.2
        got = {a["name"]: a for a in edge["node"]["spanAnnotations"]}
        assert sorted(got) == ["correctness", "format", "verifier"], got
        assert all(a["annotatorKind"] == "CODE" for a in got.values())
        assert got["verifier"]["score"] == 1.0 + fmt and got["verifier"]["label"] == "correct"
        assert got["correctness"]["score"] == 1.0
        assert got["format"]["score"] == fmt
        assert got["format"]["label"] == ("ok" if fmt else "format_error")
        assert got["format"]["explanation"] == ("#### answer found" if fmt else "no #### answer")
    names = phoenix.graphql("query($n: String!) { getProjectByName(name: $n) "
                            "{ spanAnnotationNames } }", n=project)
    assert sorted(names["getProjectByName"]["spanAnnotationNames"]) == \
        ["correctness", "format", "verifier"]
    # a component as the UI's evaluation filter finds it
    found = phoenix.graphql(ROOTS, n=project, f="annotations['format'].label == 'format_error'")
    rollouts = [json.loads(e["node"]["attributes"])["rollout"]["rollout_n"]
                for e in found["getProjectByName"]["spans"]["edges"]]
    assert rollouts == [2], rollouts
