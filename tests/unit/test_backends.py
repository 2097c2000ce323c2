"""Backends as configured through RolloutTraceConfig: file store, OTLP exporters, provider hygiene."""

import base64
import json
import logging
import os
import socket
import string
import urllib.parse

import pytest
from google.protobuf import json_format
from hypothesis import given, settings
from hypothesis import strategies as st
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
from otel_verl.exporters import _otlp_endpoint
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


@pytest.mark.parametrize(("endpoint", "expected"), [
    ("http://h:4318", "http://h:4318/v1/traces"),
    ("http://h:4318/", "http://h:4318/v1/traces"),
    ("http://h:4318/v1/traces", "http://h:4318/v1/traces"),
    ("http://h:4318/otlp/", "http://h:4318/otlp/v1/traces"),
    ("http://h:4318?api_key=K", "http://h:4318/v1/traces?api_key=K"),
    ("http://h:4318/?api_key=K&team=a", "http://h:4318/v1/traces?api_key=K&team=a"),
    ("http://u:p@h:4318/sk-x/v1/traces?k=v", "http://u:p@h:4318/sk-x/v1/traces?k=v"),
])
def test_otlp_http_signal_path_goes_into_the_path_not_after_the_query(endpoint, expected,
                                                                      tmp_path):
    RolloutTraceConfig.init("p", "e", "otlp", otlp_protocol="http/protobuf",
                            otlp_endpoint=endpoint, trace_dir=str(tmp_path))
    assert RolloutTraceConfig.get_client().inner._endpoint == expected


def test_otlp_grpc_userinfo_becomes_an_authorization_header(tmp_path, monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-team=rl")
    RolloutTraceConfig.init("p", "e", "otlp", otlp_protocol="grpc",
                            otlp_endpoint="http://alice:s%40cret@127.0.0.1:4999",
                            trace_dir=str(tmp_path))
    inner = RolloutTraceConfig.get_client().inner
    assert inner._endpoint == "127.0.0.1:4999"  # gRPC has no userinfo: it would not resolve
    headers = dict(inner._headers)
    assert headers["x-team"] == "rl"  # the environment's headers are kept
    assert base64.b64decode(headers["authorization"].removeprefix("Basic ")) == b"alice:s@cret"


_SECRET = st.text(string.ascii_letters + string.digits + "-_.~", min_size=6, max_size=40)


@settings(max_examples=200, deadline=None)
@given(user=_SECRET, password=_SECRET, key=_SECRET, token=_SECRET,
       path=st.sampled_from(["", "/", "/otlp", "/v1/traces", "/api/public/otel/"]))
def test_redacted_endpoint_holds_no_credential(user, password, key, token, path):
    token = "sk-" + token
    url = f"https://{user}:{password}@collector.example:4318/{token}{path}?api_key={key}&x=1"
    redacted = _otlp_endpoint.redact_url(url)
    for secret in (user, password, key, token):
        assert secret not in redacted.replace("collector.example", "")
    assert redacted.startswith("https://***@collector.example:4318/***")
    assert _otlp_endpoint.redact_url(redacted) == redacted  # idempotent
    joined = _otlp_endpoint.join_signal_path(url)
    assert urllib.parse.urlsplit(joined).path.endswith("/v1/traces")
    assert urllib.parse.urlsplit(joined).query == f"api_key={key}&x=1"


def test_library_log_lines_are_redacted_once_installed(tmp_path, caplog):
    """The OTLP HTTP client's own 'Transient error' line (the error object as a %s argument)."""
    secret = "PlantedQueryKey0123"
    RolloutTraceConfig.init("p", "e", "otlp", otlp_protocol="http/protobuf",
                            otlp_endpoint=f"http://127.0.0.1:1/?api_key={secret}",
                            trace_dir=str(tmp_path))
    RolloutTraceConfig.init("p", "e", "otlp", otlp_protocol="http/protobuf",  # twice: one filter
                            otlp_endpoint="http://127.0.0.1:1/", trace_dir=str(tmp_path))
    name = "opentelemetry.exporter.otlp.proto.http.trace_exporter"
    library = logging.getLogger(name)
    ours = [f for f in library.filters if isinstance(f, _otlp_endpoint.CredentialLogFilter)]
    assert len(ours) == 1
    error = ConnectionError(f"Max retries exceeded with url: /v1/traces?api_key={secret}-other")
    with caplog.at_level(logging.DEBUG):
        library.warning("Transient error %s encountered while exporting %s batch", error, "span")
        logging.getLogger("otel_verl").warning("kept in /spool/otlp_api_key_%s", secret)
        logging.getLogger("urllib3.connectionpool").debug(
            '"POST /v1/traces?api_key=%s HTTP/1.1" 200 2', secret)
    assert len(caplog.records) == 3
    assert secret not in caplog.text
    assert "api_key=***" in caplog.records[0].getMessage()


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
