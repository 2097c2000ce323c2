"""Load a module from its file: bench scripts, other tiers' helpers, and files that are not on
`sys.path` (the suite runs with `--import-mode=importlib`, which puts no test folder there).

`tests/conftest.py` puts `tests/` itself on `sys.path`, so the shared helpers beside this file
(`_lake_store`, `_hostile_spans`, `_servers`) are plain imports, and so is this one:
`from _modules import load_file`.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_file(path: str | Path, name: str | None = None) -> ModuleType:
    """The module at `path`, executed once per name: it is registered in `sys.modules` before it
    runs (dataclasses and pickling look their module up there), and a second call with the same
    name and file returns the first module."""
    path = Path(path).resolve()
    name = name or path.stem
    loaded = sys.modules.get(name)
    if loaded is not None and Path(getattr(loaded, "__file__", "") or "").resolve() == path:
        return loaded
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"no module can be loaded from {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module
