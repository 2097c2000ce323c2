"""``semconv.genai_request_attributes``: the one mapping from an engine request's sampling
parameters to ``gen_ai.request.*`` (the project's own clients and verl's LLMServerClient use it)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_verl import semconv


def test_vllm_and_sglang_parameters():
    assert semconv.genai_request_attributes(
        {"temperature": 1, "top_p": 0.9, "top_k": -1, "max_tokens": 96, "n": 4}) == {
        semconv.GEN_AI_REQUEST_TEMPERATURE: 1.0, semconv.GEN_AI_REQUEST_TOP_P: 0.9,
        semconv.GEN_AI_REQUEST_TOP_K: -1, semconv.GEN_AI_REQUEST_MAX_TOKENS: 96}
    assert semconv.genai_request_attributes({"max_new_tokens": 12}) == {
        semconv.GEN_AI_REQUEST_MAX_TOKENS: 12}
    attrs = semconv.genai_request_attributes({"temperature": 1})
    assert type(attrs[semconv.GEN_AI_REQUEST_TEMPERATURE]) is float


def test_odd_values_are_left_out_not_cast():
    odd = {"temperature": "0.7", "top_p": None, "top_k": 2.5, "max_tokens": True}
    assert semconv.genai_request_attributes(odd) == {}
    assert semconv.genai_request_attributes(None) == {}
    assert semconv.genai_request_attributes(["temperature", 1.0]) == {}


values = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True),
                   st.text(max_size=5), st.lists(st.integers(), max_size=2),
                   st.dictionaries(st.text(max_size=2), st.integers(), max_size=2))


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.dictionaries(st.sampled_from(["temperature", "top_p", "top_k", "max_tokens",
                                        "max_new_tokens", "other"]), values))
def test_any_parameters_give_plain_numbers_and_never_raise(params):
    attrs = semconv.genai_request_attributes(params)
    for key, value in attrs.items():
        assert type(value) in (int, float), (key, value)
    if semconv.GEN_AI_REQUEST_TOP_K in attrs:
        assert type(attrs[semconv.GEN_AI_REQUEST_TOP_K]) is int
