"""The fault tier: each test records one figure (spans recorded, received, lost, duplicates);
the table is printed at the end of the run (and written to $OTEL_VERL_FAULTS_REPORT as JSON)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:  # the tests import _receiver from here (--import-mode=importlib)
    sys.path.insert(0, _HERE)

FIGURES: list[dict[str, object]] = []


@pytest.fixture
def figure():
    """Call with fault=..., recorded=..., received=..., lost=..., allowed=..., **more."""

    def add(**values: object) -> None:
        FIGURES.append(values)

    return add


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not FIGURES:
        return
    terminalreporter.write_sep("-", "spans lost per fault")
    keys = ["fault", "recorded", "received", "lost", "allowed", "duplicates", "seconds", "note"]
    rows = [[str(f.get(k, "")) for k in keys] for f in FIGURES]
    widths = [max(len(k), *(len(r[i]) for r in rows)) for i, k in enumerate(keys)]
    terminalreporter.write_line("  ".join(k.ljust(w) for k, w in zip(keys, widths, strict=True)))
    for row in rows:
        terminalreporter.write_line("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
    path = os.environ.get("OTEL_VERL_FAULTS_REPORT")
    if path:
        with open(path, "w") as handle:
            json.dump(FIGURES, handle, indent=1)
