"""The viewer's text over the lake: the table's prompt and answer snippets, its search text and
the free-text filter follow the rule the SQLite index had (written out in Python below, over the
trajectory model), for trajectories compacted into segments and for those still in raw lines
beside them."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _hostile_spans as H
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_verl import semconv
from otel_verl.store import Trajectory, clean_text, first_error, group_trajectories, read_spans
from otel_verl.store._compact import compact
from otel_verl.store._record import prompt_and_response, snippet
from otel_verl.ui import _lake
from otel_verl.ui._lake import LakeSource

#: the hostile kinds that damage the text the viewer shows (payload JSON, messages, errors);
#: the trajectory model's own disagreements on other kinds (a lone surrogate in the experiment
#: name splits a trajectory in the lake) are not this file's subject
H.KINDS["lone surrogates in messages"] = H._messages([
    {"role": "user", "content": "\ud83d What?"}, {"role": "assistant", "content": "\x00\udc00"}])
H.KINDS["an error status"] = H._field("status", {"code": 2, "message": "Tool Exploded"}, "all")
_TEXT_KINDS = ["an error status", "payload JSON nested too deeply", "non-lists where lists belong",
               "tool_calls a number", "tool call id a list", "tool span call id a list",
               "events garbage", "status garbage", "lone surrogates in messages"]


def _text_row(t: Trajectory) -> tuple[Any, ...]:
    """A trajectory's (key, prompt, response, search): the first prompt and the last answer its
    spans' payloads show (400 characters), and the search text (prompt, answer, every tool
    call as ``name(arguments) -> result``, the first error; lower case, 4,000 characters)."""
    prompt = response = None
    search: list[str] = []
    for span in t.spans:
        a = span["attributes"]
        found = prompt_and_response(span)
        if prompt is None and found[0] is not None:
            prompt = snippet(found[0], 2000)
        if found[1] is not None:
            response = snippet(found[1], 2000)
        if semconv.GEN_AI_TOOL_NAME in a or a.get(
                semconv.OPENINFERENCE_SPAN_KIND) == semconv.SpanKindName.TOOL:
            arguments = a.get(semconv.GEN_AI_TOOL_CALL_ARGUMENTS, a.get(semconv.INPUT_VALUE))
            result = a.get(semconv.GEN_AI_TOOL_CALL_RESULT, a.get(semconv.OUTPUT_VALUE))
            search.append(snippet(f"{a.get(semconv.GEN_AI_TOOL_NAME, span['name'])}("
                                  f"{snippet(arguments, 300)}) -> {snippet(result, 300)}", 700))
    error = first_error(t)
    if error:
        search.append(error)
    text = "\n".join([prompt or "", response or "", *search])[:4000]
    return (f"{t.trace_id}:{t.span_id or ''}",
            clean_text(snippet(prompt, 400)) if prompt else None,
            clean_text(snippet(response, 400)) if response else None, clean_text(text.lower()))


class _Model:
    """The text rows of the trajectory model, filtered and paged as the viewer's source is."""

    def __init__(self, store: Path, lake: LakeSource) -> None:
        self.by_key = {r[0]: r for r in map(_text_row, group_trajectories(read_spans(store)))}
        self.lake = lake

    def trajectories(self, *, text: str | None = None, **query: Any) -> dict[str, Any]:
        page = self.lake.trajectories(**query)  # the order and the other filters: the lake's
        rows = [self.by_key[r["key"]] for r in page["rows"]]
        if text:
            rows = [r for r in rows if clean_text(text.lower()) in r[3]]
        return {"total": len(rows), "rows": [
            {"key": k, "prompt": p, "response": a, "search": t} for k, p, a, t in rows]}

    def trajectory_row(self, key: str) -> dict[str, Any]:
        k, p, a, _ = self.by_key[key]
        return {"key": k, "prompt": p, "response": a}


def _rows(source: Any, **query: Any) -> list[tuple[Any, ...]]:
    page = source.trajectories(page_size=1000, with_search=True, **query)
    assert page["total"] == len(page["rows"])
    return [(r["key"], r["prompt"], r["response"], r["search"]) for r in page["rows"]]


@pytest.fixture(scope="module", params=["compacted", "raw", "search on disk"])
def sources(request: Any, tmp_path_factory: Any) -> Iterator[tuple[_Model, LakeSource]]:
    """Real ToolAgentLoop rollouts (prompt, tool call, answer, reward) at step 1, compacted or
    not, and more at step 2 in raw lines; hostile lines and spans around them."""
    tmp = tmp_path_factory.mktemp(f"snippets-{request.param}")
    store = tmp / "store"
    H.write_good_store(store, 6, step=1)
    H.poison_store(store, _TEXT_KINDS)
    if request.param != "raw":
        compact(store, live_bytes=0)
    H.write_good_store(store, 4, step=2)
    held = _lake._SEARCH_IN_MEMORY
    if request.param == "search on disk":  # the search text read from compaction's file
        _lake._SEARCH_IN_MEMORY = -1
    try:
        lake = LakeSource(store, compact=False)
    finally:
        _lake._SEARCH_IN_MEMORY = held
    assert lake._serving.search_held is (request.param != "search on disk")
    if request.param != "raw":
        assert lake.problems()["segments"] > 0 and lake.problems()["raw_files"] > 0
    try:
        yield _Model(store, LakeSource(store, compact=False)), lake
    finally:
        lake.close()


