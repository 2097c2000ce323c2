"""A traced rollout as Phoenix shows it: read back through Phoenix's own GraphQL and REST APIs,
and screenshotted in its UI by a real headless Chromium (see conftest.py for the rollout)."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import pytest
from _browser import Browser, chromium_path
from _phoenix_server import PhoenixServer
from _rollout_plan import DROPIN_PROJECT, EXPERIMENT, PROJECT, Q1, Rollout, Trajectory

from otel_verl.integrations.phoenix import annotate_rewards

ROOTS = """query($n: String!) { getProjectByName(name: $n) {
  spans(first: 100, filterCondition: "parent_id is None") { edges { node {
    name spanKind spanId metadata input { value } output { value }
    cumulativeTokenCountPrompt cumulativeTokenCountCompletion
    trace { traceId numSpans spans(first: 100) { edges { node {
      name spanKind parentId tokenCountPrompt tokenCountCompletion attributes } } } }
    spanAnnotations { name score label annotatorKind } } } } } }"""


def _roots(phoenix: PhoenixServer) -> list[dict]:
    data = phoenix.graphql(ROOTS, n=PROJECT)["getProjectByName"]
    return [edge["node"] for edge in data["spans"]["edges"]]


def _key(meta: dict) -> tuple:
    return (meta["sample_index"], meta["rollout_n"], meta["validate"])


def _by_trajectory(rollout: Rollout, phoenix: PhoenixServer) -> dict[Trajectory, dict]:
    roots = {_key(json.loads(r["metadata"])): r for r in _roots(phoenix)}
    return {t: roots[(t.sample_index, t.rollout_n, t.validate)] for t in rollout.trajectories}


def test_delivery_counts_match_what_phoenix_stored(rollout: Rollout):
    expected = sum(sum(t.span_kinds.values()) for t in rollout.trajectories)
    assert rollout.stats.get("exported") == expected, rollout.stats
    assert not rollout.stats.get("export_failed") and not rollout.stats.get("dropped_queue_full")
    print(f"\nrollout of {len(rollout.trajectories)} trajectories ({expected} spans) sent and "
          f"stored in {rollout.seconds:.1f}s")


def test_each_trajectory_is_one_trace_with_every_span_kind(rollout: Rollout,
                                                           phoenix: PhoenixServer):
    roots = _roots(phoenix)
    assert len(roots) == len(rollout.trajectories)  # one root per trajectory: nothing orphaned
    assert len({r["trace"]["traceId"] for r in roots}) == len(rollout.trajectories)
    for t, root in _by_trajectory(rollout, phoenix).items():
        assert (root["name"], root["spanKind"]) == ("agent_loop", "agent")
        spans = [e["node"] for e in root["trace"]["spans"]["edges"]]
        assert root["trace"]["numSpans"] == len(spans) == sum(t.span_kinds.values())
        kinds = Counter(s["spanKind"].upper() for s in spans)
        assert kinds == Counter({k: v for k, v in t.span_kinds.items() if v}), t
        names = {s["name"] for s in spans}
        assert {"agent_loop", "ToolAgentLoop.run", "AsyncTokenClient.generate",
                "Gsm8kReward.compute_score"} <= names
        assert not {n for n in names if n.startswith("chat ")}  # one span per LLM call
        assert ("BaseTool.execute" in names) == bool(t.tool_calls)
        conversations = set()
        for span in spans:  # every span carries the trajectory, filterable on its own
            attrs = json.loads(span["attributes"])
            assert attrs["rollout"]["sample_index"] == t.sample_index, span["name"]
            assert attrs["rollout"]["validate"] is t.validate
            assert attrs["session"]["id"] == t.session
            if span["spanKind"] in ("agent", "llm") or span["name"] == "ToolAgentLoop.run":
                conversations.add(attrs["gen_ai"]["conversation"]["id"])
        assert len(conversations) == 1  # the trajectory is one GenAI conversation


def test_root_row_reads_prompt_in_answer_and_reward_out(rollout: Rollout, phoenix: PhoenixServer):
    for t, root in _by_trajectory(rollout, phoenix).items():
        assert root["input"]["value"] == t.prompt  # the question, as plain text
        assert json.loads(root["output"]["value"]) == {
            "answer": t.answer, "reward": t.reward, "reward_label": t.label}
        assert json.loads(root["metadata"]) == {
            "step": 1, "sample_index": t.sample_index, "rollout_n": t.rollout_n,
            "validate": t.validate, "experiment_name": EXPERIMENT}


def test_dropin_api_root_rows_show_the_agent_loops_input_and_output(dropin_rollout,
                                                                    phoenix: PhoenixServer):
    """verl's drop-in API (rollout_trace_attr + rollout_trace_op + record_reward, nothing else):
    each root row shows the agent loop's input (the prompt) and its output with the reward."""
    data = phoenix.graphql(ROOTS, n=DROPIN_PROJECT)["getProjectByName"]
    roots = [edge["node"] for edge in data["spans"]["edges"]]
    shown = [r for r in roots if (r["input"] or {}).get("value") and
             (r["output"] or {}).get("value")]
    print(f"\nphoenix, drop-in API: {len(shown)} of {len(roots)} root rows have input and output")
    assert len(roots) == len(dropin_rollout) and len(shown) == len(roots)
    by_key = {(m["step"], m["sample_index"], m["rollout_n"]): r for r in roots
              for m in [json.loads(r["metadata"])]}
    for sample in dropin_rollout:
        root = by_key[(sample.step, sample.sample_index, sample.rollout_n)]
        assert (root["name"], root["spanKind"]) == ("agent_loop", "agent")
        inputs = json.loads(root["input"]["value"])
        assert inputs["kwargs"]["raw_prompt"] == [{"role": "user", "content": sample.question}]
        output = json.loads(root["output"]["value"])
        assert output["_type"] == "AgentLoopOutput" and output["reward"] == sample.reward
        assert output["num_turns"] == sample.llm_turns + sample.tool_calls
        spans = [e["node"] for e in root["trace"]["spans"]["edges"]]
        kinds = Counter(s["spanKind"] for s in spans if s["name"] == "LLMServerClient.generate")
        assert kinds == {"llm": sample.llm_turns}  # verl's generate is an LLM span here too


