"""``Lake.trajectories`` filters through the one rule (otel_verl/store/_filters.py): a value the
viewer refuses is refused here too, a numpy integer is an integer, and the lake keeps the rows
the trajectory model says match (the filters written out in Python), raw and compacted, in the
order the viewer's source pages them."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _lake_store as S
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_verl.store import Trajectory, finite_number, group_trajectories, read_spans
from otel_verl.store._compact import compact
from otel_verl.store._filters import BadRequest
from otel_verl.store._query import Lake
from otel_verl.store._record import is_tool_error
from otel_verl.ui._lake import LakeSource


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("lake_filters") / "store"
    S.write_store(directory, 7)  # 3 steps x 3 prompts x 3 rollouts; step 2 is validation
    return directory


@pytest.fixture(scope="module")
def lake(store: Path) -> Iterator[Lake]:
    with Lake.open(store) as opened:
        yield opened


def _keys(lake: Lake, **filters: Any) -> list[str]:
    return [r["key"] for r in lake.trajectories(limit=None, **filters)["rows"]]


# what the old loop did with each (the store has steps 0, 1, 2): True kept step 1's rows, "1"
# was cast by DuckDB, 2**70 and 1.5 silently kept nothing, NaN kept every rewarded row as a
# maximum and none as a minimum, "3" and True were a page size
@pytest.mark.parametrize("filters", [
    {"step": True}, {"step": "1"}, {"step": 1.5}, {"step": 2**70}, {"sample_index": False},
    {"rollout_n": -(2**64)}, {"reward_max": math.nan}, {"reward_min": math.nan},
    {"reward_min": "0.5"}, {"validate": "false"}, {"validate": 2}, {"limit": "3"},
    {"limit": True}, {"offset": 2.0},
], ids=repr)
def test_the_lake_refuses_what_the_viewer_refuses(lake: Lake, filters: dict[str, Any]) -> None:
    with pytest.raises(BadRequest):
        lake.trajectories(**filters)


@pytest.mark.parametrize("numpy, plain", [
    ({"step": np.int64(1)}, {"step": 1}),
    ({"sample_index": np.int32(2), "rollout_n": np.uint8(0)}, {"sample_index": 2, "rollout_n": 0}),
    ({"validate": np.bool_(True)}, {"validate": True}),
    ({"reward_min": np.float32(0.5)}, {"reward_min": 0.5}),
    ({"step": np.int64(0), "limit": np.int64(2), "offset": np.int16(1)},
     {"step": 0, "limit": 2, "offset": 1}),
], ids=repr)
def test_a_numpy_value_filters_like_the_plain_one(lake: Lake, numpy: dict[str, Any],
                                                  plain: dict[str, Any]) -> None:
    """A step read back from a frame (``df.step[0]``): the old loop handed it to DuckDB's binder,
    which raised NotImplementedException."""
    want = lake.trajectories(**{"limit": None, **plain})
    assert want["rows"], plain  # the filter keeps something, so equality means something
    got = lake.trajectories(**{"limit": None, **numpy})
    assert got["total"] == want["total"]
    assert [r["key"] for r in got["rows"]] == [r["key"] for r in want["rows"]]


def test_the_status_filter_keeps_that_status(lake: Lake) -> None:
    every = lake.trajectories(limit=None)["rows"]
    statuses = {r["status"] for r in every}
    assert len(statuses) > 1, statuses
    for status in statuses:
        assert _keys(lake, status=status) == [r["key"] for r in every if r["status"] == status]


_FILTERS = st.fixed_dictionaries({}, optional={
    "experiment": st.sampled_from(["exp", "other"]),
    "step": st.one_of(st.integers(-1, 3), st.integers(0, 2).map(np.int64)),
    "sample_index": st.integers(0, 3),
    "rollout_n": st.integers(0, 2),
    "validate": st.booleans(),
    "reward_min": st.sampled_from([0.0, 0.25, 0.5, 1.0, -math.inf]),
    "reward_max": st.sampled_from([0.0, 0.5, 1.0, math.inf]),
    "errors_only": st.booleans(),
    "trace_id": st.sampled_from(["0", "00000000000000000000000000000001", "0000000000000000000"
                                 "000000000000A", "f"]),
})


def _matches(t: Trajectory, filters: dict[str, Any]) -> bool:
    """The filters of otel_verl/store/_filters.py, read off the trajectory model."""
    reward = finite_number(t.reward)
    for name, value in filters.items():
        if name == "reward_min" and (reward is None or reward < value):
            return False
        if name == "reward_max" and (reward is None or reward > value):
            return False
        if name == "errors_only" and value and not (
                t.errors or any(is_tool_error(s) for s in t.spans)):
            return False
        if name == "trace_id" and not t.trace_id.startswith(value.lower()):
            return False
        if name in ("experiment", "step", "sample_index", "rollout_n", "validate") and (
                getattr(t, name) is None or getattr(t, name) != value):
            return False
    return True


@pytest.fixture(scope="module")
def both(store: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[
        tuple[list[Trajectory], LakeSource, Lake, Lake]]:
    """The trajectory model, the viewer's source, the lake over the raw lines and the lake over
    compacted segments (of the same store)."""
    compacted = tmp_path_factory.mktemp("lake_filters_compacted") / "store"
    S.write_store(compacted, 7)
    compact(compacted, live_bytes=0, chunk_spans=40)
    model = group_trajectories(read_spans(store))
    viewer = LakeSource(compacted, compact=False)
    with Lake.open(store) as raw, Lake.open(compacted) as done:
        assert done.state.segments > 0 and done.state.raw_spans == 0
        yield model, viewer, raw, done
    viewer.close()


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(filters=_FILTERS, order=st.sampled_from(["reward", "step", "rollout_n", "start_ns"]))
def test_the_lake_keeps_the_rows_the_model_keeps(
        both: tuple[list[Trajectory], LakeSource, Lake, Lake], filters: dict[str, Any],
        order: str) -> None:
    """One rule, the same rows: the trajectory model's (as a set), the viewer's source and the
    lake raw and compacted (in the same order)."""
    model, viewer, raw, done = both
    want = viewer.trajectories(order=order, page_size=5000, **filters)
    keys = [r["key"] for r in want["rows"]]
    assert set(keys) == {f"{t.trace_id}:{t.span_id or ''}" for t in model
                         if _matches(t, filters)}
    for lake in (raw, done):
        got = lake.trajectories(order=order, limit=None, **filters)
        assert got["total"] == want["total"]
        assert [r["key"] for r in got["rows"]] == keys
