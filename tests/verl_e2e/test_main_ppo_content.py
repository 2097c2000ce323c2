"""Per-turn content in unchanged verl's training run: every traced turn's whole prompt, rebuilt
from otel_verl's content store and from what the Weave exporter sent, equals token for token the
prompt vLLM's engine received.

One ``main_ppo`` run (verl's default v1 trainer, GRPO, 2 steps, the tool agent loop on a real vLLM
CPU server actor), ``trace.backend=weave`` against Weave's own server code. The engine side is
noted inside vLLM's server actor by ``shims/e2e_engine_prompts.py`` (loaded by verl's own plugin
hook): each request's prompt token ids and the ``traceparent`` it came with, which names the
``LLMServerClient.generate`` span (= the Weave call id) that sent it.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any

import pytest
from _run import MAX_SAMPLES, PROJECT, STEPS, N, run_main_ppo

from otel_verl.demo.otlp_receiver import OTLPReceiver
from otel_verl.store._content import ContentIndex

pytestmark = pytest.mark.timeout(1500)

GENERATE = "LLMServerClient.generate"
CONTENT_ID = "otel_verl.content.id"
BASE_ID = "otel_verl.content.base_id"


def test_every_traced_turn_rebuilds_as_the_engine_received_it(
        tool_model: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    sys.path.insert(0, str(Path(__file__).parent / "shims"))
    import e2e_engine_prompts
    from _weave_objects import WeaveObjectsShim

    workdir = tmp_path_factory.mktemp("content")
    notes = workdir / "engine_prompts"
    trace_dir = workdir / "traces"
    api_key = "k" * 40
    with contextlib.ExitStack() as stack:
        shim = stack.enter_context(WeaveObjectsShim(str(workdir / "weave.sqlite"), api_key))
        # vLLM's own tracing on (its spans go nowhere that matters): the engine then takes the
        # trace context verl's request carried, which the shim notes with the prompt
        engine = stack.enter_context(OTLPReceiver())
        run = run_main_ppo(workdir, tool_model, use_v1=True, backend="weave",
                           engine_traces_url=engine.traces_url, trace_dir=trace_dir,
                           env={"WANDB_API_KEY": api_key, "OTEL_VERL_WEAVE_BASE_URL": shim.url,
                                "OTEL_VERL_WEAVE_ENTITY": "ent",
                                # the tiny model's prompts are small: shown as object segments
                                "OTEL_EXPORTER_WEAVE_CONTENT_INLINE_BYTES": "64",
                                "VERL_USE_EXTERNAL_MODULES": "verl_cpu_platform,e2e_engine_prompts",
                                e2e_engine_prompts.ENV: str(notes)})
        assert run.returncode == 0, f"main_ppo failed ({run.returncode}):\n{run.tail()}"
        calls = [c for c in shim.calls(f"ent/{PROJECT}") if c.op_name == GENERATE]
        assert calls, run.tail()
        from_weave = {c.id: shim.prompt(c.inputs["prompt_ids"]) for c in calls}
        assert all(isinstance(c.inputs["prompt_ids"], dict) for c in calls)
        objects = shim.objects(f"ent/{PROJECT}")
        assert shim.object_rows() == len(objects) > 0  # each stored once
        assert all(r["status"] == 200 for r in shim.requests), \
            [r for r in shim.requests if r["status"] != 200][:3]

    received: dict[str, list[int]] = {}
    for note in e2e_engine_prompts.read(str(notes)):
        if note["traceparent"]:
            received[note["traceparent"].split("-")[2]] = note["prompt_token_ids"]
    assert len(received) == len(calls)  # traced turns only carry a trace context
    index = ContentIndex.load(trace_dir)
    trajectories: set[Any] = set()
    later = 0
    for c in calls:
        attrs: dict[str, Any] = c.attributes["otel"]["attributes"]
        assert from_weave[c.id] == received[c.id], c.id
        assert index.rebuild(attrs[CONTENT_ID]) == received[c.id], c.id
        later += BASE_ID in attrs
        trajectories.add((c.attributes["step"], c.attributes["rollout_n"]))
    assert len(trajectories) == STEPS * MAX_SAMPLES * N
    assert later >= 1, "no turn extended an earlier one (the model called no tool)"
