"""Every secret shape of the catalogue, planted in every place a rollout can put text, must not
appear in any exported byte: the local store's file, the OTLP protobuf request, the Weave calls.

The spans are produced by the real API (ops, trajectories, rewards, hand-made spans through
``get_tracer()``) with the real provider, so the redaction wiring is what is tested; the OTLP and
Weave encodings are applied to what the exporter received (exactly what those exporters send).
"""

from __future__ import annotations

import gzip
import json
import os
import pathlib

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.trace import Link, Status, StatusCode

from otel_verl import (
    RolloutTraceConfig,
    get_tracer,
    payload_json,
    record_reward,
    rollout_trace_attr,
    rollout_trace_op,
    scrub_text,
    set_trajectory_attribute,
)
from otel_verl.testing import capture_spans

_HEX = "9f8e7d6c5b4a39281706f5e4d3c2b1a098765432"
#: (shape, the secret itself, the text it travels in)
SECRETS: list[tuple[str, str, str]] = [
    ("wandb", _HEX, f"WANDB key {_HEX}"),
    ("wandb_local", "local-" + _HEX[::-1], "local-" + _HEX[::-1]),
    ("openai", "sk-proj-Abc123Def456Ghi789Jkl012Mno345Pqr678", "key sk-proj-Abc123Def456Ghi789Jkl012Mno345Pqr678"),
    ("anthropic", "sk-ant-api03-Zyx987Wvu654Tsr321Qpo098Nml765Kji432-AAA",
     "x-api: sk-ant-api03-Zyx987Wvu654Tsr321Qpo098Nml765Kji432-AAA"),
    ("huggingface", "hf_AbCdEfGhIjKlMnOpQrStUvWxYz01234567", "hf_AbCdEfGhIjKlMnOpQrStUvWxYz01234567"),
    ("github_classic", "ghp_A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8",
     "git push https://ghp_A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8@github.com/x/y"),
    ("github_fine_grained", "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyzABCDEFGHIJ",
     "token github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyzABCDEFGHIJ"),
    ("slack", "xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx",
     "slack xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx"),
    ("google", "AIzaSyA1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q", "maps AIzaSyA1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q"),
    ("stripe", "sk_live_51HxYzAbCdEfGhIjKlMnOpQrSt", "stripe sk_live_51HxYzAbCdEfGhIjKlMnOpQrSt"),
    ("aws_key_id", "AKIAZ7EXAMPLEKEY1234", "aws AKIAZ7EXAMPLEKEY1234"),
    ("aws_secret", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzEXAMPLEKEY",
     "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYzEXAMPLEKEY"),
    ("aws_secret_prose", "Qz8rXUtnFEMI/K7MDENG/bPxRfiCYzEXAMPLEKEY",
     "AWS secret: Qz8rXUtnFEMI/K7MDENG/bPxRfiCYzEXAMPLEKEY"),
    ("jwt", "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4ifQ."
     "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c",
     "jwt=eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4ifQ."
     "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"),
    ("pem", "MIIEpAIBAAKCAQEA3Tz2mr7SZiAMfQyuvBjM2Ks9jd3Pqx4",
     "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA3Tz2mr7SZiAMfQyuvBjM2Ks9jd3Pqx4\n"
     "kq1Vr2C+Yb7wTs/hOi0o9Zg==\n-----END RSA PRIVATE KEY-----"),
    ("url_credentials", "S3cretDbPassw0rd", "postgres://admin:S3cretDbPassw0rd@db.internal:5432/x"),
    ("bearer", "abcDEF123456ghiJKL789mno", "Authorization: Bearer abcDEF123456ghiJKL789mno"),
    ("basic", "dXNlcjpodW50ZXIyaHVudGVyMg==", "Authorization: Basic dXNlcjpodW50ZXIyaHVudGVyMg=="),
    ("authorization_token", "Tk9sZWFrUGxlYXNlMTIz", "authorization: Token Tk9sZWFrUGxlYXNlMTIz"),
    ("password_assign", "hunter2hunter2", "login user=bob password=hunter2hunter2"),
    ("password_flag", "CorrectHorseBattery9", "run.sh --password CorrectHorseBattery9 --fast"),
    ("key_name_assign", "plainValue77", "config api_key: plainValue77"),
    # encodings of promised shapes: newlines already escaped (a PEM read from a JSON config or a
    # .env file), and a JSON document serialised twice (a tool result holding JSON text)
    ("pem_escaped_newlines", "MIIEowIBAAKCAQEAq8Vw3Lr2Nf5Zt9Hk0Pd1Xc",
     "-----BEGIN PRIVATE KEY-----\\nMIIEowIBAAKCAQEAq8Vw3Lr2Nf5Zt9Hk0Pd1Xc\\n"
     "Yb7wTs/hOi0o9Zg==\\n-----END PRIVATE KEY-----"),
    ("api_key_double_json", "Zq9PlainSecretValue42",
     json.dumps(json.dumps({"api_key": "Zq9PlainSecretValue42", "n": 1}))),
]


