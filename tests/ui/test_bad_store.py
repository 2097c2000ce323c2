"""Bad stores: the viewer shows what it can and says what it skipped."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from playwright.sync_api import expect
from uihelpers import UIProcess, goto, shot

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
        server.stop()
    assert any("bad line" in line for line in server.log), server.log