def test_llm_spans_carry_messages_and_token_counts(rollout: Rollout, phoenix: PhoenixServer):
    for t, root in _by_trajectory(rollout, phoenix).items():
        spans = [e["node"] for e in root["trace"]["spans"]["edges"]]
        llm = [s for s in spans if s["spanKind"] == "llm"]
        prompt = completion = 0
        conversation: list[dict] = []  # each turn's messages hold what it appends (per-turn capture)
        for span in sorted(llm, key=lambda s: s["tokenCountPrompt"]):
            attrs = json.loads(span["attributes"])
            usage = attrs["gen_ai"]["usage"]
            # Phoenix's own token columns, from the GenAI usage attributes
            assert span["tokenCountPrompt"] == usage["input_tokens"] > 0
            assert span["tokenCountCompletion"] == usage["output_tokens"] > 0
            prompt += usage["input_tokens"]
            completion += usage["output_tokens"]
            # gen_ai.input.messages became Phoenix's chat messages: the first turn's whole
            # prompt, later turns what they append to the messages their base holds
            content = attrs["otel_verl"]["content"]
            assert content.get("messages_base_len", 0) == len(conversation)
            conversation += [m["message"] for m in attrs["llm"]["input_messages"]]
            assert content["messages_len"] == len(conversation)
            assert attrs["llm"]["output_messages"][0]["message"]["role"] == "assistant"
        first = conversation[0]
        assert (first["role"], first["content"]) == ("user", t.prompt)
        assert root["cumulativeTokenCountPrompt"] == prompt
        assert root["cumulativeTokenCountCompletion"] == completion
        if t.tool_calls:  # the last turn saw the tool call and its result as messages
            assert [m["role"] for m in conversation] == ["user", "assistant", "tool"]
            assert conversation[1]["tool_calls"][0]["tool_call"]["function"]["name"] == \
                "calculator"


