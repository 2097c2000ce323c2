"""``RolloutTraceConfig``: verl's process-wide tracing configuration, on OpenTelemetry.

Usage::

    from otel_verl import RolloutTraceConfig

    RolloutTraceConfig.init("my_project", "exp1", "file")   # or "otlp", "weave", "console", None
    ...
    RolloutTraceConfig.shutdown()                          # bounded; also runs at exit

Configuration: see ``otel_verl._config`` (explicit > verl keys > environment > default).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from opentelemetry.sdk.trace.export import SpanExporter

from otel_verl import _content, _env
from otel_verl._config import TraceConfig, has_worker_config, resolve_config, with_wandb_run_id
from otel_verl._sampling import TrajectorySampler
from otel_verl._state import STATE, _half_millis

_UNSET: Any = object()


class RolloutTraceConfig:
    """Process-wide tracing configuration with verl's interface (a singleton).

    Only the first ``init`` in a process takes effect, as in verl; ``reset()`` undoes it (tests).
    """

    _instance: RolloutTraceConfig | None = None

    def __init__(self, config: TraceConfig) -> None:
        self.config = config
        self.project_name = config.project_name
        self.experiment_name = config.experiment_name
        self.backend = config.backend if config.enabled else None
        self.token2text = config.token2text
        self.max_samples_per_step_per_worker = config.max_samples_per_step_per_worker
        self.client: SpanExporter | None = None

    @classmethod
    def get_instance(cls) -> RolloutTraceConfig:
        """The process's instance (an un-initialised, tracing-off one before ``init``)."""
        if cls._instance is None:
            return cls(STATE.config)
        return cls._instance

    @classmethod
    def init(
        cls,
        project_name: str | None = None,
        experiment_name: str | None = None,
        backend: str | None = _UNSET,
        token2text: bool = _UNSET,
        max_samples_per_step_per_worker: int | None = _UNSET,
        **otel_options: Any,
    ) -> None:
        """Initialise tracing for this process (only the first call takes effect).

        Args:
            project_name: verl's ``trainer.project_name`` (Weave project, resource attribute).
            experiment_name: verl's ``trainer.experiment_name`` (on every span).
            backend: ``file`` (default when omitted), ``otlp``, ``weave``, ``console``, ``none``;
                ``None`` or an unknown name turns tracing off, as in verl.
            token2text: add decoded ``prompt_text``/``response_text`` to traced outputs.
            max_samples_per_step_per_worker: N samples traced per step per worker; None = all.
            **otel_options: any ``TraceConfig`` field (``trace_dir``, ``otlp_endpoint``,
                ``otlp_protocol``, ``service_name``, ``max_field_bytes``, ``max_span_bytes``,
                ``redact``, ``processor``, ``spool_dir``, ``weave_entity``, ``weave_base_url``, ...),
                plus ``exporter`` (a SpanExporter replacing the backend's) and ``verl_config``
                (a verl config mapping or dotted overrides).

        Raises:
            ConfigError: a value is invalid (the message names the key and allowed values).
        """
        with STATE.lock:
            if cls._instance is not None:
                return
            exporter = otel_options.pop("exporter", None)
            verl_config = otel_options.pop("verl_config", None)
            explicit: dict[str, Any] = {k: v for k, v in otel_options.items() if v is not None}
            for key, name in (("project_name", project_name),
                              ("experiment_name", experiment_name)):
                if name is not None:
                    explicit[key] = name
            for key, value in (("backend", backend), ("token2text", token2text),
                               ("max_samples_per_step_per_worker",
                                max_samples_per_step_per_worker)):
                if value is not _UNSET:
                    explicit[key] = value
            config = resolve_config(explicit, verl_config)
            cls._install(config, exporter)

    @classmethod
    def _install(cls, config: TraceConfig, exporter: SpanExporter | None) -> None:
        instance = cls(config)
        runtime = STATE.start(config, exporter)
        if runtime is not None:
            instance.client = runtime.exporter
        cls._instance = instance

    @classmethod
    def init_from_env(cls) -> bool:
        """In a worker process: initialise from ``export_env()``'s variables, if not done yet.

        Returns:
            True when tracing is on in this process afterwards.
        """
        with STATE.lock:
            if cls._instance is None:
                if not has_worker_config():
                    return False
                cls._install(resolve_config(), None)
            return STATE.runtime is not None

    @classmethod
    def export_env(cls) -> dict[str, str]:
        """Environment variables that make a worker process build this configuration.

        What the driver chose (an argument of ``init`` or a verl key) stays chosen in the worker
        whatever its standard ``OTEL_*`` variables say; an ``OTEL_VERL_*`` variable there still
        overrides it (precedence: ``otel_verl._config``).

        Put them in a Ray ``runtime_env={"env_vars": ...}`` or a subprocess environment; the
        worker calls ``init_from_env()`` (``otel_verl.integrations.ray`` does it for you).
        """
        config = cls.get_instance().config
        # workers may start in another directory (Ray does): make local paths absolute
        config = dataclasses.replace(
            config, trace_dir=os.path.abspath(config.trace_dir),
            spool_dir=os.path.abspath(config.spool_dir) if config.spool_dir else None)
        if cls._instance is None:
            config = dataclasses.replace(config, backend="none")
        # backend=weave: the W&B run the workers' calls link to, fixed here (the driver) when
        # unset, also when wandb.init runs later (verl starts the run in fit())
        fixed = with_wandb_run_id(config)
        if fixed.wandb_run_id != config.wandb_run_id:  # the driver's choice for every worker
            fixed = dataclasses.replace(fixed, chosen=tuple(sorted({*fixed.chosen,
                                                                    "wandb_run_id"})))
        return {_env.OTEL_VERL_CONFIG: fixed.to_json()}

    @classmethod
    def get_backend(cls) -> str | None:
        return cls.get_instance().backend

    @classmethod
    def get_client(cls) -> SpanExporter | None:
        """The backend's exporter (verl returns its backend client here)."""
        return cls.get_instance().client

    @classmethod
    def enable_token2text(cls) -> bool:
        return cls.get_instance().token2text

    @classmethod
    def get_config(cls) -> TraceConfig:
        return cls.get_instance().config

    @classmethod
    def sampler(cls) -> TrajectorySampler:
        """The deterministic sampler for ``max_samples_per_step_per_worker``."""
        runtime = STATE.runtime
        if runtime is not None:
            return runtime.sampler
        config = STATE.config
        return TrajectorySampler(config.max_samples_per_step_per_worker, config.experiment_name)

    @classmethod
    def flush(cls, timeout_s: float = 5.0) -> bool:
        """Export everything finished so far; returns False if not done within ``timeout_s``."""
        runtime = STATE.runtime
        if runtime is None:
            return True
        # a float (inf included) works: the SDK only adds and compares it
        done = runtime.provider.force_flush(_half_millis(timeout_s) * 2)  # type: ignore[arg-type]
        return _content.flush_all(min(float(timeout_s), 60.0)) and done

    @classmethod
    def shutdown(cls, timeout_s: float = 5.0) -> bool:
        """Flush and stop exporting (bounded in time). Tracing is off afterwards."""
        return STATE.stop(timeout_s)

    @classmethod
    def stats(cls) -> dict[str, int]:
        """Delivery counts (keys: see ``otel_verl.exporters``); after ``shutdown``, the last
        counts (spans that ended after it included)."""
        runtime = STATE.runtime or STATE.last_runtime
        return runtime.stats() if runtime is not None else {}

    @classmethod
    def reset(cls) -> None:
        """Shut tracing down and forget the configuration (for tests)."""
        cls.shutdown(timeout_s=2.0)
        with STATE.lock:
            cls._instance = None
            STATE.forget()
