"""Bad stores: the viewer shows what it can and says what it skipped."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from playwright.sync_api import expect
from uihelpers import UIProcess, goto, leave, shot

from otel_verl.store import list_files

pytestmark = pytest.mark.timeout(300)

FOREIGN = {"resourceSpans": [{"resource": {"attributes": [
    {"key": "service.name", "value": {"stringValue": "checkout"}}]},
    "scopeSpans": [{"scope": {"name": "shop"}, "spans": [{
        "traceId": "0af7651916cd43dd8448eb211c80319c", "spanId": "b7ad6b7169203331",
        "name": "GET /cart", "kind": 2, "startTimeUnixNano": "1700000000000000000",
        "endTimeUnixNano": "1700000000500000000", "status": {"code": 2, "message": "HTTP 503"},
        "attributes": [{"key": "http.route", "value": {"stringValue": "/cart"}}]},
        {"traceId": "zz", "spanId": "nothex", "name": "broken"}]}]}]}


def test_bad_store_is_shown_with_what_was_skipped(page, real_store, tmp_path, artifacts):
    store = tmp_path / "bad"
    shutil.copytree(real_store, store, ignore=shutil.ignore_patterns(".otel_verl_index"))
    first = next(f for f in list_files(store) if b"otel_verl.trajectory" in Path(f).read_bytes())
    with open(first, "rb") as handle:
        lines = handle.read().splitlines(keepends=True)
    # a trace that lost its trajectory span: drop the trajectory spans from the first file
    dropped = []
    for i, line in enumerate(lines):
        request = json.loads(line)
        for rs in request["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                keep = []
                for span in ss["spans"]:
                    marked = any(a["key"] == "otel_verl.trajectory" for a in span["attributes"])
                    if marked and not dropped:
                        dropped.append(span["traceId"])
                        continue
                    keep.append(span)
                ss["spans"] = keep
        lines[i] = (json.dumps(request) + "\n").encode()
    with open(first, "wb") as handle:
        handle.writelines(lines)
        handle.write(b"this is not json\n")                     # a bad line
        handle.write((json.dumps(FOREIGN) + "\n").encode())    # another service, one bad span
        handle.write(lines[0][: len(lines[0]) // 2])            # a writer that crashed mid-line
    server = UIProcess(store)
    try:
        goto(page, server.url, "#/overview")
        banner = page.get_by_test_id("problems")
        expect(banner).to_contain_text("1 bad line(s) skipped")
        expect(banner).to_contain_text("1 undecodable span(s) skipped")
        expect(banner).to_contain_text("1 file(s) end in an incomplete line")
        expect(banner).to_contain_text("trace(s) without a trajectory span")
        expect(page.get_by_test_id("steps-table").first).to_be_visible()  # the rest still shows
        shot(page, artifacts, "bad-store")
        goto(page, server.url, "#/trajectories?trace=0af7651916cd43dd")
        expect(page.get_by_test_id("count")).to_have_text("1–1 of 1")
        expect(page.locator("[data-testid=trajectory-table] tbody tr td.status-partial")
               ).to_have_text("partial · error")
        page.locator("[data-testid=trajectory-table] tbody tr a").first.click()
        expect(page.get_by_test_id("error-message").first).to_have_text("HTTP 503")
        expect(page.get_by_test_id("waterfall")).to_contain_text("GET /cart")
        # the trace that lost its trajectory span is listed as partial, spans and all
        goto(page, server.url, f"#/trajectories?trace={dropped[0][:16]}")
        expect(page.locator("td.status-partial").first).to_be_visible()
        # the writer finishes its line: the next look reads it
        with open(first, "ab") as handle:
            handle.write(lines[0][len(lines[0]) // 2:])
        goto(page, server.url, "#/overview")
        expect(page.get_by_test_id("problems")).not_to_contain_text("incomplete line",
                                                                    timeout=15_000)
    finally:
        leave(page)
        server.stop()
    assert any("bad line" in line for line in server.log), server.log


def _hostile():
    import _hostile_spans  # tests/: on sys.path (tests/conftest.py)

    return _hostile_spans


def test_a_poisoned_store_serves_every_good_trajectory(page, real_store, tmp_path, artifacts):
    """Every hostile kind of tests/_hostile_spans.py, one poisoned line each, between the good
    lines of a real store: every good trajectory is listed and its page served, the poisoned
    ones that decode are listed too, and the banner says what was skipped."""
    from urllib.parse import quote

    from otel_verl.ui._lake import LakeSource

    hostile = _hostile()
    clean = tmp_path / "clean"  # the good keys, read from a copy (nothing written beside the fixture)
    shutil.copytree(real_store, clean, ignore=shutil.ignore_patterns(".otel_verl_index",
                                                                     ".otel_verl_lake"))
    good_source = LakeSource(clean, compact=False)
    good = {r["key"] for r in good_source.trajectories(page_size=5000)["rows"]}
    good_source.close()
    store = tmp_path / "poisoned"
    shutil.copytree(real_store, store, ignore=shutil.ignore_patterns(".otel_verl_index"))
    poisoned = hostile.poison_store(store)
    server = UIProcess(store)
    try:
        goto(page, server.url, "#/overview")
        banner = page.get_by_test_id("problems")
        expect(banner).to_contain_text("bad line(s) skipped")
        expect(banner).to_contain_text("undecodable span(s) skipped")
        expect(page.get_by_test_id("steps-table").first).to_be_visible()
        shot(page, artifacts, "poisoned-store")
        listed = page.request.get(f"{server.url}api/trajectories?page_size=5000").json()["rows"]
        keys = {r["key"] for r in listed}
        assert good <= keys
        served = 0
        for key in sorted(good):
            answer = page.request.get(f"{server.url}api/trajectory?key={quote(key)}")
            assert answer.status == 200, answer.text()
            if answer.json().get("messages") or answer.json().get("waterfall"):
                served += 1
        assert served == len(good)
        print(f"\n{len(hostile.KINDS)} hostile kinds: {served} of {len(good)} good trajectories "
              f"served; {len(keys) - len(good)} poisoned trajectories listed")
        # a poisoned trajectory whose tool_calls is a number: its page and its group render
        row = next(r for r in listed if r["trace_id"] == poisoned[
            list(hostile.KINDS).index("tool_calls a number")])
        goto(page, server.url, f"#/trajectory?key={row['key']}")
        expect(page.get_by_test_id("conversation")).to_be_visible()
        shot(page, artifacts, "poisoned-trajectory")
        for key in sorted(good)[:3]:
            goto(page, server.url, f"#/trajectory?key={key}")
            expect(page.get_by_test_id("conversation")).to_be_visible()
    finally:
        leave(page)
        server.stop()
