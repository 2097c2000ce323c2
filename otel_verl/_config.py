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
from typing import Any, TypeVar

from otel_verl import _env

_log = logging.getLogger("otel_verl")

#: backends otel_verl implements; ``None`` means tracing off
BACKENDS = ("file", "otlp", "weave", "console", "none")
#: backends verl knows that otel_verl does not implement: accepted, tracing off, with a warning
FOREIGN_BACKENDS = ("mlflow", "trackio")
OTLP_PROTOCOLS = ("grpc", "http/protobuf")
PROCESSORS = ("batch", "simple")
#: the rules of ``tail_keep`` (see ``otel_verl.exporters._tail``)
TAIL_RULES = ("errors", "truncated", "reward_outliers", "flags", "groups")
#: how backend=weave delivers: the Weave exporter's calls, or Weave's own OTel ingestion
WEAVE_INGEST = ("calls", "otel")

VERL_TRACE_PREFIX = "actor_rollout_ref.rollout.trace."


class ConfigError(ValueError):
    """A configuration value that cannot be used; the message names the key and what is allowed."""


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


def _parse_detect_flags(value: Any) -> tuple[str, ...]:
    """Detector names (``otel_verl.exporters._detect``) as ``tail_keep`` takes rules; ``all`` =
    every one known (built-in and registered); empty = off."""
    from otel_verl.exporters._detect import known_detectors

    known = known_detectors()
    if isinstance(value, str) and value.strip().strip("[]").strip().lower() == "all":
        return known
    if value is None:
        return ()
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("[") and text.endswith("]"):
            text = text[1:-1]
        items: list[Any] = [p.strip().strip("'\"") for p in text.split(",") if p.strip()]
        if [p.lower() for p in items] in (["none"], ["null"]):
            items = []
    elif isinstance(value, Iterable) and not _is_mapping(value):
        items = list(value)
    else:
        raise ConfigError(f"expected a list of detector names or 'all'; got {value!r}")
    names: list[str] = []
    for item in items:
        name = item.strip().lower() if isinstance(item, str) else item
        if name == "all":
            return known
        if name not in known:
            raise ConfigError(f"expected detectors among {', '.join(known)}; got {item!r}")
        if name not in names:
            names.append(name)
    return tuple(names)


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


def _ms_to_s(value: Any) -> float:
    try:
        return _parse_schedule_delay(float(value) / 1000.0)
    except (TypeError, ValueError):
        raise ConfigError(f"expected a positive number of milliseconds, got {value!r}") from None


def _int_at_least(minimum: int) -> Callable[[Any], int]:
    def parse(value: Any) -> int:
        return _parse_int(value, minimum)

    return parse


# --- the options: one row each, in TraceConfig's fields ------------------------------------------

_T = TypeVar("_T")
_ROW = "otel_verl.option"  # the key of an option's row in its dataclass field's metadata


@dataclasses.dataclass(frozen=True)
class _Row:
    """What a ``TraceConfig`` field's metadata says about its option (see ``Option``)."""

    parse: Callable[[Any], Any]
    env: tuple[str, ...]
    env_parsed: tuple[tuple[str, Callable[[Any], Any]], ...]
    verl: tuple[str, ...]
    doc: str
    note: str


def _option(default: _T, parse: Callable[[Any], Any], *, env: tuple[str, ...] = (),
            env_parsed: tuple[tuple[str, Callable[[Any], Any]], ...] = (),
            also_verl: tuple[str, ...] = (), note: str = "", doc: str) -> _T:
    """A ``TraceConfig`` field and everything about its option, in one row.

    Args:
        default: the value when no source gives one.
        parse: turns a value from any source into the field's value, or raises ``ConfigError``.
        env: environment names, first that parses wins (``OTEL_VERL_*`` ones rank above the
            driver's choice in a worker, standard ones below it).
        env_parsed: more environment names, each with its own parser (another unit or form),
            read after ``env``.
        also_verl: verl keys after ``actor_rollout_ref.rollout.trace.<name>``.
        note: what the default means, where its value says too little (shown beside it).
        doc: one line for the configuration table (docs/configuration.md).
    """
    row = _Row(parse, env, env_parsed, also_verl, doc, note)
    return dataclasses.field(default=default, metadata={_ROW: row})


