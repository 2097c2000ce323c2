"""The scrubber's per-span cost on the export thread, redaction unchanged.

- An anchor's gate character (``_``, ``-``, ``:``) is checked only against the anchors whose byte
  beside the gate matches: JSON keys such as ``"prompt_tokens"`` cost no anchor check at all.
- A scrubber remembers what each attribute key scrubbed to (the same few keys on every span).
Both are checked here against the plain definition on hostile input; ``test_scrub.py``'s oracle
(every rule at every position) and ``test_secrets_catalogue.py`` cover the catalogue itself.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.trace import SpanContext, Status, StatusCode

from otel_verl.exporters import _scrub
from otel_verl.exporters._scrub import REDACTED, REDACTED_COUNT_KEY, Scrubber

_PIECES = ["sk-", "sk_live_", "sk_test_", "rk_live_", "rk_test_", "whsec_", "ghp_", "gho_",
           "ghu_", "ghs_", "ghr_", "github_pat_", "hf_", "xapp-", "xoxb-", "xox-", "-----BEGIN",
           "-----", "://", "eyJ", "AIza", "_", "-", ":", "J", "z", "k", "x", "o", "/", "token_ids",
           "prompt_tokens", '"', "é", "\ud800", " ", "a"]
_texts = st.one_of(st.lists(st.sampled_from(_PIECES), max_size=30).map("".join),
                   st.text(st.sampled_from("_-:Jzskxo/abghpfwIAy"), max_size=60))


def _reference_starts(data: bytes, gate: bytes, anchors) -> list[tuple[int, bytes, str]]:
    """Every occurrence of the gate checked against every anchor (the definition)."""
    found = []
    pos = data.find(gate)
    while pos != -1:
        for literal, offset, rule in anchors:
            start = pos - offset
            if start >= 0 and data.startswith(literal, start):
                found.append((start, literal, rule))
        pos = data.find(gate, pos + 1)
    return found


@settings(max_examples=500, deadline=None)
@given(text=_texts)
def test_gated_starts_finds_what_checking_every_anchor_finds(text):
    data = text.encode("ascii", "replace")
    for gate, anchors in _scrub._ANCHORS.items():
        got = _scrub._gated_starts(data, gate, anchors)
        if got is not None:  # None: too many gates, the literal search takes over
            assert sorted(got) == sorted(_reference_starts(data, gate, anchors))


class _CountingBytes(bytes):
    checks = 0

    def startswith(self, *args, **kwargs):  # type: ignore[override]
        _CountingBytes.checks += 1
        return super().startswith(*args, **kwargs)


def test_json_keys_with_underscores_cost_no_anchor_check():
    """Token-id payloads are JSON whose keys have underscores (``"prompt_tokens"``,
    ``"finish_reason"``): each ``_`` used to be checked against all 11 of its anchors."""
    text = '{"token_ids":[1,2,3],"log_probs":null,"finish_reason":"stop","prompt_tokens":3,' \
           '"completion_tokens":83,"response_id":"abc-0","request_id":"x","max_tokens":256}'
    data = _CountingBytes(text.encode("ascii"))
    _CountingBytes.checks = 0
    assert _scrub._gated_starts(data, b"_", _scrub._ANCHORS[b"_"]) == []
    assert _CountingBytes.checks == 0
    # and a real anchor among them is still checked, and found
    data = _CountingBytes((text + "sk_live_abcdefghijklmnopqrstuv").encode("ascii"))
    assert [rule for _, _, rule in _scrub._gated_starts(data, b"_", _scrub._ANCHORS[b"_"])] == \
        ["stripe"]


_keys = st.one_of(st.sampled_from(["input.value", "api_key", "password", "max_tokens",
                                   "session.id", "sk-abcdefghijklmnopqrstuvwx", "token",
                                   "gen_ai.usage.input_tokens", "é\ud800"]),
                  st.text(max_size=12))
_values = st.one_of(st.sampled_from(["sk-abcdefghijklmnopqrstuvwx", "password=hunter2",
                                     REDACTED, "", "\ud800x", "ok"]),
                    st.text(max_size=30), st.integers(), st.booleans(), st.floats(),
                    st.lists(st.sampled_from(["a", "sk-abcdefghijklmnopqrstuvwx", "b"]),
                             max_size=3).map(tuple),
                    st.binary(max_size=8))
_attrs = st.dictionaries(_keys, _values, max_size=8)


@settings(max_examples=300, deadline=None)
@given(batches=st.lists(_attrs, min_size=1, max_size=4))
def test_remembered_keys_scrub_as_before(batches):
    """A scrubber that has seen the keys before returns what a fresh one returns, for every
    span (a sensitive key's value redacted, a key holding a secret renamed, counts kept)."""
    cached = Scrubber()
    for attrs in batches * 2:  # every key seen, then seen again
        fresh = Scrubber()
        fresh._keys = None  # the plain path: every key through the catalogue
        expected = fresh.attributes(attrs)
        assert cached.attributes(attrs) == expected


def test_a_key_is_scrubbed_once_per_scrubber(monkeypatch):
    scrubber = Scrubber()
    attrs = {"input.value": "x" * 40, "gen_ai.request.model": "m", "sk-abcdefghijklmnopqrstu": "v",
             "api_key": "secret-value"}
    first, count = scrubber.attributes(attrs)
    assert count == 2 and first["api_key"] == REDACTED and REDACTED in first
    seen = []
    real = scrubber.text

    def counting(text):
        seen.append(text)
        return real(text)

    monkeypatch.setattr(scrubber, "text", counting)
    assert scrubber.attributes(attrs) == (first, count)
    assert not set(seen) & set(attrs)  # no key scrubbed again


def test_spans_with_remembered_keys_are_still_redacted_and_counted():
    scrubber = Scrubber()
    ctx = SpanContext(1, 2, is_remote=False)
    clean = ReadableSpan("op", ctx, attributes={"input.value": "hello", "n": 1},
                         events=[Event("e", {"input.value": "fine"})],
                         status=Status(StatusCode.ERROR, "failed"))
    assert scrubber(clean) is clean
    assert scrubber(clean) is clean  # keys remembered: still the same object, no copy
    dirty = ReadableSpan("op", ctx, attributes={"input.value": "key sk-abcdefghijklmnopqrstuv",
                                                "n": 1},
                         events=[Event("e", {"input.value": "password=hunter2"})])
    out = scrubber(dirty)
    assert out.attributes["input.value"] == f"key {REDACTED}"
    assert out.events[0].attributes["input.value"] == f"password={REDACTED}"
    assert out.attributes[REDACTED_COUNT_KEY] == 2


# --- ids no rule can match are not scanned ---------------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(text=st.from_regex(_scrub._CLEAN_ID, fullmatch=True))
def test_what_passes_as_a_clean_id_is_what_the_full_scan_leaves_alone(text):
    assert _scrub._scrub(text, ()) == (text, 0)


@settings(max_examples=200, deadline=None)
@given(hex40=st.text("0123456789abcdef", min_size=40, max_size=40),
       form=st.sampled_from(["{}", "local-{}", "{}-3", "tok:sha256:{}", "x {}"]))
def test_a_wandb_key_is_never_taken_for_an_id(hex40, form):
    text = form.format(hex40)
    assert _scrub._CLEAN_ID.fullmatch(text) is None
    out, count = _scrub.scrub(text)
    assert hex40 not in out and count == 1


def test_content_and_request_ids_are_not_scanned(monkeypatch):
    """otel_verl's content ids and an engine's ``<request id>-<turn>`` are on every LLM span,
    each unique: each cost a full pass of the catalogue (~10 us)."""
    _scrub._scrub_short.cache_clear()
    scanned = []
    real = _scrub._Finder

    def finder(text):
        scanned.append(text)
        return real(text)

    monkeypatch.setattr(_scrub, "_Finder", finder)
    ids = ["tok:sha256:" + "3f" * 32, "msg:sha256:" + "a0" * 32, "7c744733359446e0901da4edd206a1f4-0",
           "0123456789abcdef", "deadbeef" * 4]
    for text in ids:
        assert _scrub.scrub(text) == (text, 0)
    assert scanned == []
    assert _scrub.scrub("token:" + "3f" * 32)[1] == 1  # a sensitive name before it: scanned
    assert scanned


def _unprefixed_reference(text: str) -> list[tuple[int, int]]:
    """The W&B and AWS shapes without the run-length gates."""
    finder = _scrub._Finder(text)
    data, spans = finder.ascii, finder.spans
    for pos, end in _scrub._runs(data.translate(_scrub._HEX_MASK), _scrub._HEX40):
        if end - pos == 40:
            spans.append((pos - 6 if text.startswith("local-", pos - 6) else pos, end))
    for pos, _ in _scrub._runs(data.translate(_scrub._UPPER_MASK), _scrub._UPPER20):
        match = _scrub._RULE["aws_access_key_id"].match(text, pos)
        if match is not None and _scrub._boundary_ok(text, pos):
            spans.append(match.span())
    return sorted(spans)


_run_texts = st.lists(st.sampled_from(["0123456789abcdef" * 2, "0123456789", "abcdef", "ABCDEF",
                                       "AKIAIOSFODNN7EXAMPLE", "local-", "-", "_", " ", '"', ":",
                                       "9f8e7d6c5b4a39281706f5e4d3c2b1a098765432", "é", "x"]),
                      max_size=12).map("".join)


@settings(max_examples=400, deadline=None)
@given(text=_run_texts)
def test_unprefixed_shapes_are_found_as_without_the_gates(text):
    finder = _scrub._Finder(text)
    finder.unprefixed()
    assert sorted(finder.spans) == _unprefixed_reference(text)
