"""The charts' toolbar (Plotly's modebar) in Chromium at 1400 px: it never covers a chart's title,
and on a pointer device it shows only over the chart the pointer is on."""

from __future__ import annotations

import pytest
from uihelpers import goto, shot

pytestmark = pytest.mark.timeout(600)

_BOXES = """() => [...document.querySelectorAll('.chart')].filter((c) => c.querySelector('.gtitle'))
  .map((c) => {
    const t = c.querySelector('.gtitle').getBoundingClientRect();
    const bar = c.querySelector('.modebar');
    const b = bar ? bar.getBoundingClientRect() : null;
    const shown = bar !== null && getComputedStyle(c.querySelector('.modebar-container'))
      .visibility === 'visible';
    const overlap = b !== null && !(t.right <= b.left || b.right <= t.left || t.bottom <= b.top ||
      b.bottom <= t.top);
    return {id: c.id, title: c.querySelector('.gtitle').textContent, shown, overlap};
  })"""


def test_the_chart_toolbar_never_covers_a_title(page, ui, artifacts):
    goto(page, ui.url, "")
    page.locator(".chart .modebar").first.wait_for(state="attached")
    page.mouse.move(5, 5)  # on the page's header, over no chart
    charts = page.evaluate(_BOXES)
    titles = {c["title"] for c in charts}
    assert {"Reward per step", "Tokens", "Latency (s)"} <= titles, titles
    assert not [c for c in charts if c["overlap"]], charts
    assert not [c for c in charts if c["shown"]], charts  # hidden while no chart is pointed at
    page.hover("[data-testid=chart-latency]", position={"x": 200, "y": 150})
    page.wait_for_timeout(500)  # Plotly fades the buttons in
    charts = {c["id"]: c for c in page.evaluate(_BOXES)}
    assert charts["chart-latency"]["shown"] and not charts["chart-latency"]["overlap"]
    assert [c for c in charts.values() if c["shown"]] == [charts["chart-latency"]]
    shot(page, artifacts, "overview-chart-toolbar-hover", full_page=False)
