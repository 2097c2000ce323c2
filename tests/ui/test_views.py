"""Each view of `otel-verl ui` in Chromium, checked through the DOM against the store itself
(the expected numbers come from otel_verl.store, not from the viewer's index)."""

from __future__ import annotations

import json
import shutil
import statistics
import time
import urllib.parse
from collections import defaultdict

import pytest
from playwright.sync_api import expect
from uihelpers import (
    EDGE_EXPERIMENT,
    PROMPTS,
    STEPS,
    VAL_PROMPTS,
    N,
    UIProcess,
    edge_rollouts,
    goto,
    leave,
    shot,
)

from otel_verl import semconv
from otel_verl.store import group_trajectories, read_spans

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def trajectories(real_store):
    return [t for t in group_trajectories(read_spans(real_store)) if t.root is not None]


def demo_trajectories(trajectories):
    return [t for t in trajectories if t.experiment != EDGE_EXPERIMENT]


def cells(page, table: str, column: int) -> list[str]:
    return page.locator(f"[data-testid={table}] tbody tr").evaluate_all(
        f"rows => rows.map(r => r.children[{column}].textContent.trim())")


def test_overview_rewards_per_step(page, ui, trajectories, artifacts):
    demo = demo_trajectories(trajectories)
    experiment = demo[0].experiment
    assert len(demo) == STEPS * PROMPTS * N + VAL_PROMPTS  # the demo traced every rollout
    goto(page, ui.url, f"#/overview?experiment={experiment}")
    table = page.locator("[data-testid=steps-table]")
    expect(table).to_be_visible()
    for step in range(1, STEPS + 1):
        rewards = [t.reward for t in demo if t.step == step and t.validate is False]
        assert len(rewards) == PROMPTS * N
        row = table.locator(f"tr[data-step='{step}'][data-split='training']")
        assert row.locator("td").nth(2).inner_text() == str(PROMPTS * N)
        assert row.locator("td.reward-mean").inner_text() == f"{statistics.fmean(rewards):.3f}"
        passed = sum(r > 0 for r in rewards) / len(rewards)
        assert row.locator("td").nth(5).inner_text() == f"{100 * passed:.1f}%"
        tool_calls = sum(1 for t in demo if t.step == step and t.validate is False
                         for s in t.spans if s["attributes"].get(semconv.GEN_AI_TOOL_NAME))
        assert row.locator("td").nth(13).inner_text() == str(tool_calls)
    val = [t.reward for t in demo if t.validate is True]
    val_row = table.locator("tr[data-split='validation']")
    assert val_row.locator("td.reward-mean").inner_text() == f"{statistics.fmean(val):.3f}"
    # the charts are drawn, and hovering a point shows its numbers
    chart = page.locator("[data-testid=chart-reward]")
    expect(chart.locator(".main-svg").first).to_be_visible()
    point = chart.locator(".scatterlayer .trace .points path").first
    point.hover(force=True)
    expect(page.locator(".hoverlayer .hovertext").first).to_contain_text("reward mean")
    shot(page, artifacts, "overview")


def test_trajectory_table_filters_sort_and_pages(page, ui, trajectories, artifacts):
    total = len(trajectories)
    goto(page, ui.url, "#/trajectories?page_size=10")
    expect(page.get_by_test_id("count")).to_have_text(f"1–10 of {total}")
    page.get_by_test_id("next").click()
    expect(page.get_by_test_id("count")).to_have_text(f"11–20 of {total}")
    # filters through the form
    goto(page, ui.url, "#/trajectories")
    page.get_by_test_id("filter-step").fill("2")
    page.get_by_test_id("filter-validate").select_option("false")
    page.get_by_test_id("apply").click()
    want = [t for t in trajectories if t.step == 2 and t.validate is False]
    expect(page.get_by_test_id("count")).to_have_text(f"1–{len(want)} of {len(want)}")
    assert set(cells(page, "trajectory-table", 3)) == {"2"}
    assert set(cells(page, "trajectory-table", 6)) == {"training"}
    # reward range and sort by reward, descending
    goto(page, ui.url, "#/trajectories?reward_min=0.5&order=reward&desc=true")
    rewarded = [t for t in trajectories if t.reward is not None and t.reward >= 0.5]
    expect(page.get_by_test_id("count")).to_contain_text(f"of {len(rewarded)}")
    shown = [float(x) for x in cells(page, "trajectory-table", 7)]
    assert shown == sorted(shown, reverse=True) and min(shown) >= 0.5
    # validation only
    goto(page, ui.url, "#/trajectories?validate=true")
    expect(page.get_by_test_id("count")).to_contain_text(f"of {VAL_PROMPTS}")
    # errors only: the engine that refused and the tool that failed
    goto(page, ui.url, "#/trajectories")
    page.get_by_test_id("filter-errors").check()
    page.get_by_test_id("apply").click()
    expect(page.get_by_test_id("count")).to_have_text("1–2 of 2")
    assert set(cells(page, "trajectory-table", 2)) == {EDGE_EXPERIMENT}
    # free text over prompts, answers and tool calls
    goto(page, ui.url, "#/trajectories?text=division by zero")
    expect(page.get_by_test_id("count")).to_have_text("1–1 of 1")
    goto(page, ui.url, "#/trajectories?sample_index=1&rollout_n=2")
    want = [t for t in trajectories if t.sample_index == 1 and t.rollout_n == 2]
    expect(page.get_by_test_id("count")).to_contain_text(f"of {len(want)}")
    goto(page, ui.url, "#/trajectories?order=reward&desc=true")
    expect(page.locator("th[data-sort=reward]")).to_have_text("reward ▼")
    shot(page, artifacts, "trajectories", full_page=False)


