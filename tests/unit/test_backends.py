"""Backends as configured through RolloutTraceConfig: file store, OTLP exporters, provider hygiene."""

import json
import os
import socket

import pytest
from google.protobuf import json_format
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_verl import (
    ConfigError,
    RolloutTraceConfig,
    get_tracer_provider,
    rollout_trace_attr,
    rollout_trace_op,
    semconv,
)
from otel_verl.store import read_spans


@rollout_trace_op
def tool(expression):
    return {"result": 42}


def test_file_backend_writes_parsable_otlp_json_with_resource(tmp_path):
    RolloutTraceConfig.init("proj", "exp", "file", trace_dir=str(tmp_path))
    with rollout_trace_attr(step=2, sample_index=9, rollout_n=1, name="agent_loop"):
        tool("6*7")
    assert RolloutTraceConfig.shutdown(timeout_s=5)
    files = list(tmp_path.glob("*.jsonl"))
    assert len(files) == 1
    for line in files[0].read_text().splitlines():
        json_format.Parse(line, ExportTraceServiceRequest())  # standard OTLP tooling parses it
    spans = {s["name"]: s for s in read_spans(tmp_path)}
    assert set(spans) == {"agent_loop", "tool"}
    resource = spans["tool"]["resource"]
    assert resource[semconv.SERVICE_NAME] == "otel-verl"
    assert resource[semconv.ROLLOUT_PROJECT_NAME] == "proj"
    assert resource[semconv.ROLLOUT_EXPERIMENT_NAME] == "exp"
    assert resource[semconv.HOST_NAME] == socket.gethostname()
    assert resource[semconv.PROCESS_PID] == os.getpid()
    assert spans["tool"]["attributes"][semconv.ROLLOUT_SAMPLE_INDEX] == 9
    assert spans["tool"]["parent_span_id"] == spans["agent_loop"]["span_id"]
    assert json.loads(spans["tool"]["attributes"][semconv.INPUT_VALUE]) == {"expression": "6*7"}


def test_global_provider_is_never_clobbered_and_context_is_shared():
    app_exporter = InMemorySpanExporter()
    app_provider = TracerProvider()
    app_provider.add_span_processor(SimpleSpanProcessor(app_exporter))
    ours = InMemorySpanExporter()
    RolloutTraceConfig.init("p", "e", "console", exporter=ours, processor="simple")
    assert get_tracer_provider() is not trace.get_tracer_provider()
    with app_provider.get_tracer("app").start_as_current_span("app_request") as app_span:
        tool("1+1")
    (ours_span,) = ours.get_finished_spans()
    assert ours_span.parent.span_id == app_span.get_span_context().span_id  # one trace
    assert [s.name for s in app_exporter.get_finished_spans()] == ["app_request"]


@pytest.mark.parametrize(("protocol", "module"), [
    ("grpc", "opentelemetry.exporter.otlp.proto.grpc.trace_exporter"),
    ("http/protobuf", "opentelemetry.exporter.otlp.proto.http.trace_exporter"),
])
def test_otlp_backend_builds_the_standard_exporter(protocol, module, tmp_path):
    RolloutTraceConfig.init("p", "e", "otlp", otlp_protocol=protocol,
                            otlp_endpoint="http://127.0.0.1:4999", trace_dir=str(tmp_path))
    client = RolloutTraceConfig.get_client()
    inner = client.inner  # wrapped by the spooling exporter
    assert type(inner).__module__ == module
    if protocol == "http/protobuf":
        assert inner._endpoint == "http://127.0.0.1:4999/v1/traces"


def test_otlp_unreachable_spools_and_reports(tmp_path, caplog):
    # nothing listens on this port: the span waits in the durable log, is retried and reported
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    RolloutTraceConfig.init("p", "e", "otlp", otlp_protocol="http/protobuf",
                            otlp_endpoint=f"http://127.0.0.1:{port}", trace_dir=str(tmp_path),
                            export_timeout_s=1.0, schedule_delay_s=0.05)
    tool("2+2")
    assert RolloutTraceConfig.flush(timeout_s=3) is False  # not delivered: the backend is down
    stats = RolloutTraceConfig.stats()
    assert stats["spooled"] == 1 and stats["spool_pending"] == 1 and stats["retries"] >= 1
    assert stats.get("export_failed", 0) == 0 and stats["delivered"] == 0
    RolloutTraceConfig.shutdown(timeout_s=2)
    assert [s["name"] for s in read_spans(tmp_path / "spool")] == ["tool"]
    assert "wait in the durable log" in caplog.text


def test_disabled_backends_build_nothing():
    for backend in ("none", None):
        RolloutTraceConfig.reset()
        RolloutTraceConfig.init("p", "e", backend)
        assert get_tracer_provider() is None and RolloutTraceConfig.get_client() is None


def test_console_backend():
    import io

    from opentelemetry.sdk.trace.export import ConsoleSpanExporter

    RolloutTraceConfig.init("p", "e", "console", processor="simple")
    client = RolloutTraceConfig.get_client()
    assert isinstance(client, ConsoleSpanExporter)
    client.out = io.StringIO()
    tool("3")
    assert '"name": "tool"' in client.out.getvalue()


def test_bad_option_names_the_key():
    with pytest.raises(ConfigError, match="max_field_bytes"):
        RolloutTraceConfig.init("p", "e", "file", max_field_bytes=3)


def test_weave_backend_needs_a_key_and_never_prompts(monkeypatch, tmp_path):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    with pytest.raises(ValueError, match="WANDB_API_KEY"):
        RolloutTraceConfig.init("ent/proj", "e", "weave", trace_dir=str(tmp_path))
    RolloutTraceConfig.reset()
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    RolloutTraceConfig.init("ent/proj", "e", "weave", trace_dir=str(tmp_path),
                            weave_base_url="http://127.0.0.1:9")
    client = RolloutTraceConfig.get_client()
    # behind the durable log, which keeps and retries what Weave does not accept
    assert type(client).__name__ == "DurableSpanExporter"
    assert str(client.directory).startswith(str(tmp_path / "spool" / "weave-"))
    assert type(client.inner).__name__ == "WeaveSpanExporter"
    assert client.inner.config.spool_dir is None