@dataclasses.dataclass(frozen=True)
class TraceConfig:
    """The resolved tracing configuration of one process. Build it with ``resolve_config``.

    Each field is one option: its default, parser, environment names, verl keys and documentation
    are in its ``_option(...)`` row (``OPTIONS`` lists them; ``options_markdown`` renders them).
    """
    project_name: str = _option(
        "otel-verl", _parse_str, env=(_env.OTEL_VERL_PROJECT_NAME,),
        also_verl=("trainer.project_name",),
        doc="the run's project: Weave project, `rollout.project_name` on the resource")
    experiment_name: str = _option(
        "default", _parse_str, env=(_env.OTEL_VERL_EXPERIMENT_NAME,),
        also_verl=("trainer.experiment_name",),
        doc="`rollout.experiment_name` on every span; keys the deterministic sampler")
    backend: str | None = _option(
        "file", _parse_backend, env=(_env.OTEL_VERL_BACKEND,),
        env_parsed=((_env.OTEL_TRACES_EXPORTER, _parse_traces_exporter),),
        doc="`file`, `otlp`, `weave`, `console`, `none`; explicit `None` or an unknown name = off"
            " (verl's rule, with a warning). `OTEL_TRACES_EXPORTER` (first of a list) counts "
            "below `OTEL_VERL_BACKEND`")
    token2text: bool = _option(
        False, _parse_bool, env=(_env.OTEL_VERL_TOKEN2TEXT,),
        doc="add decoded `prompt_text`/`response_text` to traced outputs (needs the owner's "
            "`tokenizer`)")
    max_samples_per_step_per_worker: int | None = _option(
        None, _parse_max_samples, env=(_env.OTEL_VERL_MAX_SAMPLES_PER_STEP_PER_WORKER,),
        note="all",
        doc="N unique samples traced per step per worker (every rollout of a chosen sample); `0` "
            "= none; negative = error")
    trace_dir: str = _option(
        "./otel_verl_traces", _parse_str, env=(_env.OTEL_VERL_TRACE_DIR,),
        doc="the local store (`backend=file`) and the default spool")
    otlp_endpoint: str | None = _option(
        None, _parse_opt_str,
        env=(_env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, _env.OTEL_EXPORTER_OTLP_ENDPOINT),
        note="the OTLP exporter's own",
        doc="collector address for `backend=otlp`")
    otlp_protocol: str = _option(
        "grpc", _choice(OTLP_PROTOCOLS),
        env=(_env.OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, _env.OTEL_EXPORTER_OTLP_PROTOCOL),
        doc="`grpc` or `http/protobuf`")
    service_name: str = _option(
        "otel-verl", _parse_str, env=(_env.OTEL_SERVICE_NAME,),
        doc="`service.name` on the resource")
    max_field_bytes: int = _option(
        64 * 1024, _int_at_least(256), env=(_env.OTEL_VERL_MAX_FIELD_BYTES,),
        doc="cap of one `input.value`/`output.value` (and of free-text attributes)")
    max_span_bytes: int = _option(
        512 * 1024, _int_at_least(1024), env=(_env.OTEL_VERL_MAX_SPAN_BYTES,),
        doc="cap of input + output of one span")
    redact: bool = _option(
        True, _parse_bool, env=(_env.OTEL_VERL_REDACT,),
        doc="redact secrets (key names like `api_key`, `authorization`, `password`; values that "
            "look like keys or tokens) before anything leaves the process")
    capture_payloads: bool = _option(
        True, _parse_bool, env=(_env.OTEL_VERL_CAPTURE_PAYLOADS,),
        doc="`false` = metadata-only tracing: spans, attributes, usage and errors, no "
            "`input.value`/`output.value`/tool content")
    content_dedup: bool = _option(
        True, _parse_bool,
        doc="per-turn content (docs/content.md): an LLM call records only what its prompt "
            "appends to the trajectory's previous call, by reference; each unique content is "
            "stored once in `<trace_dir>/content/`; `false` = each call records its whole prompt "
            "(capped)")
    content_inline_bytes: int = _option(
        4096, _int_at_least(0),
        doc="a prompt delta up to this many bytes is shown whole in `input.value`; a larger one "
            "is shown by its head (the content store has all of it)")
    content_store_bytes: int = _option(
        1024 * 1024 * 1024, _int_at_least(0), note="1 GiB",
        doc="bytes the content store may take per process and run; content beyond it is not "
            "stored, counted (`content_dropped`) and said (`otel_verl.content.stored=missing`)")
    processor: str = _option(
        "batch", _choice(PROCESSORS), env=(_env.OTEL_VERL_PROCESSOR,),
        doc="`batch`, or `simple` (synchronous export: tests only)")
    max_queue_size: int = _option(
        16384, _int_at_least(1), env=(_env.OTEL_BSP_MAX_QUEUE_SIZE,),
        doc="spans held in memory waiting for export")
    max_export_batch_size: int = _option(
        512, _int_at_least(1), env=(_env.OTEL_BSP_MAX_EXPORT_BATCH_SIZE,),
        doc="spans per export request at most")
    schedule_delay_s: float = _option(
        1.0, _parse_schedule_delay,
        env_parsed=((_env.OTEL_BSP_SCHEDULE_DELAY, _ms_to_s),),
        doc="seconds a finished span waits in memory at most before its batch is exported (to the"
            " durable log with `durable`: what a SIGKILL can lose); at least 0.01 "
            "(`OTEL_BSP_SCHEDULE_DELAY` is in ms)")
    export_timeout_s: float = _option(
        10.0, _parse_positive_float,
        doc="one export request's time limit")
    spool_dir: str | None = _option(
        None, _parse_opt_str, env=(_env.OTEL_VERL_SPOOL_DIR,),
        note="`<trace_dir>/spool/<backend>`",
        doc="the durable log: spans wait there until the backend accepts them")
    weave_entity: str | None = _option(
        None, _parse_opt_str, env=(_env.OTEL_VERL_WEAVE_ENTITY,), note="the W&B default entity",
        doc="Weave entity (then `WANDB_ENTITY`)")
    weave_base_url: str | None = _option(
        None, _parse_opt_str, env=(_env.OTEL_VERL_WEAVE_BASE_URL,),
        note="W&B's hosted trace server",
        doc="Weave trace server (then `WANDB_BASE_URL`)")
    redact_patterns: tuple[str, ...] = _option(
        (), _parse_patterns, env=(_env.OTEL_VERL_REDACT_PATTERNS,),
        doc="more regular expressions whose matches are redacted from everything exported (a "
            "list; in the environment a JSON array or one pattern), added to the built-in "
            "catalogue")
    durable: bool = _option(
        True, _parse_bool, env=(_env.OTEL_VERL_DURABLE,),
        doc="otlp, weave and exporters passed in (batch processor) deliver through a log on disk "
            "(`spool_dir`, default `<trace_dir>/spool/<backend>`): an outage of any length loses "
            "nothing within `max_spool_bytes`; the next process or `otel-verl traces replay` "
            "delivers what a process left")
    max_queue_bytes: int = _option(
        256 * 1024 * 1024, _int_at_least(1024), env=(_env.OTEL_VERL_MAX_QUEUE_BYTES,),
        doc="bytes of finished spans held in memory at most (estimated); from half of it the "
            "queue is handed to the exporter (the log) early, beyond it spans are dropped and "
            "counted")
    max_request_bytes: int = _option(
        3 * 1024 * 1024, _int_at_least(4096), env=(_env.OTEL_VERL_MAX_REQUEST_BYTES,),
        doc="bytes per export request at most (OTLP/JSON size of its spans; under the Collector's"
            " 4 MiB gRPC limit); a larger span is cut to fit and marked `otel_verl.request_truncated`")
    max_spool_bytes: int = _option(
        1024 * 1024 * 1024, _int_at_least(1024 * 1024), env=(_env.OTEL_VERL_MAX_SPOOL_BYTES,),
        doc="bytes the durable log may hold per process; beyond it the oldest spans are dropped, "
            "counted (`dropped_spool_full`) and reported")
    export_delay_s: float = _option(
        1.0, _parse_positive_float, env=(_env.OTEL_VERL_EXPORT_DELAY,),
        doc="with `durable`: a request that is not full leaves once its oldest span waited this "
            "long (the spans are on disk meanwhile); longer fills requests better but leaves more"
            " on disk when a worker is killed (picked up by the next process)")
    tail_keep: tuple[str, ...] = _option(
        (), _parse_tail_keep, env=(_env.OTEL_VERL_TAIL_KEEP,), note="off",
        doc="tail rules that export a trajectory the head rule did not pick, decided when it "
            "ends: `errors`, `truncated`, `reward_outliers`, `flags`, `groups` (a list, or a comma string "
            "in the environment); empty = off (no provisional recording, no cost)")
    group_size: int | None = _option(
        None, _parse_opt_int(1), env=(_env.OTEL_VERL_GROUP_SIZE,),
        also_verl=("actor_rollout_ref.rollout.n",),
        doc="rollouts per GRPO group (verl's `actor_rollout_ref.rollout.n`); a group is decided "
            "when this many of its trajectories ended on this worker, else at a step change, "
            "`tail_group_timeout_s` or a flush; `null` = only then")
    tail_reward_z: float = _option(
        2.0, _parse_z, env=(_env.OTEL_VERL_TAIL_REWARD_Z,),
        doc="`reward_outliers` with continuous rewards: keep a trajectory whose reward is at "
            "least this many standard deviations from its group's mean (a group of n can reach at"
            " most sqrt(n-1): 2.0 needs groups of 5 or more)")
    tail_max_per_step_per_worker: int | None = _option(
        None, _parse_opt_int(0), env=(_env.OTEL_VERL_TAIL_MAX_PER_STEP_PER_WORKER,), note="no cap",
        doc="most trajectories the tail rules add per step per worker (`null` = no cap); the rest"
            " are dropped and counted as `over_budget`")
    tail_buffer_bytes: int = _option(
        64 * 1024 * 1024, _int_at_least(0), env=(_env.OTEL_VERL_TAIL_BUFFER_BYTES,),
        doc="memory for spans of undecided trajectories (estimated bytes); when full, the oldest "
            "undecided trajectories are exported early (reason `overflow`), never dropped")
    tail_group_timeout_s: float = _option(
        300.0, _parse_positive_float, env=(_env.OTEL_VERL_TAIL_GROUP_TIMEOUT_S,),
        doc="an incomplete group is decided with the trajectories it has after this long")
    detect_flags: tuple[str, ...] = _option(
        (), _parse_detect_flags, env=(_env.OTEL_VERL_DETECT_FLAGS,), note="off",
        doc="detectors tagging `rl.flag.<name>` with evidence on trajectory spans, run off the "
            "rollout's loop when a trajectory or its step ends (docs/signals.md): `length_cap`, "
            "`repeated_tool_calls`, `tool_error_streak`, `copied_prompt`, `format_failure`, "
            "`degenerate_group`, `reward_outlier`, `length_outlier`, `reward_hacking`, yours; "
            "`all`; empty = off")
    live: bool = _option(
        False, _parse_bool, env=(_env.OTEL_VERL_LIVE,),
        doc="in-flight records: the spans running now, snapshotted every second to "
            "`<trace_dir>/live/<host>-<pid>.json` (`otel-verl traces live`, the viewer's Live "
            "board), stuck ops sent as `otel_verl.in_flight` spans, a per-step "
            "`otel_verl.straggler_report` (docs/live.md)")
    stuck_after_s: float = _option(
        300.0, _parse_positive_float, env=(_env.OTEL_VERL_STUCK_AFTER_S,),
        doc="an op in flight this long is flagged stuck (earlier: 5x the step's running p99 for "
            "its name, once 20 ended, never under 1 s)")
    compact: bool = _option(
        True, _parse_bool, env=(_env.OTEL_VERL_COMPACT,),
        doc="`backend=file`: the exporter compacts the store into the lake (docs/lakehouse.md) "
            "in a child process at idle CPU priority, started from the export thread, one at a "
            "time: closed store files, and this process's file once `compact_live_bytes` of it "
            "are not compacted; without the `lake` extra it does nothing (said once); `false` = "
            "never (a reader or `otel-verl compact` does it)")
    compact_interval_s: float = _option(
        60.0, _parse_positive_float, env=(_env.OTEL_VERL_COMPACT_INTERVAL_S,),
        doc="with `compact`: the shortest time between two compaction children (doubled after "
            "each failed one, up to an hour)")
    compact_live_bytes: int = _option(
        64 * 1024 * 1024, _int_at_least(1), env=(_env.OTEL_VERL_COMPACT_LIVE_BYTES,),
        note="compaction's own",
        doc="with `compact`: a file still being written is compacted once this many of its bytes"
            " are not compacted")
    weave_ingest: str = _option(
        "calls", _choice(WEAVE_INGEST), env=(_env.OTEL_VERL_WEAVE_INGEST,),
        doc="backend=weave path: `calls` (our exporter: complete calls) or `otel` (Weave's own "
            "OTel ingestion, `/otel/v1/traces`); docs/weave.md compares them")
    weave_keep_trajectory: bool = _option(
        True, _parse_bool, env=(_env.OTEL_EXPORTER_WEAVE_KEEP_TRAJECTORY,),
        doc="the trajectory span is each trajectory's one root call; `false`: verl's shape (the "
            "agent loop is the root; a reward span beside it is a second root)")
    weave_threads: bool = _option(
        True, _parse_bool, env=(_env.OTEL_EXPORTER_WEAVE_THREADS,),
        doc="Weave threads: `thread_id` = the trajectory, `turn_id` on each LLM turn")
    weave_include_otel_attributes: bool = _option(
        True, _parse_bool,
        doc="the span's other attributes, kind, scope and resource under `attributes.otel`")
    wandb_run_id: str | None = _option(
        None, _parse_opt_str, env=(_env.WANDB_RUN_ID,), note="the active wandb run",
        doc="the W&B run every Weave call links to (`wb_run_id`); when unset, `export_env()` "
            "fixes one in the driver (a later `wandb.init` there uses it) for its workers")
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


