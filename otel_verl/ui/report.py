"""``otel-verl report``: the viewer's views as one self-contained HTML file (no server, no network).

The page embeds the viewer's own script and stylesheet, the installed plotly bundle, and the
answers the server would give (run overview, the selected trajectory rows, and the details of up
to ``max_details`` trajectories) as JSON escaped for a script element; a Content-Security-Policy
in the page forbids every network request. Filtering, sorting and paging run in the browser over
the embedded rows.
"""

from __future__ import annotations

import datetime as _dt
import os
from typing import Any

from otel_verl.ui import assets
from otel_verl.ui.server import dumps
from otel_verl.ui.views import Source, overview_view, trajectory_view

__all__ = ["build_report_data", "write_report"]

#: trajectory rows in one report at most (the rows are small; details are what weighs)
MAX_ROWS = 200_000


def build_report_data(index: Source, *, experiment: str | None = None,
                      step: int | None = None, sample_index: int | None = None,
                      validate: bool | None = None, max_details: int = 300) -> dict[str, Any]:
    """The answers the report embeds (the same shapes as the server's API)."""
    rows = index.trajectories(experiment=experiment, step=step, sample_index=sample_index,
                              validate=validate, page_size=MAX_ROWS, max_page_size=MAX_ROWS,
                              with_search=True)["rows"]
    # details: trajectories with errors first (what one looks for), then in run order
    chosen = sorted(rows, key=lambda r: (not (r["errors"] or r["tool_errors"]),
                                         r["start_ns"] or 0))[: max(0, max_details)]
    details = {}
    for row in chosen:
        view = trajectory_view(index, row["key"])
        if view is not None:
            details[row["key"]] = view
    overview = overview_view(index, experiment)
    if step is not None or validate is not None:
        keep = [s for s in overview["steps"] if (step is None or s["step"] == step)
                and (validate is None or s["validate"] is validate)]
        overview = {"steps": keep, "flat": overview["flat"]}
    problems = index.problems()
    problems["trajectories"] = len(rows)
    generated = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    experiments = sorted({r["experiment"] for r in rows if r["experiment"] is not None})
    return {
        "meta": {"generation": 0, "problems": problems, "experiments": experiments,
                 "store": os.path.abspath(index.trace_dir), "mode": "report",
                 "generated": generated, "details": len(details), "rows": len(rows)},
        "overview": overview, "rows": rows, "details": details,
    }


def write_report(index: Source, path: str | os.PathLike[str],
                 **selection: Any) -> dict[str, Any]:
    """Write the report to ``path``; returns its ``meta`` (counts). ``selection``: the filters
    of :func:`build_report_data`."""
    data = build_report_data(index, **selection)
    html = assets.page(report_data=dumps(data), title="otel-verl report")
    tmp = f"{os.fspath(path)}.tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(html)
    os.replace(tmp, path)
    return data["meta"]
