"""The span-end redaction pass: the catalogue, JSON kept valid, spans copied only when needed,
user patterns, and the wiring into the provider (hand-made spans included)."""

from __future__ import annotations

import json
import logging
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Status, StatusCode

from otel_verl import ConfigError, get_tracer, rollout_trace_attr, semconv
from otel_verl._config import resolve_config
from otel_verl.exporters._scrub import (
    REDACTED,
    Scrubber,
    ScrubbingSpanExporter,
    build_scrubber,
    fix_surrogates,
    is_sensitive_key,
    scrub,
)
from otel_verl.testing import capture_spans


@pytest.mark.parametrize(("text", "expected"), [
    ("use sk-proj-abcdefghijklmnop1234 now", "use [REDACTED] now"),
    ("line\\nsk-ant-api03-abcdefghijklmnopqrstu", "line\\n[REDACTED]"),  # after a JSON escape
    ("https://bob:hunter2pass@example.com/x", "https://bob:[REDACTED]@example.com/x"),
    ("Authorization: Bearer abcdefgh12345678", "Authorization: Bearer [REDACTED]"),
    ("password=hunter2 --password s3cret", "password=[REDACTED] --password [REDACTED]"),
    ('{"api_key": "abc", "password": null}', '{"api_key": "[REDACTED]", "password": null}'),
    ("AWS secret: wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "AWS secret: [REDACTED]"),
    ("id AKIAIOSFODNN7EXAMPLE.", "id [REDACTED]."),
])
def test_catalogue_examples(text, expected):
    assert scrub(text)[0] == expected


@pytest.mark.parametrize("text", [
    "task-abcdefghijklmnopqrstuvwxyz is a task id",  # not an sk- key
    '{"max_tokens": 100, "prompt_tokens": 9, "token_ids": [1, 2], "eos_token": "</s>"}',
    "author: bob, authors: [a, b]",
    "basic arithmetic: 2+3",
    "the key to the problem is 42",
    "x" * 1000,
    "[" + ",".join(str(i * 7919 % 151000) for i in range(5000)) + "]",
])
def test_ordinary_rollout_text_is_left_alone(text):
    out, count = scrub(text)
    assert count == 0 and out is text


@pytest.mark.parametrize(("key", "sensitive"), [
    ("api_key", True), ("Authorization", True), ("password", True), ("client_secret", True),
    ("WANDB_API_KEY", True), ("access_token", True), ("token", True), ("cookie", True),
    ("session_id", True), ("http.request.header.authorization", True), ("mysql_pwd", True),
    ("max_tokens", False), ("prompt_ids", False), ("token_ids", False), ("input_tokens", False),
    ("gen_ai.usage.input_tokens", False), ("eos_token", False), ("author", False),
    ("monkey", False), ("keys", False), ("tokenizer", False),
])
def test_sensitive_key_names(key, sensitive):
    assert is_sensitive_key(key) is sensitive


def test_no_semconv_key_is_taken_for_a_secret():
    keys = [v for k, v in vars(semconv).items() if k.isupper() and isinstance(v, str)]
    assert keys and not [k for k in keys if is_sensitive_key(k)]


json_text = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
    | st.text(max_size=60) | st.sampled_from([
        "sk-proj-abcdefghijklmnop1234", "password=hunter2", "Bearer abcdefgh12345678",
        "https://u:p@h/x", "-----BEGIN PRIVATE KEY-----\nMIIB\n-----END PRIVATE KEY-----",
        '\\"', "\\", "api_key", "--password", "\n", "eyJabcdefghij.eyJabcdefghij.sig",
    ]),
    lambda children: st.lists(children, max_size=6) | st.dictionaries(
        st.text(max_size=12) | st.sampled_from(["api_key", "password", "token", "note"]),
        children, max_size=6),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None)
@given(json_text)
def test_scrubbed_json_stays_valid_json(value):
    text = json.dumps(value, ensure_ascii=False)
    out, count = scrub(text)
    json.loads(out)  # no rule eats a quote or half an escape
    if not count:
        assert out is text


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=400))
def test_any_text_scrubs_without_raising(text):
    out, _ = scrub(text)
    out.encode("utf-8")  # lone surrogates were replaced


