"""A real Arize Phoenix server (``phoenix serve``) for the tests: SQLite in a temporary working
dir, HTTP (UI, REST, GraphQL, OTLP/HTTP) and OTLP/gRPC on free ports of 127.0.0.1, telemetry and
every other outbound request of its own switched off.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

#: Phoenix settings that keep it local and quiet (see phoenix/config.py)
QUIET = {
    "PHOENIX_HOST": "127.0.0.1",
    "PHOENIX_TELEMETRY_ENABLED": "false",  # FullStory / Scarf pixels
    "PHOENIX_ALLOW_EXTERNAL_RESOURCES": "false",  # web fonts, sandbox downloads, ...
    "PHOENIX_DISABLE_AGENT_ASSISTANT": "true",
    "PHOENIX_LOG_MIGRATIONS": "false",
    "PHOENIX_ENABLE_AUTH": "false",
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PhoenixServer:
    """``with PhoenixServer(workdir) as px: px.url, px.graphql(...), px.rest(...)``."""

    def __init__(self, workdir: Path, log_path: Path, start_timeout_s: float = 240) -> None:
        self.workdir = workdir
        self.log_path = log_path
        self.start_timeout_s = start_timeout_s
        self.port = free_port()
        self.grpc_port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> PhoenixServer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **QUIET, "PHOENIX_WORKING_DIR": str(self.workdir),
               "PHOENIX_PORT": str(self.port), "PHOENIX_GRPC_PORT": str(self.grpc_port),
               "PHOENIX_SQL_DATABASE_URL": f"sqlite:///{self.workdir / 'phoenix.db'}"}
        for key in ("PHOENIX_COLLECTOR_ENDPOINT", "PHOENIX_API_KEY", "OTEL_EXPORTER_OTLP_ENDPOINT"):
            env.pop(key, None)
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in __exit__
        self._proc = subprocess.Popen([sys.executable, "-m", "phoenix.server.main", "serve"],
                                      env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                      cwd=self.workdir)
        self._wait_healthy()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=10)
        self._log.close()

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                break
            try:
                with urllib.request.urlopen(f"{self.url}/healthz", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        tail = self.log_path.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"phoenix did not become healthy at {self.url}:\n{tail}")

    @property
    def version(self) -> str:
        with urllib.request.urlopen(f"{self.url}/arize_phoenix_version", timeout=10) as answer:
            return answer.read().decode().strip()

    # -- Phoenix's own APIs ----------------------------------------------------------------------
    def graphql(self, query: str, **variables: Any) -> dict[str, Any]:
        request = urllib.request.Request(
            f"{self.url}/graphql", data=json.dumps({"query": query, "variables": variables}).encode(),
            headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as answer:
            body = json.load(answer)
        if body.get("errors"):
            raise AssertionError(f"GraphQL errors: {body['errors']}")
        return body["data"]

    def rest(self, path: str, **params: Any) -> Any:
        """GET ``/v1/...``; list values repeat the parameter (``attribute=[a, b]``)."""
        query = urllib.parse.urlencode(
            [(k, item) for k, v in params.items() for item in (v if isinstance(v, list) else [v])])
        with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=60) as answer:
            return json.load(answer)
