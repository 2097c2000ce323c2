"""Parity: is what a trace shows what the trainer trained on? (issue 22, docs/parity.md)

Usage::

    spans = list(read_spans(trace_dir))
    index = ContentIndex.load(trace_dir)
    consumed = load_consumed(trace_dir)        # <trace_dir>/parity/*.jsonl (the verl integration)
    # or load_consumed("batch.jsonl")          # a dataset file: prompt_ids, response_ids, ...
    for report in check(spans, index, consumed):
        print(report.label(), "equal" if report.equal else report.differences)

Both sides become a **summary** of content ids (hashes, never copies): the prompt's id, the
response's id, and the response cut into runs of equal mask (a model's turn: mask 1; what the
loop inserted, a tool's answer or a chat template: mask 0), each run with its length and id;
plus the reward, the number of turns and the policy versions. The trace's side is rebuilt from
the per-turn content (``otel_verl.store._content``): turn k's prompt ``P_k`` and ``O_k`` =
``P_k`` + its response; the response is the last ``O`` after the first prompt, its model runs
are each turn's response. Ids are ``otel_verl._content.token_content_id``, what a trainer
computes from the tokens it holds.

What is reported (``Difference.kind``):
- ``retokenized``: turn k+1's prompt does not extend turn k's prompt + response (inside the
  trace: the tokens the model sampled are not the tokens the next turn was given);
- ``prompt`` / ``response``: the ids differ (which run: turn k's response, or the tokens inserted
  after turn k); ``mask``: the masks differ (how many tokens). A response the trainer cut (verl
  cuts it to ``response_length``) is compared over what it holds, and said in ``notes``;
- ``reward``; ``turns`` (``rollout.num_turns``); ``policy_version`` (the trainer's record of the
  versions that sampled the trajectory is not the trace's); ``stale`` (staleness over a limit);
- ``untraced``: the trajectory has no per-turn token content to compare; ``unmatched``: no
  record of what the trainer consumed for it.
"""

from __future__ import annotations

import difflib
import itertools
import json
import math
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from otel_verl import _content, semconv
from otel_verl.store._content import ContentError, ContentIndex

__all__ = ["CONSUMED_DIR", "CONSUMED_SUFFIX", "Difference", "Report", "TracedTrajectory", "check",
           "consumed_key", "load_consumed", "summarize", "traced_trajectories"]

#: the folder under a trace dir where the verl integration writes what the trainer consumed
CONSUMED_DIR = "parity"
#: its files' suffix (JSON lines; not ``.jsonl``, which span readers take for span files)
CONSUMED_SUFFIX = ".parity"


# --- summaries ----------------------------------------------------------------------------------


def _ints(values: Any) -> list[int]:
    """A token or mask list as a list (lists as they are; numpy arrays, tensors via tolist)."""
    if type(values) is list:
        return values
    if hasattr(values, "tolist"):
        values = values.tolist()
    return [int(v) for v in values]


def mask_runs(mask: Sequence[int]) -> list[tuple[int, int]]:
    """``[(mask value (0/1), length), ...]`` of consecutive equal values (truthy = 1)."""
    try:
        data = bytes(mask)  # C speed for a list of 0/1 ints: one find per run
    except (TypeError, ValueError):
        data = None
    if data is None or data.translate(None, b"\x00\x01"):
        return [(1 if value else 0, sum(1 for _ in group))
                for value, group in itertools.groupby(bool(v) for v in mask)]
    runs, pos, n = [], 0, len(data)
    while pos < n:
        value = data[pos]
        end = data.find(b"\x00" if value else b"\x01", pos)
        end = n if end < 0 else end
        runs.append((value, end - pos))
        pos = end
    return runs


def summarize(prompt_ids: Any, response_ids: Any, response_mask: Any, *,
              reward: Any = None, num_turns: Any = None, min_version: Any = None,
              max_version: Any = None, trained_step: Any = None) -> dict[str, Any]:
    """The content-id summary of one trained sample (what ``check`` compares).

    Raises:
        ValueError: the mask and the response have different lengths.
    """
    prompt, response, mask = _ints(prompt_ids), _ints(response_ids), _ints(response_mask)
    if len(mask) != len(response):
        raise ValueError(f"response_mask has {len(mask)} values for {len(response)} tokens")
    segments = []
    start = 0
    for value, length in mask_runs(mask):
        segments.append([value, length, _content.token_content_id(response[start:start + length])])
        start += length
    return {"prompt": {"id": _content.token_content_id(prompt), "len": len(prompt)},
            "response": {"id": _content.token_content_id(response), "len": len(response),
                         "segments": segments},
            "reward": _number(reward), "num_turns": _int(num_turns),
            "min_version": _int(min_version), "max_version": _int(max_version),
            "trained_step": _int(trained_step)}


