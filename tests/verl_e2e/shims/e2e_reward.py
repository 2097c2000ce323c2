"""The reward of the end-to-end run (verl's ``custom_reward_function``; test infrastructure).

Graded, so that it varies inside a GRPO group: a well-formed calculator call earns 0.5, the right
final answer ("The answer is N.") 1.0, and a shorter response a little more (a small length
term), so two samples of one prompt almost never tie and GRPO's advantages are not all zero.
"""

from __future__ import annotations

import re
from typing import Any

_CALL = re.compile(r'<tool_call>\s*\{"name":\s*"calculator",\s*"arguments":\s*\{"expression":'
                   r'\s*"\d+[-+*]\d+"\}\}\s*</tool_call>')
_ANSWER = re.compile(r"answer is (-?\d+)")


def compute_score(data_source: str, solution_str: str, ground_truth: str,
                  extra_info: dict[str, Any] | None = None, **kwargs: Any) -> float:
    score = 0.0
    if _CALL.search(solution_str):
        score += 0.5
    answer = _ANSWER.search(solution_str)
    if answer is not None and answer.group(1) == str(ground_truth).strip():
        score += 1.0
    return score + 0.1 / (1.0 + len(solution_str) / 100.0)