def test_lone_surrogates_become_replacement_characters():
    assert fix_surrogates("a\ud800b") == "a\ufffdb"
    assert scrub("name \udcff with sk-proj-abcdefghijklmnop1234")[0] == \
        "name \ufffd with [REDACTED]"


def test_cost_is_linear_on_hostile_text():
    # anchors everywhere: each is looked at a bounded number of times
    for piece in ("key:", "--", "://", "sk-", "-----BEGIN", "a" * 40 + ","):
        text = piece * 20000
        out, _ = scrub(text)
        assert isinstance(out, str)


def _span(**kwargs) -> ReadableSpan:
    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span(kwargs.pop("name", "op"), **kwargs) as span:
        span.add_event("e", {"detail": "fine"})
    return exporter.get_finished_spans()[0]


def test_clean_span_is_returned_unchanged():
    span = _span(attributes={"input.value": '{"a": 1}', "gen_ai.usage.input_tokens": 5})
    assert Scrubber()(span) is span


def test_dirty_span_is_copied_and_counted():
    span = _span(name="call sk-proj-abcdefghijklmnop1234",
                 attributes={"api_key": "x", "note": "password=hunter2", "n": 1,
                             "tags": ["Bearer abcdefgh12345678", "ok"]})
    out = Scrubber()(span)
    assert out is not span
    assert out.name == "call [REDACTED]"
    assert out.attributes["api_key"] == REDACTED
    assert out.attributes["note"] == "password=[REDACTED]"
    assert out.attributes["tags"] == ("Bearer [REDACTED]", "ok")
    assert out.attributes[semconv.OTEL_VERL_REDACTED] == 4
    assert out.context == span.context and out.end_time == span.end_time
    assert span.name.startswith("call sk-")  # the original is untouched


@pytest.fixture(params=["regex", "re"])
def engine(request, monkeypatch):
    """User patterns run both ways: with the ``regex`` module (in unit.txt: a time limit per
    pattern) and without it (``re``, catastrophic patterns refused)."""
    from otel_verl.exporters import _scrub as s

    if request.param == "regex":
        import regex  # required here: the unit tier installs it

        monkeypatch.setattr(s, "_regex", regex)
    else:
        monkeypatch.setattr(s, "_regex", None)
    return request.param


def test_the_engine_that_runs_user_patterns(engine):
    user = Scrubber([r"ACME-\d{5}"])._user
    assert user is not None
    (pattern, compiled, timed), = user.compiled
    assert pattern == r"ACME-\d{5}" and timed is (engine == "regex")
    if engine == "regex":
        import regex

        assert isinstance(compiled, regex.Pattern)
    else:
        assert isinstance(compiled, re.Pattern)


def test_user_patterns_are_added(engine):
    span = _span(name="ticket ACME-12345", attributes={"note": "ACME-99999 ok"})
    out = Scrubber([r"ACME-\d{5}"])(span)
    assert out.name == "ticket [REDACTED]" and out.attributes["note"] == "[REDACTED] ok"


def test_redact_patterns_config(monkeypatch):
    assert resolve_config({"redact_patterns": ["a+b"]}).redact_patterns == ("a+b",)
    env = {"OTEL_VERL_REDACT_PATTERNS": '["x\\\\d+", "y"]'}
    assert resolve_config(environ=env).redact_patterns == ("x\\d+", "y")
    assert resolve_config(environ={"OTEL_VERL_REDACT_PATTERNS": "z+"}).redact_patterns == ("z+",)
    with pytest.raises(ConfigError, match="redact_patterns"):
        resolve_config({"redact_patterns": ["("]})
    assert build_scrubber(resolve_config({"redact": False})) is None
    assert build_scrubber(resolve_config({})) is not None


def test_worker_config_that_is_not_an_object_warns(caplog):
    for raw in ("[1, 2]", "7", '"text"', "null"):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="otel_verl"):
            config = resolve_config(environ={"OTEL_VERL_CONFIG": raw})
        assert config.backend == "file"
        assert "OTEL_VERL_CONFIG" in caplog.text, raw