def _number(value: Any) -> float | None:
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _int(value: Any) -> int | None:
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    return value if type(value) is int else None


def consumed_key(record: Mapping[str, Any]) -> tuple[Any, ...]:
    """(step, sample_index, rollout_n, validate): how a record without a trace id is matched."""
    return (record.get("step"), record.get("sample_index"), record.get("rollout_n"),
            bool(record.get("validate")))


# --- the trace's side ---------------------------------------------------------------------------


@dataclass
class Turn:
    """One LLM call of a trajectory: its whole prompt, prompt + response, and policy version."""

    span_id: str
    prompt: list[int] | None
    output: list[int] | None
    version: int | None
    error: str | None = None


@dataclass
class TracedTrajectory:
    """What the trace shows for one trajectory."""

    trace_id: str
    span_id: str | None
    attrs: Mapping[str, Any]
    turns: list[Turn]

    @property
    def key(self) -> tuple[Any, ...]:
        a = self.attrs
        return (a.get(semconv.ROLLOUT_STEP), a.get(semconv.ROLLOUT_SAMPLE_INDEX),
                a.get(semconv.ROLLOUT_ROLLOUT_N), bool(a.get(semconv.ROLLOUT_VALIDATE)))

    def label(self) -> str:
        step, sample, n, validate = self.key
        return (f"{self.trace_id[:16]} step={step} sample={sample} n={n}"
                + (" validate" if validate else ""))

    def conversation(self) -> tuple[list[int], list[int], list[int], list[str]] | None:
        """(prompt ids, response ids, response mask, a label per mask run) the trace shows, or
        None when a turn cannot be rebuilt. Turn k's response (``O_k[len(P_k):]``) is mask 1,
        the rest of the response (what the loop inserted) mask 0, in the last turn's coordinates.
        """
        if not self.turns or any(t.prompt is None for t in self.turns):
            return None
        first = self.turns[0].prompt or []
        last = self.turns[-1]
        full = last.output if last.output is not None else last.prompt
        assert full is not None
        start = len(first)
        mask = [0] * (len(full) - start)
        origin: list[str] = [""] * len(mask)
        previous_end = start
        for k, turn in enumerate(self.turns, 1):
            assert turn.prompt is not None
            p_len = len(turn.prompt)
            o_len = len(turn.output) if turn.output is not None else p_len
            for i in range(max(previous_end, start), min(p_len, len(full))):
                origin[i - start] = f"the tokens inserted before turn {k}"
            for i in range(max(p_len, start), min(o_len, len(full))):
                mask[i - start] = 1
                origin[i - start] = f"turn {k}'s response"
            previous_end = max(previous_end, o_len)
        for i in range(max(previous_end, start), len(full)):
            origin[i - start] = "the tokens after the last turn"
        labels, pos = [], 0
        for _, length in mask_runs(mask):
            labels.append(origin[pos])
            pos += length
        return list(first), list(full[start:]), mask, labels

    def versions(self) -> list[int]:
        return [t.version for t in self.turns if t.version is not None]


def traced_trajectories(spans: Iterable[Mapping[str, Any]], index: ContentIndex
                        ) -> list[TracedTrajectory]:
    """Every trajectory span of ``spans`` with its token-content LLM calls, rebuilt."""
    from otel_verl.store import group_trajectories

    spans = list(spans)
    index.add_spans(s for s in spans
                    if type((s.get("attributes") or {}).get(semconv.CONTENT_ID)) is str)
    out: list[TracedTrajectory] = []
    for traj in group_trajectories([dict(s) for s in spans]):
        if traj.root is None:
            continue
        turns: list[Turn] = []
        for span in traj.spans:
            attrs = span.get("attributes") or {}
            if type(attrs.get(semconv.CONTENT_ID)) is not str or \
                    attrs.get(semconv.CONTENT_KIND) != _content.KIND_TOKENS:
                continue
            turn = Turn(span["span_id"], None, None, _int(attrs.get(semconv.RL_POLICY_VERSION)))
            try:
                turn.prompt = index.rebuild(attrs[semconv.CONTENT_ID])
                output_id = attrs.get(semconv.CONTENT_OUTPUT_ID)
                if type(output_id) is str:
                    turn.output = index.rebuild(output_id)
            except ContentError as exc:
                turn.error = str(exc)
            turns.append(turn)
        out.append(TracedTrajectory(traj.trace_id, traj.root.get("span_id"),
                                    traj.root.get("attributes") or {}, turns))
    return out


