"""DuckDB is the one statistics and read engine (issue 19): without the ``lake`` extra the
statistics and read paths (``ui``, ``report``, ``traces list`` / ``--steps``, ``sql``,
``compact``) say what to install and exit, with no fallback of their own; ``traces show`` (one
trajectory from the raw files) still works; nothing in otel_verl imports ``sqlite3``."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import _lake_store as S
import pytest

from otel_verl.store import LAKE_EXTRA, group_trajectories, read_spans

PACKAGE = Path(__file__).resolve().parents[2] / "otel_verl"

#: a child that cannot import the blocked modules (a ``sys.meta_path`` finder refusing them, as
#: an installation without them would), then runs the CLI
_CHILD = """
import sys

class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, Blocker())
from otel_verl.cli import main
code = main({argv!r})
loaded = sorted(m for m in {blocked!r} if m in sys.modules)
print("LOADED", loaded, file=sys.stderr)
sys.exit(code)
"""


def _child(blocked: tuple[str, ...], argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _CHILD.format(blocked=blocked, argv=argv)],
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("store")
    S.write_store(directory, 5, files=1)
    return directory


def _commands(store: Path, out: Path) -> list[tuple[str, list[str]]]:
    d = ["--dir", str(store)]
    return [
        ("ui", ["ui", *d, "--port", "0"]),
        ("report", ["report", *d, "-o", str(out / "r.html")]),
        ("traces list", ["traces", "list", *d]),
        ("traces list", ["traces", "list", "--steps", *d]),
        ("traces list", ["traces", "list", "--step", "1", "--json", *d]),
        ("sql", ["sql", "SELECT * FROM steps", *d]),
        ("compact", ["compact", *d]),
    ]


@pytest.mark.parametrize("blocked", [("duckdb",), ("pyarrow",), ("duckdb", "pyarrow")])
def test_without_the_lake_extra_every_statistics_path_says_what_to_install(
        store: Path, tmp_path: Path, blocked: tuple[str, ...]) -> None:
    """One line on stderr naming the extra, exit 2, nothing on stdout, no traceback, no
    report written, and no second engine tried (the blocked modules never load)."""
    for command, argv in _commands(store, tmp_path):
        result = _child(blocked, argv)
        assert result.returncode == 2, (argv, result.stderr)
        assert result.stdout == "", argv
        assert f"otel-verl {command}: {LAKE_EXTRA}" in result.stderr, (argv, result.stderr)
        assert "Traceback" not in result.stderr and "sqlite" not in result.stderr.lower()
        assert "LOADED []" in result.stderr
    assert not (tmp_path / "r.html").exists()
    assert LAKE_EXTRA == "this needs the lake extra: pip install 'otel-verl[lake]'"


def test_traces_show_reads_one_trajectory_from_the_raw_files_without_the_extra(
        store: Path) -> None:
    """``traces show`` is not a statistics path: it reads the raw files with the codec."""
    trace_id = group_trajectories(read_spans(store))[0].trace_id
    result = _child(("duckdb", "pyarrow"), ["traces", "show", trace_id, "--dir", str(store)])
    assert result.returncode == 0, result.stderr
    assert f"trace {trace_id}" in result.stdout and "trajectory" in result.stdout


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def test_nothing_in_otel_verl_imports_sqlite3() -> None:
    """The SQLite index is gone: no module of the package imports ``sqlite3`` (statically:
    ``import`` statements anywhere, functions included)."""
    users = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                   if "sqlite3" in _imports(p))
    assert users == []
    assert not (PACKAGE / "store" / "_index.py").exists()


@pytest.mark.parametrize("name", ["StoreIndex", "IndexStats", "default_index_path",
                                  "step_statistics", "StepStatistics"])
def test_a_removed_public_name_says_what_replaces_it(name: str) -> None:
    """Removed, not silently: the attribute error names the replacement and the extra (a
    ``from otel_verl.store import ...`` says only "cannot import name": Python's wording)."""
    import otel_verl.store as store

    with pytest.raises(AttributeError, match="was removed: .*lake.*pip install 'otel-verl"):
        getattr(store, name)
    with pytest.raises(ImportError):
        exec(f"from otel_verl.store import {name}", {})
    assert name not in store.__all__ and name not in dir(store)
