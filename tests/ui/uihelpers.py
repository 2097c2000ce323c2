"""Helpers of the ui tier (constants, the `otel-verl ui` subprocess, the CLI, screenshots).

A plain module (tests run with --import-mode=importlib): conftest.py puts this folder on sys.path.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
#: the demo's shape: steps x prompts x n training rollouts, then val prompts (greedy, n=1)
STEPS, PROMPTS, N, VAL_PROMPTS = 3, 3, 4, 2
EDGE_EXPERIMENT = "ui-edge-cases"


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def chromium_path() -> str:
    found = os.environ.get("OTEL_VERL_CHROMIUM") or shutil.which("chromium") or shutil.which(
        "chromium-browser")
    if not found:
        raise RuntimeError("Chromium not found: apt-get install -y chromium (nox -s ui does it)")
    return found


def run_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "otel_verl.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env=_env(), cwd=ROOT, check=False)


def edge_rollouts(trace_dir: Path, experiment: str = EDGE_EXPERIMENT) -> None:
    done = subprocess.run([sys.executable, str(HERE / "_edge_rollouts.py"), str(trace_dir),
                           experiment], capture_output=True, text=True, timeout=120, env=_env(),
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr


class UIProcess:
    """`otel-verl ui` as a subprocess on a free port (stderr names the URL)."""

    def __init__(self, trace_dir: Path, *extra: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "otel_verl.cli", "ui", "--trace-dir", str(trace_dir),
             "--port", "0", "--poll", "0.5", *extra],
            stderr=subprocess.PIPE, text=True, env=_env(), cwd=ROOT)
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


def leave(page) -> None:
    """Take the page off the viewer before a test stops the viewer: a poll in flight when the
    server goes away would log ``net::ERR_CONNECTION_RESET`` as a console error, which the
    ``page`` fixture counts against the test. Best effort: a page already broken keeps the
    test's own failure."""
    with contextlib.suppress(Exception):
        page.goto("about:blank")


def shot(page, artifacts: Path, name: str, full_page: bool = True) -> None:
    page.screenshot(path=str(artifacts / f"{name}.png"), full_page=full_page)


def goto(page, base: str, route: str = "") -> None:
    """Open ``base + route`` and wait until the page shows that route's view (the viewer builds
    a view aside and swaps it in whole, so the previous one stays visible meanwhile)."""
    from playwright.sync_api import expect

    page.goto(base + route)
    expect(page.locator(f'main[data-route="{route}"]')).to_be_attached()
