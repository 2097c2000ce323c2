"""Parsers, tools and reward with bad model output: nothing raises, everything is traced."""

from __future__ import annotations

import json

import pytest

import otel_verl
from otel_verl import semconv
from otel_verl.rollout.parsers import HermesToolParser
from otel_verl.rollout.reward import Gsm8kReward, extract_answer, score_answer
from otel_verl.rollout.tools import CalculatorTool, safe_eval
from otel_verl.testing import capture_spans

CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>'


@pytest.mark.parametrize(
    ("text", "names", "errors", "content"),
    [
        ("The answer is 5.", [], [], "The answer is 5."),
        (CALL, ["calculator"], [None], ""),
        ("Let me compute. " + CALL + CALL, ["calculator", "calculator"], [None, None],
         "Let me compute."),
        ('<tool_call>{"name": "calculator", "arguments": {"expression": </tool_call>', [""],
         ["invalid JSON"], ""),
        ("<tool_call>[1, 2]</tool_call>", [""], ["tool call is not an object"], ""),
        ('<tool_call>{"arguments": {}}</tool_call>', [""], ["missing tool name"], ""),
        ('<tool_call>{"name": "calculator", "arguments": [1]}</tool_call>', ["calculator"],
         ["arguments must be a JSON object"], ""),
        ('<tool_call>{"name": "calculator", "arguments": "{\\"expression\\": \\"1+1\\"}"}'
         "</tool_call>", ["calculator"], [None], ""),
        ('ok <tool_call>{"name": "calculator", "argu', [""], ["unterminated"], "ok"),
        ("<tool_call>" + "[" * 5000 + "</tool_call>", [""], ["invalid JSON"], ""),
        ("\x00\udcff<tool_call>\x00</tool_call>", [""], ["invalid JSON"], "\x00\udcff"),
    ],
)
def test_hermes_parser_never_raises(text, names, errors, content):
    got_content, calls = HermesToolParser().parse(text)
    assert got_content == content
    assert [c.name for c in calls] == names
    for call, expected in zip(calls, errors, strict=True):
        if expected is None:
            assert call.error is None
        else:
            assert expected in call.error
    assert len(calls) == len(errors)


def test_parsed_string_arguments_are_decoded():
    _, calls = HermesToolParser().parse(
        '<tool_call>{"name": "calculator", "arguments": "{\\"expression\\": \\"1+1\\"}"}</tool_call>')
    assert calls[0].arguments == {"expression": "1+1"}


async def test_extract_tool_calls_is_traced(spans):
    with otel_verl.rollout_trace_attr(step=1, sample_index=2, rollout_n=0):
        content, calls = await HermesToolParser().extract_tool_calls("x " + CALL)
    assert content == "x" and calls[0].arguments == {"expression": "2+3"}
    (span,) = [s for s in spans.get_finished_spans()
               if s.name == "HermesToolParser.extract_tool_calls"]
    assert "2+3" in span.attributes[semconv.INPUT_VALUE]
    assert span.attributes[semconv.ROLLOUT_STEP] == 1


@pytest.mark.parametrize(("expr", "value"), [
    ("2+3", 5), ("12*(3+4)", 84), ("-4--2", -2), ("7/2", 3.5), ("2**10", 1024), ("17 % 5", 2),
    ("1.5*2", 3.0), ("9//2", 4),
])
def test_safe_eval(expr, value):
    assert safe_eval(expr) == value


@pytest.mark.parametrize("expr", [
    "__import__('os').system('true')", "x+1", "abs(-1)", "(1).real", "1/0", "2**99999",
    "9**9**9", "[1,2]", "'a'*3", "", "1+" * 200 + "1", "1 if 1 else 2", "lambda: 1", "True+1",
])
def test_safe_eval_rejects(expr):
    with pytest.raises(ValueError):
        safe_eval(expr)


