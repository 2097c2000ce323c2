"""Test helpers for users of otel_verl (and for our own tests).

Usage::

    from otel_verl.testing import capture_spans

    def test_my_loop():
        with capture_spans(experiment_name="t") as exporter:
            ...
        names = [s.name for s in exporter.get_finished_spans()]
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from typing import Any

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_verl import _errors
from otel_verl._facade import RolloutTraceConfig


@contextlib.contextmanager
def capture_spans(project_name: str = "test", experiment_name: str = "test",
                  strict: bool = True, **init_kwargs: Any) -> Iterator[InMemorySpanExporter]:
    """Initialise tracing into an in-memory exporter (simple processor), reset afterwards.

    Args:
        project_name / experiment_name: as in ``RolloutTraceConfig.init``.
        strict: re-raise otel_verl's own internal errors instead of logging them.
        **init_kwargs: more ``RolloutTraceConfig.init`` options (``token2text``, caps, ...).
            Without ``trace_dir``, what tracing writes beside the trace (the content store)
            goes to a temporary folder, removed afterwards, never into the working directory.

    Yields:
        The exporter; ``get_finished_spans()`` lists what was recorded.
    """
    RolloutTraceConfig.reset()
    exporter = InMemorySpanExporter()
    init_kwargs.setdefault("backend", "console")
    init_kwargs.setdefault("processor", "simple")
    old = _errors.set_strict(strict)
    with contextlib.ExitStack() as stack:
        if "trace_dir" not in init_kwargs:
            init_kwargs["trace_dir"] = stack.enter_context(
                tempfile.TemporaryDirectory(prefix="otel_verl_capture_"))
        try:
            RolloutTraceConfig.init(project_name, experiment_name, exporter=exporter,
                                    **init_kwargs)
            yield exporter
        finally:
            RolloutTraceConfig.reset()
            _errors.set_strict(old)


def spans_by_name(exporter: InMemorySpanExporter) -> dict[str, Any]:
    """The exporter's finished spans keyed by name (the last one wins for repeated names)."""
    return {span.name: span for span in exporter.get_finished_spans()}