def test_tool_and_evaluator_spans(rollout: Rollout, phoenix: PhoenixServer):
    for t, root in _by_trajectory(rollout, phoenix).items():
        spans = [e["node"] for e in root["trace"]["spans"]["edges"]]
        (evaluator,) = [s for s in spans if s["spanKind"] == "evaluator"]
        evaluation = json.loads(evaluator["attributes"])["gen_ai"]["evaluation"]
        assert (evaluation["name"], evaluation["score"]["value"], evaluation["score"]["label"]) \
            == ("gsm8k", t.reward, t.label)
        for tool in (s for s in spans if s["spanKind"] == "tool"):
            attrs = json.loads(tool["attributes"])
            assert attrs["gen_ai"]["operation"]["name"] == "execute_tool"
            assert attrs["gen_ai"]["tool"]["name"] == "calculator"
            assert attrs["tool"]["name"] == "calculator"  # Phoenix's own tool name


def test_rollout_attributes_are_filterable_metadata(rollout: Rollout, phoenix: PhoenixServer):
    # REST: the attribute filter on the dotted rollout.* keys
    body = phoenix.rest(f"/v1/projects/{PROJECT}/spans", limit=1000,
                        attribute=["rollout.sample_index:1", "otel_verl.trajectory:true"])
    assert sorted(s["attributes"]["rollout.rollout_n"] for s in body["data"]) == [0, 1]
    # GraphQL / the UI's filter box: metadata under verl's names, and the attributes themselves
    query = """query($n: String!, $f: String!) { getProjectByName(name: $n) {
      spans(first: 100, filterCondition: $f) { edges { node { name metadata } } } } }"""
    expected = {
        "metadata['sample_index'] == 0 and metadata['validate'] == False and parent_id is None":
            3,
        "metadata['validate'] == True and span_kind == 'LLM'": 2,
        "attributes['rollout']['rollout_n'] == 1 and span_kind == 'EVALUATOR'": 2,
        "metadata['step'] == 1 and span_kind == 'AGENT'": len(rollout.trajectories),
    }
    for condition, count in expected.items():
        edges = phoenix.graphql(query, n=PROJECT, f=condition)["getProjectByName"]["spans"]
        assert len(edges["edges"]) == count, condition


def test_runs_in_the_rollout_project_grouped_by_grpo_group(rollout: Rollout,
                                                           phoenix: PhoenixServer):
    data = phoenix.graphql("""{ projects { edges { node { name traceCount
      sessions(first: 20) { edges { node { sessionId numTraces firstInput { value } } } } } } } }""")
    projects = {e["node"]["name"]: e["node"] for e in data["projects"]["edges"]}
    assert projects[PROJECT]["traceCount"] == len(rollout.trajectories)
    assert projects.get("default", {"traceCount": 0})["traceCount"] == 0
    sessions = {e["node"]["sessionId"]: e["node"] for e in
                projects[PROJECT]["sessions"]["edges"]}
    assert {sid: s["numTraces"] for sid, s in sessions.items()} == Counter(
        t.session for t in rollout.trajectories)
    for t in rollout.trajectories:
        assert t.prompt in sessions[t.session]["firstInput"]["value"]


@pytest.fixture(scope="session")
def annotated(rollout: Rollout, phoenix: PhoenixServer) -> int:
    return annotate_rewards(phoenix.url, PROJECT)


