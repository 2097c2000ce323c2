"""What a span means lives in one place (otel_verl/store/_record.py): the lake's columns (raw
tails and compacted segments, whose row builders inline the same tests for speed), the
trajectory rows the viewer's table shows and its trajectory page all say what the record's
predicates say, for the same spans."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import _lake_store as S
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_verl import semconv
from otel_verl.store import _record as R
from otel_verl.store import read_spans
from otel_verl.store._compact import compact
from otel_verl.store._query import Lake
from otel_verl.ui._lake import LakeSource
from otel_verl.ui.views import trajectory_view

_RESOURCE = {"service.name": "rollout", "rollout.experiment_name": "exp"}

#: the attributes that decide what a child span is (any mix of them, conflicting ones too)
_MEANING = st.fixed_dictionaries({}, optional={
    semconv.GEN_AI_OPERATION_NAME: st.sampled_from(
        ["chat", "text_completion", "generate_content", "execute_tool", "invoke_agent",
         "evaluate", "Chat", ""]),
    semconv.OPENINFERENCE_SPAN_KIND: st.sampled_from(["LLM", "TOOL", "CHAIN", "llm"]),
    semconv.GEN_AI_TOOL_NAME: st.sampled_from(["calc", "search"]),
    semconv.ERROR_TYPE: st.just("tool_error"),
    semconv.OUTPUT_VALUE: st.sampled_from(['{"ok": false}', '{"ok":true}', '{"ok" : false}',
                                           "plain", '{"a": {"ok": false}}']),
    semconv.GEN_AI_EVALUATION_SCORE_LABEL: st.sampled_from(["pass", "fail"]),
})
_CHILD = st.tuples(_MEANING, st.booleans())  # (attributes, status ERROR)


def _write(directory: Path, trajectories: list[list[tuple[dict[str, Any], bool]]]) -> None:
    lines = []
    for i, children in enumerate(trajectories):
        trace, root = f"{i + 1:032x}", f"{i + 1:08x}00000001"
        ident = {"rollout.step": 0, "rollout.sample_index": i, "rollout.rollout_n": 0,
                 "rollout.validate": False}
        spans = [S._span(trace, f"{i + 1:08x}{j + 2:08x}", root, f"child{j}", 10**18 + j,
                         {**ident, **attrs}, error=error)
                 for j, (attrs, error) in enumerate(children)]
        spans.append(S._span(trace, root, None, "agent_loop", 10**18 - 1,
                             {**ident, "otel_verl.trajectory": True}))
        lines.append(S._line(spans, _RESOURCE))
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "otel_verl-meaning-1-20260101T000000000Z.jsonl").write_bytes(b"".join(lines))


def _lake_columns(lake: Lake) -> dict[str, tuple[bool, bool, bool]]:
    return {r["SpanId"]: (r["is_llm"], r["is_tool"], r["tool_error"]) for r in lake.rows(
        "SELECT SpanId, is_llm, is_tool, tool_error FROM spans")}


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(trajectories=st.lists(st.lists(_CHILD, min_size=1, max_size=4), min_size=1, max_size=4))
def test_every_read_path_says_what_the_record_says(tmp_path_factory: Any,
                                                  trajectories: list[Any]) -> None:
    store = tmp_path_factory.mktemp("meaning")
    _write(store, trajectories)
    spans = list(read_spans(store))
    want = {s["span_id"]: (R.is_llm_span(s), R.is_tool_span(s), R.is_tool_error(s))
            for s in spans}
    counts = {}
    for t in {s["trace_id"] for s in spans}:
        mine = [s for s in spans if s["trace_id"] == t]
        counts[t] = (sum(R.is_llm_span(s) for s in mine), sum(R.is_tool_span(s) for s in mine),
                     sum(R.is_tool_error(s) for s in mine), R.first_label(mine))
    with Lake.open(store) as lake:
        assert lake.state.raw_spans == len(spans)
        assert _lake_columns(lake) == want  # the raw tail's rows
        compact(store, live_bytes=0)
        lake.refresh()
        assert lake.state.raw_spans == 0 and lake.state.segments > 0
        assert _lake_columns(lake) == want  # the segments' rows
        rows = lake.trajectories(limit=None)["rows"]
        assert {r["trace_id"]: (r["llm_calls"], r["tool_calls"], r["tool_errors"],
                                r["reward_label"]) for r in rows} == counts
    index = LakeSource(store, compact=False)  # the viewer, over the compacted store
    try:
        page = index.trajectories(page_size=100)
        assert {r["trace_id"]: (r["llm_calls"], r["tool_calls"], r["tool_errors"],
                                r["reward_label"]) for r in page["rows"]} == counts
        for row in page["rows"]:  # the page's tool list marks as failed what the row counts
            view = trajectory_view(index, row["key"])
            assert view is not None and "tools" in view, view
            assert sum(not tool["ok"] for tool in view["tools"]) == row["tool_errors"]
            assert len(view["tools"]) == row["tool_calls"]
    finally:
        index.close()


def test_a_tool_call_named_by_its_operation_alone_counts_its_failure_everywhere(
        tmp_path: Path) -> None:
    """``execute_tool`` without ``gen_ai.tool.name`` or OpenInference's kind, answering
    ``{"ok": false}``: the lake counted a tool error, the old SQLite index did not (its mark was
    set by a rule of its own); and a tool with ``error.type`` was counted failed by both while the
    trajectory page showed it ok."""
    _write(tmp_path, [[({semconv.GEN_AI_OPERATION_NAME: "execute_tool",
                         semconv.OUTPUT_VALUE: '{"ok": false}'}, False)],
                      [({semconv.GEN_AI_TOOL_NAME: "calc", semconv.OPENINFERENCE_SPAN_KIND: "TOOL",
                         semconv.ERROR_TYPE: "tool_error"}, False)]])
    with Lake.open(tmp_path) as lake:
        assert [r["tool_errors"] for r in lake.trajectories(limit=None, order="trace_id")[
            "rows"]] == [1, 1]
    index = LakeSource(tmp_path, compact=False)
    try:
        rows = index.trajectories(order="trace_id")["rows"]
        assert [r["tool_errors"] for r in rows] == [1, 1]
        for row in rows:
            view = trajectory_view(index, row["key"])
            assert view is not None and [t["ok"] for t in view["tools"]] == [False]
    finally:
        index.close()
