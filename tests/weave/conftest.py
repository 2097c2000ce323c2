"""Shared fixtures for the weave tier. Test-safe environment: nothing here may reach the network."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# weave must never auto-init, report errors, print links or write a fallback file
for _k, _v in {
    "WANDB_DISABLE_WEAVE": "true",
    "WANDB_ERROR_REPORTING": "false",
    "WEAVE_PRINT_CALL_LINK": "false",
    "WEAVE_ENABLE_DISK_FALLBACK": "false",
    "WANDB_SILENT": "true",
}.items():
    os.environ.setdefault(_k, _v)

sys.path.insert(0, str(Path(__file__).parent))  # the _helpers next to this file

from _common import API_KEY  # noqa: E402 -- after the path insert above
from _recorder import Recorder  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "weave_latest: wire-level tests needing the newest weave (requirements/weave_latest.txt)"
    )


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("WANDB_API_KEY", "WANDB_ENTITY", "WANDB_PROJECT", "WANDB_BASE_URL",
                 "WANDB_PUBLIC_BASE_URL", "WF_TRACE_SERVER_URL", "OTEL_EXPORTER_WEAVE_PROJECT",
                 "OTEL_EXPORTER_WEAVE_ENDPOINT", "OTEL_EXPORTER_WEAVE_TIMEOUT",
                 "OTEL_EXPORTER_WEAVE_SPOOL_DIR", "OTEL_EXPORTER_WEAVE_KEEP_TRAJECTORY"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def recorder():
    with Recorder() as rec:
        yield rec


@pytest.fixture
def weave_server(tmp_path):
    """Weave's own SqliteTraceServer (weave 0.52.42) behind the HTTP shim on 127.0.0.1."""
    pytest.importorskip(
        "weave.trace_server.sqlite_trace_server",
        reason="needs weave==0.52.42 + trace-server extras (requirements/weave.txt)",
    )
    from _weave_server import WeaveShim, make_server

    server = make_server(str(tmp_path / "weave.sqlite"))
    with WeaveShim(server, API_KEY) as shim:
        yield shim