def _tool_span(trajectory):
    return next(s for s in trajectory.spans if s["attributes"].get(semconv.GEN_AI_TOOL_NAME))


def test_trajectory_conversation_tool_call_reward_and_engine_spans(page, ui, trajectories,
                                                                    artifacts):
    t = next(t for t in demo_trajectories(trajectories) if t.step == 1 and t.validate is False)
    goto(page, ui.url, f"#/trajectory?key={t.trace_id}:{t.span_id}")
    expect(page.get_by_test_id("conversation")).to_be_visible()
    tool = _tool_span(t)["attributes"]
    result = page.get_by_test_id("tool-result").first
    args = json.loads(tool[semconv.GEN_AI_TOOL_CALL_ARGUMENTS])
    expect(result).to_contain_text(f'"expression": "{args["expression"]}"')
    expect(result).to_contain_text(f"result {tool[semconv.GEN_AI_TOOL_CALL_RESULT]}")
    expect(page.get_by_test_id("tool-call").first).to_contain_text("calculator")
    expect(page.get_by_test_id("reward")).to_contain_text(f"reward {t.reward:g}")
    label = next(e["attributes"][semconv.GEN_AI_EVALUATION_SCORE_LABEL] for s in t.spans
                 for e in s["events"] if e["name"] == semconv.GEN_AI_EVALUATION_RESULT)
    expect(page.get_by_test_id("reward-label")).to_have_text(label)
    # per-turn usage: the first LLM call's token counts (its one span: op + GenAI attributes)
    chat = next(s for s in t.spans
                if s["attributes"].get(semconv.GEN_AI_OPERATION_NAME) == "chat")
    expect(page.get_by_test_id("turn-stats").first).to_contain_text(
        f"{chat['attributes'][semconv.GEN_AI_USAGE_INPUT_TOKENS]} tokens in")
    # the waterfall holds every span, the engine's llm_request included (tinted)
    waterfall = page.get_by_test_id("waterfall")
    expect(waterfall.locator("details.span-row")).to_have_count(len(t.spans))
    engine_rows = waterfall.locator("details[data-name='llm_request']")
    assert engine_rows.count() == sum(1 for s in t.spans if s["name"] == "llm_request") >= 1
    expect(engine_rows.first.locator(".engine-tag")).to_be_visible()
    engine_rows.first.locator("summary").click()
    expect(engine_rows.first.locator(".span-body")).to_be_visible()
    shot(page, artifacts, "trajectory")


def test_error_message_is_shown(page, ui, trajectories, artifacts):
    t = next(t for t in trajectories if t.experiment == EDGE_EXPERIMENT and t.sample_index == 0)
    message = next(e["attributes"]["exception.message"] for s in t.spans for e in s["events"]
                   if e["name"] == "exception")
    goto(page, ui.url, f"#/trajectory?key={t.trace_id}:{t.span_id}")
    expect(page.get_by_test_id("errors")).to_be_visible()
    expect(page.get_by_test_id("error-message").first).to_have_text(message)
    shot(page, artifacts, "trajectory-error")
    failed_tool = next(t for t in trajectories
                       if t.experiment == EDGE_EXPERIMENT and t.sample_index == 1)
    goto(page, ui.url, f"#/trajectory?key={failed_tool.trace_id}:{failed_tool.span_id}")
    expect(page.get_by_test_id("tool-result").first).to_contain_text("division by zero")
    expect(page.locator(".msg.role-tool .bad").first).to_have_text("failed")


