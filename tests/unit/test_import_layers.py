"""No import circles between the process state and what only reads the current trajectory: the
live tracker and the evaluation events read it from ``otel_verl._current``, and the process state
takes the loss keys from the module that defines them, not from the ``exporters`` package (whose
``install_sigterm_handoff`` imports the state)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "otel_verl"


def _imports(relative: str) -> set[str]:
    """Every module a file imports (at the top or inside a function)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse((ROOT / relative).read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            if node.module == "otel_verl":
                found.update(f"otel_verl.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


def test_readers_of_the_current_trajectory_do_not_import_the_process_state():
    for reader in ("_live.py", "_evaluations.py", "_current.py"):
        assert "otel_verl._state" not in _imports(reader), reader
    assert "otel_verl._state" in _imports("exporters/__init__.py")  # the SIGTERM hand-off
    assert "otel_verl.exporters" not in _imports("_state.py")


def test_the_state_re_exports_what_its_importers_use():
    import otel_verl._current as current
    import otel_verl._state as state
    import otel_verl.exporters as exporters
    from otel_verl.exporters import _delivery

    assert (state.TRAJECTORY, state.Trajectory, state.current_trajectory_attrs) == (
        current.TRAJECTORY, current.Trajectory, current.current_trajectory_attrs)
    assert state.LOSS_KEYS is exporters.LOSS_KEYS is _delivery.LOSS_KEYS
