"""Writes a store for the ui tier's flags test: trajectories with GenAI turns, one at the length
cap, one with a format failure, reward components, detectors on (``detect_flags=all``)."""

from __future__ import annotations

import sys

from otel_verl import (
    RolloutTraceConfig,
    get_tracer,
    record_reward,
    rollout_trace_attr,
    rollout_trace_op,
    semconv,
)


@rollout_trace_op
def generate(request_id: str, *, finish: str) -> dict:
    with get_tracer().start_as_current_span("chat tiny", attributes={
            semconv.GEN_AI_OPERATION_NAME: "chat", semconv.GEN_AI_REQUEST_MODEL: "tiny",
            semconv.GEN_AI_REQUEST_MAX_TOKENS: 64,
            semconv.GEN_AI_USAGE_OUTPUT_TOKENS: 64 if finish == "length" else 20,
            semconv.GEN_AI_RESPONSE_FINISH_REASONS: (finish,)}):
        return {"token_ids": [7] * 8}


def main(trace_dir: str) -> None:
    RolloutTraceConfig.init("ui-flags", "flags", "file", trace_dir=trace_dir,
                            detect_flags="all", group_size=4)
    for step in (1, 2):
        for sample in range(3):
            for n in range(4):
                with rollout_trace_attr(step=step, sample_index=sample, rollout_n=n):
                    finish = "length" if (sample, n) == (1, 2) else "stop"
                    generate(f"r{step}{sample}{n}", finish=finish)
                    fmt = 0.0 if (sample, n) == (2, 0) else 0.2
                    record_reward(0.5 + 0.1 * n + fmt, name="verifier", components={
                        "correctness": 1.0, "format": {
                            "score": fmt, "label": "ok" if fmt else "format_error"}})
    RolloutTraceConfig.shutdown(10.0)


if __name__ == "__main__":
    main(sys.argv[1])
