"""Shared pytest setup: every test starts and ends with tracing reset; under nox, a skipped test
fails the run (a tier that silently skips is not a passing tier)."""

import os
import sys
from pathlib import Path

import pytest

from otel_verl import RolloutTraceConfig

#: tests/ itself: its shared helpers (`_modules`, `_lake_store`, `_hostile_spans`, `_servers`) are
#: plain imports in every tier (`--import-mode=importlib` puts no test folder on sys.path). It goes
#: last: its tier folders have no `__init__.py`, and there a namespace package only answers for a
#: name (`verl`, `weave`, `phoenix`) that nothing before it on the path has
_TESTS = str(Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.append(_TESTS)

#: set by noxfile.py for every tier
NO_SKIPS = "OTEL_VERL_NO_SKIPS"


@pytest.fixture(autouse=True)
def _reset_tracing():
    RolloutTraceConfig.reset()
    yield
    RolloutTraceConfig.reset()


def pytest_sessionfinish(session, exitstatus):
    if os.environ.get(NO_SKIPS) != "1":
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter is not None else []
    if skipped and exitstatus == 0:
        reporter.write_line(f"{len(skipped)} test(s) skipped: every test of a tier must run "
                            f"in its nox session ({NO_SKIPS}=1)", red=True)
        session.exitstatus = 1
