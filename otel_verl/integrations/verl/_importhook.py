"""Post-import hooks without third-party helpers: run a callback right after a module executes.

A hook fires after the module's body ran and before the ``import`` statement that triggered the
load returns, so ``from verl.utils.rollout_trace import rollout_trace_op`` in any later module
already sees the patched name. If the module is already imported, the hook runs immediately.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

Hook = Callable[[ModuleType], None]


class _HookLoader(importlib.abc.Loader):
    """Wraps the real loader: executes the module, then runs the hooks registered for it."""

    def __init__(self, loader: Any, finder: _PostImportFinder, name: str) -> None:
        self._loader = loader
        self._finder = finder
        self._name = name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        # put the real loader back first, so introspection (inspect, linecache, importlib.resources)
        # sees the ordinary loader and not this proxy
        module.__loader__ = self._loader
        spec = getattr(module, "__spec__", None)
        if spec is not None:
            spec.loader = self._loader
        self._loader.exec_module(module)
        self._finder.run_hooks(self._name, module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_resource_reader, is_package, ...
        return getattr(self._loader, name)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """A meta-path finder that only intercepts the module names it has hooks for."""

    def __init__(self) -> None:
        self.hooks: dict[str, list[Hook]] = {}
        self._lock = threading.RLock()
        self._resolving = threading.local()

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in self.hooks:
            return None
        busy = getattr(self._resolving, "names", None)
        if busy is None:
            busy = self._resolving.names = set()
        if fullname in busy:
            return None
        busy.add(fullname)
        try:
            spec = None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
        finally:
            busy.discard(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _HookLoader(spec.loader, self, fullname)
        return spec

    def add(self, name: str, hook: Hook) -> None:
        with self._lock:
            self.hooks.setdefault(name, []).append(hook)

    def remove_all(self) -> None:
        with self._lock:
            self.hooks.clear()

    def run_hooks(self, name: str, module: ModuleType) -> None:
        with self._lock:
            hooks = list(self.hooks.get(name, ()))
        for hook in hooks:
            hook(module)


_FINDER: _PostImportFinder | None = None
_FINDER_LOCK = threading.Lock()


def when_imported(name: str, hook: Hook) -> None:
    """Call ``hook(module)`` once ``name`` is imported (now, if it already is)."""
    global _FINDER
    with _FINDER_LOCK:
        if _FINDER is None:
            _FINDER = _PostImportFinder()
        if _FINDER not in sys.meta_path:
            sys.meta_path.insert(0, _FINDER)
        module = sys.modules.get(name)
        _FINDER.add(name, hook)
    if module is not None:
        hook(module)


def clear_hooks() -> None:
    """Forget every hook and take the finder off ``sys.meta_path``."""
    with _FINDER_LOCK:
        if _FINDER is not None:
            _FINDER.remove_all()
            if _FINDER in sys.meta_path:
                sys.meta_path.remove(_FINDER)
