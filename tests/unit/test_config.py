"""Configuration precedence, as a table: explicit > verl key > environment > default."""

import json
import logging

import pytest

from otel_verl import ConfigError, RolloutTraceConfig
from otel_verl._config import TraceConfig, flatten_verl_config, resolve_config

VERL = "actor_rollout_ref.rollout.trace."


@pytest.mark.parametrize(
    ("explicit", "verl", "env", "field", "expected"),
    [
        # default
        ({}, None, {}, "backend", "file"),
        ({}, None, {}, "trace_dir", "./otel_verl_traces"),
        ({}, None, {}, "max_samples_per_step_per_worker", None),
        # environment beats default
        ({}, None, {"OTEL_VERL_BACKEND": "otlp"}, "backend", "otlp"),
        ({}, None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4317"}, "otlp_endpoint", "http://a:4317"),
        # the signal-specific variable beats the generic one
        ({}, None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4317",
                    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://b:4317"}, "otlp_endpoint",
         "http://b:4317"),
        ({}, None, {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, "otlp_protocol",
         "http/protobuf"),
        ({}, None, {"OTEL_SERVICE_NAME": "svc"}, "service_name", "svc"),
        ({}, None, {"OTEL_BSP_SCHEDULE_DELAY": "250"}, "schedule_delay_s", 0.25),
        # verl key beats environment
        ({}, {"actor_rollout_ref": {"rollout": {"trace": {"backend": "weave"}}}},
         {"OTEL_VERL_BACKEND": "otlp"}, "backend", "weave"),
        ({}, [VERL + "token2text=true"], {"OTEL_VERL_TOKEN2TEXT": "false"}, "token2text", True),
        ({}, ["trainer.project_name=proj_a"], {"OTEL_VERL_PROJECT_NAME": "env"}, "project_name",
         "proj_a"),
        # the rollout.trace key beats trainer.*
        ({}, [VERL + "project_name=inner", "trainer.project_name=outer"], {}, "project_name",
         "inner"),
        # verl's explicit null backend turns tracing off even when the environment says otlp
        ({}, [VERL + "backend=null"], {"OTEL_VERL_BACKEND": "otlp"}, "backend", None),
        # explicit beats everything
        ({"backend": "console"}, [VERL + "backend=otlp"], {"OTEL_VERL_BACKEND": "weave"},
         "backend", "console"),
        # 0 is honoured (not treated as "unset")
        ({"max_samples_per_step_per_worker": 0}, [VERL + "max_samples_per_step_per_worker=5"], {},
         "max_samples_per_step_per_worker", 0),
        ({}, ["+" + VERL + "max_samples_per_step_per_worker=3"], {},
         "max_samples_per_step_per_worker", 3),
    ],
)
def test_precedence(explicit, verl, env, field, expected):
    config = resolve_config(explicit, verl, env)
    assert getattr(config, field) == expected


@pytest.mark.parametrize(
    ("explicit", "verl", "message"),
    [
        ({"max_samples_per_step_per_worker": -1}, None, "max_samples_per_step_per_worker"),
        ({"otlp_protocol": "udp"}, None, "grpc, http/protobuf"),
        ({"token2text": "maybe"}, None, "token2text"),
        ({}, [VERL + "max_samples_per_step_per_worker=-2"], VERL + "max_samples_per_step_per_worker"),
        ({}, [VERL + "processor=fast"], "batch, simple"),
        ({"no_such_option": 1}, None, "unknown option"),
        ({}, ["not-an-override"], "key=value"),
    ],
)
def test_bad_explicit_or_verl_value_raises_naming_the_key(explicit, verl, message):
    with pytest.raises(ConfigError, match=message.replace("+", r"\+").replace(".", r"\.")):
        resolve_config(explicit, verl, {})


def test_bad_environment_value_warns_and_falls_back(caplog):
    caplog.set_level(logging.WARNING, "otel_verl")
    config = resolve_config({}, None, {"OTEL_VERL_MAX_SAMPLES_PER_STEP_PER_WORKER": "-3",
                                       "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "carrier-pigeon",
                                       "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"})
    assert config.max_samples_per_step_per_worker is None
    assert config.otlp_protocol == "http/protobuf"
    assert "OTEL_VERL_MAX_SAMPLES_PER_STEP_PER_WORKER" in caplog.text
    assert "carrier-pigeon" in caplog.text


def test_verl_config_as_nested_mapping_and_omegaconf_like():
    class Node(dict):  # OmegaConf DictConfig behaves like a mapping with get/keys
        pass

    cfg = Node(actor_rollout_ref=Node(rollout=Node(trace=Node(
        backend="otlp", token2text=True, max_samples_per_step_per_worker=None))),
        trainer=Node(project_name="p", experiment_name="e"))
    flat = flatten_verl_config(cfg)
    assert flat[VERL + "backend"] == "otlp"
    config = resolve_config({}, cfg, {})
    assert (config.backend, config.token2text, config.project_name, config.experiment_name) == (
        "otlp", True, "p", "e")


def test_worker_environment_round_trip():
    driver = resolve_config({"project_name": "p", "experiment_name": "e", "backend": "otlp",
                             "max_samples_per_step_per_worker": 2}, None, {})
    env = {"OTEL_VERL_CONFIG": driver.to_json()}
    assert resolve_config({}, None, env) == driver
    # an individual variable still overrides the carried configuration in the worker
    env["OTEL_VERL_BACKEND"] = "console"
    assert resolve_config({}, None, env).backend == "console"


def test_init_reads_verl_config_and_exports_env(tmp_path, monkeypatch):
    monkeypatch.delenv("OTEL_VERL_CONFIG", raising=False)
    RolloutTraceConfig.init(None, None, verl_config=[
        "trainer.project_name=pp", "trainer.experiment_name=ee",
        VERL + "backend=file", VERL + f"trace_dir={tmp_path}"])
    assert RolloutTraceConfig.get_backend() == "file"
    config = RolloutTraceConfig.get_config()
    assert (config.project_name, config.experiment_name, config.trace_dir) == ("pp", "ee",
                                                                               str(tmp_path))
    env = RolloutTraceConfig.export_env()
    RolloutTraceConfig.reset()
    monkeypatch.setenv("OTEL_VERL_CONFIG", env["OTEL_VERL_CONFIG"])
    assert RolloutTraceConfig.init_from_env() is True
    assert RolloutTraceConfig.get_config() == config


def test_export_env_makes_paths_absolute(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    RolloutTraceConfig.init("p", "e", "file", trace_dir="rel_traces")
    carried = json.loads(RolloutTraceConfig.export_env()["OTEL_VERL_CONFIG"])
    assert carried["trace_dir"] == str(tmp_path / "rel_traces")


def test_init_from_env_without_configuration_is_off(monkeypatch):
    monkeypatch.delenv("OTEL_VERL_CONFIG", raising=False)
    assert RolloutTraceConfig.init_from_env() is False


def test_defaults_are_documented_values():
    config = TraceConfig()
    assert config.redact is True and config.token2text is False and config.enabled


@pytest.mark.parametrize("bad", ["inf", "nan", "-1", "0"])
def test_delays_must_be_finite_and_positive(bad):
    with pytest.raises(ConfigError, match="schedule_delay_s"):
        resolve_config({"schedule_delay_s": bad}, None, {})
    assert resolve_config({}, None, {"OTEL_BSP_SCHEDULE_DELAY": bad}).schedule_delay_s == 1.0


def test_readme_configuration_table_is_generated_from_the_field_table():
    """One source of truth: the README's table is ``markdown_table()`` verbatim."""
    from pathlib import Path

    from otel_verl._config import markdown_table

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    start = readme.index("<!-- config-table:")
    start = readme.index("\n", start) + 1
    end = readme.index("<!-- /config-table -->")
    expected = markdown_table()
    assert readme[start:end] == expected, (
        "README.md's configuration table is out of date; replace it with:\n" + expected)


@pytest.mark.parametrize("environ, backend", [
    ({"OTEL_TRACES_EXPORTER": "otlp"}, "otlp"),
    ({"OTEL_TRACES_EXPORTER": "console,otlp"}, "console"),
    ({"OTEL_TRACES_EXPORTER": "none"}, "none"),
    ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_VERL_BACKEND": "file"}, "file"),  # ours ranks higher
    ({"OTEL_TRACES_EXPORTER": "zipkin"}, "file"),  # not ours: warn, fall back to the default
    ({}, "file"),
])
def test_otel_traces_exporter_is_honoured_below_our_backend(environ, backend, caplog):
    from otel_verl._config import resolve_config

    assert resolve_config(environ=environ).backend == backend
    if environ.get("OTEL_TRACES_EXPORTER") == "zipkin":
        assert "OTEL_TRACES_EXPORTER" in caplog.text


def test_verl_key_outranks_otel_traces_exporter():
    from otel_verl._config import resolve_config

    config = resolve_config(verl_config=["actor_rollout_ref.rollout.trace.backend=weave"],
                            environ={"OTEL_TRACES_EXPORTER": "none"})
    assert config.backend == "weave"
