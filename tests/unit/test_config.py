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


# --- the worker side: export_env() in the driver, init_from_env() in the worker -----------------


@pytest.mark.parametrize("backend", ["weave", "file"])
def test_worker_keeps_the_drivers_backend_under_otel_traces_exporter_none(monkeypatch, tmp_path,
                                                                          backend):
    """The README's opentelemetry-instrument setup (OTEL_TRACES_EXPORTER=none) in a Ray worker
    must not turn off the backend the driver chose explicitly."""
    monkeypatch.delenv("OTEL_VERL_CONFIG", raising=False)
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    RolloutTraceConfig.init("p", "e", backend, trace_dir=str(tmp_path),
                            weave_entity="ent", weave_base_url="http://127.0.0.1:9",
                            wandb_run_id="run1")
    assert RolloutTraceConfig.get_backend() == backend
    env = RolloutTraceConfig.export_env()
    RolloutTraceConfig.reset()  # the worker: a fresh process with the driver's environment
    monkeypatch.setenv("OTEL_VERL_CONFIG", env["OTEL_VERL_CONFIG"])
    assert RolloutTraceConfig.init_from_env() is True
    assert RolloutTraceConfig.get_backend() == backend
    assert RolloutTraceConfig.get_client() is not None


@pytest.mark.parametrize(
    ("driver", "worker_env", "field", "expected"),
    [
        # the driver's explicit choice: no standard variable in the worker undoes it
        ({"explicit": {"backend": "weave"}}, {"OTEL_TRACES_EXPORTER": "none"}, "backend", "weave"),
        ({"explicit": {"backend": "weave"}}, {"OTEL_TRACES_EXPORTER": "otlp"}, "backend", "weave"),
        ({"verl": [VERL + "backend=otlp"]}, {"OTEL_TRACES_EXPORTER": "console"}, "backend", "otlp"),
        ({"explicit": {"backend": None}}, {"OTEL_TRACES_EXPORTER": "weave"}, "backend", None),
        ({"explicit": {"otlp_endpoint": "http://a:4317"}},
         {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://b:4317"}, "otlp_endpoint", "http://a:4317"),
        ({"explicit": {"service_name": "drv"}}, {"OTEL_SERVICE_NAME": "w"}, "service_name", "drv"),
        ({"explicit": {"schedule_delay_s": 2}}, {"OTEL_BSP_SCHEDULE_DELAY": "250"},
         "schedule_delay_s", 2.0),
        ({"explicit": {"weave_keep_trajectory": False}},
         {"OTEL_EXPORTER_WEAVE_KEEP_TRAJECTORY": "true"}, "weave_keep_trajectory", False),
        # ... but a worker's OTEL_VERL_* variable does (ours, named on purpose)
        ({"explicit": {"backend": "weave"}}, {"OTEL_VERL_BACKEND": "console"}, "backend",
         "console"),
        ({"explicit": {"backend": "weave"}}, {"OTEL_VERL_BACKEND": "none"}, "backend", "none"),
        ({"explicit": {"trace_dir": "/d"}}, {"OTEL_VERL_TRACE_DIR": "/w"}, "trace_dir", "/w"),
        ({"explicit": {"token2text": True}}, {"OTEL_VERL_TOKEN2TEXT": "false"}, "token2text",
         False),
        # what the driver did not choose: the worker's standard variables apply ...
        ({}, {"OTEL_TRACES_EXPORTER": "otlp"}, "backend", "otlp"),
        ({}, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://b:4317"}, "otlp_endpoint", "http://b:4317"),
        ({"env": {"OTEL_SERVICE_NAME": "drv"}}, {"OTEL_SERVICE_NAME": "w"}, "service_name", "w"),
        # ... else the driver's value travels
        ({"env": {"OTEL_SERVICE_NAME": "drv"}}, {}, "service_name", "drv"),
        ({"explicit": {"max_samples_per_step_per_worker": 0}}, {}, "max_samples_per_step_per_worker",
         0),
        # a standard variable never turns tracing off where the driver traces
        ({}, {"OTEL_TRACES_EXPORTER": "none"}, "backend", "file"),
        ({"env": {"OTEL_TRACES_EXPORTER": "otlp"}}, {"OTEL_TRACES_EXPORTER": "none"}, "backend",
         "otlp"),
        # a worker's own explicit argument still ranks first
        ({"explicit": {"backend": "weave"}}, {"explicit": {"backend": "file"}}, "backend", "file"),
    ],
)
def test_worker_precedence(driver, worker_env, field, expected):
    """Worker side: explicit > verl key > OTEL_VERL_* > the driver's choice > standard OTEL_* >
    the rest of the driver's configuration > default."""
    config = resolve_config(driver.get("explicit"), driver.get("verl"), driver.get("env", {}))
    worker_env = dict(worker_env)
    worker_explicit = worker_env.pop("explicit", None)
    env = {"OTEL_VERL_CONFIG": config.to_json(), **worker_env}
    worker = resolve_config(worker_explicit, None, env)
    assert getattr(worker, field) == expected
    # and one process further (a worker's worker): the driver's choices are still choices
    again = resolve_config(None, None, {"OTEL_VERL_CONFIG": worker.to_json(), **worker_env})
    assert getattr(again, field) == expected


def test_a_standard_variable_turning_tracing_off_says_so(caplog):
    caplog.set_level(logging.WARNING, "otel_verl")
    assert resolve_config(None, None, {"OTEL_TRACES_EXPORTER": "none"}).backend == "none"
    assert "OTEL_TRACES_EXPORTER=none turns otel_verl's tracing off" in caplog.text
    caplog.clear()
    driver = resolve_config({"backend": "otlp"}, None, {})
    worker = resolve_config(None, None, {"OTEL_VERL_CONFIG": driver.to_json(),
                                         "OTEL_TRACES_EXPORTER": "none"})
    assert worker.backend == "otlp" and caplog.text == ""  # the driver's choice: nothing to say
    undecided = resolve_config(None, None, {"OTEL_VERL_CONFIG": TraceConfig().to_json(),
                                            "OTEL_TRACES_EXPORTER": "none"})
    assert undecided.backend == "file" and "ignoring OTEL_TRACES_EXPORTER=none" in caplog.text


def test_export_env_marks_the_drivers_choices(monkeypatch, tmp_path):
    RolloutTraceConfig.init("p", "e", "file", trace_dir=str(tmp_path), wandb_run_id="r9")
    carried = json.loads(RolloutTraceConfig.export_env()["OTEL_VERL_CONFIG"])
    assert {"backend", "project_name", "experiment_name", "trace_dir", "wandb_run_id"} <= \
        set(carried["chosen"])
    assert "service_name" not in carried["chosen"]
