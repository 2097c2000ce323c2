"""``otel-verl demo``: a small GRPO-style traced rollout job against a real vLLM it starts itself.

Usage::

    otel-verl demo                                   # file backend, ./otel_verl_traces
    otel-verl demo --steps 3 --prompts 4 --n 4
    otel-verl demo --backend otlp --set actor_rollout_ref.rollout.trace.otlp_endpoint=http://127.0.0.1:4317
    otel-verl traces list --step 1                   # then look at what was recorded

What it does:

1. builds the tiny Qwen2 model + tokenizer (``tiny_model``; cached, ~5 s the first time);
2. initialises tracing (``RolloutTraceConfig.init``; ``--backend`` and ``--set key=value`` Hydra-style
   overrides, passed as ``verl_config``, so verl's keys work unchanged);
3. starts ``python -m vllm.entrypoints.openai.api_server`` on 127.0.0.1 with its own tracing on:
   backend ``file`` -> an in-process OTLP/HTTP receiver (``otlp_receiver``) that appends the
   engine's ``llm_request`` spans that joined a trajectory to the same local store (so ``otel-verl traces show`` shows them
   under the chat turn that caused them); backend ``otlp`` -> the same endpoint/protocol as the
   rollout; other backends -> engine tracing off (the rollout's spans are complete without it);
4. runs ``--steps`` training steps of ``--prompts`` x ``--n`` rollouts (GRPO groups), then one
   validation pass (greedy, n=1), each trajectory inside ``rollout_trace_attr(step=, sample_index=,
   rollout_n=, validate=)`` with the deterministic sampler (``max_samples_per_step_per_worker``)
   deciding ``trace=``; the random tiny model is steered with structured outputs into real hermes
   tool calls (turn 1: a calculator call; turn 2: "The answer is N.");
5. prints a summary table and where the traces are; always stops the server (also on Ctrl-C /
   SIGTERM).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import signal
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import otel_verl
from otel_verl import RolloutTraceConfig, rollout_trace_attr

__all__ = ["DemoResult", "ForcedToolPolicy", "main", "make_rows", "run_demo"]

MODEL_NAME = "tiny-qwen2"
_EXPR_ANY = r"[1-9][0-9]?[+*-][1-9][0-9]?"


def make_rows(n: int, *, offset: int = 0, split: str = "train") -> list[dict[str, Any]]:
    """``n`` deterministic GSM8K-style rows in verl's row format (``raw_prompt``, ``reward_model``,
    ``extra_info.index``...)."""
    rows = []
    for i in range(offset, offset + n):
        a, b = 3 + (i * 7) % 40, 2 + (i * 5) % 9
        op = "+-*"[i % 3]
        value = a + b if op == "+" else a - b if op == "-" else a * b
        rows.append(
            {
                "raw_prompt": [
                    {"role": "user", "content": f"What is {a} {op} {b}? Use the calculator."}
                ],
                "reward_model": {"style": "rule", "ground_truth": str(value)},
                "extra_info": {"index": i, "split": split, "expression": f"{a}{op}{b}"},
                "data_source": "toy_gsm8k",
                "index": i,
            }
        )
    return rows


def _literal(text: str) -> str:
    """``text`` as a regex literal (escaping only what arithmetic uses; ``-`` stays bare)."""
    return "".join("\\" + c if c in "+*.()/" else c for c in text)


class ForcedToolPolicy:
    """Structured-output constraints that make a random model write real hermes tool calls.

    A random tiny model never writes a tool call by itself, so each turn is constrained (vLLM
    ``structured_outputs={"regex": ...}``); the tokens are still sampled by the model inside the
    constraint. Turn 0: a calculator call; with probability ``p_exact`` (a seeded RNG) the regex
    admits only the question's own expression, otherwise any small expression. Turn 1+: ``The
    answer is N.`` with N the tool's result. So about ``p_exact`` of the rollouts earn reward 1,
    and GRPO groups have varied rewards, like a real policy's.
    """

    def __init__(self, p_exact: float = 0.5, seed: int = 0) -> None:
        self.p_exact = p_exact
        self._rng = random.Random(seed)

    def __call__(
        self, turn: int, messages: list[dict[str, Any]], row: Mapping[str, Any]
    ) -> dict[str, Any] | None:
        if turn == 0:
            expr = str((row.get("extra_info") or {}).get("expression", ""))
            exact = bool(expr) and self._rng.random() < self.p_exact
            pattern = _literal(expr) if exact else _EXPR_ANY
            regex = (
                r'<tool_call>\{"name": "calculator", "arguments": \{"expression": "'
                + pattern
                + r'"\}\}</tool_call>'
            )
            return {"structured_outputs": {"regex": regex}}
        result = ""
        for message in reversed(messages):
            if message.get("role") == "tool":
                result = str(message.get("content", ""))
                break
        number = result if re.fullmatch(r"-?[0-9]+", result) else r"-?[0-9]{1,4}"
        return {"structured_outputs": {"regex": rf"The answer is {number}\."}}


@dataclass
class DemoResult:
    trajectories: int = 0
    traced: int = 0
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    rewards: dict[str, list[float]] = field(default_factory=dict)  # "step 1" / "validation"
    traced_requests: int = 0  # engine requests made inside traced trajectories
    engine_spans: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    report: str | None = None  # the offline HTML report of the store (backend file)


def _parse_sets(items: Sequence[str]) -> list[str]:
    for item in items:
        if "=" not in item:
            raise SystemExit(f"--set expects key=value, got {item!r}")
    return list(items)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="otel-verl demo",
        description="A small GRPO-style traced rollout job against a real vLLM (CPU) it starts.",
    )
    p.add_argument("--backend", default="file", help="file|otlp|weave|console|none (default file)")
    p.add_argument("--steps", type=int, default=2, help="training steps (default 2)")
    p.add_argument("--prompts", type=int, default=4, help="prompts per step (default 4)")
    p.add_argument("--n", type=int, default=4, help="rollouts per prompt, a GRPO group (default 4)")
    p.add_argument("--val-prompts", type=int, default=4, help="validation prompts (default 4)")
    p.add_argument("--port", type=int, default=0, help="vLLM port (default: a free one)")
    p.add_argument("--concurrency", type=int, default=8, help="rollouts in flight (default 8)")
    p.add_argument("--trace-dir", default=None, help="local store (default ./otel_verl_traces)")
    p.add_argument("--model-dir", default=None, help="tiny model cache dir")
    p.add_argument("--project-name", default="otel_verl_demo")
    p.add_argument("--experiment-name", default="tiny_grpo")
    p.add_argument("--max-samples-per-step", type=int, default=None,
                   help="max_samples_per_step_per_worker (default: trace all)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="Hydra-style override passed as verl_config (repeatable), e.g. "
                        "actor_rollout_ref.rollout.trace.token2text=true")
    p.add_argument("--server-log", default=None, help="where the vLLM log goes")
    p.add_argument("--startup-timeout", type=float, default=240.0,
                   help="seconds to wait for vLLM to become healthy (default 240; its CPU "
                        "start-up takes longer on a crowded machine)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


class _Interrupted(BaseException):
    pass


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise _Interrupted(signal.Signals(signum).name)


async def _rollouts(
    loop: Any,
    jobs: list[tuple[int, int, dict[str, Any], bool, bool]],
    sampling: dict[str, Any],
    concurrency: int,
    progress: Any,
) -> list[tuple[int, bool, Any]]:
    semaphore = asyncio.Semaphore(max(1, concurrency))

    async def one(step: int, rollout_n: int, row: dict[str, Any], validate: bool, traced: bool):
        async with semaphore:
            with rollout_trace_attr(
                sample_index=row["extra_info"]["index"],
                step=step,
                rollout_n=rollout_n,
                validate=validate,
                trace=traced,
                name="agent_loop",
            ):
                out = await loop.run(dict(sampling), **row)
            if progress is not None:
                progress.update(1)
            return step, validate, out

    return await asyncio.gather(*(one(*job) for job in jobs))


async def _run_jobs(args: argparse.Namespace, base_url: str, tokenizer: Any, result: DemoResult,
                    progress: Any) -> None:
    from otel_verl.rollout.agent_loop import ToolAgentLoop
    from otel_verl.rollout.clients import VLLMCompletionsClient
    from otel_verl.rollout.reward import Gsm8kReward
    from otel_verl.rollout.tools import CalculatorTool

    client = VLLMCompletionsClient(base_url, MODEL_NAME, tokenizer=tokenizer,
                                   max_connections=max(4, args.concurrency))
    agent = ToolAgentLoop(
        client,
        tokenizer,
        tools=[CalculatorTool()],
        reward_fn=Gsm8kReward(),
        max_assistant_turns=3,
        max_response_length=256,
        max_tool_response_length=64,
        turn_sampling=ForcedToolPolicy(),
    )
    train_rows = make_rows(args.prompts)
    val_rows = make_rows(args.val_prompts, offset=1000, split="test")
    tracing = otel_verl.is_recording()  # False with backend none/off: nothing is traced

    def select(rows: list[dict[str, Any]]) -> frozenset:
        if not tracing:
            return frozenset()
        return otel_verl.RolloutTraceConfig.sampler().select([r["extra_info"]["index"] for r in rows])

    try:
        for step in range(1, args.steps + 1):
            chosen = select(train_rows)
            jobs = [
                (step, n, row, False, row["extra_info"]["index"] in chosen)
                for row in train_rows
                for n in range(args.n)
            ]
            outs = await _rollouts(agent, jobs, {"temperature": 1.0, "max_tokens": 96,
                                                 "logprobs": True}, args.concurrency, progress)
            _account(result, f"step {step}", jobs, outs)
        chosen = select(val_rows)
        jobs = [(args.steps, 0, row, True, row["extra_info"]["index"] in chosen) for row in val_rows]
        outs = await _rollouts(agent, jobs, {"temperature": 0.0, "max_tokens": 96},
                               args.concurrency, progress)
        _account(result, "validation", jobs, outs)
    finally:
        await client.aclose()


def _account(result: DemoResult, label: str, jobs: list[Any], outs: list[Any]) -> None:
    rewards = result.rewards.setdefault(label, [])
    for job, (_, _, out) in zip(jobs, outs, strict=True):
        result.trajectories += 1
        result.traced += 1 if job[4] else 0
        result.traced_requests += out.extra_fields["assistant_turns"] if job[4] else 0
        result.turns += out.num_turns
        result.tool_calls += out.extra_fields["num_tool_calls"]
        result.tool_errors += out.extra_fields["num_tool_errors"]
        rewards.append(float(out.reward_score or 0.0))


def _engine_tracing(config: Any, receiver_url: str | None) -> tuple[str | None, str]:
    """(endpoint, protocol) for the vLLM server's own spans, from the rollout's configuration."""
    if config.backend == "otlp":
        protocol = config.otlp_protocol
        endpoint = config.otlp_endpoint or (
            "http://127.0.0.1:4318" if protocol != "grpc" else "http://127.0.0.1:4317"
        )
        if protocol != "grpc" and not endpoint.rstrip("/").endswith("/v1/traces"):
            endpoint = endpoint.rstrip("/") + "/v1/traces"
        return endpoint, protocol
    if receiver_url is not None:
        return receiver_url, "http/protobuf"
    return None, "http/protobuf"


def _print_summary(result: DemoResult, config: Any, trace_dir: str | None, server_log: str,
                   out: Any) -> None:
    rows = [("trajectories", f"{result.trajectories} ({result.traced} traced)"),
            ("turns", str(result.turns)),
            ("tool calls", f"{result.tool_calls} ({result.tool_errors} errors)")]
    for label, values in result.rewards.items():
        mean = statistics.fmean(values) if values else 0.0
        rows.append((f"reward {label}", f"mean {mean:.3f}  ({sum(v > 0 for v in values)}"
                                        f"/{len(values)} correct)"))
    rows.append(("engine spans", f"{result.engine_spans} vLLM llm_request spans joined"
                 if config.backend == "file" else
                 ("sent by vLLM to " + str(config.otlp_endpoint or "the default endpoint"))
                 if config.backend == "otlp" else "engine tracing off for this backend"))
    for key, seconds in result.seconds.items():
        rows.append((f"time {key}", f"{seconds:.1f} s"))
    if config.backend == "file":
        default_dir = os.path.abspath("otel_verl_traces")
        where = "" if trace_dir == default_dir else f" --dir {trace_dir}"
        rows.append(("traces", str(trace_dir)))
        if result.report:
            rows.append(("report", f"{result.report}  (one file, opens offline in a browser)"))
        rows.append(("browse", f"python3 -m nox -s ui_serve -- --trace-dir {trace_dir}"))
        rows.append(("", f"otel-verl ui --trace-dir {trace_dir}  (with otel-verl[ui] installed)"))
        rows.append(("view", f"otel-verl traces list --step 1{where}"))
        rows.append(("", f"otel-verl traces show <TRACE_ID_PREFIX>{where}"))
        if sys.prefix != sys.base_prefix:  # in a venv (e.g. nox's): say how to reach its CLI
            rows.append(("", f"(outside this venv: {sys.executable} -m otel_verl.cli ...)"))
    elif config.backend == "otlp":
        rows.append(("traces", f"OTLP {config.otlp_protocol} -> {config.otlp_endpoint}"))
        rows.append(("view", "your collector / Jaeger: search rollout.step=1"))
    elif config.backend == "weave":
        rows.append(("traces", f"Weave project {config.project_name}"))
    else:
        rows.append(("traces", f"backend {config.backend!r}"))
    rows.append(("vLLM log", server_log))
    width = max(len(k) for k, _ in rows)
    print("\n" + "=" * (width + 50), file=out)
    print(f"otel-verl demo summary (backend={config.backend})", file=out)
    print("-" * (width + 50), file=out)
    for key, value in rows:
        print(f"{key:<{width}}  {value}", file=out)
    print("=" * (width + 50), file=out)
    if config.backend == "file":
        print(f"\nbrowse the rollouts: python3 -m nox -s ui_serve -- --trace-dir {trace_dir}\n"
              "  then open http://127.0.0.1:8686/", file=out)


def _write_report(trace_dir: str, out: Any) -> str | None:
    """The store's offline report (``otel-verl report``) as ``<trace_dir>/report.html``."""
    try:
        from otel_verl.ui._lake import open_source
        from otel_verl.ui.report import write_report

        source = open_source(trace_dir)  # ImportError without the lake extra (said below)
        path = os.path.join(trace_dir, "report.html")
        write_report(source, path)
        source.close()
        return path
    except Exception as exc:  # noqa: BLE001 - a convenience: never fail the demo over it
        print(f"warning: no report ({type(exc).__name__}: {exc})", file=out)
        return None


