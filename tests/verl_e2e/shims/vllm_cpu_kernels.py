"""Pin vLLM CPU's linear layers to plain ``torch.nn.functional.linear`` (test infrastructure).

vLLM CPU 0.32 picks a kernel per linear layer when the weights are loaded
(``vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm``), by what the CPU offers:

- AMX (``torch.cpu._is_amx_tile_supported()``): SGL's packed-weight kernels for small layers;
- oneDNN (``vllm._custom_ops._supports_onednn``, true on AVX-512 builds): a oneDNN handle;
- otherwise ``torch.nn.functional.linear``.

The first two replace ``layer.weight`` with an empty bare ``Parameter`` (``remove_weight=True``),
so verl's weight sync (``load_weights`` after each training step) fails with ``'Parameter'
object has no attribute 'weight_loader'``; on some AMX machines the SGL path also dies with
SIGILL on the first model step. This project's machines differ in CPU, so the torch tiers pin the
third path everywhere: the noxfile installs this module and a ``.pth`` line that imports it into
the shared torch venv, so every process of that venv (pytest, vLLM's engine and worker processes,
Ray's actors, ``vllm serve``) takes the same path on every CPU.

It costs nothing at start-up: it only registers a post-import hook for ``torch.cpu`` and
``vllm._custom_ops``, and switches the two capability checks off when (if) they are imported.
``OTEL_VERL_VLLM_CPU_KERNELS=native`` leaves vLLM's own choice alone. Nothing here is part of
otel_verl; docs/verl.md ("verl on a CPU-only machine") tells users of CPU-only runs the same knob.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
from types import ModuleType
from typing import Any

#: set to ``native`` to let vLLM pick its CPU kernels itself
ENV = "OTEL_VERL_VLLM_CPU_KERNELS"


def _no() -> bool:
    return False


def _pin_torch_cpu(module: ModuleType) -> None:
    module._is_amx_tile_supported = _no  # type: ignore[attr-defined]
    module._is_amx_fp16_supported = _no  # type: ignore[attr-defined]


def _pin_custom_ops(module: ModuleType) -> None:
    module._supports_onednn = False  # type: ignore[attr-defined]


PINS = {"torch.cpu": _pin_torch_cpu, "vllm._custom_ops": _pin_custom_ops}


class _Pinned(importlib.abc.Loader):
    def __init__(self, loader: Any, pin: Any) -> None:
        self.loader, self.pin = loader, pin

    def create_module(self, spec: Any) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self.loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        self.pin(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)


class _Finder(importlib.abc.MetaPathFinder):
    """Intercepts only the two module names above; everything else goes to the next finder."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        pin = PINS.get(fullname)
        if pin is None:
            return None
        sys.meta_path.remove(self)  # find the real spec without finding ourselves again
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is not None and spec.loader is not None:
            spec.loader = _Pinned(spec.loader, pin)
        return spec


def install() -> None:
    """Register the hook (once); modules already imported are pinned at once."""
    if os.environ.get(ENV, "").lower() == "native":
        return
    if any(isinstance(f, _Finder) for f in sys.meta_path):
        return
    for name, pin in PINS.items():
        if name in sys.modules:
            pin(sys.modules[name])
    sys.meta_path.insert(0, _Finder())


def active() -> dict[str, bool]:
    """What this process's vLLM would see (imports torch and vLLM): used by the tests."""
    import torch
    import vllm._custom_ops as ops

    return {"amx_tile": bool(torch.cpu._is_amx_tile_supported()),
            "amx_fp16": bool(torch.cpu._is_amx_fp16_supported()),
            "onednn": bool(ops._supports_onednn)}


class WorkerProbe:
    """A vLLM worker extension (``AsyncEngineArgs(worker_extension_cls=...)``) that the tests use
    to look inside vLLM's own worker process: ``collective_rpc("otel_verl_kernel_path")``."""

    def otel_verl_kernel_path(self) -> dict[str, Any]:
        """What vLLM's CPU kernel dispatch saw here, and whether every linear layer still holds
        a weight verl's weight sync can load into (a ``weight_loader``)."""
        from vllm.model_executor.layers.linear import LinearBase

        runner: Any = getattr(self, "model_runner", None)
        model = runner.get_model() if hasattr(runner, "get_model") else runner.model
        layers = [(name, m) for name, m in model.named_modules() if isinstance(m, LinearBase)]
        return {"pid": os.getpid(), "switches": active(), "linear_layers": len(layers),
                "without_weight_loader": [name for name, m in layers
                                          if m.weight.numel() == 0
                                          or not hasattr(m.weight, "weight_loader")]}


install()
