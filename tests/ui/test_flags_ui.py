"""The detectors' flags in the viewer, in a real Chromium: the flag filter on the trajectories
page lists the flagged trajectories, and a flagged trajectory's page shows each flag's evidence
and the overview charts the flags per step (screenshots: ``flags-trajectories.png``,
``flags-trajectory.png``, ``flags-panel.png``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from playwright.sync_api import expect
from uihelpers import HERE, UIProcess, _env, goto, leave, shot


def test_flag_filter_and_evidence(page, tmp_path, artifacts):
    store = tmp_path / "traces"
    done = subprocess.run([sys.executable, str(Path(HERE) / "_flag_rollouts.py"), str(store)],
                          capture_output=True, text=True, timeout=120, env=_env(), check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    ui = UIProcess(store)
    try:
        goto(page, ui.url, "#/trajectories?flag=length_cap")
        expect(page.get_by_test_id("count")).to_have_text("1–2 of 2")  # one per step
        expect(page.get_by_test_id("filter-flag")).to_have_value("length_cap")
        shot(page, artifacts, "flags-trajectories")
        page.locator("[data-testid=trajectory-table] tbody tr a.mono").first.click()
        flag = page.get_by_test_id("flag-length_cap")
        expect(flag).to_contain_text('"finish_reason":"length"')
        shot(page, artifacts, "flags-trajectory")
        goto(page, ui.url, "#/trajectories?flag=format_failure")
        expect(page.get_by_test_id("count")).to_have_text("1–2 of 2")
        goto(page, ui.url, "#/overview?experiment=flags")
        panel = page.get_by_test_id("chart-flags")
        expect(panel).to_contain_text("Flagged trajectories per step")
        expect(panel).to_contain_text("length_cap")
        shot(page, artifacts, "flags-panel")
    finally:
        leave(page)
        ui.stop()
