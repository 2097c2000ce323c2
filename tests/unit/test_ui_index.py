"""The viewer's source over the lake (otel_verl.ui._lake.LakeSource), its HTTP API and the
report, without a browser (the browser tests are the ui tier: tests/ui). These ran over the SQLite
index until the lake became the only read path; each checks what is still true of the viewer."""

from __future__ import annotations

import json
import os
import threading
import urllib.error
import urllib.request

import pytest
from hypothesis import given
from hypothesis import strategies as st

import otel_verl
from otel_verl import RolloutTraceConfig, rollout_trace_attr, rollout_trace_op, semconv
from otel_verl.store import list_files
from otel_verl.ui._lake import LakeSource
from otel_verl.ui.report import write_report
from otel_verl.ui.server import UIServer, dumps

SAMPLING_WEIGHT = semconv.ROLLOUT_SAMPLING_WEIGHT


@rollout_trace_op
def agent(prompt: str, fail: bool = False) -> str:
    if fail:
        raise RuntimeError("tool server down")
    return "The answer is 7."


def write_store(trace_dir, rewards, *, step=1, weight=None, prompt="What is 3+4?"):
    RolloutTraceConfig.init("p", "exp", "file", trace_dir=str(trace_dir), processor="simple")
    for i, reward in enumerate(rewards):
        with rollout_trace_attr(step=step, sample_index=i // 2, rollout_n=i % 2):
            try:
                agent(prompt, fail=reward is None)
            except RuntimeError:
                pass
            if reward is not None:
                otel_verl.record_reward(reward, name="exact", label="ok" if reward else "wrong")
            if weight is not None:
                otel_verl.set_trajectory_attribute(SAMPLING_WEIGHT, weight)
    RolloutTraceConfig.shutdown()
    RolloutTraceConfig.reset()


def test_new_lines_show_and_a_half_written_one_waits(tmp_path):
    write_store(tmp_path, [1.0, 0.0, 1.0, 0.0])
    index = LakeSource(tmp_path, compact=False)
    assert index.problems()["spans"] == 8 and index.problems()["trajectories"] == 4
    assert not index.update()  # nothing new: not reopened
    path = list_files(tmp_path)[0]
    with open(path, "rb") as handle:
        line = handle.readline()
    with open(path, "ab") as handle:  # a writer in the middle of a line
        handle.write(line[:50])
    assert index.update()
    assert index.problems()["files_with_incomplete_last_line"] == 1
    assert index.problems()["trajectories"] == 4
    with open(path, "ab") as handle:
        handle.write(line[50:])  # the same spans again: kept once
    assert index.update()
    assert index.problems()["trajectories"] == 4
    assert index.problems()["files_with_incomplete_last_line"] == 0
    write_store(tmp_path, [1.0, 1.0], step=2)  # a second process, a second file
    assert index.update()
    steps = {(s["step"], s["trajectories"]) for s in index.overview()}
    assert steps == {(1, 4), (2, 2)}
    index.close()


@pytest.mark.parametrize("compacted", [False, True], ids=["raw", "compacted"])
def test_a_replaced_file_is_read_as_it_is_now(tmp_path, compacted):
    from otel_verl.store import compact

    write_store(tmp_path, [1.0, 0.0])
    if compacted:
        compact(tmp_path, live_bytes=0)
    index = LakeSource(tmp_path, compact=False)
    assert index.problems()["trajectories"] == 2
    path = list_files(tmp_path)[0]
    with open(path, "rb") as handle:
        lines = handle.readlines()
    with open(path, "wb") as handle:
        handle.writelines(lines[:1])
    assert index.update()
    assert index.problems()["trajectories"] == 1
    index.close()


def test_overview_is_weighted_and_counts_errors(tmp_path):
    write_store(tmp_path, [1.0, 0.0], weight=3.0)
    write_store(tmp_path, [0.0, None])  # weight 1; one trajectory fails before its reward
    index = LakeSource(tmp_path, compact=False)
    (step,) = index.overview()
    # rewards 1 (w3), 0 (w3), 0 (w1); the failed one has no reward
    assert step["reward_mean"] == pytest.approx(3 / 7)
    assert step["pass_rate"] == pytest.approx(3 / 7)
    assert step["with_errors"] == 1 and step["trajectories"] == 4
    errors = index.trajectories(errors_only=True)["rows"]
    assert len(errors) == 1 and errors[0]["error"] == "RuntimeError: tool server down"
    assert index.trajectories(text="TOOL SERVER")["total"] == 1
    labels = {r["reward_label"] for r in index.trajectories()["rows"]}
    assert labels == {"ok", "wrong", None}


def _report_line(step, ran, dropped, span_id):
    attributes = [{"key": k, "value": v} for k, v in (
        (semconv.ROLLOUT_STEP, {"intValue": str(step)}), (semconv.ROLLOUT_VALIDATE,
                                                          {"boolValue": False}),
        (semconv.ROLLOUT_EXPERIMENT_NAME, {"stringValue": "exp"}),
        (semconv.ROLLOUT_SAMPLING_RAN, {"intValue": str(ran)}),
        (semconv.ROLLOUT_SAMPLING_DROPPED, {"intValue": str(dropped)}))]
    return json.dumps({"resourceSpans": [{"resource": {}, "scopeSpans": [{"spans": [{
        "traceId": f"{span_id:032x}", "spanId": f"{span_id:016x}",
        "name": semconv.SAMPLING_REPORT_SPAN, "startTimeUnixNano": "1",
        "endTimeUnixNano": "1", "attributes": attributes}]}]}]}) + "\n"


def test_sampling_reports_give_what_ran_per_step(tmp_path):
    write_store(tmp_path, [1.0, 0.0])
    with open(tmp_path / "reports.jsonl", "w") as handle:  # two workers report step 1; step 2
        handle.write(_report_line(1, 10, 8, 1) + _report_line(1, 6, 6, 2)
                     + _report_line(2, 5, 5, 3))
    index = LakeSource(tmp_path, compact=False)
    steps = {s["step"]: s for s in index.overview()}
    assert steps[1]["trajectories"] == 2 and (steps[1]["ran"], steps[1]["dropped"]) == (16, 14)
    assert steps[2]["trajectories"] == 0 and steps[2]["ran"] == 5
    assert index.problems()["partial_trajectories"] == 0  # reports are not trajectories


def test_foreign_and_bad_lines_are_counted_not_fatal(tmp_path, caplog):
    write_store(tmp_path, [1.0])
    foreign = {"resourceSpans": [{"resource": {}, "scopeSpans": [{"spans": [
        {"traceId": "0af7651916cd43dd8448eb211c80319c", "spanId": "b7ad6b7169203331",
         "name": "GET /cart", "startTimeUnixNano": "1", "endTimeUnixNano": "2"},
        {"traceId": "bad", "spanId": "x"}]}]}]}
    with open(tmp_path / "collector.json", "w") as handle:
        handle.write(json.dumps(foreign) + "\n[1, 2]\nnot json\n")
    index = LakeSource(tmp_path, compact=False)
    problems = index.problems()
    assert problems["bad_lines"] == 2 and problems["bad_spans"] == 1
    assert problems["partial_trajectories"] == 1 and problems["trajectories"] == 2
    assert not [r for r in caplog.records if "bad span" in r.getMessage()]  # counted, not spammed


def test_a_store_that_cannot_be_written_is_read_and_nothing_is_written_beside_it(
        tmp_path, monkeypatch):
    """The viewer's background compaction on a store it cannot write (a collector's read-only
    output): it stops compacting, says so once, and keeps serving the raw files."""
    write_store(tmp_path / "store", [1.0])
    before = sorted(os.listdir(tmp_path / "store"))
    from otel_verl.store import _compact

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(tmp_path / "store"))

    monkeypatch.setattr(_compact, "compact", refuse)
    index = LakeSource(tmp_path / "store", compact=True)
    index.background_step()
    index.background_step()
    assert index.compact is False and "Permission denied" in (index.last_error or "")
    assert index.problems()["spans"] == 2 and index.trajectories()["total"] == 1
    assert sorted(os.listdir(tmp_path / "store")) == before
    index.close()


