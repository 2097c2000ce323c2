"""verl integration: verl's own rollout tracing (``verl.utils.rollout_trace``) runs through otel_verl.

No verl code changes. Two ways to switch it on:

Usage (OpenTelemetry's launcher; the ``verl`` entry point of ``opentelemetry_instrumentor``)::

    opentelemetry-instrument python -m verl.trainer.main_ppo ... \\
        actor_rollout_ref.rollout.trace.backend=otlp

Usage (code, before verl runs)::

    from otel_verl.integrations.verl import install
    install()

Either way every Python process started afterwards from this one (Ray workers of a local cluster,
vLLM/SGLang server actors, subprocesses) installs it too, through a tiny ``sitecustomize`` put on
``PYTHONPATH`` (see ``instrumentation_env``). On a multi-node Ray cluster give the other nodes the
same environment, or ``+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=
otel_verl.integrations.verl.install``.

Configuration: verl's keys ``actor_rollout_ref.rollout.trace.{backend,token2text,
max_samples_per_step_per_worker,project_name,experiment_name}``; the backend may be ``file``,
``otlp``, ``weave``, ``console``, ``none``/null (off), or verl's own ``mlflow``/``trackio`` (handed to
verl's code unchanged). Everything else (endpoints, trace directory, caps) from otel_verl's
environment variables. One module per patched surface: ``_facade`` (``verl.utils.rollout_trace``),
``_agent_loop`` (sampling, agent span, reward), ``_tools`` (tool lifecycle), ``_vllm`` (the LLM hop
into vLLM's engine); ``_common`` holds the shared state and the undo list.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Collection, Mapping
from typing import Any

from otel_verl import _config
from otel_verl.integrations.verl import _agent_loop, _common, _facade, _importhook, _tools, _vllm

__all__ = ["SUPPORTED_VERL", "VerlInstrumentor", "install", "instrumentation_env",
           "is_driver_process", "is_installed", "uninstall"]

_log = logging.getLogger("otel_verl")

#: the verl versions this integration is tested with (a pip requirement specifier)
SUPPORTED_VERL = _common.SUPPORTED_VERL

BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bootstrap")


def _without_bootstrap(pythonpath: str) -> list[str]:
    return [p for p in pythonpath.split(os.pathsep)
            if p and os.path.abspath(p) != BOOTSTRAP_DIR]


def instrumentation_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment that makes a new Python process install this integration at startup.

    It puts ``otel_verl/integrations/verl/_bootstrap`` first on ``PYTHONPATH``; its
    ``sitecustomize`` calls ``install()`` (which only registers import hooks: a process that never
    imports verl pays a few milliseconds) and then runs any ``sitecustomize`` it shadows.

    Args:
        environ: the environment to extend (default ``os.environ``).

    Returns:
        ``{"PYTHONPATH": ...}`` to merge into a subprocess or Ray ``runtime_env`` environment.
    """
    environ = os.environ if environ is None else environ
    rest = _without_bootstrap(environ.get("PYTHONPATH", ""))
    return {"PYTHONPATH": os.pathsep.join([BOOTSTRAP_DIR, *rest])}


def install(*, propagate: bool = True) -> None:
    """Route ``verl.utils.rollout_trace`` through otel_verl in this process (idempotent).

    Safe to call before or after verl is imported: the patch is applied by an import hook the
    moment ``verl.utils.rollout_trace`` loads, or right away (re-decorating what verl's decorator
    already wrapped) if it is loaded.

    Args:
        propagate: also set ``instrumentation_env()`` in ``os.environ`` so processes started from
            this one (Ray workers on this node, engine servers) install it at startup.
    """
    if _common.mark_installed():
        _importhook.when_imported(_facade.RT_MODULE, _facade.patch_rollout_trace)
        _importhook.when_imported(_agent_loop.AGENT_LOOP_MODULE, _agent_loop.patch_agent_loop)
        _importhook.when_imported(_agent_loop.AGENT_LOOP_TQ_MODULE,
                                  _agent_loop.patch_agent_loop_tq)
        _importhook.when_imported(_tools.BASE_TOOL_MODULE, _tools.patch_base_tool)
        _importhook.when_imported(_vllm.VLLM_ASYNC_LLM_MODULE, _vllm.patch_vllm_async_llm)
    if propagate:
        os.environ.update(instrumentation_env())


