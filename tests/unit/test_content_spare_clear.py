"""A gone chain's long copy of a prompt is emptied (every item released) on the content
thread, not on the event loop that drops the chain (~40 us per 128k-token copy, at the end of
each trajectory); it becomes a spare only once emptied, and a later chain copies into it."""

from __future__ import annotations

import sys
import threading

from otel_verl import _content
from otel_verl._content import KIND_TOKENS, DeltaChain, token_content_id


class _Block:
    """Holds the content thread until released (what is queued after it waits)."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()

    def resolve(self) -> bool:
        self.started.set()
        self.release.wait(10.0)
        return True


def test_a_long_copy_is_released_off_the_loop_then_kept_as_a_spare() -> None:
    marker = 10**9 + 7  # one int object that only the prompt and the chain's copy hold
    marker = int(str(marker))
    prompt = [marker] + list(range(300, 300 + 8000))
    chain = DeltaChain(KIND_TOKENS)
    step = chain.begin(prompt)
    assert step is not None and step.id == token_content_id(prompt)
    copy = chain._items
    copy_id = id(copy)
    del copy
    held = sys.getrefcount(marker)
    block = _Block()
    _content._DEFERRED.submit(block)  # type: ignore[arg-type]
    assert block.started.wait(10.0)
    try:
        del chain, step  # on this thread: the chain goes, its copy is handed over
        # not emptied here (before: released at once, on the thread that dropped the chain)
        assert sys.getrefcount(marker) == held
        assert all(id(s) != copy_id for s in _content._SPARE)  # not a spare while full
    finally:
        block.release.set()
    assert _content.wait_idle(10.0)
    assert sys.getrefcount(marker) == held - 1  # emptied, on the content thread
    assert any(id(s) == copy_id and not s for s in _content._SPARE)
    later = DeltaChain(KIND_TOKENS)
    again = list(range(5, 9000))
    step = later.begin(again)
    assert step is not None and step.id == token_content_id(again) and later._items == again