async def test_calculator_results_and_errors_are_traced(spans):
    tool = CalculatorTool()
    with otel_verl.rollout_trace_attr(step=3, sample_index=1, rollout_n=2):
        ok = await tool.execute("call_1", {"expression": "6*7"})
        bad = await tool.execute("call_2", {"expression": "open('x')"})
        missing = await tool.execute("call_3", {})
        wrong_type = await tool.execute("call_4", ["6*7"])  # type: ignore[arg-type]
    assert (ok.text, ok.ok) == ("42", True)
    assert not bad.ok and bad.text.startswith("Error:")
    assert not missing.ok and "expression" in missing.text
    assert not wrong_type.ok
    tool_spans = [s for s in spans.get_finished_spans() if s.name == "BaseTool.execute"]
    assert len(tool_spans) == 4
    first = tool_spans[0].attributes
    assert first[semconv.GEN_AI_OPERATION_NAME] == "execute_tool"
    assert first[semconv.GEN_AI_TOOL_NAME] == "calculator"
    assert first[semconv.GEN_AI_TOOL_CALL_ID] == "call_1"
    assert json.loads(first[semconv.GEN_AI_TOOL_CALL_ARGUMENTS]) == {"expression": "6*7"}
    assert first[semconv.GEN_AI_TOOL_CALL_RESULT] == "42"
    assert first[semconv.OPENINFERENCE_SPAN_KIND] == "TOOL"
    assert first[semconv.ROLLOUT_ROLLOUT_N] == 2


@pytest.mark.parametrize(("text", "answer"), [
    ("reasoning... #### 42", "42"),
    ("The answer is 1,234.", "1234"),
    ("the answer is: $7.50", "7.5"),
    ("#### 3 but wait, The answer is 4.", "4"),
    ("The answer is -12.", "-12"),
    ("The answer is 5.0", "5"),
    ("no number here", None),
    ("The answer is many.", None),
    ("", None),
])
def test_extract_answer(text, answer):
    assert extract_answer(text) == answer


def test_score_labels():
    assert score_answer("#### 42", "42") == (1.0, "correct")
    assert score_answer("#### 41", 42) == (0.0, "incorrect")
    assert score_answer("nothing", "42") == (0.0, "no_answer")


async def test_reward_is_a_span_and_lands_on_the_trajectory(spans):
    with otel_verl.rollout_trace_attr(step=1, sample_index=0, rollout_n=0):
        score = await Gsm8kReward().compute_score("The answer is 42.", "42")
    assert score == 1.0
    by_name = {s.name: s for s in spans.get_finished_spans()}
    reward = by_name["Gsm8kReward.compute_score"]
    assert reward.attributes[semconv.GEN_AI_EVALUATION_SCORE_VALUE] == 1.0
    assert reward.attributes[semconv.GEN_AI_EVALUATION_SCORE_LABEL] == "correct"
    assert reward.attributes[semconv.OPENINFERENCE_SPAN_KIND] == "EVALUATOR"
    trajectory = by_name["rollout_trace"]
    assert trajectory.attributes[semconv.ROLLOUT_REWARD] == 1.0
    assert reward.parent.span_id == trajectory.context.span_id
    assert any(e.name == semconv.GEN_AI_EVALUATION_RESULT for e in trajectory.events)


async def test_everything_works_with_tracing_off():
    assert (await CalculatorTool().execute("c", {"expression": "1+1"})).text == "2"
    assert await Gsm8kReward().compute_score("#### 2", "2") == 1.0
    assert (await HermesToolParser().extract_tool_calls(CALL))[1][0].name == "calculator"


async def test_tool_arguments_and_results_are_redacted_and_capped():
    from otel_verl.rollout.tools import BaseTool, ToolResponse

    class Leaky(BaseTool):
        name = "leaky"
        description = "returns a secret"
        parameters = {"type": "object", "properties": {}}

        async def _run(self, arguments):
            return ToolResponse(text="token sk-abcdefghijklmnopqrstu " + "y" * 5000)

    with capture_spans(max_field_bytes=1024) as exporter:
        await Leaky().execute("c1", {"api_key": "hunter2", "q": "x"})
    (span,) = exporter.get_finished_spans()
    args = json.loads(span.attributes[semconv.GEN_AI_TOOL_CALL_ARGUMENTS])
    assert args == {"api_key": "[REDACTED]", "q": "x"}
    result = span.attributes[semconv.GEN_AI_TOOL_CALL_RESULT]
    assert "sk-abcdefghijklmnopqrstu" not in result and len(result) < 1200


async def test_tool_content_not_recorded_when_payload_capture_is_off():
    with capture_spans(capture_payloads=False) as exporter:
        await CalculatorTool().execute("c1", {"expression": "6*7"})
    (span,) = exporter.get_finished_spans()
    assert span.attributes[semconv.GEN_AI_TOOL_NAME] == "calculator"
    assert semconv.GEN_AI_TOOL_CALL_ARGUMENTS not in span.attributes
    assert semconv.GEN_AI_TOOL_CALL_RESULT not in span.attributes
