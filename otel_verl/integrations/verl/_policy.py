"""The policy version of verl's LLM calls, read from verl's own replies (issue 22).

verl 0.9's trainers (v1 and legacy) sync the rollout weights with
``checkpoint_manager.update_weights(global_steps)``; the rollout server keeps that number
(``set_global_steps``) and returns it in every reply: ``TokenOutput.extra_fields["global_steps"]``
(``min_global_steps``/``max_global_steps`` for a call resumed across a sync by a partial
rollout). ``LLMServerClient.generate``'s after-hook (``_vllm.generate_after``) hands the reply
here: the call's span gets ``rl.policy.version``, the trajectory its min/max and staleness.
Nothing is added to verl's request; a reply without the field (a server that does not keep it)
records nothing.
"""

from __future__ import annotations

from typing import Any

from otel_verl import _policy


def reply_versions(result: Any) -> tuple[int | None, int | None, int | None]:
    """(version, min, max) from a verl ``TokenOutput`` (None where absent or not an int)."""
    extra = getattr(result, "extra_fields", None)
    if not isinstance(extra, dict):
        return None, None, None

    def as_int(value: Any) -> int | None:
        if type(value) is int:
            return value
        if hasattr(value, "item") and not isinstance(value, (str, bytes)):
            try:
                item = value.item()
            except Exception:
                return None
            return item if type(item) is int else None
        return None

    version = as_int(extra.get("global_steps"))
    low = as_int(extra.get("min_global_steps"))
    high = as_int(extra.get("max_global_steps"))
    return version, (low if low is not None else version), (high if high is not None else version)


def record_reply(span: Any, result: Any) -> None:
    """The version that served this call, on its span and the trajectory (never raises)."""
    version, low, high = reply_versions(result)
    if version is None and high is not None:
        version = high
    if version is None:
        return
    _policy.record(span, version)
    for other in (low, high):
        if other is not None and other != version:
            _policy.note_trajectory(other)
