"""Hostile stores through the viewer's read side: the lake, every view and the report.

One bad line or span must not hide the good ones, a rotated or rewritten store file is seen as
what it is, rewards no float can hold do not poison a step's statistics, and out-of-range query
numbers are the caller's mistake (``BadRequest``), not the server's. (These ran over the SQLite
index until the lake became the only read path; its damaged-index cases have no lake
counterpart here: see the damaged-lake tests in test_ui_lake.py.)
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import _hostile_spans as H
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_verl.store import Lake, list_files
from otel_verl.store._compact import compact
from otel_verl.ui._lake import LakeSource
from otel_verl.ui.report import build_report_data
from otel_verl.ui.server import dumps
from otel_verl.ui.views import (
    BadRequest,
    group_view,
    overview_view,
    prompt_view,
    trajectory_view,
)

GOOD = 6


@pytest.fixture(scope="module")
def good_store(tmp_path_factory) -> Path:
    store = tmp_path_factory.mktemp("good") / "traces"
    H.write_good_store(store, GOOD)
    return store


def _copy(good_store: Path, tmp_path: Path) -> Path:
    store = tmp_path / "traces"
    shutil.copytree(good_store, store, ignore=shutil.ignore_patterns(".otel_verl_index"))
    return store


def _source(store: Path, compacted: bool = False) -> LakeSource:
    """The viewer's source over ``store`` (its closed files compacted first, or read raw)."""
    if compacted:
        compact(store, live_bytes=0)
    return LakeSource(store, compact=False)


def _good_keys(good_store: Path, tmp_path: Path) -> set[str]:
    source = LakeSource(good_store, compact=False)
    keys = {r["key"] for r in source.trajectories(page_size=100)["rows"]}
    source.close()
    assert len(keys) == GOOD
    return keys


def _every_view(index: LakeSource, good: set[str]) -> int:
    """Run every view over the index as the server and the report would (answers must be JSON
    the browser takes); returns how many good trajectories show their conversation."""
    shown = 0
    rows = index.trajectories(page_size=1000)["rows"]
    for row in rows:
        view = trajectory_view(index, row["key"])
        assert view is not None
        dumps(view).encode()
        if row["key"] in good and view.get("messages") and not view.get("problems"):
            shown += 1
    dumps(overview_view(index)).encode()
    for row in rows:
        if isinstance(row["sample_index"], int):
            dumps(group_view(index, row["experiment"], row["step"], row["sample_index"],
                             row["validate"])).encode()
            dumps(prompt_view(index, row["experiment"], row["sample_index"],
                              row["validate"])).encode()
    dumps(index.problems()).encode()
    dumps(build_report_data(index)).encode()
    return shown


@pytest.mark.parametrize("kind", list(H.KINDS))
def test_each_hostile_kind_leaves_every_good_trajectory_shown(kind, good_store, tmp_path):
    good = _good_keys(good_store, tmp_path)
    store = _copy(good_store, tmp_path)
    H.poison_store(store, [kind])  # between good lines: the lines after it count too
    index = _source(store)
    keys = {r["key"] for r in index.trajectories(page_size=1000)["rows"]}
    assert good <= keys
    assert _every_view(index, good) == GOOD


@pytest.mark.parametrize("compacted", [False, True], ids=["raw", "compacted"])
def test_a_store_with_every_hostile_kind_shows_all_good_and_says_what_it_skipped(
        good_store, tmp_path, compacted):
    good = _good_keys(good_store, tmp_path)
    store = _copy(good_store, tmp_path)
    H.poison_store(store, list(H.KINDS))
    index = _source(store, compacted)
    assert _every_view(index, good) == GOOD
    problems = index.problems()
    assert problems["bad_lines"] >= 4 and problems["bad_spans"] >= 10
    # examples come from the lines read raw: compaction's manifest keeps counts only
    assert bool(problems["examples"]) is not compacted
    print(f"\n{len(H.KINDS)} hostile kinds in one store: {GOOD} of {GOOD} good trajectories "
          f"shown; {problems['bad_lines']} bad line(s), {problems['bad_spans']} bad span(s)")


