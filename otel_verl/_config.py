"""Configuration: one frozen object, resolved once, with an explicit and tested precedence.

Precedence, highest first: explicit argument > verl/Hydra key (``actor_rollout_ref.rollout.trace.*``,
``trainer.*``) > environment (``OTEL_VERL_*`` for what is ours, then the ``OTEL_*`` standard names)
> default.

In a worker (``OTEL_VERL_CONFIG`` from the driver's ``RolloutTraceConfig.export_env()``), the
driver's configuration sits inside that order: explicit > verl key > ``OTEL_VERL_*`` > what the
driver chose (by argument or verl key) > standard ``OTEL_*`` > the rest of the driver's
configuration > default. So a worker can override any setting with an ``OTEL_VERL_*`` variable,
a standard variable (``OTEL_TRACES_EXPORTER=none`` under ``opentelemetry-instrument``) never
undoes the driver's choice, and no standard variable turns tracing off where the driver traces.

A bad explicit or verl value raises ``ConfigError`` naming the key and the allowed values; a bad
environment value logs a warning and falls back to the next source.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
import os
import re
import secrets
import string
import sys
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from typing import Any

from otel_verl import _env

_log = logging.getLogger("otel_verl")

#: backends otel_verl implements; ``None`` means tracing off
BACKENDS = ("file", "otlp", "weave", "console", "none")
#: backends verl knows that otel_verl does not implement: accepted, tracing off, with a warning
FOREIGN_BACKENDS = ("mlflow", "trackio")
OTLP_PROTOCOLS = ("grpc", "http/protobuf")
PROCESSORS = ("batch", "simple")
#: the rules of ``tail_keep`` (see ``otel_verl.exporters._tail``)
TAIL_RULES = ("errors", "truncated", "reward_outliers", "groups")
#: how backend=weave delivers: the Weave exporter's calls, or Weave's own OTel ingestion
WEAVE_INGEST = ("calls", "otel")

VERL_TRACE_PREFIX = "actor_rollout_ref.rollout.trace."


class ConfigError(ValueError):
    """A configuration value that cannot be used; the message names the key and what is allowed."""


@dataclasses.dataclass(frozen=True)
class TraceConfig:
    """The resolved tracing configuration of one process. Build it with ``resolve_config``."""

    project_name: str = "otel-verl"
    experiment_name: str = "default"
    backend: str | None = "file"
    token2text: bool = False
    max_samples_per_step_per_worker: int | None = None
    trace_dir: str = "./otel_verl_traces"
    otlp_endpoint: str | None = None
    otlp_protocol: str = "grpc"
    service_name: str = "otel-verl"
    max_field_bytes: int = 64 * 1024
    max_span_bytes: int = 512 * 1024
    redact: bool = True
    capture_payloads: bool = True
    processor: str = "batch"
    max_queue_size: int = 16384
    max_export_batch_size: int = 512
    schedule_delay_s: float = 1.0
    export_timeout_s: float = 10.0
    spool_dir: str | None = None
    weave_entity: str | None = None
    weave_base_url: str | None = None
    redact_patterns: tuple[str, ...] = ()
    durable: bool = True
    max_queue_bytes: int = 256 * 1024 * 1024
    max_request_bytes: int = 3 * 1024 * 1024
    max_spool_bytes: int = 1024 * 1024 * 1024
    export_delay_s: float = 1.0
    tail_keep: tuple[str, ...] = ()
    group_size: int | None = None
    tail_reward_z: float = 2.0
    tail_max_per_step_per_worker: int | None = None
    tail_buffer_bytes: int = 64 * 1024 * 1024
    tail_group_timeout_s: float = 300.0
    weave_ingest: str = "calls"
    weave_keep_trajectory: bool = True
    weave_threads: bool = True
    weave_include_otel_attributes: bool = True
    wandb_run_id: str | None = None
    #: the fields set by an explicit argument or a verl key (here, or in the driver this worker's
    #: configuration came from): in a worker, a standard ``OTEL_*`` variable does not override
    #: them. Not part of the configuration's value (ignored by ``==``).
    chosen: tuple[str, ...] = dataclasses.field(default=(), compare=False, repr=False)

    @property
    def enabled(self) -> bool:
        """True when a backend that records spans is selected."""
        return self.backend is not None and self.backend != "none"

    def to_json(self) -> str:
        """Serialise for a worker process (see ``RolloutTraceConfig.export_env``)."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True)


# --- value parsers: raise ConfigError(message without the key); the caller adds the key ----------


def _parse_str(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"expected a non-empty string, got {value!r}")
    return value


