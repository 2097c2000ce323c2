"""The main job, ``otel-verl demo``, end to end: it starts its own vLLM, rolls out, stops it, and
the local store holds every trajectory with the engine's spans joined to the chat turns."""

from __future__ import annotations

import collections
import subprocess

import pytest

from otel_verl import semconv
from otel_verl.demo import run as demo
from otel_verl.store import read_spans

pytestmark = pytest.mark.timeout(420)


def test_demo_end_to_end(tmp_path, tiny_model_dir, capsys):
    trace_dir = tmp_path / "traces"
    code = demo.main([
        "--steps", "2", "--prompts", "2", "--n", "2", "--val-prompts", "2",
        "--trace-dir", str(trace_dir), "--model-dir", str(tiny_model_dir), "--no-progress",
        "--set", "actor_rollout_ref.rollout.trace.token2text=true",
    ])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "trajectories            10 (10 traced)" in printed
    assert "otel-verl traces list --step 1" in printed

    spans = list(read_spans(trace_dir))
    trajectories = [s for s in spans if s["attributes"].get(semconv.OTEL_VERL_TRAJECTORY)]
    keys = collections.Counter(
        (s["attributes"][semconv.ROLLOUT_STEP], s["attributes"][semconv.ROLLOUT_VALIDATE])
        for s in trajectories)
    assert keys == {(1, False): 4, (2, False): 4, (2, True): 2}
    assert all(semconv.ROLLOUT_REWARD in s["attributes"] for s in trajectories)
    # token2text from the --set override reached the run spans' outputs
    runs = [s for s in spans if s["name"] == "ToolAgentLoop.run"]
    assert len(runs) == 10 and all("response_text" in s["attributes"]["output.value"] for s in runs)
    # every LLM call (one span: the op carrying the GenAI chat attributes) has exactly one vLLM
    # llm_request child in the same trace
    by_parent = collections.defaultdict(list)
    for s in spans:
        by_parent[s["parent_span_id"]].append(s)
    assert not [s for s in spans if s["name"].startswith("chat ")]  # no second span per call
    chats = [s for s in spans if s["attributes"].get(semconv.GEN_AI_OPERATION_NAME) == "chat"]
    assert len(chats) == 20
    for chat in chats:
        (engine,) = [c for c in by_parent[chat["span_id"]] if c["name"] == "llm_request"]
        assert engine["trace_id"] == chat["trace_id"]
    # the server is gone (the demo always stops it)
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(tiny_model_dir) not in ps


def test_demo_rejects_bad_arguments(capsys):
    assert demo.main(["--steps", "0"]) == 2
    with pytest.raises(SystemExit):
        demo.main(["--set", "novalue"])