def test_rewards_become_phoenix_evaluations(rollout: Rollout, phoenix: PhoenixServer,
                                            annotated: int, artifacts: Path):
    assert annotated == len(rollout.trajectories)
    assert annotate_rewards(phoenix.url, PROJECT) == annotated  # again: updated, not duplicated
    for t, root in _by_trajectory(rollout, phoenix).items():
        assert root["spanAnnotations"] == [{"name": "gsm8k", "score": t.reward, "label": t.label,
                                            "annotatorKind": "CODE"}]
    names = phoenix.graphql("query($n: String!) { getProjectByName(name: $n) "
                            "{ spanAnnotationNames } }", n=PROJECT)
    assert names["getProjectByName"]["spanAnnotationNames"] == ["gsm8k"]
    # the evaluation filter of the UI's filter box
    failed = phoenix.graphql("""query($n: String!, $f: String!) { getProjectByName(name: $n) {
      spans(first: 100, filterCondition: $f) { edges { node { metadata } } } } }""",
                             n=PROJECT, f="annotations['gsm8k'].score < 1")
    assert len(failed["getProjectByName"]["spans"]["edges"]) == sum(
        t.reward < 1 for t in rollout.trajectories)
    # Phoenix's view of one trajectory, as its API returns it (an artifact for the CI log)
    root = _by_trajectory(rollout, phoenix)[rollout.trajectories[0]]
    view = {k: root[k] for k in ("name", "spanKind", "input", "output", "metadata",
                                 "cumulativeTokenCountPrompt", "cumulativeTokenCountCompletion",
                                 "spanAnnotations")}
    view["trace"] = {"traceId": root["trace"]["traceId"], "numSpans": root["trace"]["numSpans"],
                     "spans": [{k: s[k] for k in ("name", "spanKind", "tokenCountPrompt",
                                                  "tokenCountCompletion")}
                               for s in (e["node"] for e in root["trace"]["spans"]["edges"])]}
    (artifacts / "trajectory-api.json").write_text(json.dumps(view, indent=1))


def _shoot(browser: Browser, url: str, needles: list[str], png: Path) -> str:
    browser.open(url)
    text = browser.wait_for_text(needles, timeout_s=180)
    time.sleep(3.0)  # let charts and side panels settle
    browser.screenshot(png)
    png.with_suffix(".txt").write_text(text)
    return text


def _assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000, (path, len(data))


@pytest.mark.skipif(chromium_path() is None, reason="chromium missing (the nox session installs it)")
def test_trace_view_in_a_real_browser(rollout: Rollout, phoenix: PhoenixServer, annotated: int,
                                      artifacts: Path):
    by_t = _by_trajectory(rollout, phoenix)
    shown = rollout.trajectories[0]  # the tool-call trajectory with a correct answer
    trace_id = by_t[shown]["trace"]["traceId"]
    project_id = phoenix.graphql("query($n: String!) { getProjectByName(name: $n) { id } }",
                                 n=PROJECT)["getProjectByName"]["id"]
    with Browser(artifacts / "chromium.log") as browser:
        # the trace view: the tree of the trajectory, the root's input/output and evaluation
        text = _shoot(browser, f"{phoenix.url}/redirects/traces/{trace_id}",
                      ["agent_loop", "ToolAgentLoop.run", "AsyncTokenClient.generate",
                       "BaseTool.execute",
                       "Gsm8kReward.compute_score", "The answer is 5.", shown.prompt],
                      artifacts / "trace-view.png")
        assert "gsm8k" in text
        # the project's root spans: one row per trajectory, prompt in, answer + reward out
        _shoot(browser, f"{phoenix.url}/projects/{project_id}",
               ["agent_loop", Q1, "The answer is 84.", "I do not know.", "reward_label"],
               artifacts / "trace-list.png")
        # the sessions: one per GRPO group
        _shoot(browser, f"{phoenix.url}/projects/{project_id}/sessions",
               [f"{EXPERIMENT}/step-1/sample-0", f"{EXPERIMENT}/step-1/sample-1"],
               artifacts / "sessions.png")
    for name in ("trace-view.png", "trace-list.png", "sessions.png"):
        _assert_png(artifacts / name)
