"""The viewer's trajectory page decodes only its trace's spans of a store line
(``otel_verl/ui/_lake._only_trace``): the same spans, in the same order, as decoding the whole
line and keeping the trace's, whatever else the line holds (other traces, upper-case and base64
ids, snake_case and pre-0.15 field names, bad spans, entries of the wrong type)."""

from __future__ import annotations

import base64
import copy
import random
from typing import Any

from _lake_store import _span
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_verl.store import decode_quietly
from otel_verl.ui._lake import _only_trace, _ParsedLine


def _spans(rng: random.Random, traces: list[str]) -> list[Any]:
    out: list[Any] = []
    for n in range(rng.randint(0, 12)):
        trace = rng.choice(traces)
        span: Any = _span(trace, f"{rng.getrandbits(64):016x}", None, f"s{n}", 10**18 + n,
                          {"rollout.step": n, "k": "v"}, error=rng.random() < 0.2)
        shape = rng.randrange(9)
        if shape == 0:
            span["traceId"] = trace.upper()
        elif shape == 1:
            span["traceId"] = base64.b64encode(bytes.fromhex(trace)).decode()
        elif shape == 2:
            span["trace_id"] = span.pop("traceId")
        elif shape == 3:
            span["startTimeUnixNano"] = {"bad": 1}  # a bad span
        elif shape == 4:
            del span["traceId"]
        elif shape == 5:
            span = "not a span"
        out.append(span)
    return out


def _request(rng: random.Random, traces: list[str]) -> dict[str, Any]:
    resource_spans: list[Any] = []
    for _ in range(rng.randint(0, 3)):
        scopes: list[Any] = []
        for _ in range(rng.randint(0, 3)):
            shape = rng.randrange(6)
            if shape == 0:
                scopes.append({"scope": {"name": "t"}, "spans": "not a list"})
            elif shape == 1:
                scopes.append(["not a scope"])
            else:
                scopes.append({"scope": {"name": "t", "version": "1"},
                               "spans": _spans(rng, traces)})
        entry: Any = {"resource": {"attributes": [
            {"key": "service.name", "value": {"stringValue": "r"}}]}}
        shape = rng.randrange(6)
        if shape == 0:
            entry["scope_spans"] = scopes
        elif shape == 1:
            entry["instrumentationLibrarySpans"] = scopes
        elif shape == 2:
            entry["scopeSpans"] = "not a list"
        else:
            entry["scopeSpans"] = scopes
        resource_spans.append(entry)
    return {"resourceSpans": resource_spans}


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32))
def test_a_trace_decoded_alone_equals_the_whole_line_kept_to_it(seed: int) -> None:
    rng = random.Random(seed)
    traces = [f"{rng.getrandbits(128):032x}" for _ in range(3)]
    request = _request(rng, traces)
    before = copy.deepcopy(request)
    whole = decode_quietly(request)
    line = _ParsedLine(request)
    for trace in [*traces, "0" * 32]:
        want = [span for span in whole if span["trace_id"] == trace]
        alone = decode_quietly(_only_trace(request, trace))
        assert [span for span in alone if span["trace_id"] == trace] == want
        assert [span for span in line.spans_of(trace) if span["trace_id"] == trace] == want
        assert [span for span in line.spans_of(trace) if span["trace_id"] == trace] == want
    assert request == before  # the parsed line is kept as it was


def test_an_unparsed_line_gives_no_spans() -> None:
    assert _ParsedLine(None).spans_of("0" * 32) == []