def _parse_opt_str(value: Any) -> str | None:
    if value is None or value == "":
        return None
    return _parse_str(value)


def _parse_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if isinstance(value, str) and value.strip().lower() in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"expected true or false, got {value!r}")


def _parse_int(value: Any, minimum: int) -> int:
    if isinstance(value, bool):
        raise ConfigError(f"expected an integer >= {minimum}, got {value!r}")
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"expected an integer >= {minimum}, got {value!r}") from None
    if isinstance(value, float) and value != number:
        raise ConfigError(f"expected an integer >= {minimum}, got {value!r}")
    if number < minimum:
        raise ConfigError(f"expected an integer >= {minimum}, got {value!r}")
    return number


def _parse_max_samples(value: Any) -> int | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "null", "none")):
        return None
    return _parse_int(value, 0)


def _parse_positive_float(value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"expected a positive number, got {value!r}") from None
    if not 0 < number <= 86400:  # also rejects nan and inf (a thread cannot wait forever)
        raise ConfigError(f"expected a positive number of seconds up to 86400, got {value!r}")
    return number


def _parse_patterns(value: Any) -> tuple[str, ...]:
    """Regular expressions: a list, a JSON array in a string, or one pattern as a string."""
    if value is None or value == "":
        return ()
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                value = json.loads(text)
            except ValueError:
                raise ConfigError(f"expected a JSON array of regular expressions, got {value!r}") \
                    from None
        else:
            value = [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(p, str) and p for p in value):
        raise ConfigError(f"expected a list of regular expressions, got {value!r}")
    for pattern in value:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ConfigError(f"invalid regular expression {pattern!r}: {exc}") from None
    return tuple(value)


#: the shortest schedule delay (a smaller one turns the export worker into a busy loop)
MIN_SCHEDULE_DELAY_S = 0.01


def _parse_schedule_delay(value: Any) -> float:
    number = _parse_positive_float(value)
    if number < MIN_SCHEDULE_DELAY_S:
        raise ConfigError(f"expected at least {MIN_SCHEDULE_DELAY_S} seconds, got {value!r}")
    return number


def _parse_opt_int(minimum: int) -> Callable[[Any], int | None]:
    def parse(value: Any) -> int | None:
        if value is None or (isinstance(value, str) and value.strip().lower() in
                             ("", "null", "none")):
            return None
        return _parse_int(value, minimum)

    return parse


def _parse_tail_keep(value: Any) -> tuple[str, ...]:
    """A list of rules, or a comma-separated string (the environment's form, or Hydra's
    ``[errors,groups]``); empty = off."""
    if value is None:
        return ()
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("[") and text.endswith("]"):  # a Hydra list on the command line
            text = text[1:-1]
        items: list[Any] = [part.strip().strip("'\"") for part in text.split(",")
                            if part.strip()]
        if [part.strip().lower() for part in items] in (["none"], ["null"]):
            items = []
    elif isinstance(value, Iterable) and not _is_mapping(value):  # list, tuple, ListConfig
        items = list(value)
    else:
        raise ConfigError(f"expected a list of {', '.join(TAIL_RULES)} (or a comma-separated "
                          f"string); got {value!r}")
    rules: list[str] = []
    for item in items:
        rule = item.strip().lower() if isinstance(item, str) else item
        if rule not in TAIL_RULES:
            raise ConfigError(f"expected rules among {', '.join(TAIL_RULES)}; got {item!r}")
        if rule not in rules:
            rules.append(rule)
    return tuple(rules)


