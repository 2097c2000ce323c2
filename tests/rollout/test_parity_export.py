"""Trajectories exported as data (issue 22): ``otel-verl traces export`` over real rollouts
(``ToolAgentLoop`` -> HTTP -> the engine stub; the file backend and its content store) writes a
JSONL and a Parquet file that pyarrow loads; their token ids rebuild each traced conversation
exactly (equal to the loop's own output), the messages are the conversation the loop held, and
``otel-verl parity`` finds the export equal to the trace (and a changed one not).
"""

from __future__ import annotations

import json

import pyarrow.json as pa_json
import pyarrow.parquet as pq

from otel_verl import semconv
from otel_verl.cli import main

from .test_parity import STEP, _run


def _export(tmp_path, *args: str) -> int:
    return main(["traces", "export", "--dir", str(tmp_path / "traces"), *args])


def test_exported_dataset_loads_and_rebuilds_every_traced_conversation(tmp_path, capsys):
    outs, spans = _run(tmp_path, 3)
    jsonl, parquet = tmp_path / "set.jsonl", tmp_path / "set.parquet"
    assert _export(tmp_path, "-o", str(jsonl)) == 0
    assert _export(tmp_path, "-o", str(parquet), "--format", "parquet") == 0
    rows = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert pa_json.read_json(jsonl).to_pylist() == pq.read_table(parquet).to_pylist()
    table = pq.read_table(parquet)
    assert table.num_rows == 3
    assert {"messages", "prompt_ids", "response_ids", "response_mask", "reward",
            "policy_version_min", "policy_versions"} <= set(table.column_names)
    for row in pq.read_table(parquet).to_pylist():
        out = outs[row["sample_index"]]
        # the token view, rebuilt from the content store, is what the loop produced
        assert row["prompt_ids"] == out.prompt_ids
        assert row["response_ids"] == out.response_ids
        assert row["response_mask"] == out.response_mask
        assert (row["reward"], row["num_turns"]) == (out.reward_score, out.num_turns)
        assert row["policy_versions"] == [1, 1, 1, 1] and row["staleness"] == 0
        # the chat view: the loop's conversation, its last answer included
        held = out.extra_fields["messages"]
        assert [m["role"] for m in row["messages"]] == [m["role"] for m in held]
        assert [m["content"] for m in row["messages"]] == [m.get("content") for m in held]
        calls = [m["tool_calls"] for m in row["messages"] if m["tool_calls"]]
        assert len(calls) == 3
        assert all(c[0]["function"]["name"] == "calculator" for c in calls)
        assert all(isinstance(c[0]["function"]["arguments"], str) for c in calls)
    assert rows == pq.read_table(parquet).to_pylist()

    # filters: the list filters and rewards
    assert _export(tmp_path, "-o", str(tmp_path / "one.jsonl"), "--sample-index", "1") == 0
    assert [json.loads(x)["sample_index"]
            for x in (tmp_path / "one.jsonl").read_text().splitlines()] == [1]
    assert _export(tmp_path, "-o", str(tmp_path / "none.jsonl"), "--min-reward", "2") == 0
    assert (tmp_path / "none.jsonl").read_text() == ""
    assert _export(tmp_path, "-o", str(tmp_path / "other.jsonl"), "--step", str(STEP + 1)) == 0
    assert (tmp_path / "other.jsonl").read_text() == ""

    # the export is a source for parity: equal; a changed mask in it is found (exit 3)
    capsys.readouterr()
    assert main(["parity", "--dir", str(tmp_path / "traces"), "--against", str(parquet)]) == 0
    assert "3 of 3 trajectories equal" in capsys.readouterr().out
    rows[2]["response_mask"][0] = 0
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["parity", "--dir", str(tmp_path / "traces"), "--against", str(bad),
                 "--json"]) == 3
    reports = json.loads(capsys.readouterr().out)
    assert [r["equal"] for r in sorted(reports, key=lambda r: r["sample_index"])] == \
        [True, True, False]
    assert [d["kind"] for r in reports for d in r["differences"]] == ["mask"]
    roots = [s for s in spans if s["attributes"].get(semconv.OTEL_VERL_TRAJECTORY)]
    assert {r["trace_id"] for r in reports} == {s["trace_id"] for s in roots}


def test_the_viewers_export_holds_the_filtered_rows(tmp_path):
    import io

    import pytest

    from otel_verl.store._export import export_file

    outs, _ = _run(tmp_path, 2)
    body, n = export_file(tmp_path / "traces", {"sample_index": "1", "validate": "false",
                                                "reward_min": "", "page": "0"}, "jsonl")
    (row,) = [json.loads(line) for line in body.decode().splitlines()]
    assert n == 1 and row["sample_index"] == 1
    assert row["prompt_ids"] + row["response_ids"] == outs[1].prompt_ids + outs[1].response_ids
    body, n = export_file(tmp_path / "traces", {}, "parquet")
    assert n == 2 and pq.read_table(io.BytesIO(body)).num_rows == 2
    for bad in ({"step": "x"}, {"validate": "maybe"}):
        with pytest.raises(ValueError):
            export_file(tmp_path / "traces", bad, "jsonl")
