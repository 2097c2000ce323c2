"""The demo's data and steering policy, and how it routes the engine's spans (no engine needed)."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from otel_verl.demo.run import ForcedToolPolicy, _engine_tracing, _parser, make_rows
from otel_verl.rollout.parsers import HermesToolParser
from otel_verl.rollout.reward import score_answer
from otel_verl.rollout.tools import format_number, safe_eval


def test_rows_are_deterministic_and_correct():
    rows = make_rows(12)
    assert rows == make_rows(12)
    assert [r["extra_info"]["index"] for r in make_rows(3, offset=1000)] == [1000, 1001, 1002]
    for row in rows:
        expr = row["extra_info"]["expression"]
        assert format_number(safe_eval(expr)) == row["reward_model"]["ground_truth"]
        assert row["raw_prompt"][0]["role"] == "user"


def test_policy_regexes_admit_real_hermes_calls_and_answers():
    row = make_rows(3)[2]  # a "*" expression: must be escaped in the regex
    exact = ForcedToolPolicy(p_exact=1.0)(0, [], row)["structured_outputs"]["regex"]
    call = ('<tool_call>{"name": "calculator", "arguments": {"expression": "'
            + row["extra_info"]["expression"] + '"}}</tool_call>')
    assert re.fullmatch(exact, call)
    assert not re.fullmatch(exact, call.replace(row["extra_info"]["expression"], "1+1"))
    content, calls = HermesToolParser().parse(call)
    assert calls[0].arguments == {"expression": row["extra_info"]["expression"]}

    free = ForcedToolPolicy(p_exact=0.0)(0, [], row)["structured_outputs"]["regex"]
    assert re.fullmatch(free, call.replace(row["extra_info"]["expression"], "12-7"))
    assert not re.fullmatch(free, call.replace(row["extra_info"]["expression"], "os.system"))

    messages = [{"role": "tool", "content": "-21"}]
    answer = ForcedToolPolicy()(1, messages, row)["structured_outputs"]["regex"]
    assert re.fullmatch(answer, "The answer is -21.")
    assert score_answer("The answer is -21.", "-21") == (1.0, "correct")
    odd = ForcedToolPolicy()(1, [{"role": "tool", "content": "Error: boom"}], row)
    assert re.fullmatch(odd["structured_outputs"]["regex"], "The answer is 77.")


def test_policy_is_seeded():
    rows = make_rows(20)
    first, second = ForcedToolPolicy(seed=1), ForcedToolPolicy(seed=1)
    a = [first(0, [], r) for r in rows]
    b = [second(0, [], r) for r in rows]
    assert a == b
    exact = sum("[1-9]" not in x["structured_outputs"]["regex"] for x in a)
    assert 3 <= exact <= 17  # about half


@pytest.mark.parametrize(("backend", "endpoint", "protocol", "expected"), [
    ("file", None, "grpc", ("http://127.0.0.1:1/v1/traces", "http/protobuf")),
    ("otlp", "http://collector:4317", "grpc", ("http://collector:4317", "grpc")),
    ("otlp", "http://collector:4318", "http/protobuf",
     ("http://collector:4318/v1/traces", "http/protobuf")),
    ("otlp", None, "http/protobuf", ("http://127.0.0.1:4318/v1/traces", "http/protobuf")),
    ("weave", None, "grpc", (None, "http/protobuf")),
    ("none", None, "grpc", (None, "http/protobuf")),
])
def test_engine_span_routing(backend, endpoint, protocol, expected):
    config = SimpleNamespace(backend=backend, otlp_endpoint=endpoint, otlp_protocol=protocol)
    receiver = "http://127.0.0.1:1/v1/traces" if backend == "file" else None
    assert _engine_tracing(config, receiver) == expected


def test_cli_options():
    args = _parser().parse_args(["--backend", "otlp", "--steps", "3", "--n", "2", "--set", "a=b",
                                 "--set", "c.d=1", "--port", "8123"])
    assert (args.backend, args.steps, args.n, args.port) == ("otlp", 3, 2, 8123)
    assert args.sets == ["a=b", "c.d=1"]
