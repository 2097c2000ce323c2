"""Rewards with components and detector flags, backend="weave" -> the Weave exporter -> Weave's own
server code (SqliteTraceServer): each trajectory's root call carries its reward's components
(``rollout.reward.<name>`` and labels, as ``attributes["reward.<name>"]``) and its flags with
their evidence (``attributes.otel.attributes``), read back through the server's
``calls_query``."""

from __future__ import annotations

import json

import pytest
from _common import API_KEY

otel_verl = pytest.importorskip("otel_verl", reason="needs the otel_verl core (pip install -e .)")

from otel_verl import get_tracer, rollout_trace_op, semconv  # noqa: E402


class Server:
    @rollout_trace_op
    def generate(self, request_id: str, *, finish: str) -> dict:
        with get_tracer().start_as_current_span("chat tiny", attributes={
                semconv.GEN_AI_OPERATION_NAME: "chat", semconv.GEN_AI_REQUEST_MODEL: "tiny",
                semconv.GEN_AI_REQUEST_MAX_TOKENS: 8,
                semconv.GEN_AI_USAGE_OUTPUT_TOKENS: 8 if finish == "length" else 5,
                semconv.GEN_AI_RESPONSE_FINISH_REASONS: (finish,)}):
            return {"token_ids": [7] * 8}


def test_reward_components_and_flags_are_call_attributes_in_weave(weave_server, monkeypatch,
                                                                 tmp_path):
    from otel_verl import RolloutTraceConfig, record_reward, rollout_trace_attr

    monkeypatch.setenv("WANDB_API_KEY", API_KEY)
    RolloutTraceConfig.reset()
    RolloutTraceConfig.init("proj", "exp", backend="weave", weave_entity="ent",
                            weave_base_url=weave_server.url, trace_dir=str(tmp_path / "traces"),
                            detect_flags=["length_cap", "format_failure"])
    try:
        server = Server()
        for n, finish in enumerate(("length", "stop", "stop")):
            with rollout_trace_attr(step=1, sample_index=0, rollout_n=n):
                server.generate(f"r{n}", finish=finish)
                fmt = 0.0 if n == 2 else 0.2
                record_reward(1.0 + fmt, name="verifier", label="correct", components={
                    "correctness": 1.0,
                    "format": {"score": fmt, "label": "ok" if fmt else "format_error",
                               "explanation": "#### found" if fmt else "no #### answer"}})
        assert RolloutTraceConfig.shutdown(timeout_s=10)
    finally:
        RolloutTraceConfig.reset()
    roots = weave_server.calls("ent/proj", trace_roots_only=True)
    assert len(roots) == 3
    by_n = {r.attributes["rollout_n"]: r for r in roots}
    for n, root in by_n.items():
        attrs = root.attributes["otel"]["attributes"]
        assert root.attributes["reward"] == pytest.approx(1.2 if n != 2 else 1.0)
        # the components under verl's names (rollout.X -> X), beside the reward
        assert root.attributes["reward.correctness"] == 1.0
        assert root.attributes["reward.format"] == pytest.approx(0.2 if n != 2 else 0.0)
        assert root.attributes["reward.format.label"] == ("format_error" if n == 2 else "ok")
        assert semconv.RL_FLAGS in attrs or n == 1
    flagged = {n: r.attributes["otel"]["attributes"].get(semconv.RL_FLAGS) for n, r in
               by_n.items()}
    assert flagged == {0: ["length_cap"], 1: None, 2: ["format_failure"]}
    evidence = json.loads(by_n[0].attributes["otel"]["attributes"][
        semconv.flag_evidence_key("length_cap")])
    assert evidence["finish_reason"] == "length"
