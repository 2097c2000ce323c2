"""Fakes for the rollout unit tests: a char-level ChatML tokenizer and a scripted engine client
(defined in ``_scripted.py``, shared with the phoenix tier).

Only the unit tier's dependencies (+ httpx) are needed: no torch, no transformers, no engine.
"""

from __future__ import annotations

import pytest

from otel_verl.testing import capture_spans

from ._scripted import SPECIALS, CharTokenizer, ScriptedClient

__all__ = ["SPECIALS", "CharTokenizer", "ScriptedClient"]


@pytest.fixture
def tokenizer() -> CharTokenizer:
    return CharTokenizer()


@pytest.fixture
def spans():
    """Tracing into memory; yields the in-memory exporter."""
    with capture_spans(project_name="proj", experiment_name="exp") as exporter:
        yield exporter
