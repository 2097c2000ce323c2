"""`nox -s verl_demo`: unchanged verl 0.9.1 trains 2 GRPO steps on this CPU, traced by otel_verl.

verl's default (v1) trainer, ``python -m verl.trainer.main_ppo`` under ``opentelemetry-instrument``,
the tool agent loop on a real vLLM CPU server actor, the project's tiny model after a short tool
fine-tune; the traces (and vLLM's own ``llm_request`` spans, joined) go to the local store in
``$OTEL_VERL_TRACE_DIR`` (default ``./otel_verl_traces``). Ends with a summary of what was traced
and the commands to look at it. The CPU platform and the vLLM alias it needs are test
infrastructure (``tests/verl_e2e/shims``), not part of otel_verl.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def main() -> int:
    from _model import tool_model
    from _run import EXPERIMENT, run_main_ppo

    from otel_verl.demo.otlp_receiver import OTLPReceiver, joined_spans_only
    from otel_verl.store import group_trajectories, read_spans

    trace_dir = Path(os.environ.get("OTEL_VERL_TRACE_DIR", "otel_verl_traces")).resolve()
    print("verl_demo: building the tiny tool-calling model (cached) ...", flush=True)
    model = tool_model()
    workdir = Path(tempfile.mkdtemp(prefix="otel_verl_verl_demo-"))
    print(f"verl_demo: python -m verl.trainer.main_ppo (v1 trainer, 2 GRPO steps) in {workdir};"
          f" traces -> {trace_dir}", flush=True)
    with OTLPReceiver(store_dir=trace_dir, span_filter=joined_spans_only) as engine:
        run = run_main_ppo(workdir, model, use_v1=True, backend="file",
                           engine_traces_url=engine.traces_url, trace_dir=trace_dir,
                           stream=True, timeout_s=float(os.environ.get("VERL_DEMO_TIMEOUT_S",
                                                                       "1800")))
    if run.returncode != 0:
        print(f"verl_demo: main_ppo failed ({run.returncode}); log: {run.log}", flush=True)
        return 1
    trajectories = [t for t in group_trajectories(read_spans(trace_dir))
                    if t.root is not None and t.experiment == EXPERIMENT]
    spans = Counter(s["name"] for t in trajectories for _, s in t.walk())
    print(f"\nverl_demo: done in {run.wall_s:.0f} s. {len(trajectories)} trajectories traced "
          f"(max_samples_per_step_per_worker=1, n=2):")
    for t in sorted(trajectories, key=lambda t: (t.step, t.sample_index, t.rollout_n)):
        print(f"  step {t.step} sample {t.sample_index} rollout {t.rollout_n}: "
              f"reward {t.reward:.3f}, {t.num_turns} turns, trace {t.trace_id}")
        question, response = _io(t.root)
        print(f"    in:  {question}\n    out: {response}")
    print("  spans: " + ", ".join(f"{name} x{n}" for name, n in spans.most_common()))
    first = trajectories[0].trace_id if trajectories else "<trace id>"
    where = f"--dir {trace_dir}" if "OTEL_VERL_TRACE_DIR" not in os.environ else ""
    print("\nLook at them:")
    print(f"  nox -s traces -- list {where}".rstrip())
    print(f"  nox -s traces -- show {first[:12]} {where}".rstrip())
    print(f"  nox -s ui_serve -- --trace-dir {trace_dir}")
    print(f"verl's own log of the run: {run.log}")
    subprocess.run([sys.executable, "-m", "otel_verl.cli", "traces", "list", "--dir",
                    str(trace_dir)], check=False)
    return 0


def _io(root: dict) -> tuple[str, str]:
    """The trajectory's question and response, one line each (the root's input/output)."""
    import json

    attrs = root["attributes"]
    try:
        messages = json.loads(attrs.get("input.value") or "[]")
        question = str(messages[-1]["content"]) if messages else ""
    except (ValueError, TypeError, KeyError, IndexError):
        question = str(attrs.get("input.value") or "")
    try:
        outcome = json.loads(attrs.get("output.value") or "{}")
        response = str(outcome.get("response", "")) if isinstance(outcome, dict) else ""
    except ValueError:
        response = ""
    return (" ".join(question.split())[:100], " ".join(response.split())[:160])


if __name__ == "__main__":
    raise SystemExit(main())