def test_grpo_group_side_by_side(page, ui, trajectories, artifacts):
    demo = demo_trajectories(trajectories)
    groups = defaultdict(list)
    for t in demo:
        if t.validate is False:
            groups[(t.step, t.sample_index)].append(t)
    # a group whose rewards differ, if the run made one (it nearly always does)
    (step, sample), members = max(groups.items(),
                                  key=lambda kv: len({t.reward for t in kv[1]}))
    assert len(members) == N
    goto(page, ui.url, f"#/group?experiment={members[0].experiment}&step={step}"
              f"&sample_index={sample}&validate=false")
    table = page.get_by_test_id("group-table")
    expect(table.locator("tbody tr")).to_have_count(N)
    mean = statistics.fmean(t.reward for t in members)
    for t in members:
        row = table.locator(f"tr[data-rollout='{t.rollout_n}']")
        assert row.locator("td.reward").inner_text() == f"{t.reward:g}"
        advantage = t.reward - mean
        shown = row.locator("td.advantage").inner_text()
        assert abs(float(shown) - advantage) < 1e-3, (shown, advantage)
    expect(page.locator(".side-by-side .column")).to_have_count(N)
    if len({t.reward for t in members}) > 1:
        expect(page.get_by_test_id("divergence")).to_contain_text("diverge at step")
    shot(page, artifacts, "group")


def test_prompt_through_training(page, ui, trajectories, artifacts):
    demo = [t for t in demo_trajectories(trajectories) if t.validate is False]
    sample = demo[0].sample_index
    goto(page, ui.url, f"#/prompt?experiment={demo[0].experiment}&sample_index={sample}"
              "&validate=false")
    rows = page.get_by_test_id("prompt-table").locator("tbody tr")
    expect(rows).to_have_count(STEPS * N)
    steps = sorted({int(s) for s in cells(page, "prompt-table", 0)})
    assert steps == list(range(1, STEPS + 1))
    expect(page.get_by_test_id("prompt-text")).to_contain_text("Use the calculator")
    expect(page.locator("[data-testid=chart-prompt] .main-svg").first).to_be_visible()
    shot(page, artifacts, "prompt")
    # each answer is the one its trajectory page's conversation ends with (token2text's
    # response_text ends with the raw end-of-turn token; the conversation has none)
    answers = cells(page, "prompt-table", 5)
    assert answers and not [a for a in answers if "<|" in a], answers
    links = page.get_by_test_id("prompt-table").locator("tbody tr td:nth-child(3) a")
    hrefs = links.evaluate_all("links => links.map(a => a.getAttribute('href'))")
    for answer, link in list(zip(answers, hrefs, strict=True))[:3]:
        goto(page, ui.url, urllib.parse.unquote(link))
        last = page.locator(".msg.role-assistant pre.content").last
        expect(last).to_have_text(answer)


def test_compare_two_trajectories(page, ui, trajectories, artifacts):
    demo = demo_trajectories(trajectories)
    a, b = (t for t in demo if t.step == 1 and t.sample_index == demo[0].sample_index
            and t.rollout_n in (0, 1) and t.validate is False)
    goto(page, ui.url, "#/trajectories?step=1&sample_index=" + str(a.sample_index)
              + "&validate=false")
    page.locator(f"tr[data-key='{a.trace_id}:{a.span_id}'] input[type=checkbox]").check()
    page.locator(f"tr[data-key='{b.trace_id}:{b.span_id}'] input[type=checkbox]").check()
    page.get_by_test_id("compare-selected").click()
    summary = page.get_by_test_id("compare-summary")
    expect(summary.locator("tr[data-field='rollout_n'] td").nth(3)).to_have_text("≠")
    expect(summary.locator("tr[data-field='step'] td").nth(3)).to_have_text("")
    expect(page.get_by_test_id("compare-count")).to_contain_text("messages differ")
    shot(page, artifacts, "compare")


def test_planted_script_stays_text(page, ui, trajectories):
    t = next(t for t in trajectories if t.experiment == EDGE_EXPERIMENT and t.sample_index == 2)
    for route in (f"#/trajectory?key={t.trace_id}:{t.span_id}",
                  f"#/prompt?experiment={EDGE_EXPERIMENT}&sample_index=2"):
        goto(page, ui.url, route)
        expect(page.get_by_text("<script>window.__pwned=1</script>").first).to_be_visible()
        time.sleep(0.3)
        assert page.evaluate("window.__pwned") is None
        assert page.locator("main script, main img").count() == 0


def test_new_trajectories_appear_while_the_run_writes(page, real_store, trajectories, tmp_path):
    store = tmp_path / "traces"
    shutil.copytree(real_store, store, ignore=shutil.ignore_patterns(".otel_verl_index"))
    server = UIProcess(store)
    try:
        goto(page, server.url, "#/trajectories")
        expect(page.get_by_test_id("count")).to_contain_text(f"of {len(trajectories)}")
        edge_rollouts(store, "live-append")  # another process writes a new file meanwhile
        expect(page.get_by_test_id("count")).to_contain_text(f"of {len(trajectories) + 3}",
                                                             timeout=30_000)
        expect(page.get_by_test_id("live")).to_contain_text(
            f"{len(trajectories) + 3} trajectories")
    finally:
        leave(page)
        server.stop()
