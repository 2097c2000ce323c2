"""The weighted step statistics written out in plain Python over the trajectory model: the
tests' reference for the one implementation (``STEPS_SQL``, :meth:`otel_verl.store.Lake.steps`).

This was ``otel_verl.store.step_statistics`` until the lake became the only statistics engine
(issue 19); it lives on here as the definition the SQL is checked against, not as a read path.
Loaded by path (``importlib``) by the unit tests that compare against it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from otel_verl.store import Trajectory, finite_number

StepKey = tuple[Any, Any, Any]  # (experiment, validate, step)


class StepStatistics:
    """Per-step figures over the exported trajectories, weighted so they estimate every
    trajectory that ran (see docs/sampling.md): ``traced``, ``by_reason``, ``estimated`` (the sum
    of the weights), ``reward_mean`` (sum w*r / sum w), ``reward_mean_unweighted``,
    ``error_rate`` (weighted), ``ran`` / ``dropped`` (the workers' sampling reports). A plain
    class: this file is loaded by path, outside ``sys.modules``, where a dataclass cannot be."""

    def __init__(self, experiment: Any, validate: Any, step: Any) -> None:
        self.experiment, self.validate, self.step = experiment, validate, step
        self.traced = 0
        self.by_reason: dict[str, int] = {}
        self.estimated = 0.0
        self.reward_mean: float | None = None
        self.reward_mean_unweighted: float | None = None
        self.error_rate: float | None = None
        self.ran: int | None = None
        self.dropped: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def step_statistics(trajectories: Iterable[Trajectory],
                    reports: dict[StepKey, dict[str, int]] | None = None) -> list[StepStatistics]:
    """Per (experiment, validate, step): counts, weighted mean reward and error rate.

    Only trajectories with their trajectory span count (a partial one has no weight).
    """
    acc: dict[StepKey, dict[str, Any]] = {}
    for trajectory in trajectories:
        if trajectory.root is None:
            continue
        key = (trajectory.experiment, trajectory.validate, trajectory.step)
        a = acc.setdefault(key, {"n": 0, "reasons": {}, "w": 0.0, "wr": 0.0, "wsum_r": 0.0,
                                 "r": [], "werr": 0.0})
        weight = trajectory.sampling_weight
        a["n"] += 1
        reason = trajectory.sampling_reason or "unknown"
        a["reasons"][reason] = a["reasons"].get(reason, 0) + 1
        a["w"] += weight
        if trajectory.errors:
            a["werr"] += weight
        reward = finite_number(trajectory.reward)
        if reward is not None:
            a["wr"] += weight * reward
            a["wsum_r"] += weight
            a["r"].append(reward)
    reports = reports or {}
    result = []
    for key in sorted(set(acc) | set(reports), key=lambda k: tuple(repr(v) for v in k)):
        found = acc.get(key)
        stats = StepStatistics(*key)
        if found is not None:
            a = found
            stats.traced = a["n"]
            stats.by_reason = a["reasons"]
            stats.estimated = a["w"]
            stats.reward_mean = a["wr"] / a["wsum_r"] if a["wsum_r"] > 0 else None
            stats.reward_mean_unweighted = sum(a["r"]) / len(a["r"]) if a["r"] else None
            stats.error_rate = a["werr"] / a["w"] if a["w"] > 0 else None
        report = reports.get(key)
        if report is not None:
            stats.ran, stats.dropped = report.get("ran", 0), report.get("dropped", 0)
        result.append(stats)
    return result


# --- the viewer's per-step figures (the SQLite index's overview, which the lake replaced) -------

_INT64 = 2**63


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if -_INT64 <= value < _INT64 else None


def trajectory_row(t: Trajectory) -> dict[str, Any]:
    """A trajectory's figures the step rows add up, read off the trajectory model."""
    from otel_verl import semconv
    from otel_verl.store._record import is_llm_span, is_tool_error, is_tool_span

    llm = [s for s in t.spans if is_llm_span(s)]
    tools = [s for s in t.spans if is_tool_span(s)]
    validate = t.validate
    return {
        "experiment": t.experiment if isinstance(t.experiment, str) else None,
        "validate": validate if isinstance(validate, bool) else None,
        "step": _int(t.step), "sample_index": _int(t.sample_index),
        "reward": finite_number(t.reward),
        "weight": t.sampling_weight if t.root is not None else 0.0,
        "partial": t.root is None, "turns": _int(t.num_turns),
        "tokens_in": sum(_int(s["attributes"].get(semconv.GEN_AI_USAGE_INPUT_TOKENS)) or 0
                         for s in llm),
        "tokens_out": sum(_int(s["attributes"].get(semconv.GEN_AI_USAGE_OUTPUT_TOKENS)) or 0
                          for s in llm),
        "tool_calls": len(tools), "tool_errors": sum(1 for s in tools if is_tool_error(s)),
        "errors": len(t.errors), "sampling_reason": t.sampling_reason,
    }


def step_rows(trajectories: Iterable[Trajectory],
              reports: dict[StepKey, dict[str, int]] | None = None) -> list[dict[str, Any]]:
    """Per (experiment, validate, step), over every trajectory row (partial ones too, weight
    0): counts, weighted mean / spread / pass rate, extremes, means, sums, distinct prompts."""
    groups: dict[StepKey, list[dict[str, Any]]] = {}
    for t in trajectories:
        row = trajectory_row(t)
        groups.setdefault((row["experiment"], row["validate"], row["step"]), []).append(row)
    out = []
    for key, rows in groups.items():
        w = sum(r["weight"] for r in rows)
        rewarded = [r for r in rows if r["reward"] is not None]
        w_r = sum(r["weight"] for r in rewarded)
        mean = sum(r["weight"] * r["reward"] for r in rewarded) / w_r if w_r else None
        mean_sq = sum(r["weight"] * r["reward"] ** 2 for r in rewarded) / w_r if w_r else None
        turns = [r["turns"] for r in rows if r["turns"] is not None]
        out.append({
            "experiment": key[0], "validate": key[1], "step": key[2],
            "trajectories": len(rows), "weight": w, "reward_mean": mean,
            "reward_std": (max(mean_sq - mean * mean, 0.0) ** 0.5
                           if mean is not None and mean_sq is not None else None),
            "pass_rate": (sum(r["weight"] for r in rewarded if r["reward"] > 0) / w_r
                          if w_r else None),
            "reward_min": min((r["reward"] for r in rewarded), default=None),
            "reward_max": max((r["reward"] for r in rewarded), default=None),
            "turns_mean": sum(turns) / len(turns) if turns else None,
            "tokens_in_mean": sum(r["weight"] * r["tokens_in"] for r in rows) / w if w else None,
            "tokens_out_mean": sum(r["weight"] * r["tokens_out"] for r in rows) / w if w else None,
            "tool_calls": sum(r["tool_calls"] for r in rows),
            "tool_errors": sum(r["tool_errors"] for r in rows),
            "with_errors": sum(1 for r in rows if r["errors"]),
            "prompts": len({r["sample_index"] for r in rows if r["sample_index"] is not None}),
            "partial": sum(1 for r in rows if r["partial"]),
            "error_rate": sum(r["weight"] for r in rows if r["errors"]) / w if w else None,
            "sampling_reasons": sorted({r["sampling_reason"] for r in rows
                                        if r["sampling_reason"] is not None}),
            "ran": None, "dropped": None,
        })
    for key, counts in (reports or {}).items():
        found = [r for r in out if (r["experiment"], r["validate"], r["step"]) == key]
        if found:
            found[0]["ran"], found[0]["dropped"] = counts.get("ran", 0), counts.get("dropped", 0)
        else:
            out.append({"experiment": key[0], "validate": key[1], "step": key[2],
                        "trajectories": 0, "weight": 0.0, "ran": counts.get("ran", 0),
                        "dropped": counts.get("dropped", 0)})
    return out
