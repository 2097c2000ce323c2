"""The patch in processes that import verl on their own (Ray workers, engine servers)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from otel_verl import semconv
from otel_verl.integrations.verl import BOOTSTRAP_DIR, instrumentation_env
from otel_verl.store import read_spans

HERE = Path(__file__).parent
SCRIPT = HERE / "_fresh_process.py"
VERL_OPS = {"ToolAgentLoop.run", "LLMServerClient.generate", "HermesToolParser.extract_tool_calls",
            "CalculatorTool.execute", "CalculatorTool.create", "CalculatorTool.release",
            "AgentLoopWorker._compute_score", "agent_loop"}


def _env(tmp_path: Path, extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(OTEL_VERL_TRACE_DIR=str(tmp_path / "traces"), OTEL_VERL_PROCESSOR="simple",
               TOKENIZERS_PARALLELISM="false")
    env.update(extra)
    # the harness modules sit next to this file; appended so the bootstrap stays first
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), str(HERE)) if p)
    return env


def _run(cmd: list[str], env: dict[str, str], cwd: Path) -> dict:
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def _check_spans(tmp_path: Path) -> None:
    spans = list(read_spans(tmp_path / "traces"))
    assert {s["name"] for s in spans} == VERL_OPS
    trajectories = [s for s in spans if s["attributes"].get(semconv.OTEL_VERL_TRAJECTORY)]
    assert sorted(t["attributes"][semconv.ROLLOUT_SAMPLE_INDEX] for t in trajectories) == [0, 1]
    assert all(s["attributes"][semconv.ROLLOUT_STEP] == 5 for s in spans)


def test_worker_environment_patches_a_process_that_imports_verl_first(tiny_model, tmp_path):
    env = _env(tmp_path, instrumentation_env({}))
    assert env["PYTHONPATH"].split(os.pathsep)[0] == BOOTSTRAP_DIR
    args = {"model": str(tiny_model), "tmp": str(tmp_path), "trace": {"backend": "file"}}
    result = _run([sys.executable, str(SCRIPT), json.dumps(args)], env, tmp_path)
    assert result == {"routed": True, "otel_verl_loaded": True, "backend": "file"}
    _check_spans(tmp_path)


def test_without_the_environment_verl_is_untouched(tiny_model, tmp_path):
    args = {"model": str(tiny_model), "tmp": str(tmp_path), "trace": {"backend": "file"}}
    result = _run([sys.executable, str(SCRIPT), json.dumps(args)], _env(tmp_path, {}), tmp_path)
    # verl's own code: otel_verl never loaded, "file" is no verl backend, nothing traced
    assert result == {"routed": False, "otel_verl_loaded": False, "backend": "file"}
    assert not (tmp_path / "traces").exists()


def test_late_install_reroutes_already_imported_verl_and_uninstall_restores(tiny_model, tmp_path):
    args = {"model": str(tiny_model), "tmp": str(tmp_path), "trace": {"backend": "file"},
            "late_install": True}
    result = _run([sys.executable, str(SCRIPT), json.dumps(args)], _env(tmp_path, {}), tmp_path)
    assert result["routed"] is True and result["backend"] == "file"
    assert result["after_uninstall_routed"] is False
    assert result["after_uninstall_module"] == "verl.utils.rollout_trace"
    _check_spans(tmp_path)


def test_opentelemetry_instrument_launcher_and_its_child_processes(tiny_model, tmp_path):
    launcher = shutil.which("opentelemetry-instrument", path=os.path.dirname(sys.executable))
    if launcher is None:
        pytest.fail("opentelemetry-instrument missing: install requirements/verl.txt")
    args = {"model": str(tiny_model), "tmp": str(tmp_path), "trace": {"backend": "file"},
            "report_wandb_run_id": True}
    # the launcher runs our instrumentor (entry point "verl"); the script then starts a CHILD
    # python that imports verl on its own, like a Ray worker spawned by the driver. The driver
    # prints the W&B run id it fixed before starting the child (wandb is installed here).
    child = (f"import json, os, subprocess, sys; "
             f"a = json.loads({json.dumps(args)!r}); "
             f"a['driver_wandb_run_id'] = os.environ.get('WANDB_RUN_ID'); "
             f"out = subprocess.run([sys.executable, {str(SCRIPT)!r}, json.dumps(a)], "
             f"capture_output=True, text=True); print(out.stdout); print(out.stderr[-3000:], "
             f"file=sys.stderr); sys.exit(out.returncode)")
    env = _env(tmp_path, {"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none",
                          "OTEL_LOGS_EXPORTER": "none"})
    env.pop("WANDB_RUN_ID", None)
    result = _run([launcher, sys.executable, "-c", child], env, tmp_path)
    run_id, driver_run_id = result.pop("wandb_run_id"), result.pop("driver_wandb_run_id")
    assert result == {"routed": True, "otel_verl_loaded": True, "backend": "file"}
    # the driver fixed one run id; the worker inherited it instead of inventing its own
    assert isinstance(run_id, str) and len(run_id) == 8 and run_id == driver_run_id, result
    _check_spans(tmp_path)


def test_ray_actor_agent_loop_worker_is_traced(tiny_model, tmp_path):
    """install() in the driver; verl's AgentLoopWorker runs as a Ray actor in its own process."""
    pytest.importorskip("ray")
    args = {"model": str(tiny_model), "tmp": str(tmp_path), "mode": "install"}
    result = _run([sys.executable, str(HERE / "_ray_driver.py"), json.dumps(args)],
                  _env(tmp_path, {}), tmp_path)
    assert result["probe"]["routed"] is True and result["probe"]["pid"] != result["driver_pid"]
    assert result["flushed"] is True and result["scores"] == [1.0] * 8
    spans = list(read_spans(tmp_path / "traces"))
    assert {s["name"] for s in spans} == VERL_OPS
    pids = {s["resource"].get(semconv.PROCESS_PID) for s in spans}
    assert result["driver_pid"] not in pids and len(pids) == 1  # written by the actor
    from otel_verl import TrajectorySampler

    chosen = TrajectorySampler(2, "exp_it").select([0, 1, 2, 3])
    trajectories = {(s["attributes"][semconv.ROLLOUT_SAMPLE_INDEX],
                     s["attributes"][semconv.ROLLOUT_ROLLOUT_N])
                    for s in spans if s["attributes"].get(semconv.OTEL_VERL_TRAJECTORY)}
    assert trajectories == {(i, n) for i in chosen for n in (0, 1)}


