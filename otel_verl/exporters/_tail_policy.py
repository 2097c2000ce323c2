"""Tail-sampling policy: which finished trajectories to keep, as pure functions.

A policy looks at a finished trajectory (``TrajectoryView``) and, when it needs one, its GRPO
group (``GroupView``), and returns a ``KeepDecision`` (a reason and a weight) or ``None`` (no
opinion). It sees only what is passed in, and it sees the same inputs whatever the processor
buffered. The mechanism (``otel_verl.exporters._tail.TailSamplingProcessor``) buffers spans,
asks the policies and applies what they decide: budget, export, counts, the report.

The built-in rules of ``tail_keep`` are policies (``builtin_policies``): ``errors``,
``truncated``, ``reward_outliers``, ``flags`` and ``groups``, in that order whatever order ``tail_keep``
names them in. Your own go in ``TailSamplingProcessor(..., policies=[...])``, after the built-in
rules of the same moment and before ``groups`` (so ``groups`` keeps the group of a trajectory
your policy kept). docs/sampling.md shows two.

Usage::

    def keep_long_answers(trajectory: TrajectoryView, group: GroupView | None):
        if (trajectory.attributes.get("my.answer_tokens") or 0) > 4000:
            return KeepDecision("long_answer")
        return None

    processor = TailSamplingProcessor(export_processor, keep=("errors", "groups"),
                                      policies=[keep_long_answers])

How a policy is asked:

1. when a trajectory ends, the policies without ``needs_group`` (``errors``, ``truncated``,
   plain functions), with ``group=None``: the first that returns a decision keeps it;
2. when some policy ``needs_group``, every trajectory also waits for its group. When the group
   is decided, each policy with ``needs_group`` (``reward_outliers``, yours, ``groups``) in turn
   is asked, with the group, about every member not kept yet (a member kept by an earlier policy
   shows in ``GroupView.reasons``); what is still not kept is dropped. A trajectory that ends
   after its group was decided sees ``GroupView.late`` with no members, and ``kept_by_rule`` as
   it was.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from otel_verl._config import TAIL_RULES
from otel_verl.semconv import RL_FLAGS, SamplingReason

StepKey = tuple[Any, Any, Any]  # (experiment, validate, step)
GroupKey = tuple[Any, Any, Any, Any]  # (experiment, validate, step, sample_index)
#: reasons that are not a rule keeping a trajectory for what it is: the head rule, everything
#: traced, the buffer's early export, and the ``groups`` rule itself
_NOT_A_RULE = frozenset((SamplingReason.HEAD, SamplingReason.ALL, SamplingReason.OVERFLOW,
                         SamplingReason.GROUP))


@dataclasses.dataclass(frozen=True)
class KeepDecision:
    """Keep the trajectory: why (``rollout.sampling.reason``) and what it stands for.

    ``weight`` is written as ``rollout.sampling.weight``: the inverse of the probability that a
    trajectory like this one is exported. A rule that keeps every trajectory matching a condition
    (every built-in one) returns 1, and statistics stay unbiased; a policy that keeps a random
    share is responsible for its weight (see docs/sampling.md).
    """

    reason: str
    weight: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.reason, str) or not self.reason:
            raise ValueError(f"KeepDecision: reason must be a non-empty string, got "
                             f"{self.reason!r}")
        if not isinstance(self.weight, (int, float)) or not math.isfinite(self.weight) or \
                self.weight <= 0:
            raise ValueError(f"KeepDecision: weight must be a positive finite number, got "
                             f"{self.weight!r}")


@dataclasses.dataclass(frozen=True, slots=True)
class TrajectoryView:
    """What a policy sees of one finished trajectory."""

    #: the trajectory span's attributes (``rollout.*``, your own)
    attributes: Mapping[str, Any]
    #: (experiment, validate, step, sample_index): its GRPO group on this worker
    group: GroupKey
    #: the trajectory span or a span in it ended with status ERROR or carries ``error.type``
    error: bool = False
    #: a model turn finished with ``length``, or the agent loop ended on a length or turn limit
    truncated: bool = False
    #: ``rollout.reward`` (finite), else None
    reward: float | None = None
    #: the head rule's weight when the head rule picked it (its spans are out already), else None
    head_weight: float | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class GroupView:
    """What a policy sees of a trajectory's GRPO group when the group is decided."""

    key: GroupKey
    #: the group's trajectories that ended on this worker, in the order they ended
    members: tuple[TrajectoryView, ...]
    #: each member's reason so far (None: not kept yet), aligned with ``members``
    reasons: tuple[str | None, ...]
    #: the group was decided before this trajectory ended (``members`` is empty then)
    late: bool = False
    #: a member was kept by a rule, not by the head rule, overflow or ``groups``; for a late
    #: trajectory, as it was when the group was decided
    kept_by_rule: bool = False


#: the function a policy is: the trajectory, its group (None when the trajectory ends) -> a
#: decision, or None for no opinion
PolicyFunction = Callable[[TrajectoryView, "GroupView | None"], "KeepDecision | None"]


@dataclasses.dataclass(frozen=True)
class TailPolicy:
    """A named policy. ``needs_group``: it decides only with the group (trajectories wait)."""

    name: str
    decide: PolicyFunction
    needs_group: bool = False


Policy = TailPolicy | PolicyFunction


def as_policy(policy: Policy) -> TailPolicy:
    """A ``TailPolicy``; a plain function becomes one asked when its trajectory ends."""
    if isinstance(policy, TailPolicy):
        return policy
    if not callable(policy):
        raise TypeError(f"a tail policy is a TailPolicy or a function, got {policy!r}")
    return TailPolicy(getattr(policy, "__qualname__", repr(policy)), policy)


