"""A real headless Chromium driven over the DevTools protocol (CDP): open a page, wait until its
text shows what we expect, save a screenshot and the page text.

Debian's ``chromium`` (``/usr/bin/chromium``) is started with a fresh profile, no GPU, no
background networking, and ``--remote-debugging-port=0`` (it prints the port it chose); the
protocol is spoken with ``websockets``' synchronous client (a Phoenix dependency). Chromium's
``--screenshot`` flag alone is not enough for a single-page app: it shoots before the data loads.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from websockets.sync.client import connect

CHROMIUM = "/usr/bin/chromium"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run",
         "--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio")


def chromium_path() -> str | None:
    return CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")


class Browser:
    """One headless Chromium process and one page; use as a context manager."""

    def __init__(self, log_path: Path, width: int = 1920, height: int = 1080) -> None:
        self.log_path = log_path
        self.width, self.height = width, height
        self._profile = tempfile.mkdtemp(prefix="otel-verl-chromium-")
        self._proc: subprocess.Popen[bytes] | None = None
        self._ws: Any = None
        self._next_id = 0

    def __enter__(self) -> Browser:
        binary = chromium_path()
        if binary is None:
            raise RuntimeError("no chromium: apt-get install -y chromium")
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in __exit__
        self._proc = subprocess.Popen(
            [binary, *FLAGS, f"--user-data-dir={self._profile}", "--remote-debugging-port=0",
             "--remote-debugging-address=127.0.0.1", f"--window-size={self.width},{self.height}",
             "about:blank"],
            stdout=self._log, stderr=self._log)
        port = self._devtools_port(deadline=time.monotonic() + 90)
        page = self._page_target(port)
        self._ws = connect(page, max_size=64 * 2**20, open_timeout=30)
        self.call("Page.enable")
        self.call("Emulation.setDeviceMetricsOverride", width=self.width, height=self.height,
                  deviceScaleFactor=1, mobile=False)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._ws is not None:
            self._ws.close()
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=10)
        self._log.close()
        shutil.rmtree(self._profile, ignore_errors=True)

    # -- devtools plumbing -------------------------------------------------------------------------
    def _devtools_port(self, deadline: float) -> int:
        pattern = re.compile(rb"DevTools listening on ws://127\.0\.0\.1:(\d+)/")
        while time.monotonic() < deadline:
            match = pattern.search(self.log_path.read_bytes())
            if match:
                return int(match.group(1))
            if self._proc is not None and self._proc.poll() is not None:
                break
            time.sleep(0.2)
        raise RuntimeError(f"chromium did not open its DevTools port; see {self.log_path}")

    @staticmethod
    def _page_target(port: int) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=30) as answer:
            targets = json.load(answer)
        return next(t["webSocketDebuggerUrl"] for t in targets if t.get("type") == "page")

    def call(self, method: str, timeout_s: float = 60, **params: Any) -> dict[str, Any]:
        """Send one CDP command and wait for its answer (events in between are skipped)."""
        self._next_id += 1
        self._ws.send(json.dumps({"id": self._next_id, "method": method, "params": params}))
        deadline = time.monotonic() + timeout_s
        while True:
            message = json.loads(self._ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if message.get("id") == self._next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})

    # -- what the tests use ------------------------------------------------------------------------
    def open(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def text(self) -> str:
        result = self.call("Runtime.evaluate", expression="document.body ? document.body.innerText : ''",
                           returnByValue=True)
        return str(result.get("result", {}).get("value", ""))

    def wait_for_text(self, needles: Iterable[str], timeout_s: float = 120) -> str:
        """Poll the page's text until it contains every needle; returns the text."""
        needles = list(needles)
        deadline = time.monotonic() + timeout_s
        text = ""
        while time.monotonic() < deadline:
            text = self.text()
            if all(n in text for n in needles):
                return text
            time.sleep(0.5)
        missing = [n for n in needles if n not in text]
        raise AssertionError(f"page never showed {missing}; it shows:\n{text[:3000]}")

    def click_text(self, text: str) -> bool:
        """Click the first element whose own text is exactly ``text``; False if none."""
        script = ("(() => { const it = document.evaluate(" + json.dumps(
            f"//*[normalize-space(text())={json.dumps(text)}]") +
            ", document, null, XPathResult.FIRST_ORDERED_NODE_TYPE, null).singleNodeValue;"
            " if (!it) return false; it.click(); return true; })()")
        result = self.call("Runtime.evaluate", expression=script, returnByValue=True)
        return bool(result.get("result", {}).get("value"))

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=False)
        path.write_bytes(base64.b64decode(data["data"]))
        return path