def run_demo(args: argparse.Namespace, out: Any = None) -> DemoResult:
    """The demo with parsed arguments (see ``main``); returns the counts it printed."""
    out = sys.stdout if out is None else out
    from otel_verl.demo.otlp_receiver import OTLPReceiver, joined_spans_only
    from otel_verl.demo.server import VLLMServer
    from otel_verl.demo.tiny_model import build_tiny_model

    result = DemoResult()
    t0 = time.monotonic()
    model_dir = build_tiny_model(args.model_dir)
    result.seconds["model build/cache"] = time.monotonic() - t0

    init_kwargs: dict[str, Any] = {"verl_config": _parse_sets(args.sets)}
    if args.trace_dir:
        init_kwargs["trace_dir"] = args.trace_dir
    if args.max_samples_per_step is not None:
        init_kwargs["max_samples_per_step_per_worker"] = args.max_samples_per_step
    RolloutTraceConfig.reset()
    RolloutTraceConfig.init(args.project_name, args.experiment_name, backend=args.backend,
                            **init_kwargs)
    config = RolloutTraceConfig.get_config()
    trace_dir = os.path.abspath(config.trace_dir) if config.backend == "file" else None

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    receiver = None
    if config.backend == "file":  # keep only engine spans that belong to a trajectory
        receiver = OTLPReceiver(store_dir=trace_dir, span_filter=joined_spans_only).start()
    endpoint, protocol = _engine_tracing(config, receiver.traces_url if receiver else None)
    log_path = args.server_log or os.path.join(
        trace_dir or os.getcwd(), f"vllm-demo-{os.getpid()}.log")
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    server = VLLMServer(model_dir, port=args.port or None, served_model_name=MODEL_NAME,
                        otlp_endpoint=endpoint, otlp_protocol=protocol,
                        service_name="vllm", log_path=log_path,
                        startup_timeout_s=args.startup_timeout)
    progress = None
    old_term = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        print(f"starting vLLM (CPU) on 127.0.0.1:{server.port}, log: {log_path}", file=out,
              flush=True)
        t1 = time.monotonic()
        server.start()
        result.seconds["vLLM startup"] = time.monotonic() - t1
        total = args.steps * args.prompts * args.n + args.val_prompts
        if not args.no_progress:
            from tqdm import tqdm

            progress = tqdm(total=total, desc="rollouts", unit="traj", file=out)
        t2 = time.monotonic()
        asyncio.run(_run_jobs(args, server.base_url, tokenizer, result, progress))
        result.seconds["rollouts"] = time.monotonic() - t2
        if progress is not None:
            progress.close()
            progress = None
        RolloutTraceConfig.flush(timeout_s=10.0)
        if receiver is not None:  # vLLM exports in batches every few seconds: wait for them
            expected = result.traced_requests
            try:
                receiver.wait_for(
                    lambda spans: sum(s["name"] == "llm_request" for s in spans) >= expected,
                    timeout_s=20.0,
                )
            except TimeoutError as exc:
                print(f"warning: {exc}", file=out)
            result.engine_spans = sum(s["name"] == "llm_request" for s in receiver.spans())
    finally:
        if progress is not None:
            progress.close()
        server.stop()
        signal.signal(signal.SIGTERM, old_term)
        RolloutTraceConfig.shutdown(timeout_s=10.0)
        if receiver is not None:
            receiver.stop()
    if trace_dir is not None:
        t3 = time.monotonic()
        result.report = _write_report(trace_dir, out)
        result.seconds["report"] = time.monotonic() - t3
    result.seconds["total"] = time.monotonic() - t0
    _print_summary(result, config, trace_dir, str(log_path), out)
    return result


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``otel-verl demo``; returns the process exit code."""
    args = _parser().parse_args(argv)
    if args.steps < 1 or args.prompts < 1 or args.n < 1 or args.val_prompts < 0:
        print("otel-verl demo: --steps, --prompts and --n must be >= 1", file=sys.stderr)
        return 2
    try:
        run_demo(args)
    except (KeyboardInterrupt, _Interrupted) as exc:
        print(f"otel-verl demo: interrupted ({exc or 'Ctrl-C'}); vLLM stopped", file=sys.stderr)
        return 130
    except Exception as exc:  # a clear one-line error, the details in the log
        print(f"otel-verl demo: failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