def test_ray_worker_process_setup_hook_installs_it_without_the_driver(tiny_model, tmp_path):
    """The multi-node recipe: verl's ray.init gets worker_process_setup_hook=...install."""
    pytest.importorskip("ray")
    args = {"model": str(tiny_model), "tmp": str(tmp_path), "mode": "setup_hook"}
    result = _run([sys.executable, str(HERE / "_ray_driver.py"), json.dumps(args)],
                  _env(tmp_path, {}), tmp_path)
    assert result["driver_has_otel_verl"] is False
    assert result["probe"]["routed"] is True and result["probe"]["pid"] != result["driver_pid"]


def test_the_instrumentor_fixes_the_wandb_run_only_in_the_driver(monkeypatch):
    """Workers inherit the driver's WANDB_RUN_ID; a worker inventing its own would unlink its
    Weave calls from the run verl starts later."""
    from otel_verl.integrations import verl as integration

    calls = []
    monkeypatch.setattr("otel_verl._config.preset_wandb_run_id", lambda: calls.append(1))
    monkeypatch.setattr(integration, "install", lambda propagate=True: None)
    monkeypatch.delenv("OTEL_VERL_CONFIG", raising=False)
    monkeypatch.setenv("PYTHONPATH", BOOTSTRAP_DIR)  # a process the integration started
    assert not integration.is_driver_process()
    integration.VerlInstrumentor()._instrument()
    assert calls == []
    monkeypatch.setenv("PYTHONPATH", str(HERE))  # the process a user started
    assert integration.is_driver_process()
    integration.VerlInstrumentor()._instrument(link_wandb_run=False)
    assert calls == []
    integration.VerlInstrumentor()._instrument()
    assert calls == [1]
    monkeypatch.setenv("OTEL_VERL_CONFIG", "{}")  # export_env()'s variable: a worker
    assert not integration.is_driver_process()
