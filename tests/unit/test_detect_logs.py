"""backend=otlp: rewards and their components also reach the collector as log-based GenAI events
(``gen_ai.evaluation.result`` log records over OTLP/HTTP ``/v1/logs``, in the trajectory span's
context), beside the span events; received by a local OTLP/HTTP endpoint and decoded with the
OTLP protobuf types."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

import otel_verl
from otel_verl import RolloutTraceConfig, _evaluations, semconv

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _servers import LocalServer, QuietHandler  # noqa: E402


@pytest.mark.parametrize("logs", ["otlp", None])
def test_otlp_backend_sends_rewards_as_log_based_evaluation_events(tmp_path, monkeypatch, logs):
    if logs:
        monkeypatch.setenv("OTEL_LOGS_EXPORTER", logs)
    else:  # not asked for: a collector without a logs pipeline (Phoenix) is never sent any
        monkeypatch.delenv("OTEL_LOGS_EXPORTER", raising=False)
    received: list[tuple[str, bytes]] = []
    got = threading.Event()

    class Handler(QuietHandler):
        def do_POST(self) -> None:
            received.append((self.path, self.read_body(decompress=True)))
            if self.path.endswith("/v1/logs"):
                got.set()
            self.reply(200, b"", "application/x-protobuf")

    server = LocalServer(Handler)
    server.start()
    try:
        RolloutTraceConfig.init("proj", "exp", "otlp", otlp_endpoint=server.url,
                                otlp_protocol="http/protobuf", trace_dir=str(tmp_path))
        with otel_verl.rollout_trace_attr(step=1, sample_index=0, rollout_n=0):
            otel_verl.record_reward(1.2, name="verifier", label="correct",
                                    components={"correctness": 1.0, "format": 0.2})
        assert RolloutTraceConfig.flush(10.0)
        assert got.wait(10.0) == bool(logs)
        RolloutTraceConfig.shutdown(10.0)
    finally:
        server.close()
        _evaluations.set_logger_provider(None)
    records = []
    for path, body in received:
        if path.endswith("/v1/logs"):
            request = ExportLogsServiceRequest.FromString(body)
            records += [r for rl in request.resource_logs for sl in rl.scope_logs
                        for r in sl.log_records]
    if not logs:
        assert records == [] and any(p.endswith("/v1/traces") for p, _ in received)
        return
    assert [r.event_name for r in records] == [semconv.GEN_AI_EVALUATION_RESULT] * 3
    names = [next(a.value.string_value for a in r.attributes
                  if a.key == semconv.GEN_AI_EVALUATION_NAME) for r in records]
    assert names == ["verifier", "correctness", "format"]
    assert len({r.trace_id for r in records}) == 1 and len(records[0].span_id) == 8