def test_hostile_attribute_payloads_keep_the_page_and_mark_it(good_store, tmp_path):
    """A tool_calls that is a number, a call id that is a list: the poisoned trajectory's own
    page still shows (its conversation and waterfall), and its group view and the report too."""
    store = _copy(good_store, tmp_path)
    ids = H.poison_store(store, ["tool_calls a number", "tool call id a list",
                                 "tool span call id a list"])
    index = _source(store)
    for trace_id in ids:
        row = index.trajectories(trace_id=trace_id)["rows"][0]
        view = trajectory_view(index, row["key"])
        assert view is not None and view["messages"] and view["waterfall"], view
        dumps(group_view(index, row["experiment"], row["step"], row["sample_index"],
                         row["validate"])).encode()
    assert len(build_report_data(index)["details"]) == GOOD + 3


# --- property: hostile values anywhere in a span --------------------------------------------

_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**30), 10**30) | st.floats()
    | st.text(st.characters(blacklist_categories=()), max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                max_size=3),
    max_leaves=8)
_any_value = st.one_of(
    st.dictionaries(st.sampled_from(["stringValue", "intValue", "doubleValue", "boolValue",
                                     "arrayValue", "kvlistValue", "bytesValue"]), _json,
                    min_size=1, max_size=1),
    st.builds(lambda v: {"stringValue": json.dumps(v)}, _json),
    _json)
_FIELDS = ["name", "startTimeUnixNano", "endTimeUnixNano", "status", "events", "links",
           "parentSpanId", "kind", "flags"]
_ATTRIBUTES = ["rollout.step", "rollout.reward", "rollout.sample_index", "rollout.validate",
               "rollout.experiment_name", "rollout.sampling.weight", "otel_verl.trajectory",
               "input.value", "output.value", "gen_ai.tool.call.id", "gen_ai.tool.name",
               "gen_ai.operation.name", "gen_ai.usage.input_tokens", "gen_ai.input.messages",
               "gen_ai.output.messages", "openinference.span.kind", "exception.message"]
_damage = st.lists(st.tuples(
    st.integers(0, 20),
    st.one_of(st.tuples(st.just("field"), st.sampled_from(_FIELDS), _json),
              st.tuples(st.just("attribute"), st.sampled_from(_ATTRIBUTES), _any_value))),
    min_size=1, max_size=6)


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(damage=_damage)
def test_hostile_span_values_through_the_lake_and_every_view(damage, good_store,
                                                             tmp_path_factory):
    tmp = tmp_path_factory.mktemp("prop")
    good = _good_keys(good_store, tmp)
    store = _copy(good_store, tmp)
    template = next(iter(H.raw_traces(store).values()))
    request, spans = H.moved_request(template, "bad" + "0" * 28 + "1")
    for which, (where, name, value) in damage:
        span = spans[which % len(spans)]
        if where == "field":
            span[name] = value
        else:
            H._attr(span, name, value)
    with open(list_files(store)[0], "ab") as handle:
        handle.write(H.line_of(request))
        handle.write(Path(list_files(good_store)[0]).read_bytes().splitlines(True)[0])
    index = _source(store)
    assert _every_view(index, good) == GOOD
    index.close()


# --- file identity ----------------------------------------------------------------------------

def _rows(index: LakeSource) -> set[tuple]:
    return {(r["trace_id"], r["step"]) for r in index.trajectories(page_size=1000)["rows"]}


@pytest.mark.parametrize("compacted", [False, True], ids=["raw", "compacted"])
def test_a_rotated_file_keeps_its_rows_and_the_new_one_is_read(tmp_path, compacted):
    store = tmp_path / "traces"
    H.write_good_store(store, 2, step=1)
    index = _source(store, compacted)
    first = _rows(index)
    (path,) = list_files(store)
    os.rename(path, path.replace(".jsonl", ".1.jsonl"))  # the collector's rotation
    H.write_good_store(store, 2, step=2)
    if compacted:
        compact(store, live_bytes=0)
    assert index.update()  # seen as changed, reopened
    rows = _rows(index)
    assert first <= rows and len(rows) == 4
    key = next(r["key"] for r in index.trajectories(step=1)["rows"])
    assert trajectory_view(index, key)["messages"]


