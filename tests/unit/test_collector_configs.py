"""Static checks of collector-config/ and docker/compose.yaml.

No otelcol-contrib binary can be installed on the dev/CI machine (no Docker engine; nothing on
PyPI, npm or Debian ships one), so `otelcol-contrib validate` cannot run here. These tests check
what it would: that the YAML parses, that every component exists in the pinned distribution, that
pipelines reference only defined components and every defined component is used; plus what it
would not: that the compose file, the configs and otel_verl agree on files, ports, service names
and attribute keys, and that the redaction patterns mask secrets but not token counts.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from otel_verl import semconv

ROOT = Path(__file__).resolve().parents[2]
CONFIG_DIR = ROOT / "collector-config"
COMPOSE = ROOT / "docker" / "compose.yaml"
CONFIGS = ["sidecar.yaml", "gateway.yaml"]
KINDS = {"receivers": "receiver", "processors": "processor", "exporters": "exporter",
         "extensions": "extension", "connectors": "connector"}
ENV_REF = re.compile(r"\$\{env:([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def component_list() -> tuple[str, dict[tuple[str, str], str]]:
    """(version, {(kind, type): status}) from the checked-in component list."""
    files = sorted(CONFIG_DIR.glob("otelcol-contrib-*-components.txt"))
    assert len(files) == 1, files
    version = re.match(r"otelcol-contrib-(.+)-components\.txt", files[0].name).group(1)
    table = {}
    for line in files[0].read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        kind, ctype, _module, status = line.split()
        table[(kind, ctype)] = status
    return version, table


def load(name: str) -> dict[str, Any]:
    return yaml.safe_load((CONFIG_DIR / name).read_text())


def expand_env(text: str, env: dict[str, str | None] | None = None) -> str:
    """The collector's `${env:NAME:-default}` substitution: the default only when NAME is unset
    (absent from `env`, or None there, as compose's pass-through leaves it)."""
    env = env or {}

    def value(m: re.Match[str]) -> str:
        got = env.get(m.group(1))
        if got is not None:
            return got
        default = m.group(2) or ""
        whole = m.string[m.start() - 2:m.start()] == ": " and m.string[m.end():m.end() + 1] in (
            "\n", "")
        # an explicitly empty default is kept as the empty STRING (envprovider special-cases it)
        return '""' if whole and default == "" else default

    return ENV_REF.sub(value, text)


def load_expanded(name: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    return yaml.safe_load(expand_env((CONFIG_DIR / name).read_text(), env))


def ctype(component_id: str) -> str:
    return component_id.split("/", 1)[0]


def port_of(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1])


# --- the component list itself ---------------------------------------------------------------------


def test_component_list_is_the_whole_distribution() -> None:
    version, table = component_list()
    assert re.fullmatch(r"\d+\.\d+\.\d+", version)
    kinds = {k for k, _ in table}
    assert kinds == {"receiver", "processor", "exporter", "extension", "connector"}
    assert len(table) > 200  # the contrib build has ~240 components; a stub list would be tiny
    # core components are verified against their metadata.yaml, with the renamed OTLP exporters
    assert table[("exporter", "otlp_grpc")] == "verified"
    assert table[("exporter", "otlp")] == "deprecated-alias"
    assert table[("receiver", "otlp")] == "verified"


# --- every config ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", CONFIGS)
def test_config_parses_and_has_traces_pipelines(name: str) -> None:
    cfg = load(name)
    assert isinstance(cfg, dict)
    pipelines = cfg["service"]["pipelines"]
    assert pipelines
    for pid in pipelines:
        assert ctype(pid) == "traces", f"{name}: {pid} is not a traces pipeline"


@pytest.mark.parametrize("name", CONFIGS)
def test_every_component_exists_in_the_pinned_distribution(name: str) -> None:
    _, table = component_list()
    cfg = load(name)
    for section, kind in KINDS.items():
        for cid in cfg.get(section) or {}:
            status = table.get((kind, ctype(cid)))
            assert status is not None, f"{name}: {kind} {cid!r} is not in otelcol-contrib"
            assert status == "verified", (
                f"{name}: {kind} {cid!r} is {status}: read its metadata.yaml and mark it verified")


@pytest.mark.parametrize("name", CONFIGS)
def test_pipelines_reference_defined_components_and_all_are_used(name: str) -> None:
    cfg = load(name)
    service = cfg["service"]
    used: dict[str, set[str]] = {s: set() for s in KINDS}
    for pid, pipe in service["pipelines"].items():
        assert pipe.get("receivers"), f"{name}: {pid} has no receiver"
        assert pipe.get("exporters"), f"{name}: {pid} has no exporter"
        for section in ("receivers", "processors", "exporters"):
            refs = pipe.get(section) or []
            assert len(refs) == len(set(refs)), f"{name}: {pid} lists a {section[:-1]} twice"
            for ref in refs:
                assert ref in (cfg.get(section) or {}), f"{name}: {pid} uses undefined {ref!r}"
                used[section].add(ref)
    for ext in service.get("extensions") or []:
        assert ext in (cfg.get("extensions") or {}), f"{name}: undefined extension {ext!r}"
        used["extensions"].add(ext)
    for section in KINDS:
        unused = set(cfg.get(section) or {}) - used[section]
        assert not unused, f"{name}: defined but unused {section}: {sorted(unused)}"


@pytest.mark.parametrize("name", CONFIGS)
def test_processor_order(name: str) -> None:
    """memory_limiter first (refuse before OOM), batch last (batch what survives)."""
    cfg = load(name)
    for pid, pipe in cfg["service"]["pipelines"].items():
        procs = [ctype(p) for p in pipe.get("processors") or []]
        assert procs and procs[0] == "memory_limiter", f"{name}: {pid}: {procs}"
        if "batch" in procs:
            assert procs[-1] == "batch", f"{name}: {pid}: {procs}"


@pytest.mark.parametrize("name", CONFIGS)
def test_env_references_are_well_formed(name: str) -> None:
    text = (CONFIG_DIR / name).read_text()
    code = "\n".join(line.split("#", 1)[0] for line in text.splitlines())
    assert code.count("${") == len(ENV_REF.findall(code)), f"{name}: malformed ${{...}}"
    assert not re.search(r"\$[A-Za-z_]", code), f"{name}: bare $VAR (not expanded by otelcol)"
    # with only the defaults, the result is still a complete config with typed values
    cfg = load_expanded(name)
    assert cfg["service"]["pipelines"]


@pytest.mark.parametrize("name", CONFIGS)
def test_receivers_accept_chat_sized_payloads(name: str) -> None:
    cfg = load(name)
    for rid, rcv in cfg["receivers"].items():
        grpc_cfg = rcv["protocols"]["grpc"]
        assert grpc_cfg["max_recv_msg_size_mib"] >= 16, rid  # default 4 MiB is too small
        if "http" in rcv["protocols"]:
            assert rcv["protocols"]["http"]["max_request_body_size"] >= 16 * 2**20, rid


@pytest.mark.parametrize("name", CONFIGS)
def test_resource_attributes_have_values_with_defaults(name: str) -> None:
    cfg = load_expanded(name)
    for pid, proc in cfg["processors"].items():
        if ctype(pid) == "resource":
            for action in proc["attributes"]:
                assert isinstance(action["value"], str), (pid, action)


# --- sidecar ---------------------------------------------------------------------------------------


def test_sidecar_shape() -> None:
    cfg = load_expanded("sidecar.yaml")
    assert {port_of(p["endpoint"]) for p in cfg["receivers"]["otlp"]["protocols"].values()} == {
        4317, 4318}
    exporters = {ctype(e) for e in cfg["exporters"]}
    assert exporters == {"otlp_grpc", "otlp_http", "file"}  # Jaeger/gateway, Weave, archive
    weave = cfg["exporters"]["otlp_http/weave"]
    assert weave["traces_endpoint"].endswith("/otel/v1/traces")
    assert "wandb-api-key" in weave["headers"]
    assert cfg["exporters"]["otlp_grpc/upstream"]["tls"]["insecure"] is True
    # queued batches survive a collector restart
    storage = cfg["exporters"]["otlp_grpc/upstream"]["sending_queue"]["storage"]
    assert storage in cfg["service"]["extensions"]
    (pipe,) = cfg["service"]["pipelines"].values()
    assert "redaction/secrets" in pipe["processors"]


def _redaction() -> dict[str, Any]:
    return load("sidecar.yaml")["processors"]["redaction/secrets"]


@pytest.mark.parametrize("key", [
    "api_key", "openai.api_key", "OPENAI_API_KEY", "http.request.header.authorization",
    "password", "db.password", "client_secret", "access_token", "auth-token", "set_cookie",
    "aws.credentials",
])
def test_redaction_masks_secret_keys(key: str) -> None:
    patterns = _redaction()["blocked_key_patterns"]
    assert any(re.search(p, key) for p in patterns), key


@pytest.mark.parametrize("key", [
    semconv.GEN_AI_USAGE_INPUT_TOKENS, semconv.GEN_AI_USAGE_OUTPUT_TOKENS,
    semconv.GEN_AI_REQUEST_MAX_TOKENS, semconv.INPUT_VALUE, semconv.OUTPUT_VALUE,
    *semconv.TRAJECTORY_KEYS, semconv.ROLLOUT_REWARD, "gen_ai.tool.call.id", "response_tokens",
])
def test_redaction_keeps_ordinary_keys(key: str) -> None:
    patterns = _redaction()["blocked_key_patterns"]
    assert not any(re.search(p, key) for p in patterns), key


def test_redaction_value_patterns() -> None:
    values = _redaction()["blocked_values"]
    secret = '{"messages": [{"content": "use key sk-abcdefghijklmnopqrstuvwx1234 please"}]}'
    assert any(re.search(p, secret) for p in values)
    assert any(re.search(p, "Authorization: Bearer abcdefghijklmnop.qrstu") for p in values)
    assert any(re.search(p, "AKIAABCDEFGHIJKLMNOP") for p in values)
    ordinary = '{"messages": [{"role": "user", "content": "What is 17 * 23? Think step by step."}]}'
    assert not any(re.search(p, ordinary) for p in values)


# --- gateway ---------------------------------------------------------------------------------------


def test_gateway_routes_by_trace_id_then_samples() -> None:
    cfg = load_expanded("gateway.yaml")
    pipes = cfg["service"]["pipelines"]
    lb = cfg["exporters"]["loadbalancing"]
    assert lb["routing_key"] == "traceID"
    sampling_port = port_of(cfg["receivers"]["otlp/sampling"]["protocols"]["grpc"]["endpoint"])
    assert lb["resolver"]["dns"]["port"] == sampling_port
    assert sampling_port != port_of(cfg["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"])
    for pid, pipe in pipes.items():
        has_lb = "loadbalancing" in pipe["exporters"]
        has_ts = "tail_sampling" in (pipe.get("processors") or [])
        # routing happens on what the sidecars send; sampling only on what was routed here
        assert not (has_lb and has_ts), pid
        if has_lb:
            assert pipe["receivers"] == ["otlp"] and pipe["exporters"] == ["loadbalancing"], pid
        if has_ts:
            assert pipe["receivers"] == ["otlp/sampling"], pid
    assert sum("tail_sampling" in (p.get("processors") or []) for p in pipes.values()) == 1


def test_gateway_policies_use_otel_verl_attribute_keys() -> None:
    cfg = load_expanded("gateway.yaml")
    policies = {p["name"]: p for p in cfg["processors"]["tail_sampling"]["policies"]}
    assert policies["keep-errors"]["status_code"]["status_codes"] == ["ERROR"]
    assert policies["keep-validation"]["boolean_attribute"] == {
        "key": semconv.ROLLOUT_VALIDATE, "value": True}
    chosen = policies["keep-chosen-samples"]["numeric_attribute"]
    assert chosen["key"] == semconv.ROLLOUT_SAMPLE_INDEX
    assert isinstance(chosen["max_value"], int) and chosen["min_value"] == 0
    env = load_expanded("gateway.yaml", {"OTEL_VERL_KEEP_SAMPLE_INDEX_MAX": "15"})
    (chosen15,) = [p for p in env["processors"]["tail_sampling"]["policies"]
                   if p["name"] == "keep-chosen-samples"]
    assert chosen15["numeric_attribute"]["max_value"] == 15


# --- docker compose --------------------------------------------------------------------------------


def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def compose_default(text: str) -> str:
    """docker compose's `${VAR:-default}` interpolation with nothing set."""
    return re.sub(r"\$\{[A-Za-z_][A-Za-z0-9_]*:-([^}]*)\}", r"\1", text)


def published(service: dict[str, Any]) -> dict[int, int]:
    """container port -> host port."""
    out = {}
    for spec in service.get("ports") or []:
        host, container = str(spec).split(":")[-2:]
        out[int(container)] = int(host)
    return out


def test_compose_pins_the_distribution_of_the_component_list() -> None:
    version, _ = component_list()
    services = compose()["services"]
    assert services["otel-sidecar"]["image"] == f"otel/opentelemetry-collector-contrib:{version}"
    assert re.fullmatch(r"jaegertracing/jaeger:2\.\d+\.\d+", services["jaeger"]["image"])


def test_compose_mounts_existing_config_files() -> None:
    services = compose()["services"]
    for name, svc in services.items():
        for vol in svc.get("volumes") or []:
            src = vol.split(":")[0]
            if src.startswith("."):
                assert (COMPOSE.parent / src).resolve().exists(), f"{name}: {src} does not exist"
    sidecar = services["otel-sidecar"]
    mounts = {v.split(":")[1]: (COMPOSE.parent / v.split(":")[0]).resolve()
              for v in sidecar["volumes"] if v.startswith(".")}
    configs = [a.split("=", 1)[1] for a in sidecar["command"]
               if a.startswith("--config=") and not a.startswith("--config=yaml:")]
    assert configs == ["/etc/otelcol/sidecar.yaml"]
    for path in configs:
        mount = next(m for m in mounts if path.startswith(m + "/"))
        assert (mounts[mount] / path[len(mount) + 1:]).is_file(), path


def test_compose_exporter_overlay_names_defined_exporters() -> None:
    sidecar = compose()["services"]["otel-sidecar"]
    (overlay,) = [a for a in sidecar["command"] if a.startswith("--config=yaml:")]
    key, value = compose_default(overlay[len("--config=yaml:"):]).split(": ", 1)
    assert key == "service::pipelines::traces::exporters"
    exporters = yaml.safe_load(value)
    defined = load("sidecar.yaml")["exporters"]
    assert exporters and set(exporters) <= set(defined)
    assert "otlp_grpc/upstream" in exporters
    # the comment's "enable Weave" value is valid too
    assert "otlp_http/weave" in defined


def test_compose_ports_match_the_configs() -> None:
    services = compose()["services"]
    side_cfg = load_expanded("sidecar.yaml")
    sidecar = services["otel-sidecar"]
    ports = published(sidecar)
    receiver_ports = {port_of(p["endpoint"])
                      for p in side_cfg["receivers"]["otlp"]["protocols"].values()}
    health_port = port_of(side_cfg["extensions"]["health_check"]["endpoint"])
    assert receiver_ports | {health_port} == set(ports)
    assert all(ports[p] == p for p in ports)  # same numbers on the host: what docs/scale.md says
    # the sidecar's upstream is a compose service, on a port that service listens on
    upstream = load_expanded("sidecar.yaml", sidecar["environment"])
    host, port = upstream["exporters"]["otlp_grpc/upstream"]["endpoint"].rsplit(":", 1)
    assert host in services and host == "jaeger"
    assert port in {str(p) for p in services[host].get("expose") or []}
    assert 16686 in published(services["jaeger"])
    # nothing else publishes the sidecar's host ports
    for name, svc in services.items():
        if name != "otel-sidecar":
            assert not set(published(svc).values()) & set(ports.values()), name


def test_compose_never_sets_a_variable_to_empty() -> None:
    """otelcol's `${env:X:-default}` applies the default only when X is UNSET; a set-but-empty X
    becomes null (e.g. a resource attribute without a value: the collector refuses to start)."""
    for name, svc in compose()["services"].items():
        env = svc.get("environment") or {}
        assert isinstance(env, dict), name
        for key, value in env.items():
            if value is None:
                continue  # pass-through: set only when set in the caller's shell
            assert compose_default(str(value)) != "", f"{name}: {key} defaults to empty"


def test_compose_healthchecks_probe_the_right_ports() -> None:
    services = compose()["services"]
    side_cfg = load_expanded("sidecar.yaml")
    health = port_of(side_cfg["extensions"]["health_check"]["endpoint"])
    probe = " ".join(services["sidecar-ready"]["healthcheck"]["test"])
    assert f"http://otel-sidecar:{health}/" in probe
    jaeger_probe = " ".join(services["jaeger"]["healthcheck"]["test"])
    assert ":13133/status" in jaeger_probe
    assert services["otel-sidecar"]["depends_on"]["jaeger"]["condition"] == "service_healthy"
    assert services["demo"]["depends_on"]["sidecar-ready"]["condition"] == "service_healthy"


def test_compose_demo_points_at_the_sidecar() -> None:
    services = compose()["services"]
    demo = services["demo"]
    assert demo["profiles"] == ["demo"]  # optional
    env = demo["environment"]
    assert env["OTEL_VERL_BACKEND"] == "otlp"
    host, port = env["OTEL_EXPORTER_OTLP_ENDPOINT"].removeprefix("http://").split(":")
    assert host == "otel-sidecar"
    side_cfg = load_expanded("sidecar.yaml")
    proto = "grpc" if env["OTEL_EXPORTER_OTLP_PROTOCOL"] == "grpc" else "http"
    assert int(port) == port_of(side_cfg["receivers"]["otlp"]["protocols"][proto]["endpoint"])
    script = " ".join(demo["command"])
    assert "otel-verl demo --backend otlp" in script
    assert f"otlp_endpoint={env['OTEL_EXPORTER_OTLP_ENDPOINT']}" in script
    # what it installs from the checkout exists (the checkout is copied to /work/src)
    for rel in re.findall(r"/work/src/([\w./-]+\.txt)", script):
        assert (ROOT / rel).is_file(), rel
    assert "/work/src[otlp,rollout]" in script
    extras = re.search(r"\[project\.optional-dependencies\](.*?)\n\[", (ROOT / "pyproject.toml")
                       .read_text(), re.DOTALL).group(1)
    assert re.search(r"^otlp\s*=", extras, re.MULTILINE) and re.search(r"^rollout\s*=", extras, re.MULTILINE)