# --- the comparison -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Difference:
    kind: str
    message: str

    def __str__(self) -> str:
        return self.message


@dataclass
class Report:
    """One trajectory: equal, or its differences (``notes`` are said but are not differences)."""

    traced: TracedTrajectory
    differences: list[Difference] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def equal(self) -> bool:
        return not self.differences

    def label(self) -> str:
        return self.traced.label()

    def as_dict(self) -> dict[str, Any]:
        step, sample, n, validate = self.traced.key
        return {"trace_id": self.traced.trace_id, "step": step, "sample_index": sample,
                "rollout_n": n, "validate": validate, "equal": self.equal,
                "differences": [{"kind": d.kind, "message": d.message}
                                for d in self.differences],
                "notes": self.notes}


def _retokenized(turns: Sequence[Turn]) -> Iterator[Difference]:
    for k in range(1, len(turns)):
        before, turn = turns[k - 1], turns[k]
        if before.prompt is None or turn.prompt is None or before.output is None:
            continue
        base = before.output
        if turn.prompt[:len(base)] == base:
            continue
        p_len = len(before.prompt)
        if turn.prompt[:p_len] != before.prompt:
            first = next((i for i, (a, b) in enumerate(zip(turn.prompt, before.prompt, strict=False))
                          if a != b), min(len(turn.prompt), p_len))
            yield Difference("retokenized", f"turn {k + 1}: its prompt differs from turn {k}'s "
                             f"at token {first} (before turn {k}'s response)")
            continue
        response = base[p_len:]
        # the sampled tokens found, in order, in what the next prompt holds after the old one
        # (a retokenization may merge or split tokens, shifting the rest)
        matcher = difflib.SequenceMatcher(None, response, turn.prompt[p_len:], autojunk=False)
        kept = sum(block.size for block in matcher.get_matching_blocks())
        # the base differs where the old prompt does not: at least one response token changed,
        # even when the matcher pairs it with an equal token further on (a tool token)
        differ = max(1, len(response) - kept)
        yield Difference("retokenized", f"turn {k + 1}: {differ} of {len(response)} tokens of "
                         f"turn {k}'s response retokenized differently in its prompt")


def _mask_diff(a: Sequence[Sequence[Any]], b: Sequence[Sequence[Any]]) -> int:
    """Positions (over the shorter length) where two run-length masks differ."""
    def expand(runs: Sequence[Sequence[Any]]) -> list[int]:
        return [int(run[0]) for run in runs for _ in range(int(run[1]))]

    return sum(1 for x, y in zip(expand(a), expand(b), strict=False) if x != y)


def compare(traced: TracedTrajectory, consumed: Mapping[str, Any] | None, *,
            max_staleness: int | None = None) -> Report:
    """One trajectory's report: the trace's summary against the trainer's ``consumed``."""
    report = Report(traced)
    diffs = report.differences
    broken = [t for t in traced.turns if t.error is not None]
    if not traced.turns or broken:
        why = broken[0].error if broken else "no LLM call with per-turn token content"
        diffs.append(Difference("untraced", f"nothing to compare: {why}"))
        return report
    diffs.extend(_retokenized(traced.turns))
    if consumed is None:
        diffs.append(Difference("unmatched", "no record of what the trainer consumed"))
        return report
    conversation = traced.conversation()
    assert conversation is not None
    prompt, response, mask, labels = conversation
    theirs_prompt, theirs_response = consumed.get("prompt") or {}, consumed.get("response") or {}
    n_theirs = theirs_response.get("len")
    if type(n_theirs) is int and n_theirs < len(response):
        # the trainer cut the response (verl: to response_length): what it holds is compared
        # with the same head of the trace's, token for token (the ids of the cut runs too)
        report.notes.append(f"the trainer holds the first {n_theirs} of the {len(response)} "
                            "response tokens the trace shows (a response cut to its length)")
        response, mask = response[:n_theirs], mask[:n_theirs]
        labels = labels[:len(mask_runs(mask))]
    mine = summarize(prompt, response, mask)
    if theirs_prompt.get("id") != mine["prompt"]["id"]:
        diffs.append(Difference("prompt", f"prompt ids differ (traced {len(prompt)} tokens, "
                                f"trained {theirs_prompt.get('len')})"))
    _compare_response(report, mine["response"], theirs_response, labels)
    _compare_scalars(report, traced, consumed, max_staleness)
    return report