def group_view(key: GroupKey, members: Sequence[TrajectoryView],
               reasons: Sequence[str | None]) -> GroupView:
    """The view of a group being decided, with the decisions so far."""
    return GroupView(key, tuple(members), tuple(reasons),
                     kept_by_rule=any(r is not None and r not in _NOT_A_RULE for r in reasons))


# --- the built-in rules ---------------------------------------------------------------------------


def reward_outliers(rewards: list[float], z: float) -> set[int]:
    """Positions of the outliers among a group's rewards.

    Binary rewards (every reward 0/1, or every one -1/1): the minority outcome of a mixed group,
    both outcomes on a tie. Otherwise the rewards at least ``z`` standard deviations from the
    group's mean.

    Args:
        rewards: the group's rewards (two or more to find anything).
        z: the z-score threshold for continuous rewards.

    Returns:
        The positions in ``rewards`` of the trajectories to keep.
    """
    distinct = set(rewards)
    if len(rewards) < 2 or len(distinct) < 2:
        return set()
    if distinct <= {0.0, 1.0} or distinct <= {-1.0, 1.0}:  # binary: the minority outcome
        counts = collections.Counter(rewards)
        (low_value, low), (_, high) = sorted(counts.items(), key=lambda kv: kv[1])
        if low == high:  # a tie: both outcomes are as rare; keep the whole (informative) group
            return set(range(len(rewards)))
        return {i for i, r in enumerate(rewards) if r == low_value}
    mean = sum(rewards) / len(rewards)
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
    if std == 0.0 or not math.isfinite(std):
        return set()
    return {i for i, r in enumerate(rewards) if abs(r - mean) / std >= z}


_KEEP_ERROR = KeepDecision(SamplingReason.ERROR)
_KEEP_TRUNCATED = KeepDecision(SamplingReason.TRUNCATED)
_KEEP_OUTLIER = KeepDecision(SamplingReason.REWARD_OUTLIER)
_KEEP_GROUP = KeepDecision(SamplingReason.GROUP)


def keep_errors(trajectory: TrajectoryView, group: GroupView | None) -> KeepDecision | None:
    """``errors``: a span of the trajectory failed."""
    return _KEEP_ERROR if group is None and trajectory.error else None


def keep_truncated(trajectory: TrajectoryView, group: GroupView | None) -> KeepDecision | None:
    """``truncated``: a turn hit the length cap, or the loop a length or turn limit."""
    return _KEEP_TRUNCATED if group is None and trajectory.truncated else None


def reward_outlier_policy(z: float) -> PolicyFunction:
    """``reward_outliers``: its reward is unlike its group's (see ``reward_outliers``)."""

    last: list[Any] = [None, ()]  # the group last looked at, its outliers: once per group

    def keep_reward_outliers(trajectory: TrajectoryView,
                             group: GroupView | None) -> KeepDecision | None:
        if group is None or trajectory.reward is None:
            return None
        if last[0] is not group:
            scored = [m for m in group.members if m.reward is not None]
            positions = reward_outliers([m.reward for m in scored], z)  # type: ignore[misc]
            last[:] = [group, tuple(scored[i] for i in positions)]
        return _KEEP_OUTLIER if any(m is trajectory for m in last[1]) else None

    return keep_reward_outliers


_KEEP_FLAGGED = KeepDecision(SamplingReason.FLAG)


def _flagged(trajectory: TrajectoryView) -> bool:
    return bool(trajectory.attributes.get(RL_FLAGS))


def keep_flagged(trajectory: TrajectoryView, group: GroupView | None) -> KeepDecision | None:
    """``flags``: a detector flagged it (``rl.flags``, otel_verl.exporters._detect), or a member
    of its group (kept as ``group``): the flagged trajectory beside the ones it is compared to."""
    if group is None:
        return None
    if _flagged(trajectory):
        return _KEEP_FLAGGED
    if any(_flagged(m) for m in group.members):
        return _KEEP_GROUP
    return None


def keep_groups(trajectory: TrajectoryView, group: GroupView | None) -> KeepDecision | None:
    """``groups``: another rollout of its group was kept by a rule."""
    return _KEEP_GROUP if group is not None and group.kept_by_rule else None


#: the built-in rules in the order they are asked; a factory takes ``tail_reward_z``
_BUILTIN: dict[str, Callable[[float], TailPolicy]] = {
    "errors": lambda z: TailPolicy("errors", keep_errors),
    "truncated": lambda z: TailPolicy("truncated", keep_truncated),
    "reward_outliers": lambda z: TailPolicy("reward_outliers", reward_outlier_policy(z),
                                            needs_group=True),
    "flags": lambda z: TailPolicy("flags", keep_flagged, needs_group=True),
    "groups": lambda z: TailPolicy("groups", keep_groups, needs_group=True),
}
#: the built-in rules that come after the user's policies (they look at what the others kept)
_LAST = ("groups",)
RULES = tuple(_BUILTIN)
assert RULES == TAIL_RULES, "the config's tail_keep rules and the built-in policies differ"


def builtin_policies(keep: Iterable[str], reward_z: float = 2.0,
                     extra: Iterable[Policy] = ()) -> tuple[TailPolicy, ...]:
    """The policies for ``tail_keep`` rules plus ``extra`` (your own), in the order they are asked.

    Raises:
        ValueError: an unknown rule.
    """
    keep = tuple(keep)
    unknown = set(keep) - set(RULES)
    if unknown:
        raise ValueError(f"tail_keep: unknown rule(s) {sorted(unknown)}; known: "
                         f"{', '.join(RULES)}")
    first = [_BUILTIN[name](reward_z) for name in RULES if name in keep and name not in _LAST]
    last = [_BUILTIN[name](reward_z) for name in RULES if name in keep and name in _LAST]
    return (*first, *(as_policy(p) for p in extra), *last)