@dataclasses.dataclass(frozen=True)
class Option:
    """One configuration option, as its ``TraceConfig`` field declares it (see ``_option``)."""

    name: str
    #: the field's annotation, as written (``"int | None"``)
    type: str
    default: Any
    parse: Callable[[Any], Any]
    #: environment names read with ``parse``, first that parses wins
    env: tuple[str, ...]
    #: environment names read with their own parser (another unit or form), after ``env``
    env_parsed: tuple[tuple[str, Callable[[Any], Any]], ...]
    #: verl / Hydra keys, first that is set wins
    verl: tuple[str, ...]
    doc: str
    #: what the default means, where its value says too little
    note: str

    @property
    def env_names(self) -> tuple[str, ...]:
        """Every environment name of the option, in the order they are read."""
        return self.env + tuple(name for name, _ in self.env_parsed)

    @property
    def shown_default(self) -> str:
        """The default as the configuration table shows it."""
        shown = _show(self.default)
        return f"{shown} ({self.note})" if self.note else shown


def _show(value: Any) -> str:
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f"`{value}`"
    if isinstance(value, tuple) and not value:
        return "empty"
    if isinstance(value, int) and value >= 1 << 20 and value % (1 << 20) == 0:
        unit, size = ("GiB", value >> 30) if value % (1 << 30) == 0 else ("MiB", value >> 20)
        return f"{value} ({size} {unit})"
    return repr(value)