def _compare_response(report: Report, mine: Mapping[str, Any], theirs: Mapping[str, Any],
                      labels: Sequence[str]) -> None:
    diffs = report.differences
    a, b = mine["segments"], list(theirs.get("segments") or [])
    n_mine, n_theirs = mine["len"], theirs.get("len")
    if type(n_theirs) is not int:
        diffs.append(Difference("response", "the trainer's record has no response"))
        return
    if n_theirs > n_mine:  # a tail the trace does not hold (a tool's answer after the last turn)
        tail = n_theirs - n_mine
        cut = sum(int(s[1]) for s in b)
        tail_masked = _tail_mask(b, n_mine)
        if tail_masked:
            diffs.append(Difference("mask", f"masked tokens differ: {tail_masked} trained "
                                    f"tokens after the last traced turn are not in the trace"))
        elif cut == n_theirs:
            report.notes.append(f"{tail} tokens after the last turn (mask 0) are not in the "
                                "trace: not compared")
        b = _cut_runs(b, n_mine)
    runs_a = [(int(s[0]), int(s[1])) for s in a]
    runs_b = [(int(s[0]), int(s[1])) for s in b]
    if runs_a != runs_b:
        differ = _mask_diff(a, b)
        diffs.append(Difference("mask", f"masked tokens differ: {differ} tokens"
                                if differ else "masked tokens differ: the runs differ"))
        if n_theirs == n_mine and theirs.get("id") != mine["id"]:
            diffs.append(Difference("response", "response ids differ"))
        return
    cut_here = n_theirs != n_mine
    for i, (sa, sb) in enumerate(zip(a, b, strict=False)):
        if sa[2] is None or sb[2] is None:
            continue  # a run cut by the comparison: its id is not comparable
        if sa[2] != sb[2]:
            where = labels[i] if i < len(labels) else f"run {i + 1}"
            diffs.append(Difference("response", f"response ids differ in {where} "
                                    f"({int(sa[1])} tokens)"))
    if not cut_here and theirs.get("id") != mine["id"] and \
            not any(d.kind == "response" for d in diffs):
        diffs.append(Difference("response", "response ids differ"))


def _tail_mask(runs: Sequence[Sequence[Any]], start: int) -> int:
    """How many mask-1 positions ``runs`` have from ``start`` on."""
    pos = masked = 0
    for run in runs:
        value, length = int(run[0]), int(run[1])
        lo = max(pos, start)
        if value and pos + length > lo:
            masked += pos + length - lo
        pos += length
    return masked


def _cut_runs(runs: Sequence[Sequence[Any]], length: int) -> list[list[Any]]:
    """``runs`` up to ``length`` positions; a run cut short loses its id (None)."""
    out, pos = [], 0
    for run in runs:
        if pos >= length:
            break
        n = int(run[1])
        if pos + n <= length:
            out.append([int(run[0]), n, run[2]])
        else:
            out.append([int(run[0]), length - pos, None])
        pos += n
    return out