def uninstall() -> None:
    """Undo ``install()`` in this process: verl's own functions and classes are back in place.

    Functions decorated while installed fall back to verl's original behaviour. The
    ``PYTHONPATH`` entry is removed, so processes started later do not install it.
    """
    _importhook.clear_hooks()
    _common.undo_all()
    rest = _without_bootstrap(os.environ.get("PYTHONPATH", ""))
    if rest:
        os.environ["PYTHONPATH"] = os.pathsep.join(rest)
    else:
        os.environ.pop("PYTHONPATH", None)


def is_driver_process(environ: Mapping[str, str] | None = None) -> bool:
    """True in the process a user started (verl's driver), False in one this integration's
    environment started (a Ray worker, an engine server: ``instrumentation_env`` reached it)."""
    environ = os.environ if environ is None else environ
    paths = {os.path.abspath(p) for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    return BOOTSTRAP_DIR not in paths and not _config.has_worker_config(environ)


def _link_wandb_run() -> None:
    """In verl's driver, before Ray starts: fix the W&B run id (``WANDB_RUN_ID``) that every
    worker's Weave calls carry and that verl's ``wandb.init`` (in its TaskRunner actor, started
    later) then uses, so the traces link to the training run. Never raises."""
    try:
        _config.preset_wandb_run_id()
    except Exception as exc:  # pragma: no cover - never break the launch
        _log.warning("otel_verl: W&B run id not preset (%r): Weave calls are not linked to the "
                     "run", exc)


def is_installed() -> bool:
    """True while the integration is installed in this process."""
    return _common.is_installed()


try:  # the launcher's base class when opentelemetry-instrumentation is there
    from opentelemetry.instrumentation.instrumentor import (  # type: ignore[attr-defined,unused-ignore]
        BaseInstrumentor as _Base,
    )
except ImportError:  # pragma: no cover - a small stand-in with the same public methods
    class _Base:  # type: ignore[no-redef]
        _instance: Any = None
        _is_instrumented_by_opentelemetry = False

        def __new__(cls, *args: Any, **kwargs: Any) -> Any:
            if cls._instance is None:
                cls._instance = object.__new__(cls)
            return cls._instance

        @property
        def is_instrumented_by_opentelemetry(self) -> bool:
            return self._is_instrumented_by_opentelemetry

        def instrument(self, **kwargs: Any) -> None:
            if not self._is_instrumented_by_opentelemetry:
                self._instrument(**kwargs)
                self._is_instrumented_by_opentelemetry = True

        def uninstrument(self, **kwargs: Any) -> None:
            if self._is_instrumented_by_opentelemetry:
                self._uninstrument(**kwargs)
                self._is_instrumented_by_opentelemetry = False

        def _instrument(self, **kwargs: Any) -> None:
            raise NotImplementedError

        def _uninstrument(self, **kwargs: Any) -> None:
            raise NotImplementedError


class VerlInstrumentor(_Base):  # type: ignore[misc,valid-type,unused-ignore]
    """OpenTelemetry instrumentor for verl (``opentelemetry-instrument`` loads it by entry point).

    ``VerlInstrumentor().instrument(propagate=True)`` is ``install()``, plus, in verl's driver (not
    in the processes it starts), ``WANDB_RUN_ID`` fixed up front (``link_wandb_run=False`` skips
    it; nothing happens without wandb installed) so Weave calls link to the training's W&B run;
    ``uninstrument()`` is ``uninstall()``. Skipped by the launcher when no supported verl is
    installed (``instrumentation_dependencies``).
    """

    def instrumentation_dependencies(self) -> Collection[str]:
        return (SUPPORTED_VERL,)

    def _instrument(self, **kwargs: Any) -> None:
        driver = is_driver_process()
        install(propagate=bool(kwargs.get("propagate", True)))
        if driver and kwargs.get("link_wandb_run", True):
            _link_wandb_run()

    def _uninstrument(self, **kwargs: Any) -> None:
        uninstall()