def _options() -> tuple[Option, ...]:
    options = []
    for field in dataclasses.fields(TraceConfig):
        row = field.metadata.get(_ROW)
        if isinstance(row, _Row):
            options.append(Option(
                name=field.name, type=str(field.type), default=field.default, parse=row.parse,
                env=row.env, env_parsed=row.env_parsed,
                verl=(VERL_TRACE_PREFIX + field.name, *row.verl), doc=row.doc, note=row.note))
    return tuple(options)


#: every option, in ``TraceConfig``'s order (``chosen`` is bookkeeping, not an option)
OPTIONS: tuple[Option, ...] = _options()
FIELD_NAMES = tuple(option.name for option in OPTIONS)
_OPTION_BY_NAME = {option.name: option for option in OPTIONS}
#: the local store's directory when neither an argument nor the environment names one
DEFAULT_TRACE_DIR: str = _OPTION_BY_NAME["trace_dir"].default


def trace_dir_from_env(environ: Mapping[str, str] | None = None) -> str:
    """The local store's directory: ``$OTEL_VERL_TRACE_DIR`` when set and not empty, else
    ``DEFAULT_TRACE_DIR`` (the one place both are read; the file exporter and the CLI use it)."""
    value = _from_env(_OPTION_BY_NAME["trace_dir"], os.environ if environ is None else environ)
    return DEFAULT_TRACE_DIR if value is _MISSING else str(value)