def _compare_scalars(report: Report, traced: TracedTrajectory, consumed: Mapping[str, Any],
                     max_staleness: int | None) -> None:
    diffs = report.differences
    attrs = traced.attrs
    mine_reward, theirs_reward = _number(attrs.get(semconv.ROLLOUT_REWARD)), consumed.get("reward")
    if theirs_reward is not None and (mine_reward is None or
                                      not math.isclose(mine_reward, theirs_reward,
                                                       rel_tol=1e-9, abs_tol=1e-12)):
        diffs.append(Difference("reward", f"reward differs: traced {mine_reward}, "
                                f"trained {theirs_reward}"))
    mine_turns, theirs_turns = _int(attrs.get(semconv.ROLLOUT_NUM_TURNS)), consumed.get("num_turns")
    if theirs_turns is not None and mine_turns is not None and mine_turns != theirs_turns:
        diffs.append(Difference("turns", f"number of turns differs: traced {mine_turns}, "
                                f"trained {theirs_turns}"))
    versions = traced.versions()
    low, high = consumed.get("min_version"), consumed.get("max_version")
    if versions and (low is not None or high is not None):
        t_low, t_high = min(versions), max(versions)
        if (low is not None and low != t_low) or (high is not None and high != t_high):
            odd = [k for k, t in enumerate(traced.turns, 1) if t.version is not None
                   and ((low is not None and t.version < low)
                        or (high is not None and t.version > high))]
            where = (f"turn {odd[0]} was sampled by version {traced.turns[odd[0] - 1].version}"
                     if odd else f"the trace shows versions {t_low}..{t_high}")
            diffs.append(Difference("policy_version", f"stale policy version: {where}, the "
                                    f"trainer recorded {low}..{high}"))
    elif (low is not None or high is not None) and not versions:
        diffs.append(Difference("policy_version", "policy version not traced (the trainer "
                                f"recorded {low}..{high})"))
    step = consumed.get("trained_step")
    if step is None:
        step = _int(attrs.get(semconv.ROLLOUT_STEP))
    if max_staleness is not None and versions and type(step) is int and \
            not attrs.get(semconv.ROLLOUT_VALIDATE):
        lag = step - 1 - min(versions)
        if lag > max_staleness:
            diffs.append(Difference("stale", f"stale policy version: sampled by version "
                                    f"{min(versions)}, trained at step {step} (staleness {lag} "
                                    f"> {max_staleness})"))


def check(spans: Iterable[Mapping[str, Any]], index: ContentIndex,
          consumed: Iterable[Mapping[str, Any]], *, max_staleness: int | None = None
          ) -> list[Report]:
    """A report per traced trajectory, matched to ``consumed`` records by trace id (the
    integration's records), else by (step, sample index, rollout n, validate)."""
    by_trace: dict[str, Mapping[str, Any]] = {}
    by_key: dict[tuple[Any, ...], Mapping[str, Any]] = {}
    for record in consumed:
        if type(record.get("trace_id")) is str:
            by_trace[record["trace_id"]] = record
        by_key.setdefault(consumed_key(record), record)
    reports = []
    for traced in traced_trajectories(spans, index):
        match = by_trace.get(traced.trace_id)
        if match is None and not by_trace:
            match = by_key.get(traced.key)
        reports.append(compare(traced, match, max_staleness=max_staleness))
    return reports


# --- the trainer's side, from files -------------------------------------------------------------


def _summary_of_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """A consumed record from a dataset row (``prompt_ids``...) or an integration record."""
    if isinstance(row.get("prompt"), dict) and isinstance(row.get("response"), dict):
        return dict(row)
    low, high = row.get("policy_version_min"), row.get("policy_version_max")
    summary = summarize(row["prompt_ids"], row["response_ids"], row["response_mask"],
                        reward=row.get("reward"), num_turns=row.get("num_turns"),
                        min_version=low, max_version=high, trained_step=row.get("trained_step"))
    for key in ("trace_id", "step", "sample_index", "rollout_n", "validate"):
        if key in row:
            summary[key] = row[key]
    return summary


def load_consumed(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """What the trainer consumed: a trace dir (its ``parity/`` records), a JSONL or a Parquet
    dataset file (rows with ``prompt_ids``, ``response_ids``, ``response_mask`` and optionally
    ``reward``, ``num_turns``, ``policy_version_min``/``max``, ``trace_id`` or ``step``,
    ``sample_index``, ``rollout_n``, ``validate``). A line that is not a record is skipped."""
    root = os.fspath(path)
    if os.path.isdir(root):
        folder = os.path.join(root, CONSUMED_DIR)
        files = sorted(os.path.join(folder, n) for n in os.listdir(folder)
                       if n.endswith(CONSUMED_SUFFIX)) if os.path.isdir(folder) else []
        return [r for f in files for r in _jsonl(f)]
    if root.endswith(".parquet"):
        import pyarrow.parquet as pq

        return [_summary_of_row(row) for row in pq.read_table(root).to_pylist()]
    return list(_jsonl(root))


def _jsonl(path: str) -> Iterator[dict[str, Any]]:
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                row = json.loads(line)
                if isinstance(row, dict):
                    yield _summary_of_row(row)
            except (ValueError, KeyError, TypeError):
                continue
