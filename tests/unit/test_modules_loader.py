"""tests/_modules.load_file: one module per name and file, and nothing half-loaded left behind."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from _modules import load_file


def test_a_file_loads_once_per_name_and_is_registered(tmp_path: Path) -> None:
    path = tmp_path / "counted.py"
    path.write_text("import itertools\nRUNS = next(itertools.count(1))\n")
    first = load_file(path, "_loader_probe_counted")
    try:
        assert sys.modules["_loader_probe_counted"] is first
        assert load_file(path, "_loader_probe_counted") is first
        other = tmp_path / "sub" / "counted.py"
        other.parent.mkdir()
        other.write_text("RUNS = 2\n")
        assert load_file(other, "_loader_probe_counted").RUNS == 2  # another file: loaded anew
    finally:
        sys.modules.pop("_loader_probe_counted", None)


def test_a_failing_module_is_not_left_registered(tmp_path: Path) -> None:
    path = tmp_path / "broken.py"
    path.write_text("raise RuntimeError('broken at import')\n")
    with pytest.raises(RuntimeError, match="broken at import"):
        load_file(path, "_loader_probe_broken")
    assert "_loader_probe_broken" not in sys.modules


def test_the_shared_helpers_are_plain_imports() -> None:
    import _hostile_spans
    import _lake_store

    assert Path(_lake_store.__file__).parent == Path(__file__).resolve().parents[1]
    assert Path(_hostile_spans.__file__).parent == Path(__file__).resolve().parents[1]
