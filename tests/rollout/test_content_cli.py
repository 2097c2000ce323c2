"""``otel-verl traces show TRACE --full --json`` prints every LLM call's whole prompt as the
engine received it, rebuilt from the per-turn deltas and the content store (docs/content.md)."""

from __future__ import annotations

import contextlib
import io
import json

from otel_verl.cli import main as cli_main

from .test_content_turns import _row, _run


def test_traces_show_full_json_prints_every_prompt_as_sent(tmp_path):
    engine, spans = _run(tmp_path, [_row(0, 4096)])
    trace_id = spans[0]["trace_id"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli_main(["traces", "show", trace_id, "--dir", str(tmp_path), "--full",
                         "--json"]) == 0
    prompts = json.loads(out.getvalue())["trajectories"][0]["prompts"]
    assert [p["prompt"] for p in prompts] == [r["body"]["prompt"] for r in engine.requests]
