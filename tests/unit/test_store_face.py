"""The read side's public face (otel_verl/store/__init__.py): the viewer and the CLI read the store
through ``otel_verl.store`` alone, and importing it loads neither DuckDB nor pyarrow until a name
that needs them is used."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import otel_verl.store as store

ROOT = Path(__file__).resolve().parents[2]
#: the CLI's own sub-commands that live beside the store (argparse glue, not the read side)
_ALLOWED = {"otel_verl.store._data_cli"}


def test_importing_the_store_loads_no_engine_until_one_is_used():
    code = ("import sys, otel_verl.store as s\n"
            "heavy = lambda: sorted(m for m in ('duckdb', 'pyarrow', 'otel_verl.store._query', "
            "'otel_verl.store._compact', 'otel_verl.store._index') if m in sys.modules)\n"
            "print(heavy()); s.list_files; s.filter_clauses; print(heavy()); s.Lake; "
            "print(heavy())")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, check=True)
    before, light, after = result.stdout.splitlines()
    assert before == light == "[]"
    assert "duckdb" in after and "otel_verl.store._query" in after


@pytest.mark.parametrize("name", sorted(store._LAZY))
def test_each_public_name_is_its_module_s_object(name):
    module, attribute = store._LAZY[name]
    assert getattr(store, name) is getattr(importlib.import_module(f"otel_verl.store.{module}"),
                                           attribute)
    assert name in dir(store) and name not in store.__all__  # a star import stays light


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        store.no_such_name  # noqa: B018
    assert store.lake_available() is True  # the unit tier has the lake extra


def test_the_viewer_and_the_cli_import_no_private_store_module():
    files = [ROOT / "otel_verl" / "cli.py", *sorted((ROOT / "otel_verl" / "ui").glob("*.py"))]
    private = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([node.module] if isinstance(node, ast.ImportFrom) and node.module else
                     [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            private += [f"{path.name}:{node.lineno} {n}" for n in names
                        if n.startswith("otel_verl.store._") and n not in _ALLOWED]
    assert private == []