def _parse_z(value: Any) -> float:
    if isinstance(value, bool):
        raise ConfigError(f"expected a positive number, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"expected a positive number, got {value!r}") from None
    if not 0 < number < 1e6:  # also rejects nan and inf
        raise ConfigError(f"expected a positive number, got {value!r}")
    return number


def _choice(allowed: tuple[str, ...]) -> Callable[[Any], str]:
    def parse(value: Any) -> str:
        text = value.strip().lower() if isinstance(value, str) else value
        if text not in allowed:
            raise ConfigError(f"expected one of {', '.join(allowed)}; got {value!r}")
        return text

    return parse


def _parse_backend(value: Any) -> str | None:
    """verl semantics: None or an unknown name turns tracing off (with a warning for a name)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise ConfigError(f"expected one of {', '.join(BACKENDS)} or null; got {value!r}")
    name = value.strip().lower()
    if name in BACKENDS:
        return name
    if name in ("", "null"):
        return None
    known = ", ".join(BACKENDS)
    if name in FOREIGN_BACKENDS:
        _log.warning("otel_verl: backend %r is verl's own and not provided by otel_verl; tracing "
                     "is off. Use one of: %s", value, known)
    else:
        _log.warning("otel_verl: unknown backend %r, tracing is off (like verl). Known: %s",
                     value, known)
    return None


#: ``OTEL_TRACES_EXPORTER`` names (the SDK's entry points) that mean one of our backends
_TRACES_EXPORTER_ALIASES = {"otlp": "otlp", "otlp_proto_grpc": "otlp", "otlp_proto_http": "otlp",
                            "console": "console", "weave": "weave", "none": "none"}


def _parse_traces_exporter(value: Any) -> str:
    """``OTEL_TRACES_EXPORTER``: the first name of the list, if it is one otel_verl provides."""
    first = str(value).split(",")[0].strip().lower()
    if first not in _TRACES_EXPORTER_ALIASES:
        raise ConfigError(f"expected one of {', '.join(sorted(_TRACES_EXPORTER_ALIASES))} "
                          f"(first of the list); got {value!r}")
    return _TRACES_EXPORTER_ALIASES[first]


@dataclasses.dataclass(frozen=True)
class _Field:
    """One option: its parser, environment names (first wins), verl keys and documentation.

    The default is the ``TraceConfig`` field's; ``doc`` feeds the README's configuration table.
    """

    name: str
    parse: Callable[[Any], Any]
    env: tuple[str, ...] = ()
    verl: tuple[str, ...] = ()
    doc: str = ""
    #: the default as the README shows it (when the TraceConfig default says too little)
    shown_default: str = ""


def _ms_to_s(value: Any) -> float:
    try:
        return _parse_schedule_delay(float(value) / 1000.0)
    except (TypeError, ValueError):
        raise ConfigError(f"expected a positive number of milliseconds, got {value!r}") from None


_FIELDS: tuple[_Field, ...] = (
    _Field("project_name", _parse_str, (_env.OTEL_VERL_PROJECT_NAME,),
           (VERL_TRACE_PREFIX + "project_name", "trainer.project_name"),
           doc="the run's project: Weave project, `rollout.project_name` on the resource",
           shown_default='`otel-verl`'),
    _Field("experiment_name", _parse_str, (_env.OTEL_VERL_EXPERIMENT_NAME,),
           (VERL_TRACE_PREFIX + "experiment_name", "trainer.experiment_name"),
           doc='`rollout.experiment_name` on every span; keys the deterministic sampler',
           shown_default='`default`'),
    _Field("backend", _parse_backend, (_env.OTEL_VERL_BACKEND,), (VERL_TRACE_PREFIX + "backend",),
           doc=('`file`, `otlp`, `weave`, `console`, `none`; explicit `None` or an unknown name = '
                "off (verl's rule, with a warning). `OTEL_TRACES_EXPORTER` (first of a list) counts"
                ' below `OTEL_VERL_BACKEND`'),
           shown_default='`file`'),
    _Field("token2text", _parse_bool, (_env.OTEL_VERL_TOKEN2TEXT,),
           (VERL_TRACE_PREFIX + "token2text",),
           doc=("add decoded `prompt_text`/`response_text` to traced outputs (needs the owner's "
                '`tokenizer`)'),
           shown_default='`false`'),
    _Field("max_samples_per_step_per_worker", _parse_max_samples,
           (_env.OTEL_VERL_MAX_SAMPLES_PER_STEP_PER_WORKER,),
           (VERL_TRACE_PREFIX + "max_samples_per_step_per_worker",),
           doc=('N unique samples traced per step per worker (every rollout of a chosen sample); '
                '`0` = none; negative = error'),
           shown_default='`null` (all)'),
    _Field("trace_dir", _parse_str, (_env.OTEL_VERL_TRACE_DIR,), (VERL_TRACE_PREFIX + "trace_dir",),
           doc='the local store (`backend=file`) and the default spool',
           shown_default='`./otel_verl_traces`'),
    _Field("otlp_endpoint", _parse_opt_str,
           (_env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, _env.OTEL_EXPORTER_OTLP_ENDPOINT),
           (VERL_TRACE_PREFIX + "otlp_endpoint",),
           doc='collector address for `backend=otlp`',
           shown_default="the OTLP exporter's own"),
    _Field("otlp_protocol", _choice(OTLP_PROTOCOLS),
           (_env.OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, _env.OTEL_EXPORTER_OTLP_PROTOCOL),
           (VERL_TRACE_PREFIX + "otlp_protocol",),
           doc='`grpc` or `http/protobuf`',
           shown_default='`grpc`'),
    _Field("service_name", _parse_str, (_env.OTEL_SERVICE_NAME,),
           (VERL_TRACE_PREFIX + "service_name",),
           doc='`service.name` on the resource',
           shown_default='`otel-verl`'),
    _Field("max_field_bytes", lambda v: _parse_int(v, 256), (_env.OTEL_VERL_MAX_FIELD_BYTES,),
           (VERL_TRACE_PREFIX + "max_field_bytes",),
           doc='cap of one `input.value`/`output.value` (and of free-text attributes)',
           shown_default='65536'),
    _Field("max_span_bytes", lambda v: _parse_int(v, 1024), (_env.OTEL_VERL_MAX_SPAN_BYTES,),
           (VERL_TRACE_PREFIX + "max_span_bytes",),
           doc='cap of input + output of one span',
           shown_default='524288'),
    _Field("redact", _parse_bool, (_env.OTEL_VERL_REDACT,), (VERL_TRACE_PREFIX + "redact",),
           doc=('redact secrets (key names like `api_key`, `authorization`, `password`; values that'
                ' look like keys or tokens) before anything leaves the process'),
           shown_default='`true`'),
    _Field("capture_payloads", _parse_bool, (_env.OTEL_VERL_CAPTURE_PAYLOADS,),
           (VERL_TRACE_PREFIX + "capture_payloads",),
           doc=('`false` = metadata-only tracing: spans, attributes, usage and errors, no '
                '`input.value`/`output.value`/tool content'),
           shown_default='`true`'),
    _Field("processor", _choice(PROCESSORS), (_env.OTEL_VERL_PROCESSOR,),
           (VERL_TRACE_PREFIX + "processor",),
           doc='`batch`, or `simple` (synchronous export: tests only)',
           shown_default='`batch`'),
    _Field("max_queue_size", lambda v: _parse_int(v, 1), (_env.OTEL_BSP_MAX_QUEUE_SIZE,),
           (VERL_TRACE_PREFIX + "max_queue_size",),
           doc='spans held in memory waiting for export',
           shown_default='16384'),
    _Field("max_export_batch_size", lambda v: _parse_int(v, 1),
           (_env.OTEL_BSP_MAX_EXPORT_BATCH_SIZE,), (VERL_TRACE_PREFIX + "max_export_batch_size",),
           doc='spans per export request at most',
           shown_default='512'),
    _Field("schedule_delay_s", _parse_schedule_delay, (), (VERL_TRACE_PREFIX + "schedule_delay_s",),
           doc="seconds a finished span waits in memory at most before its batch is exported "
               "(to the durable log with `durable`: what a SIGKILL can lose); at least 0.01 "
               "(`OTEL_BSP_SCHEDULE_DELAY` is in ms)",
           shown_default='1.0'),
    _Field("export_timeout_s", _parse_positive_float, (), (VERL_TRACE_PREFIX + "export_timeout_s",),
           doc="one export request's time limit",
           shown_default='10.0'),
    _Field("spool_dir", _parse_opt_str, (_env.OTEL_VERL_SPOOL_DIR,),
           (VERL_TRACE_PREFIX + "spool_dir",),
           doc='the durable log: spans wait there until the backend accepts them',
           shown_default='`<trace_dir>/spool/<backend>`'),
    _Field("weave_entity", _parse_opt_str, (_env.OTEL_VERL_WEAVE_ENTITY,),
           (VERL_TRACE_PREFIX + "weave_entity",),
           doc='Weave entity (then `WANDB_ENTITY`)',
           shown_default='the W&B default entity'),
    _Field("weave_base_url", _parse_opt_str, (_env.OTEL_VERL_WEAVE_BASE_URL,),
           (VERL_TRACE_PREFIX + "weave_base_url",),
           doc='Weave trace server (then `WANDB_BASE_URL`)',
           shown_default="W&B's hosted trace server"),
    _Field("redact_patterns", _parse_patterns, (_env.OTEL_VERL_REDACT_PATTERNS,),
           (VERL_TRACE_PREFIX + "redact_patterns",),
           doc="more regular expressions whose matches are redacted from everything exported "
               "(a list; in the environment a JSON array or one pattern), added to the built-in "
               "catalogue",
           shown_default="none"),
    _Field("durable", _parse_bool, (_env.OTEL_VERL_DURABLE,), (VERL_TRACE_PREFIX + "durable",),
           doc="otlp, weave and exporters passed in (batch processor) deliver through a log on "
               "disk (`spool_dir`, default `<trace_dir>/spool/<backend>`): an outage of any "
               "length loses nothing within `max_spool_bytes`; the next process or "
               "`otel-verl traces replay` delivers what a process left",
           shown_default='`true`'),
    _Field("max_queue_bytes", lambda v: _parse_int(v, 1024), (_env.OTEL_VERL_MAX_QUEUE_BYTES,),
           (VERL_TRACE_PREFIX + "max_queue_bytes",),
           doc="bytes of finished spans held in memory at most (estimated); from half of it the "
               "queue is handed to the exporter (the log) early, beyond it spans are dropped "
               "and counted",
           shown_default='268435456 (256 MiB)'),
    _Field("max_request_bytes", lambda v: _parse_int(v, 4096),
           (_env.OTEL_VERL_MAX_REQUEST_BYTES,), (VERL_TRACE_PREFIX + "max_request_bytes",),
           doc="bytes per export request at most (OTLP/JSON size of its spans; under the "
               "Collector's 4 MiB gRPC limit); a larger span is cut to fit and marked "
               "`otel_verl.truncated`",
           shown_default='3145728 (3 MiB)'),
    _Field("max_spool_bytes", lambda v: _parse_int(v, 1024 * 1024),
           (_env.OTEL_VERL_MAX_SPOOL_BYTES,), (VERL_TRACE_PREFIX + "max_spool_bytes",),
           doc="bytes the durable log may hold per process; beyond it the oldest spans are "
               "dropped, counted (`dropped_spool_full`) and reported",
           shown_default='1073741824 (1 GiB)'),
    _Field("export_delay_s", _parse_positive_float, (_env.OTEL_VERL_EXPORT_DELAY,),
           (VERL_TRACE_PREFIX + "export_delay_s",),
           doc="with `durable`: a request that is not full leaves once its oldest span waited "
               "this long (the spans are on disk meanwhile); longer fills requests better but "
               "leaves more on disk when a worker is killed (picked up by the next process)",
           shown_default='1.0'),
    # tail sampling (otel_verl.exporters._tail, docs/sampling.md)
    _Field("tail_keep", _parse_tail_keep, (_env.OTEL_VERL_TAIL_KEEP,),
           (VERL_TRACE_PREFIX + "tail_keep",),
           doc="tail rules that export a trajectory the head rule did not pick, decided when it "
               "ends: `errors`, `truncated`, `reward_outliers`, `groups` (a list, or a comma "
               "string in the environment); empty = off (no provisional recording, no cost)",
           shown_default="empty (off)"),
    _Field("group_size", _parse_opt_int(1), (_env.OTEL_VERL_GROUP_SIZE,),
           (VERL_TRACE_PREFIX + "group_size", "actor_rollout_ref.rollout.n"),
           doc="rollouts per GRPO group (verl's `actor_rollout_ref.rollout.n`); a group is "
               "decided when this many of its trajectories ended on this worker, else at a step "
               "change, `tail_group_timeout_s` or a flush; `null` = only then",
           shown_default="`null`"),
    _Field("tail_reward_z", _parse_z, (_env.OTEL_VERL_TAIL_REWARD_Z,),
           (VERL_TRACE_PREFIX + "tail_reward_z",),
           doc="`reward_outliers` with continuous rewards: keep a trajectory whose reward is at "
               "least this many standard deviations from its group's mean (a group of n can "
               "reach at most sqrt(n-1): 2.0 needs groups of 5 or more)",
           shown_default="2.0"),
    _Field("tail_max_per_step_per_worker", _parse_opt_int(0),
           (_env.OTEL_VERL_TAIL_MAX_PER_STEP_PER_WORKER,),
           (VERL_TRACE_PREFIX + "tail_max_per_step_per_worker",),
           doc="most trajectories the tail rules add per step per worker (`null` = no cap); "
               "the rest are dropped and counted as `over_budget`",
           shown_default="`null` (no cap)"),
    _Field("tail_buffer_bytes", lambda v: _parse_int(v, 0), (_env.OTEL_VERL_TAIL_BUFFER_BYTES,),
           (VERL_TRACE_PREFIX + "tail_buffer_bytes",),
           doc="memory for spans of undecided trajectories (estimated bytes); when full, the "
               "oldest undecided trajectories are exported early (reason `overflow`), never "
               "dropped",
           shown_default="67108864 (64 MiB)"),
    _Field("tail_group_timeout_s", _parse_positive_float, (_env.OTEL_VERL_TAIL_GROUP_TIMEOUT_S,),
           (VERL_TRACE_PREFIX + "tail_group_timeout_s",),
           doc="an incomplete group is decided with the trajectories it has after this long",
           shown_default="300.0"),
    _Field("weave_ingest", _choice(WEAVE_INGEST), (_env.OTEL_VERL_WEAVE_INGEST,),
           (VERL_TRACE_PREFIX + "weave_ingest",),
           doc='backend=weave path: `calls` (our exporter: complete calls) or `otel` (Weave\'s '
               'own OTel ingestion, `/otel/v1/traces`); docs/weave.md compares them',
           shown_default='`calls`'),
    _Field("weave_keep_trajectory", _parse_bool, (_env.OTEL_EXPORTER_WEAVE_KEEP_TRAJECTORY,),
           (VERL_TRACE_PREFIX + "weave_keep_trajectory",),
           doc="the trajectory span is each trajectory's one root call; `false`: verl's shape "
               "(the agent loop is the root; a reward span beside it is a second root)"),
    _Field("weave_threads", _parse_bool, (_env.OTEL_EXPORTER_WEAVE_THREADS,),
           (VERL_TRACE_PREFIX + "weave_threads",),
           doc="Weave threads: `thread_id` = the trajectory, `turn_id` on each LLM turn"),
    _Field("weave_include_otel_attributes", _parse_bool, (),
           (VERL_TRACE_PREFIX + "weave_include_otel_attributes",),
           doc="the span's other attributes, kind, scope and resource under `attributes.otel`"),
    _Field("wandb_run_id", _parse_opt_str, (_env.WANDB_RUN_ID,),
           (VERL_TRACE_PREFIX + "wandb_run_id",),
           doc="the W&B run every Weave call links to (`wb_run_id`); when unset, `export_env()` "
               "fixes one in the driver (a later `wandb.init` there uses it) for its workers",
           shown_default="the active wandb run"),
)
FIELD_NAMES = tuple(f.name for f in _FIELDS)
# OTEL_BSP_SCHEDULE_DELAY is in milliseconds (OTel spec); ours is seconds
_ENV_CONVERTERS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "schedule_delay_s": (_env.OTEL_BSP_SCHEDULE_DELAY, _ms_to_s),
    "backend": (_env.OTEL_TRACES_EXPORTER, _parse_traces_exporter),
}


def with_wandb_run_id(config: TraceConfig,
                      environ: MutableMapping[str, str] | None = None) -> TraceConfig:
    """The driver's configuration with the W&B run its workers' Weave calls link to.

    For ``backend=weave`` with no ``wandb_run_id``: the wandb run active in this process, else a
    preset ``WANDB_RUN_ID``, else (wandb installed) a fresh id, written to ``WANDB_RUN_ID`` here so
    that the driver's later ``wandb.init`` (verl starts it in ``fit()``, after the workers exist)
    creates the run under that id. Called by ``RolloutTraceConfig.export_env()``.
    """
    if config.backend != "weave" or config.wandb_run_id:
        return config
    run_id = preset_wandb_run_id(environ)
    return dataclasses.replace(config, wandb_run_id=run_id) if run_id else config


def preset_wandb_run_id(environ: MutableMapping[str, str] | None = None) -> str | None:
    """The W&B run id of this training run, fixed before the run starts. Call it in the driver
    only (a worker calling it without the driver's environment would invent its own).

    The wandb run active in this process, else ``WANDB_RUN_ID``, else (wandb installed) a fresh
    8-character id written to ``WANDB_RUN_ID`` (processes started afterwards inherit it, and
    ``wandb.init`` here uses it); None when wandb is not installed.
    """
    environ = os.environ if environ is None else environ
    wandb = sys.modules.get("wandb")
    run_id = str(getattr(getattr(wandb, "run", None), "id", None) or "") or \
        environ.get(_env.WANDB_RUN_ID)
    if run_id:
        return run_id
    if importlib.util.find_spec("wandb") is None:
        return None  # no W&B here: nothing to link to
    run_id = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))
    environ[_env.WANDB_RUN_ID] = run_id
    _log.info("otel_verl: W&B run id fixed up front for the Weave calls of every process: %s "
              "(%s; wandb.init in this process will use it)", run_id, _env.WANDB_RUN_ID)
    return run_id


def has_worker_config(environ: Mapping[str, str] | None = None) -> bool:
    """True when ``export_env()``'s variable is in the environment (a worker process)."""
    return _env.OTEL_VERL_CONFIG in (os.environ if environ is None else environ)


def markdown_table() -> str:
    """The README's configuration table, generated from ``_FIELDS`` (one source of truth).

    A unit test fails when the README differs; it prints the table to paste.
    """
    defaults = {f.name: f.default for f in dataclasses.fields(TraceConfig)}
    rows = ["| option | verl / Hydra key (`actor_rollout_ref.rollout.trace.` + ...) | environment "
            "| default | meaning |", "|---|---|---|---|---|"]
    for field in _FIELDS:
        verl = ", then ".join(f"`{k[len(VERL_TRACE_PREFIX):]}`" if k.startswith(VERL_TRACE_PREFIX)
                              else f"`{k}`" for k in field.verl) or "—"
        env = [f"`{name}`" for name in field.env]
        if field.name in _ENV_CONVERTERS:
            env.append(f"`{_ENV_CONVERTERS[field.name][0]}`")
        default = field.shown_default or f"`{defaults[field.name]}`"
        rows.append(f"| `{field.name}` | {verl} | {', '.join(env) or '—'} | {default} "
                    f"| {field.doc} |")
    return "\n".join(rows) + "\n"


# --- verl / Hydra configs ------------------------------------------------------------------------


def _parse_scalar(text: str) -> Any:
    """Hydra-like scalars on the command line: null, true/false, ints, floats, else the string."""
    lowered = text.strip().lower()
    if lowered in ("null", "none", "~"):
        return None
    if lowered in ("true", "false"):
        return lowered == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


def flatten_verl_config(verl_config: Mapping[str, Any] | Iterable[str] | None) -> dict[str, Any]:
    """Turn a verl config (nested mapping, OmegaConf object, or dotted overrides) into dotted keys.

    Args:
        verl_config: ``{"actor_rollout_ref": {"rollout": {"trace": {...}}}, "trainer": {...}}``,
            an OmegaConf ``DictConfig``, or ``["actor_rollout_ref.rollout.trace.backend=otlp", ...]``
            (a leading ``+`` or ``++`` is accepted, as Hydra writes it).

    Returns:
        ``{"actor_rollout_ref.rollout.trace.backend": "otlp", ...}`` for the keys otel_verl reads.
    """
    if verl_config is None:
        return {}
    flat: dict[str, Any] = {}
    if isinstance(verl_config, (str, bytes)):
        raise ConfigError("verl_config: expected a mapping or a list of key=value overrides, "
                          f"got {verl_config!r}")
    if _is_mapping(verl_config):
        wanted = {key for field in _FIELDS for key in field.verl}
        for key in wanted:
            found, value = _lookup(verl_config, key)
            if found:
                flat[key] = value
        return flat
    for item in verl_config:
        if not isinstance(item, str) or "=" not in item:
            raise ConfigError(f"verl_config: override {item!r} is not of the form key=value")
        key, _, value = item.partition("=")
        flat[key.lstrip("+").strip()] = _parse_scalar(value)
    return flat


def _is_mapping(obj: Any) -> bool:
    return isinstance(obj, Mapping) or (hasattr(obj, "get") and hasattr(obj, "keys"))


def _lookup(cfg: Any, dotted: str) -> tuple[bool, Any]:
    node = cfg
    for part in dotted.split("."):
        if not _is_mapping(node) or part not in node.keys():
            return False, None
        node = node.get(part)
    return True, node


# --- resolution ----------------------------------------------------------------------------------


def resolve_config(
    explicit: Mapping[str, Any] | None = None,
    verl_config: Mapping[str, Any] | Iterable[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> TraceConfig:
    """Resolve the configuration from all sources, highest precedence first.

    Args:
        explicit: field name -> value, as passed to ``RolloutTraceConfig.init``; a value of
            ``None`` means "not given" except for ``backend`` and ``max_samples_per_step_per_worker``
            where ``None`` is verl's meaningful default and is only honoured when given explicitly
            by the caller (``explicit`` containing the key).
        verl_config: a verl config or dotted overrides (see ``flatten_verl_config``).
        environ: the environment (default ``os.environ``).

    Returns:
        The frozen ``TraceConfig``.

    Raises:
        ConfigError: an explicit or verl value is invalid, or an unknown option was given.
    """
    explicit = dict(explicit or {})
    environ = os.environ if environ is None else environ
    unknown = set(explicit) - set(FIELD_NAMES)
    if unknown:
        raise ConfigError(f"unknown option(s) {sorted(unknown)}; known: {', '.join(FIELD_NAMES)}")
    flat_verl = flatten_verl_config(verl_config)
    worker = _from_worker_env(environ)
    base, base_chosen = worker if worker is not None else ({}, frozenset())
    values: dict[str, Any] = {}
    chosen: set[str] = set()
    for field in _FIELDS:
        if field.name in explicit:
            values[field.name] = _parse_or_raise(field, explicit[field.name], field.name)
            chosen.add(field.name)
            continue
        verl_key = next((k for k in field.verl if k in flat_verl and flat_verl[k] is not None),
                        None)
        if verl_key is None and field.name in ("backend", "max_samples_per_step_per_worker"):
            verl_key = next((k for k in field.verl if k in flat_verl), None)
        if verl_key is not None:
            values[field.name] = _parse_or_raise(field, flat_verl[verl_key], verl_key)
            chosen.add(field.name)
            continue
        ours = _from_env(field, environ, generic=False)
        if ours is not _MISSING:
            values[field.name] = ours
        elif field.name in base_chosen and field.name in base:
            values[field.name] = base[field.name]  # the driver's choice, below OTEL_VERL_* only
            chosen.add(field.name)
        else:
            generic = _from_env(field, environ, ours=False)
            if generic is not _MISSING and _turns_tracing_off(field, generic, base, worker):
                generic = _MISSING
            if generic is not _MISSING:
                values[field.name] = generic
            elif field.name in base:
                values[field.name] = base[field.name]
    return TraceConfig(**values, chosen=tuple(sorted(chosen)))


_MISSING = object()
#: environment names that are otel_verl's own (a worker's override of the driver's choice)
_OURS_PREFIX = "OTEL_VERL_"


def _turns_tracing_off(field: _Field, value: Any, base: Mapping[str, Any],
                       worker: object | None) -> bool:
    """True when a standard variable's ``value`` for ``backend`` would turn tracing off, where it
    is then ignored (worker of a tracing driver) or honoured with a warning (anywhere else): a
    standard variable never turns tracing off silently."""
    if field.name != "backend" or value not in (None, "none"):
        return False
    if worker is not None and base.get("backend") not in (None, "none"):
        _log.warning("otel_verl: ignoring %s=none in this worker: its driver traces to %r (set "
                     "%s=none to turn a worker off)", _env.OTEL_TRACES_EXPORTER, base["backend"],
                     _env.OTEL_VERL_BACKEND)
        return True
    _log.warning("otel_verl: %s=none turns otel_verl's tracing off (no backend set by "
                 "init(backend=...), verl's trace.backend or %s)", _env.OTEL_TRACES_EXPORTER,
                 _env.OTEL_VERL_BACKEND)
    return False


def _parse_or_raise(field: _Field, value: Any, key: str) -> Any:
    try:
        return field.parse(value)
    except ConfigError as exc:
        raise ConfigError(f"{key}: {exc}") from None


def _from_env(field: _Field, environ: Mapping[str, str], *, ours: bool = True,
              generic: bool = True) -> Any:
    """The field's value from the environment (first name that parses wins), else ``_MISSING``;
    ``ours``/``generic`` select the ``OTEL_VERL_*`` names and the others (standard ones)."""
    sources = [(name, field.parse) for name in field.env]
    if field.name in _ENV_CONVERTERS:
        sources.append(_ENV_CONVERTERS[field.name])
    for name, parse in sources:
        if not (ours if name.startswith(_OURS_PREFIX) else generic):
            continue
        raw = environ.get(name)
        if raw is None or raw == "":
            continue
        try:
            return parse(raw)
        except ConfigError as exc:
            _log.warning("otel_verl: ignoring %s=%r (%s); using the next source", name, raw, exc)
    return _MISSING


def _from_worker_env(environ: Mapping[str, str]) -> tuple[dict[str, Any], frozenset[str]] | None:
    """The driver's whole configuration and the fields it chose (``TraceConfig.chosen``), when
    ``export_env`` put them in this process's environment; None when it did not (or malformed).

    What the driver chose ranks below ``OTEL_VERL_*`` variables only; the rest of its
    configuration below every variable (see the module docstring).
    """
    raw = environ.get(_env.OTEL_VERL_CONFIG)
    if not raw:
        return None
    try:
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise ConfigError(f"expected a JSON object, got {type(data).__name__}")
        base = {}
        for field in _FIELDS:
            if field.name in data:
                value = data[field.name]
                base[field.name] = value if value is None else field.parse(value)
        chosen = data.get("chosen") or []
        if not isinstance(chosen, list) or not all(isinstance(n, str) for n in chosen):
            raise ConfigError(f"'chosen': expected a list of option names, got {chosen!r}")
        return base, frozenset(chosen) & set(FIELD_NAMES)
    except (ValueError, TypeError, ConfigError) as exc:
        _log.warning("otel_verl: ignoring malformed %s (%s)", _env.OTEL_VERL_CONFIG, exc)
        return None
