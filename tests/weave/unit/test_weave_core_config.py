"""The Weave exporter inside otel_verl: its options in the core's one configuration table, the
W&B run id fixed up front for workers, one stats vocabulary. Pure (no weave, no wandb import)."""

from __future__ import annotations

import dataclasses
import json
import sys
import types

import pytest
from _common import API_KEY

otel_verl = pytest.importorskip("otel_verl", reason="needs the otel_verl core")

from otel_verl import RolloutTraceConfig  # noqa: E402 -- after importorskip
from otel_verl._config import TraceConfig, resolve_config, with_wandb_run_id  # noqa: E402
from otel_weave_exporter import ExporterConfig  # noqa: E402


def _init(monkeypatch, tmp_path, **options):
    """The Weave exporter otel_verl builds (unwrapped from the core's durable log)."""
    monkeypatch.setenv("WANDB_API_KEY", API_KEY)
    RolloutTraceConfig.init("proj", "exp", backend="weave", weave_entity="ent",
                            weave_base_url="http://127.0.0.1:9", trace_dir=str(tmp_path),
                            **options)
    client = RolloutTraceConfig.get_client()
    while hasattr(client, "inner"):
        client = client.inner
    return client


def test_core_defaults_are_the_exporters():
    core, exporter = TraceConfig(), {f.name: f.default for f in dataclasses.fields(ExporterConfig)}
    assert core.weave_keep_trajectory == exporter["keep_trajectory_spans"] is True
    assert core.weave_threads == exporter["threads"] is True
    assert core.weave_include_otel_attributes == exporter["include_otel_attributes"] is True
    assert core.wandb_run_id is exporter["wandb_run_id"] is None


@pytest.mark.parametrize(("source", "expected_keep"), [
    ({}, True),
    ({"env": {"OTEL_EXPORTER_WEAVE_KEEP_TRAJECTORY": "false"}}, False),
    ({"verl": ["actor_rollout_ref.rollout.trace.weave_keep_trajectory=false"]}, False),
    ({"explicit": {"weave_keep_trajectory": False}}, False),
])
def test_weave_options_reach_the_exporter_from_every_source(monkeypatch, tmp_path, source,
                                                            expected_keep):
    for name, value in source.get("env", {}).items():
        monkeypatch.setenv(name, value)
    options = dict(source.get("explicit", {}))
    if "verl" in source:
        options["verl_config"] = source["verl"]
    client = _init(monkeypatch, tmp_path, weave_threads=False, wandb_run_id="r1", **options)
    cfg = client.config
    assert (cfg.entity, cfg.project, cfg.base_url) == ("ent", "proj", "http://127.0.0.1:9")
    assert cfg.keep_trajectory_spans is expected_keep
    assert cfg.threads is False and cfg.wandb_run_id == "r1"


def test_weave_ingest_otel_uses_weaves_own_endpoint(monkeypatch, tmp_path):
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
    client = _init(monkeypatch, tmp_path, weave_ingest="otel")
    assert type(client).__name__ == "WeaveOtlpSpanExporter"
    assert client.endpoint == "http://127.0.0.1:9/otel/v1/traces"
    with pytest.raises(ValueError, match="weave_ingest"):
        resolve_config({"weave_ingest": "grpc"})


def test_wandb_run_id_is_fixed_up_front_for_the_workers(monkeypatch):
    env: dict[str, str] = {}
    weave = TraceConfig(backend="weave")
    monkeypatch.delitem(sys.modules, "wandb", raising=False)
    assert with_wandb_run_id(TraceConfig(backend="otlp"), env).wandb_run_id is None
    assert with_wandb_run_id(dataclasses.replace(weave, wandb_run_id="mine"), env) \
        .wandb_run_id == "mine"
    # no run, nothing preset, wandb installed: a fresh id, also for a later wandb.init here
    monkeypatch.setattr("importlib.util.find_spec", lambda name: object())
    fixed = with_wandb_run_id(weave, env).wandb_run_id
    assert fixed and len(fixed) == 8 and env == {"WANDB_RUN_ID": fixed}
    assert with_wandb_run_id(weave, env).wandb_run_id == fixed  # stable across calls
    # a run already active in the driver wins
    fake = types.ModuleType("wandb")
    fake.run = types.SimpleNamespace(id="active1")
    monkeypatch.setitem(sys.modules, "wandb", fake)
    assert with_wandb_run_id(weave, {}).wandb_run_id == "active1"
    # wandb not installed: nothing to link to, nothing written
    monkeypatch.delitem(sys.modules, "wandb")
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    empty: dict[str, str] = {}
    assert with_wandb_run_id(weave, empty).wandb_run_id is None and empty == {}


def test_export_env_carries_the_run_id(monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_RUN_ID", "preset7")
    _init(monkeypatch, tmp_path)
    carried = json.loads(RolloutTraceConfig.export_env()["OTEL_VERL_CONFIG"])
    assert carried["wandb_run_id"] == "preset7"


def test_one_stats_vocabulary(monkeypatch, tmp_path):
    """The Weave exporter's counters use the names of otel_verl.exporters' table where they mean
    the same thing; the few that are its own are listed here."""
    import re

    from otel_verl import exporters
    from otel_weave_exporter import STATS_KEYS

    core = set(re.findall(r"^``(\w+)``", exporters.__doc__ or "", re.M))
    assert {"delivered", "spooled", "spool_failed", "quarantined", "requests"} <= core
    own = {"received", "undelivered", "skipped", "translate_failed", "dropped_busy"}
    assert set(STATS_KEYS) - core == own
    weave = _init(monkeypatch, tmp_path)
    assert set(weave.stats()) == set(STATS_KEYS)
    assert not any(k.startswith(("calls_", "spans_")) for k in RolloutTraceConfig.stats())