def _run_rollout(carrier: str) -> None:
    """Put ``carrier`` in every place rollout code can put text (23 places)."""

    @rollout_trace_op
    def tool(arg, options):  # input value, input dict key and value
        return {"echo": arg, carrier: carrier, "api_key": carrier}  # output key and values

    @rollout_trace_op
    def failing(arg):
        exc = RuntimeError(f"engine answered: {carrier}")  # message, stacktrace, status
        exc.add_note(f"note: {carrier}")  # exception notes
        raise exc

    with rollout_trace_attr(sample_index=f"row {carrier}", step=1, name=f"traj {carrier}"):
        tool(carrier, {carrier: carrier, "nested": [carrier]})
        try:
            failing(carrier)
        except RuntimeError:
            pass
        record_reward(1.0, name=f"reward {carrier}", label=carrier)
        set_trajectory_attribute("rollout.note", carrier)
        set_trajectory_attribute(f"rollout.{carrier}", 1)
        tracer = get_tracer()
        with tracer.start_as_current_span("linked") as first:
            pass
        with tracer.start_as_current_span(
                f"hand {carrier}", attributes={"note": carrier, "api_key": "plainValue77"},
                links=[Link(first.get_span_context(), {"why": carrier})]) as span:
            span.add_event(f"event {carrier}", {"detail": carrier})
            span.set_attribute("gen_ai.tool.call.arguments", payload_json({"q": carrier}))
            span.set_attribute("gen_ai.tool.call.result", scrub_text(carrier))
            span.set_attribute("tags", [carrier, "ok"])
            span.record_exception(ValueError(f"hand-made failure {carrier}"))
            span.set_status(Status(StatusCode.ERROR, f"failed: {carrier}"))


PLACES = 23


def _needles(secret: str) -> list[bytes]:
    """The secret and a 12-character piece of its middle (catches a partial leak)."""
    middle = secret[len(secret) // 2 - 6: len(secret) // 2 + 6]
    return [secret.encode(), middle.encode()]


def _otlp_bytes(spans) -> bytes:
    return encode_spans(spans).SerializeToString()


def _weave_bytes(spans) -> bytes:
    from otel_weave_exporter._encode import encode_call
    from otel_weave_exporter._translate import Translator

    translator = Translator("entity", "project", keep_trajectory_spans=True)
    translator.begin_batch(spans)
    parts = []
    for span in spans:
        call = translator.translate(span)
        if call is not None:
            parts.append(encode_call(call, 10**8)[0])
    return b"\n".join(parts)


def _file_bytes(carrier: str, trace_dir: pathlib.Path) -> bytes:
    RolloutTraceConfig.reset()
    RolloutTraceConfig.init("proj", "exp", "file", trace_dir=str(trace_dir), processor="simple")
    try:
        _run_rollout(carrier)
    finally:
        RolloutTraceConfig.shutdown()
        RolloutTraceConfig.reset()
    data = b""
    for root, _, files in os.walk(trace_dir):
        for name in files:
            raw = pathlib.Path(root, name).read_bytes()
            # the content store is gzip (one member per node): grep what it holds, not its bytes
            data += gzip.decompress(raw) if name.endswith(".gz") else raw
    assert data, "the file backend wrote nothing"
    return data


@pytest.mark.parametrize(("shape", "secret", "carrier"), SECRETS, ids=[s[0] for s in SECRETS])
def test_no_secret_leaves_the_process(shape, secret, carrier, tmp_path):
    with capture_spans() as exporter:
        _run_rollout(carrier)
    spans = exporter.get_finished_spans()
    assert len(spans) == 5
    outputs = {
        "in_memory": "\n".join(s.to_json() for s in spans).encode(),
        "otlp_protobuf": _otlp_bytes(spans),
        "weave_json": _weave_bytes(spans),
        "file_store": _file_bytes(carrier, tmp_path),
    }
    leaks = [(backend, needle) for backend, data in outputs.items()
             for needle in _needles(secret) if needle in data]
    assert not leaks, f"{shape} leaked: {leaks}"
    # and it was not simply dropped: the places are still there, redacted
    assert b"[REDACTED]" in outputs["file_store"] and b"[REDACTED]" in outputs["weave_json"]


def test_catalogue_figure(capsys):
    """The figure for the notes: secrets planted (shapes x places x backends)."""
    planted = len(SECRETS) * PLACES * 4
    with capsys.disabled():
        print(f"\nsecret catalogue: {len(SECRETS)} shapes x {PLACES} places x 4 encodings "
              f"= {planted} planted")
    assert len({s[0] for s in SECRETS}) == len(SECRETS)


def test_payload_json_and_trajectory_attributes_stay_valid_json():
    carrier = SECRETS[0][2]
    with capture_spans() as exporter:
        _run_rollout(carrier)
    for span in exporter.get_finished_spans():
        for key in ("input.value", "output.value", "gen_ai.tool.call.arguments"):
            if key in span.attributes:
                json.loads(span.attributes[key])