def test_wiring_redacts_hand_made_spans_and_status():
    """Through the real provider: a get_tracer() span with secrets everywhere."""
    with capture_spans() as exporter, rollout_trace_attr(sample_index=1, name="traj"):
        with get_tracer().start_as_current_span(
                "GET https://u:pw123456@host/x", attributes={"authorization": "Bearer zz"}) as span:
            span.add_event("retry ghp_abcdefghijklmnopqrstuvwxyz0123456789",
                           {"body": "token=abcdefgh12345678"})
            span.set_status(Status(StatusCode.ERROR, "denied for hf_abcdefghijklmnopqrstuvwxyz123456"))
    hand = next(s for s in exporter.get_finished_spans() if s.name.startswith("GET"))
    assert hand.name == "GET https://u:[REDACTED]@host/x"
    assert hand.attributes["authorization"] == REDACTED
    assert hand.events[0].name == "retry [REDACTED]"
    assert hand.events[0].attributes["body"] == "token=[REDACTED]"
    assert hand.status.description == "denied for [REDACTED]"


def test_wrapper_exporter_forwards_the_contract():
    inner = InMemorySpanExporter()
    wrapped = ScrubbingSpanExporter(inner, Scrubber())
    span = _span(attributes={"password": "x"})
    wrapped.export([span])
    assert inner.get_finished_spans()[0].attributes["password"] == REDACTED
    assert wrapped.force_flush() is True
    assert wrapped.get_finished_spans() == inner.get_finished_spans()  # extras pass through
    wrapped.shutdown()


def test_redact_off_exports_as_recorded():
    with capture_spans(redact=False) as exporter, rollout_trace_attr(sample_index=1):
        with get_tracer().start_as_current_span("x", attributes={"api_key": "visible"}):
            pass
    span = next(s for s in exporter.get_finished_spans() if s.name == "x")
    assert span.attributes["api_key"] == "visible"


# --- encodings: escaped newlines, JSON serialised more than once ---------------------------------

_PEM_ESCAPED = ("-----BEGIN RSA PRIVATE KEY-----\\nMIIEpAIBAAKCAQEA3Tz2mr7SZiAMfQyuvBjM2Ks9\\n"
                "kq1Vr2C+Yb7wTs/hOi0o9Zg==\\n-----END RSA PRIVATE KEY-----")


@pytest.mark.parametrize("levels", [0, 1, 2, 3])
@pytest.mark.parametrize(("value", "secret"), [
    (_PEM_ESCAPED, "MIIEpAIBAAKCAQEA3Tz2mr7SZiAMfQyuvBjM2Ks9"),
    ('{"api_key": "Zq9PlainSecretValue42", "n": 1}', "Zq9PlainSecretValue42"),
    ('{"password":"hunter2hunter2"}', "hunter2hunter2"),
], ids=["pem_escaped_newlines", "api_key_json", "password_compact_json"])
def test_secrets_survive_no_level_of_json_serialisation(value, secret, levels):
    text = value
    for _ in range(levels):
        text = json.dumps(text)
    out, count = scrub(text)
    assert secret not in out and count >= 1
    for _ in range(levels):  # still valid JSON at every level
        out = json.loads(out)


# --- every anchor is found, whatever the density (the C-speed paths) -----------------------------

_FRAGMENTS = [
    "sk-proj-abcdefghijklmnop1234", "task-", "sk-", "sk_live_", "rk_test_abcdefghijklmnopqrst",
    "whsec_", "ghp_", "gho_abcdefghijklmnopqrstuvwxyz0123456789", "hf_abcdefghijklmnopqrstuvwxyz12",
    "github_pat_11ABCDEFG0123456789_abcdefghijklmnop", "xoxb-1234567890-abc", "xapp-",
    "AIzaSyA1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q", "AKIAIOSFODNN7EXAMPLE", "ASIA", "local-",
    "9f8e7d6c5b4a39281706f5e4d3c2b1a098765432", "eyJhbGciOiJIUzI1NiIs", ".eyJzdWIiOiIxMjM0NTY3",
    ".", "-----BEGIN RSA PRIVATE KEY-----", "\\n", "\\\\n", "MIIEpAIBAAKCAQEA3Tz2", "://", "u:p@",
    "@", ":", "=", "--", "--password", "password", "api_key", '"', "'", "\\", " ", "\t", "\n",
    "Bearer ", "token ", "abcDEF123456ghiJKL789", "x", "a", "A", "0", "_", "-", "é", "key",
    "secret", "max_tokens", ",", "{", "}",
]
_texts = st.lists(st.sampled_from(_FRAGMENTS), min_size=1, max_size=14).map("".join)
_dense_texts = st.tuples(_texts, st.integers(1, 60)).map(lambda t: t[0] * t[1])


