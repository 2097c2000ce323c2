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
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
#: the demo's shape: steps x prompts x n training rollouts, then val prompts (greedy, n=1)
STEPS, PROMPTS, N, VAL_PROMPTS = 3, 3, 4, 2
EDGE_EXPERIMENT = "ui-edge-cases"


def chromium_path() -> str:
    found = os.environ.get("OTEL_VERL_CHROMIUM") or shutil.which("chromium") or shutil.which(
        "chromium-browser")
    if not found:
        raise RuntimeError("Chromium not found: apt-get install -y chromium (nox -s ui does it)")
    return found


@pytest.fixture(scope="session")
def artifacts() -> Path:
    path = Path(os.environ.get("OTEL_VERL_UI_ARTIFACTS", ROOT / ".artifacts" / "ui"))
    path.mkdir(parents=True, exist_ok=True)
    print(f"\nui artifacts (screenshots, report): {path}")
    return path


def run_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "otel_verl.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=ROOT, check=False)


def edge_rollouts(trace_dir: Path, experiment: str = EDGE_EXPERIMENT) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, str(HERE / "_edge_rollouts.py"), str(trace_dir),
                           experiment], capture_output=True, text=True, timeout=120, env=env,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(scope="session")
def real_store(tmp_path_factory) -> Path:
    given = os.environ.get("OTEL_VERL_UI_STORE")
    if given:
        return Path(given)
    trace_dir = tmp_path_factory.mktemp("store") / "traces"
    started = time.monotonic()
    done = run_cli("demo", "--steps", str(STEPS), "--prompts", str(PROMPTS), "--n", str(N),
                   "--val-prompts", str(VAL_PROMPTS), "--trace-dir", str(trace_dir),
                   "--no-progress", "--set", "actor_rollout_ref.rollout.trace.token2text=true")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    # the demo ends with its offline report and the command that opens the viewer
    assert (trace_dir / "report.html").is_file(), done.stdout[-2000:]
    assert f"python3 -m nox -s ui_serve -- --trace-dir {trace_dir}" in done.stdout
    print(f"\notel-verl demo wrote {trace_dir} in {time.monotonic() - started:.0f}s")
    edge_rollouts(trace_dir)
    return trace_dir


class UIProcess:
    """`otel-verl ui` as a subprocess on a free port (stderr names the URL)."""

    def __init__(self, trace_dir: Path, *extra: str) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "otel_verl.cli", "ui", "--trace-dir", str(trace_dir),
             "--port", "0", "--poll", "0.5", *extra],
            stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
        self.log: list[str] = []
        self.url = ""
        deadline = time.monotonic() + 300
        assert self.proc.stderr is not None
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            self.log.append(line)
            found = re.search(r"otel-verl ui: (http://\S+)", line)
            if found:
                self.url = found.group(1)
                break
        if not self.url:
            self.proc.kill()
            raise RuntimeError("otel-verl ui did not start:\n" + "".join(self.log))
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


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
    pg.problems = problems  # type: ignore[attr-defined]
    yield pg
    context.close()
    assert not problems, problems


def shot(page, artifacts: Path, name: str, full_page: bool = True) -> None:
    page.screenshot(path=str(artifacts / f"{name}.png"), full_page=full_page)
