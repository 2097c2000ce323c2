"""A CPU platform for verl 0.9.1, registered through verl's own plugin hook (test infrastructure).

verl 0.9.1 registers only nvidia/npu/rocm platforms and falls back to ``nvidia`` when none is
detected, so on a CPU-only machine it builds a ``cpu:gloo,cuda:nccl`` process group and fails.
This module is loaded by ``import verl`` itself (``VERL_USE_EXTERNAL_MODULES=verl_cpu_platform``)
and selected with ``VERL_PLATFORM=cpu``. The accelerator Ray schedules is a logical GPU
(``ray_kwargs.ray_init.num_gpus=1``), so the resource name stays ``GPU``.

verl then asks for ``cpu:gloo,cpu:gloo``, which torch rejects (a duplicate device type), but it only
opens a group when none is open: in verl's Ray training workers (``WG_BACKEND=ray`` with ``RANK``
and ``MASTER_ADDR`` set by ``RayWorkerGroup``) this module opens a plain gloo group first.

Nothing here is part of otel_verl; see docs/verl.md ("verl on a CPU-only machine").
"""

from __future__ import annotations

import contextlib
import os
import types
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import torch
from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry


def _zero(*args: Any, **kwargs: Any) -> int:
    return 0


class _CPUDeviceModule(types.ModuleType):
    """``torch.cpu`` plus the ``torch.cuda`` memory calls verl makes (no device memory: 0)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return getattr(torch.cpu, name)
        except AttributeError:
            if "memory" in name or name in ("empty_cache", "ipc_collect", "reset_peak_stats"):
                return _zero
            raise

    def __eq__(self, other: object) -> bool:  # verl checks ``get_torch_device() == torch.cpu``
        return other is torch.cpu or other is self

    def __hash__(self) -> int:
        return hash(torch.cpu)

    def get_device_name(self, device: Any = None) -> str:
        return "CPU"

    def get_rng_state(self, device: Any = None) -> torch.Tensor:
        return torch.get_rng_state()

    def set_rng_state(self, state: torch.Tensor, device: Any = None) -> None:
        torch.set_rng_state(state)

    def mem_get_info(self, device: Any = None) -> tuple[int, int]:
        pages, free = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_AVPHYS_PAGES")
        size = os.sysconf("SC_PAGE_SIZE")
        return free * size, pages * size


_DEVICE_MODULE = _CPUDeviceModule("verl_cpu_platform.device")


@PlatformRegistry.register(platform="cpu")
class PlatformCPU(PlatformBase):
    """torch's CPU device behind verl's platform interface."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> ModuleType:
        return _DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        return os.environ.get("VERL_PLATFORM", "").strip().lower() == "cpu"

    def current_device(self) -> Any:
        # "cpu", not 0: verl moves modules to ``get_device_id()``, and torch reads an int as an
        # accelerator index
        return torch.cpu.current_device()

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg: str) -> Iterator[None]:
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"  # a logical GPU: Ray only sets CUDA_VISIBLE_DEVICES

    def ray_noset_envvars(self) -> list[str]:
        return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

    def is_ipc_supported(self) -> bool:
        return False  # weight sync falls back to shared memory

    def cudart(self) -> Any:
        return None


def _open_gloo_group() -> None:
    """In a verl Ray training worker, open the process group verl would open (gloo only)."""
    env = os.environ
    if env.get("WG_BACKEND") != "ray" or "RANK" not in env or "MASTER_ADDR" not in env:
        return
    import torch.distributed as dist

    if dist.is_available() and not dist.is_initialized():
        dist.init_process_group(backend="gloo", rank=int(env["RANK"]),
                                world_size=int(env.get("WORLD_SIZE", "1")))


_open_gloo_group()