def _covered(spans) -> set[int]:
    return {i for start, end in spans for i in range(start, end)}


def _oracle(text: str) -> set[int]:
    """Every shaped rule tried at every position (what ``re.finditer`` over each rule would find
    if no match hid another): the slow definition the fast pass must cover."""
    from otel_verl.exporters import _scrub as s

    spans = []
    for name, regex in s._TOKEN_RULES:
        compiled = re.compile(regex)
        for pos in range(len(text)):
            match = compiled.match(text, pos)
            if match is not None and (name not in s._NEEDS_BOUNDARY
                                      or s._boundary_ok(text, pos)):
                spans.append(match.span())
    return _covered(spans)


def _fast(text: str) -> set[int]:
    from otel_verl.exporters._scrub import _Finder

    finder = _Finder(text)
    finder.anchored()
    finder.unprefixed()
    return _covered(finder.spans)


@settings(max_examples=400, deadline=None)
@given(st.one_of(_texts, _dense_texts))
def test_anchored_pass_finds_every_match_at_every_position(text):
    assert _oracle(text) <= _fast(text)


@settings(max_examples=300, deadline=None)
@given(st.one_of(_texts, _dense_texts))
def test_keyword_pass_finds_what_the_separator_pass_finds(text):
    from otel_verl.exporters import _scrub as s

    by_separators = s._Finder(text)
    original = s._budget
    s._budget = lambda n, per: 10**9  # visit every separator
    try:
        assert s._Assignments(by_separators)._by_separators()
    finally:
        s._budget = original
    by_keywords = s._Finder(text)
    s._Assignments(by_keywords)._by_keywords()
    assert _covered(by_separators.spans) <= _covered(by_keywords.spans)


@pytest.mark.parametrize("content", ["base64", "hex", "repeated", "prose"])
def test_long_token_like_runs_keep_their_secrets(content):
    """A key planted in the middle of a long base64/hex/repeated/prose run is still found."""
    import base64
    import random

    rng = random.Random(7)
    filler = {
        "base64": base64.b64encode(rng.randbytes(150_000)).decode(),
        "hex": rng.randbytes(100_000).hex(),
        "repeated": "x" * 200_000,
        "prose": " ".join(rng.choice(["the", "model", "tool", "reward", "answer"])
                          for _ in range(40_000)),
    }[content]
    half = len(filler) // 2
    text = (filler[:half] + " sk-proj-abcdefghijklmnop1234 password=hunter2x "
            + _PEM_ESCAPED + " " + filler[half:])
    out, count = scrub(text)
    assert "abcdefghijklmnop1234" not in out and "hunter2x" not in out
    assert "MIIEpAIBAAKCAQEA3Tz2" not in out and count >= 3
    assert scrub(filler)[1] == 0


# --- the cache of long strings --------------------------------------------------------------------


def test_the_same_long_content_is_scanned_once(monkeypatch):
    from otel_verl.exporters import _scrub as s

    s._CACHE.clear()
    calls = []
    real = s._scrub
    monkeypatch.setattr(s, "_scrub", lambda text, extra: calls.append(1) or real(text, extra))
    prompt = "system: you are helpful. api_key=Zq9PlainSecretValue42 " + "the tool said ok. " * 2000
    first = scrub(prompt)
    again = scrub("".join([prompt]))  # the same content, another string object
    assert first == again and "Zq9PlainSecretValue42" not in again[0]
    assert len(calls) == 1 and s._CACHE.hits >= 1


