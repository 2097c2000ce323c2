"""`otel-verl report`: one HTML file, opened from file:// in Chromium, with no network at all."""

from __future__ import annotations

import statistics

import pytest
from playwright.sync_api import expect
from uihelpers import EDGE_EXPERIMENT, goto, run_cli, shot

from otel_verl import semconv
from otel_verl.store import group_trajectories, read_spans

pytestmark = pytest.mark.timeout(300)


def test_report_opens_offline_with_every_view(browser, real_store, artifacts):
    report = artifacts / "report.html"
    done = run_cli("report", "--trace-dir", str(real_store), "-o", str(report))
    assert done.returncode == 0, done.stderr
    html = report.read_text()
    assert "http://" not in html.split('id="otel-verl-data"')[0].split("<style>")[0]
    assert "<script>window.__pwned" not in html  # the planted prompt is escaped in the JSON
    trajectories = [t for t in group_trajectories(read_spans(real_store)) if t.root is not None]

    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    goto(page, report.as_uri())
    expect(page.get_by_test_id("report-note")).to_contain_text("offline report")
    # overview numbers, as in the server
    demo = [t for t in trajectories if t.experiment != EDGE_EXPERIMENT]
    goto(page, report.as_uri(), f"#/overview?experiment={demo[0].experiment}")
    row = page.locator("[data-testid=steps-table] tr[data-step='1'][data-split='training']")
    rewards = [t.reward for t in demo if t.step == 1 and t.validate is False]
    expect(row.locator("td.reward-mean")).to_have_text(f"{statistics.fmean(rewards):.3f}")
    expect(page.locator("[data-testid=chart-reward] .main-svg").first).to_be_visible()
    shot(page, artifacts, "report-overview")
    # filtering runs in the page
    goto(page, report.as_uri(), "#/trajectories?step=2&validate=false")
    want = [t for t in trajectories if t.step == 2 and t.validate is False]
    expect(page.get_by_test_id("count")).to_have_text(f"1–{len(want)} of {len(want)}")
    goto(page, report.as_uri(), "#/trajectories?text=division by zero")
    expect(page.get_by_test_id("count")).to_have_text("1–1 of 1")
    # a trajectory with its tool call, and the group view
    t = next(t for t in demo if t.validate is False)
    tool = next(s for s in t.spans if s["attributes"].get(semconv.GEN_AI_TOOL_NAME))
    goto(page, report.as_uri(), f"#/trajectory?key={t.trace_id}:{t.span_id}")
    expect(page.get_by_test_id("tool-result").first).to_contain_text(
        f"result {tool['attributes'][semconv.GEN_AI_TOOL_CALL_RESULT]}")
    goto(page, report.as_uri(), f"#/group?experiment={t.experiment}&step={t.step}"
              f"&sample_index={t.sample_index}&validate=false")
    expect(page.get_by_test_id("group-table").locator("tbody tr")).to_have_count(
        sum(1 for x in demo if (x.step, x.sample_index, x.validate) == (t.step, t.sample_index,
                                                                          False)))
    # the planted script stays text here too
    planted = next(x for x in trajectories
                   if x.experiment == EDGE_EXPERIMENT and x.sample_index == 2)
    goto(page, report.as_uri(), f"#/trajectory?key={planted.trace_id}:{planted.span_id}")
    expect(page.get_by_text("<script>window.__pwned=1</script>").first).to_be_visible()
    assert page.evaluate("window.__pwned") is None
    context.close()
    assert not errors, errors
    assert all(url.startswith(("file://", "data:")) for url in requests), requests
