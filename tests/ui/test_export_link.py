"""The trajectory table's export link (issue 22) in Chromium: it carries the table's filters and
downloads those trajectories as a dataset file whose token ids and mask line up."""

from __future__ import annotations

import json

from playwright.sync_api import expect
from uihelpers import goto


def test_the_table_exports_its_filtered_rows(page, ui):
    goto(page, ui.url, "#/trajectories?experiment=tiny_grpo&step=1&validate=false")
    link = page.get_by_test_id("export-jsonl")
    expect(link).to_be_visible()
    href = link.get_attribute("href") or ""
    assert "step=1" in href and "validate=false" in href and "experiment=tiny_grpo" in href
    with page.expect_download() as info:
        link.click()
    with open(info.value.path(), encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    assert rows, "no trajectory exported"
    assert all(r["step"] == 1 and r["validate"] is False and r["experiment"] == "tiny_grpo"
               for r in rows)
    assert all(len(r["response_ids"]) == len(r["response_mask"]) > 0 for r in rows), \
        [(r["experiment"], r["sample_index"], len(r["response_ids"]), len(r["response_mask"]))
         for r in rows]