def test_snippets_and_search_text_are_the_models(
        sources: tuple[_Model, LakeSource]) -> None:
    index, lake = sources
    want = _rows(index)
    assert _rows(lake) == want
    good = [r for r in want if r[0].split(":")[1]]
    assert len([r for r in good if "What is" in (r[1] or "") and "The answer is" in (r[2] or "")
                ]) >= 10
    assert any("calculator(" in r[3] for r in want)  # the tool calls are searched too
    assert any("tool exploded" in r[3] for r in want)  # and the error
    for key, *_ in want:
        row = lake.trajectory_row(key)
        assert row is not None
        assert {k: row[k] for k in ("key", "prompt", "response")} == index.trajectory_row(key)


@pytest.mark.parametrize("needle", [
    "what is 3+1", "WHAT IS", "the answer is 5.", "calculator(", "-> ", "\n", "no such text",
    "error", "tool exploded", "'", "%", "_"])
def test_free_text_finds_the_same_rows(sources: tuple[_Model, LakeSource],
                                       needle: str) -> None:
    index, lake = sources
    assert _rows(lake, text=needle) == _rows(index, text=needle)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_free_text_any_piece_of_a_search_text(sources: tuple[_Model, LakeSource],
                                              data: Any) -> None:
    """A needle cut from some row's search text (any case), alone or with other filters: the
    lake pages through the rows the model's text holds it in."""
    index, lake = sources
    texts = [r[3] for r in _rows(index) if r[3]]
    text = data.draw(st.sampled_from(texts))
    start = data.draw(st.integers(0, len(text) - 1))
    needle = text[start:start + data.draw(st.integers(1, 30))]
    needle = data.draw(st.sampled_from([needle, needle.upper(), needle.title()]))
    query = data.draw(st.fixed_dictionaries({}, optional={
        "step": st.sampled_from([1, 2]), "order": st.sampled_from(["reward", "rollout_n"]),
        "descending": st.booleans()}))
    found = _rows(lake, text=needle, **query)
    assert found == _rows(index, text=needle, **query)
    page = lake.trajectories(text=needle, page=1, page_size=2, **query)
    assert [r["key"] for r in page["rows"]] == [r[0] for r in found[2:4]]
    assert page["total"] == len(found)


def test_a_lake_compacted_before_the_text_columns_still_reads(tmp_path: Path) -> None:
    """Segments and a trajectories file without the text columns (an older compaction): the
    lake reads every trajectory (their text NULL, none from the old cache) and the spans view
    binds."""
    import pyarrow.parquet as pq

    from otel_verl.store._query import Lake

    store = tmp_path / "store"
    H.write_good_store(store, 4, step=1)
    compact(store, live_bytes=0)
    with Lake.open(store) as lake:
        want = sorted(r["key"] for r in lake.rows("SELECT key FROM trajectories"))
        cache = lake.state.cache
    assert cache is not None and os.path.basename(cache).startswith("texts-")
    for path in (store / ".otel_verl_lake" / "spans").rglob("*.parquet"):
        table = pq.read_table(path)
        pq.write_table(table.drop_columns(["text_prompt", "text_response", "text_tool"]), path)
    os.remove(cache)
    H.write_good_store(store, 2, step=2)  # and raw lines beside them
    with Lake.open(store) as lake:
        assert not lake.state.cached  # the old cache is not used: rows built from the segments
        rows = lake.rows("SELECT key, step, prompt FROM trajectories_text")
        assert sorted(r["key"] for r in rows if r["step"] == 1) == want
        assert all(r["prompt"] is None for r in rows if r["step"] == 1)
        assert all(r["prompt"] for r in rows if r["step"] == 2)
        assert lake.rows("SELECT count(*) AS n FROM spans")[0]["n"] > 0


def test_the_cache_keeps_the_trajectories_columns(tmp_path: Path) -> None:
    """Compaction's trajectories file holds exactly the ``trajectories`` columns (what a reader
    of this layout unions with the rows it builds itself); the text is in its own file, row for
    row."""
    import pyarrow.parquet as pq

    from otel_verl.store._query import Lake, cache_path, texts_path

    store = tmp_path / "store"
    H.write_good_store(store, 4, step=1)
    compact(store, live_bytes=0)
    with Lake.open(store) as lake:
        plain = [d[0] for d in lake.sql("SELECT * FROM (" + lake_sql() + ") LIMIT 0").description]
        runs = int(os.path.basename(lake.state.cache or "").split("-")[1].split(".")[0])
        assert pq.read_schema(cache_path(lake.lake_dir, runs)).names == plain
        assert pq.read_schema(texts_path(lake.lake_dir, runs)).names == [
            "prompt", "response", "search"]
        rebuilt = lake.rows(f"SELECT key, prompt, response, search FROM ("
                            f"{lake_sql(texts=True)}) ORDER BY key")
        assert lake.rows("SELECT key, prompt, response, search FROM trajectories_text "
                         "ORDER BY key") == rebuilt
        assert all(r["prompt"] for r in rebuilt)


def lake_sql(texts: bool = False) -> str:
    from otel_verl.store._query import trajectories_sql

    return trajectories_sql("spans", texts=texts)