def options_markdown() -> str:
    """The configuration table for users (docs/configuration.md), one row per option.

    A unit test fails when the page differs; it prints the table to paste.
    """
    rows = ["| option | type | default | environment | verl / Hydra key "
            "(`actor_rollout_ref.rollout.trace.` + ...) | meaning |",
            "|---|---|---|---|---|---|"]
    for option in OPTIONS:
        verl = ", then ".join(f"`{k[len(VERL_TRACE_PREFIX):]}`" if k.startswith(VERL_TRACE_PREFIX)
                              else f"`{k}`" for k in option.verl)
        env = ", ".join(f"`{name}`" for name in option.env_names) or "—"
        kind = option.type.replace("|", "\\|")  # a pipe inside a cell, code span or not
        rows.append(f"| `{option.name}` | `{kind}` | {option.shown_default} | {env} "
                    f"| {verl} | {option.doc} |")
    return "\n".join(rows) + "\n"


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
        wanted = {key for field in OPTIONS for key in field.verl}
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
    for field in OPTIONS:
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


def _turns_tracing_off(field: Option, value: Any, base: Mapping[str, Any],
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


def _parse_or_raise(field: Option, value: Any, key: str) -> Any:
    try:
        return field.parse(value)
    except ConfigError as exc:
        raise ConfigError(f"{key}: {exc}") from None


def _from_env(field: Option, environ: Mapping[str, str], *, ours: bool = True,
              generic: bool = True) -> Any:
    """The field's value from the environment (first name that parses wins), else ``_MISSING``;
    ``ours``/``generic`` select the ``OTEL_VERL_*`` names and the others (standard ones)."""
    sources = [(name, field.parse) for name in field.env] + list(field.env_parsed)
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
        for field in OPTIONS:
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