def test_cache_is_bounded_and_thread_safe():
    import threading

    from otel_verl.exporters._scrub import _Cache

    cache = _Cache(max_bytes=1 << 20, max_entries=50)

    def fill(seed: int) -> None:
        for i in range(300):
            text = f"{seed}-{i}-" + "y" * 8000
            cache.put(text, text, 0)
            assert cache.get(text) in (None, (text, 0))

    threads = [threading.Thread(target=fill, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(cache._entries) <= 50 and 0 < cache.bytes <= 1 << 20
    assert cache.bytes == sum(size for _, _, size in cache._entries.values())


# --- user patterns: no pattern can freeze the process ----------------------------------------------


@pytest.mark.parametrize(("pattern", "catastrophic"), [
    ("(a+)+$", True), ("(a|aa)+", True), (r"(\w+\s?)*$", True), (r"(a{1,3}){2,}", True),
    (r"(x)\1", True), (r"ACME-\d{5}", False), (r"[\w.+-]+@[\w-]+\.[\w.]+", False),
    (r"(?:\d{3}-){2}\d{4}", False), (r"\bticket-[0-9a-f]{8}\b", False),
])
def test_catastrophic_patterns_are_recognised(pattern, catastrophic):
    from otel_verl.exporters._scrub import backtracks_catastrophically

    assert backtracks_catastrophically(pattern) is catastrophic


def test_a_catastrophic_pattern_without_regex_fails_closed(monkeypatch, caplog):
    from otel_verl.exporters import _scrub as s

    monkeypatch.setattr(s, "_regex", None)
    with caplog.at_level(logging.WARNING, logger="otel_verl"):
        scrubber = Scrubber(["(a+)+$", r"ACME-\d{5}"])
    assert "(a+)+$" in caplog.text
    span = _span(name="op", attributes={"input.value": "a" * 18 + "b ACME-12345", "n": 1})
    out = scrubber(span)
    # never exported unchecked: every string it could not check (keys too) is [REDACTED] whole
    assert "aaaa" not in out.to_json() and "ACME-12345" not in out.to_json()
    assert set(out.attributes) == {REDACTED, "n", semconv.OTEL_VERL_REDACTED}  # "n": too short
    assert out.context == span.context and out.end_time == span.end_time
    assert scrubber.stats()["redact_patterns_refused"] == 1
    assert scrubber.stats()["redact_failed_closed"] >= 1


def test_a_span_past_its_budget_fails_closed(engine):
    scrubber = Scrubber([r"ACME-\d{5}"], budget_s=0.0)
    out = scrubber(_span(name="ticket ACME-12345", attributes={"note": "fine text here"}))
    assert out.name == REDACTED and out.attributes["note"] == REDACTED
    assert out.attributes[semconv.OTEL_VERL_REDACTED] >= 2
    assert Scrubber([r"ACME-\d{5}"])(_span(name="ticket ACME-12345")).name == "ticket [REDACTED]"


def test_with_regex_a_catastrophic_pattern_runs_under_a_timeout_and_fails_closed(monkeypatch,
                                                                                   caplog):
    """The other path of test_a_catastrophic_pattern_without_regex_fails_closed."""
    import regex

    from otel_verl.exporters import _scrub as s

    monkeypatch.setattr(s, "_regex", regex)
    with caplog.at_level(logging.WARNING, logger="otel_verl"):
        scrubber = Scrubber(["(a+)+$", r"ACME-\d{5}"])
        # accepted (it gets a time limit instead of being refused), and on short input it is fast
        assert scrubber.stats()["redact_patterns_refused"] == 0 and "(a+)+$" not in caplog.text
        out = scrubber(_span(name="op", attributes={"input.value": "a" * 18 + "b ACME-12345"}))
        assert out.attributes["input.value"] == "a" * 18 + "b [REDACTED]"
        assert scrubber.stats()["redact_failed_closed"] == 0
        # (a|aa)+$ over 40 "a" and a "b" is ~2**28 steps: the timeout stops it, the string is
        # [REDACTED] whole (never exported unchecked), and after _MAX_STRIKES it is refused
        slow = Scrubber(["(a|aa)+$"], budget_s=0.05)
        for n in range(s._MAX_STRIKES):
            out = slow(_span(name="op", attributes={"input.value": "a" * 40 + f"b {n}"}))
            attrs = dict(out.attributes)
            # the value fails closed; on a loaded machine the span's budget can be spent before
            # its key is checked, and then the key fails closed too: nothing leaves unchecked
            assert attrs.get("input.value", attrs.get(REDACTED)) == REDACTED, attrs
            assert not any("a" * 40 in str(k) + str(v) for k, v in attrs.items()), attrs
            assert out.context.span_id is not None
    assert slow.stats()["redact_failed_closed"] >= s._MAX_STRIKES
    assert slow.stats()["redact_patterns_refused"] == 1
    assert "ran past its time budget" in caplog.text
    # refused: everything it would check is failed closed from now on, without running it
    assert slow(_span(name="op", attributes={"note": "harmless text"})).attributes["note"] \
        == REDACTED
