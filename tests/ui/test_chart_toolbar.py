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
    return {id: c.id, title: c.querySelector('.gtitle').textContent, shown, overlap,
            hovered: c.matches(':hover')};
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
    # a store with several experiments has one chart-latency per experiment: the first is pointed
    # at; the live page may re-render under a still pointer (a store still growing), and
    # Chromium re-evaluates :hover only when the pointer moves, so point until it shows
    for attempt in range(10):
        page.hover("[data-testid=chart-latency] >> nth=0", position={"x": 200 + attempt, "y": 150})
        page.wait_for_timeout(300)  # Plotly fades the buttons in
        shown = [c for c in page.evaluate(_BOXES) if c["shown"]]
        if shown:
            break
    assert len(shown) == 1, shown  # only the chart under the pointer
    assert shown[0]["id"] == "chart-latency" and shown[0]["hovered"], shown
    assert not shown[0]["overlap"], shown
    shot(page, artifacts, "overview-chart-toolbar-hover", full_page=False)
