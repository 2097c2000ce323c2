"""Shared pytest setup: every test starts and ends with tracing reset."""

import pytest

from otel_verl import RolloutTraceConfig


@pytest.fixture(autouse=True)
def _reset_tracing():
    RolloutTraceConfig.reset()
    yield
    RolloutTraceConfig.reset()
