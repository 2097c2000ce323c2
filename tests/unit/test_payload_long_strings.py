"""A long string costs the payload walk O(cap), not O(its length), and is cut exactly as
before: the walk reads only the head that the cut looks at (issue 18: a 128k-character
conversation went through the surrogate fix and a UTF-8 encode whole, on the event loop)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_verl import _payload
from otel_verl._payload import TRUNCATION_MARK, _cut_point, fix_surrogates, to_payload


def _old_string(self: Any, text: str) -> str:
    """``_Walker.string`` before the change: the whole text fixed and encoded, then cut."""
    text = fix_surrogates(text)
    limit = max(32, min(self.max_str, self.budget))
    if text.isascii():
        if len(text) > limit:
            cut = _cut_point(text, limit)
            self.cut = True
            text = text[:cut] + TRUNCATION_MARK.format(n=len(text) - cut)
        self.budget -= len(text) + 3
        return text
    if len(text) * 4 > limit:
        data = text.encode("utf-8")
        if len(data) > limit:
            head = data[:limit].decode("utf-8", "ignore")
            cut = _cut_point(head + text[len(head):len(head) + 1], len(head))
            self.cut = True
            text = text[:cut] + TRUNCATION_MARK.format(n=len(text) - cut)
            self.budget -= len(text.encode("utf-8")) + 3
            return text
        self.budget -= len(data) + 3
        return text
    self.budget -= len(text) * 2 + 3
    return text


def test_a_long_string_is_read_only_as_far_as_its_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[int] = []
    fix = _payload.fix_surrogates

    def counting(text: str) -> str:
        seen.append(len(text))
        return fix(text)

    monkeypatch.setattr(_payload, "fix_surrogates", counting)
    huge = "Ünïcödé conversation, " * 50_000  # ~1.1M characters, not ASCII
    out = to_payload({"messages": [{"role": "user", "content": huge}]}, max_bytes=4096)
    assert out.truncated and len(out.json.encode("utf-8")) <= 4096
    assert seen and max(seen) <= 4096 + 1, max(seen)  # before: the whole 1.1M characters


_TEXT = st.text(alphabet=st.sampled_from(["a", "b", "_", "-", "=", " ", "é", "中", "😀",
                                          "\ud800", "\udfff", "\n", "x"]), max_size=600)


@settings(max_examples=300, deadline=None)
@given(texts=st.lists(_TEXT, min_size=1, max_size=4), cap=st.integers(256, 2048),
       long=st.integers(0, 3000))
def test_strings_are_cut_exactly_as_before(texts: list[str], cap: int, long: int) -> None:
    value: Any = {"a": texts, "b": "k" * long + "".join(texts)}
    new = to_payload(value, max_bytes=cap)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_payload._Walker, "string", _old_string)
        old = to_payload(value, max_bytes=cap)
    assert new == old
