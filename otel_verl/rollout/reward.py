"""GSM8K-style reward: extract the final answer and compare it with the ground truth.

Usage::

    score = await Gsm8kReward().compute_score("... #### 42", "42")   # 1.0

Accepted answer forms (the last one in the text wins): ``#### 42`` (GSM8K's own), ``The answer is
42.`` (any case; ``$``, thousands separators and a trailing ``.`` are ignored). ``compute_score`` is
a ``rollout_trace_op`` of kind EVALUATOR carrying the GenAI evaluation attributes, and it calls
``otel_verl.record_reward`` so the score also lands on the trajectory span (verl computes the reward
after ``run`` returns, so its traces never show it).
"""

from __future__ import annotations

import re

from opentelemetry import trace

import otel_verl
from otel_verl import semconv
from otel_verl.semconv import GenAIOperation, SpanKindName

__all__ = ["Gsm8kReward", "extract_answer", "score_answer"]

_NUMBER = r"(-?[$]?[0-9][0-9,]*(?:\.[0-9]+)?)"
_PATTERNS = (
    re.compile(r"####\s*" + _NUMBER),
    re.compile(r"the answer is\s*:?\s*" + _NUMBER, re.IGNORECASE),
)


def _normalise(number: str) -> str | None:
    cleaned = number.replace(",", "").replace("$", "").rstrip(".")
    try:
        value = float(cleaned)
    except ValueError:
        return None
    return str(int(value)) if value.is_integer() else repr(value)


def extract_answer(text: str) -> str | None:
    """The last ``#### N`` / ``The answer is N`` in ``text``, normalised (``"1,000.0"`` -> ``"1000"``)."""
    best: tuple[int, str] | None = None
    for pattern in _PATTERNS:
        for match in pattern.finditer(text):
            if best is None or match.start() > best[0]:
                best = (match.start(), match.group(1))
    return None if best is None else _normalise(best[1])


def score_answer(text: str, ground_truth: str | float) -> tuple[float, str]:
    """(score, label): 1.0 ``correct``, 0.0 ``incorrect`` or ``no_answer``."""
    answer = extract_answer(text)
    if answer is None:
        return 0.0, "no_answer"
    truth = _normalise(str(ground_truth))
    return (1.0, "correct") if answer == truth else (0.0, "incorrect")


class Gsm8kReward:
    """The reward function the agent loop calls inside ``run`` (so it is a child span of ``run``)."""

    name = "gsm8k"

    @otel_verl.rollout_trace_op(kind=SpanKindName.EVALUATOR)
    async def compute_score(self, solution_str: str, ground_truth: str) -> float:
        """Score ``solution_str`` against ``ground_truth``; records it on the trajectory too."""
        score, label = score_answer(solution_str, ground_truth)
        if otel_verl.is_recording():
            trace.get_current_span().set_attributes(
                {
                    semconv.GEN_AI_OPERATION_NAME: GenAIOperation.EVALUATE,
                    semconv.GEN_AI_EVALUATION_NAME: self.name,
                    semconv.GEN_AI_EVALUATION_SCORE_VALUE: score,
                    semconv.GEN_AI_EVALUATION_SCORE_LABEL: label,
                }
            )
        otel_verl.record_reward(score, name=self.name, label=label)
        return score