@pytest.mark.parametrize("compacted", [False, True], ids=["raw", "compacted"])
@pytest.mark.parametrize("grow", [False, True], ids=["rewritten", "regrown"])
def test_a_file_rewritten_in_place_is_read_again(tmp_path, grow, compacted):
    """Same name, same first bytes (same producer), other content: rewritten in place, or
    truncated and grown past the compacted offset. Its old rows go, its new ones come."""
    a, b = tmp_path / "a", tmp_path / "b"
    H.write_good_store(a, 2, step=1)
    H.write_good_store(b, 4, step=2)
    store = tmp_path / "traces"
    store.mkdir()
    target = store / "traces.jsonl"
    shutil.copy(list_files(a)[0], target)
    index = _source(store, compacted)
    assert {s for _, s in _rows(index)} == {1}
    new = Path(list_files(b)[0]).read_bytes()
    old_head = target.read_bytes()[:256]
    body = old_head + new[256:] if not grow else new
    with open(target, "r+b") as handle:  # in place: same inode
        handle.truncate(0)
        handle.write(body)
    assert index.update()
    rows = _rows(index)
    assert {s for _, s in rows} == {2} and len(rows) == 4, rows


# --- out-of-range inputs ----------------------------------------------------------------------

@pytest.mark.parametrize("call", [
    lambda i: i.trajectories(step=2**63),
    lambda i: i.trajectories(sample_index=-(2**64)),
    lambda i: i.trajectories(rollout_n=10**30),
    lambda i: i.trajectories(page=2**62, page_size=50),
    lambda i: i.trajectories(reward_min=10**400),
    lambda i: i.trajectories(reward_max=float("nan")),
    lambda i: group_view(i, "hostile", 2**63, 0, None),
    lambda i: group_view(i, "hostile", 1, 2**70, None),
    lambda i: prompt_view(i, "hostile", -(2**63) - 1, None),
])
def test_out_of_range_numbers_are_a_bad_request(call, good_store, tmp_path):
    index = _source(_copy(good_store, tmp_path))
    with pytest.raises(BadRequest):
        call(index)
    assert issubclass(BadRequest, ValueError)
    assert index.trajectories(experiment="\ud800", text="\udfff")["total"] == 0


def _reward_line(trace: str, reward: dict[str, object]) -> bytes:
    attributes = [{"key": "otel_verl.trajectory", "value": {"boolValue": True}},
                  {"key": "rollout.step", "value": {"intValue": "1"}},
                  {"key": "rollout.reward", "value": reward},
                  {"key": "rollout.sampling.weight", "value": reward}]
    span = {"traceId": trace, "spanId": trace[:16], "name": "t", "kind": 1,
            "startTimeUnixNano": "1", "endTimeUnixNano": "2", "attributes": attributes}
    return json.dumps({"resourceSpans": [{"resource": {"attributes": []}, "scopeSpans": [
        {"scope": {"name": "x"}, "spans": [span]}]}]}).encode() + b"\n"


@pytest.mark.parametrize("compacted", [False, True], ids=["raw", "compacted"])
def test_step_statistics_survive_rewards_no_float_can_hold(tmp_path, compacted):
    """Rewards (and weights) of +-Infinity and NaN (OTLP/JSON's spellings), and an integer
    beyond 64 bits (a bad span, skipped): the others count as traced, none poisons the
    weighted mean (the one step statistics, the lake's)."""
    store = tmp_path / "traces"
    store.mkdir()
    (store / "t.jsonl").write_bytes(
        _reward_line("a" * 32, {"intValue": str(10**400)})
        + _reward_line("b" * 32, {"doubleValue": 1.0})
        + _reward_line("c" * 32, {"doubleValue": "NaN"})
        + _reward_line("d" * 32, {"doubleValue": "Infinity"})
        + _reward_line("e" * 32, {"doubleValue": "-Infinity"}))
    if compacted:
        compact(store, live_bytes=0)
    with Lake.open(store) as lake:
        (stats,) = lake.steps()
    assert stats["traced"] == 4 and stats["reward_mean"] == 1.0
    assert stats["estimated"] == 4.0 and stats["reward_mean_unweighted"] == 1.0