@pytest.fixture
def server(tmp_path):
    write_store(tmp_path, [1.0, 0.0], prompt="<script>alert(1)</script></script><!--")
    index = LakeSource(tmp_path, compact=False)
    srv = UIServer(index, port=0, poll_s=0.0)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()
    index.close()


def _get(url):
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.status, dict(response.headers), response.read()


def test_server_binds_loopback_answers_get_only_with_a_strict_policy(server):
    assert server.server_address[0] == "127.0.0.1"
    status, headers, body = _get(server.url)
    assert status == 200 and "script-src 'self'" in headers["Content-Security-Policy"]
    assert b"<script" in body and b"alert" not in body
    status, _, body = _get(server.url + "api/trajectories?step=1&order=reward&desc=1")
    rows = json.loads(body)["rows"]
    assert [r["reward"] for r in rows] == [1.0, 0.0]
    assert b"<" not in body  # every "<" of the payload escaped (\u003c)
    assert rows[0]["prompt"] == "<script>alert(1)</script></script><!--"
    key = rows[0]["key"]
    _, _, body = _get(server.url + "api/trajectory?key=" + key)
    assert json.loads(body)["reward"] == {"score": 1.0, "label": "ok", "name": "exact"}
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(urllib.request.Request(server.url + "api/meta", data=b"x"),
                               timeout=10)
    assert refused.value.code == 405
    with pytest.raises(urllib.error.HTTPError) as missing:
        _get(server.url + "static/../../etc/passwd")
    assert missing.value.code == 404


def test_report_is_one_file_with_escaped_payloads(tmp_path):
    write_store(tmp_path / "s", [1.0, 0.0], prompt="</script><script>alert(1)</script>")
    index = LakeSource(tmp_path / "s", compact=False)
    meta = write_report(index, tmp_path / "r.html", max_details=1)
    html = (tmp_path / "r.html").read_text()
    assert meta["rows"] == 2 and meta["details"] == 1
    assert "alert(1)" in html and "<script>alert(1)" not in html and "</script><script>alert" \
        not in html
    assert "Content-Security-Policy" in html and "src=" not in html.split("<body>")[0]


@given(st.text())
def test_dumps_is_script_safe_and_lossless(text):
    encoded = dumps({"t": text, "n": float("nan")})
    assert "<" not in encoded and ">" not in encoded and "\u2028" not in encoded
    assert json.loads(encoded) == {"t": text, "n": None}
