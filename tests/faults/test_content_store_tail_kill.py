"""The content store under SIGKILL with tail sampling: a kept trajectory decided more than one
write interval before the kill has its content on disk (held nodes are queued and the store's
thread woken at the decision), and the dropped ones left nothing there."""

from __future__ import annotations

import textwrap
from pathlib import Path

from _killed_child import run_killed

from otel_verl import _content
from otel_verl.store._content import ContentIndex

CHILD = textwrap.dedent("""
    import os, signal, sys, time
    import otel_verl
    from otel_verl import RolloutTraceConfig, _content, semconv

    @otel_verl.rollout_trace_op
    def generate(request_id, *, prompt_ids, sampling_params):
        return {"token_ids": [7, 8, 9]}

    RolloutTraceConfig.init("p", "e", "file", trace_dir=sys.argv[1], tail_keep=["errors"])
    shared = list(range(1000, 9000))
    for n in range(4):
        with otel_verl.rollout_trace_attr(step=1, sample_index=0, rollout_n=n, trace=False):
            generate("r", prompt_ids=list(shared), sampling_params={})
            own = shared + [7, 8, 9] + list(range(50_000 + n * 3000, 53_000 + n * 3000))
            generate("r", prompt_ids=own, sampling_params={})
            if n == 2:
                otel_verl.set_trajectory_attribute(semconv.ERROR_TYPE, "tool_error")
    time.sleep(4 * _content.WRITE_EVERY_S + 0.5)  # well past one write interval
    print("decided", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
""")


def test_a_kept_trajectorys_content_survives_a_sigkill_and_dropped_ones_left_none(
        tmp_path: Path) -> None:
    run_killed(CHILD, tmp_path, "decided")
    index = ContentIndex.load(tmp_path)
    assert index.bad_lines == 0
    shared = list(range(1000, 9000))
    for n in range(4):
        own = shared + [7, 8, 9] + list(range(50_000 + n * 3000, 53_000 + n * 3000))
        content_id = _content.token_content_id(own)
        if n == 2:  # kept: its turns rebuild
            assert index.rebuild(content_id) == own
            assert index.rebuild(_content.token_content_id(shared)) == shared
        else:  # dropped: nothing of its own on disk
            assert content_id not in index.nodes
