"""ui tier: `otel-verl ui` and `otel-verl report` in a real browser (Debian's Chromium driven by
Playwright's Python package; `playwright install` is never run).

The store is written by a real traced rollout: `otel-verl demo` (a real vLLM CPU engine, GRPO-style
steps x prompts x n, a validation pass, the engine's `llm_request` spans joined in) plus
`_edge_rollouts.py` (the project's ToolAgentLoop against a refused port, a failing tool, a planted
`<script>`). ``OTEL_VERL_UI_STORE=DIR`` reuses a store made that way (for quick iterations).
Screenshots and the report land in ``$OTEL_VERL_UI_ARTIFACTS`` (default ``.artifacts/ui``).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from uihelpers import (  # noqa: E402
    PROMPTS,
    ROOT,
    STEPS,
    VAL_PROMPTS,
    N,
    UIProcess,
    chromium_path,
    edge_rollouts,
    run_cli,
)


@pytest.fixture(scope="session")
def artifacts() -> Path:
    path = Path(os.environ.get("OTEL_VERL_UI_ARTIFACTS", ROOT / ".artifacts" / "ui"))
    path.mkdir(parents=True, exist_ok=True)
    print(f"\nui artifacts (screenshots, report): {path}")
    return path


@pytest.fixture(scope="session")
def real_store(tmp_path_factory) -> Path:
    given = os.environ.get("OTEL_VERL_UI_STORE")
    if given:
        return Path(given)
    trace_dir = tmp_path_factory.mktemp("store") / "traces"
    started = time.monotonic()
    args = ("demo", "--steps", str(STEPS), "--prompts", str(PROMPTS), "--n", str(N),
            "--val-prompts", str(VAL_PROMPTS), "--trace-dir", str(trace_dir), "--no-progress",
            "--set", "actor_rollout_ref.rollout.trace.token2text=true",
            # ~30 s on a quiet 2-core machine; minutes when other jobs share the cores
            "--startup-timeout", "600")
    done = run_cli(*args, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    # the demo ends with its offline report and the command that opens the viewer
    assert (trace_dir / "report.html").is_file(), done.stdout[-2000:]
    assert f"python3 -m nox -s ui_serve -- --trace-dir {trace_dir}" in done.stdout
    print(f"\notel-verl demo wrote {trace_dir} in {time.monotonic() - started:.0f}s")
    edge_rollouts(trace_dir)
    return trace_dir


@pytest.fixture(scope="session")
def ui(real_store) -> Iterator[UIProcess]:
    server = UIProcess(real_store)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium_path(),
                              args=["--no-sandbox", "--disable-dev-shm-usage"])
        yield b
        b.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    pg = context.new_page()
    pg.set_default_timeout(20_000)
    problems: list[str] = []
    pg.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    pg.on("console", lambda m: problems.append(f"console {m.type}: {m.text}")
          if m.type == "error" else None)
    yield pg
    context.close()
    assert not problems, problems
