"""The content-hash thread (``_content._Deferred``): every submitted step is resolved, in order,
off the submitting thread, and a forked child gets a thread of its own."""

from __future__ import annotations

import os
import threading
from typing import Any

from otel_verl import _content


class _Step:
    def __init__(self, log: list[Any], done: threading.Event | None = None) -> None:
        self.log, self.done = log, done

    def resolve(self) -> bool:
        self.log.append((self, threading.current_thread().name))
        if self.done is not None:
            self.done.set()
        return True


def test_steps_resolve_in_order_off_the_caller() -> None:
    deferred = _content._Deferred()
    log: list[Any] = []
    done = threading.Event()
    steps = [_Step(log) for _ in range(200)] + [_Step(log, done)]
    for step in steps:
        deferred.submit(step)  # type: ignore[arg-type]
    assert done.wait(10)
    assert [s for s, _ in log] == steps
    assert {name for _, name in log} == {"otel_verl-content-hash"}


def test_a_forked_child_resolves_its_own_steps() -> None:
    deferred = _content._Deferred()
    warm = threading.Event()
    deferred.submit(_Step([], warm))  # type: ignore[arg-type]  # the parent's thread is up
    assert warm.wait(10)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the parent's thread is not here
        try:
            done = threading.Event()
            deferred.submit(_Step([], done))  # type: ignore[arg-type]
            os.write(write, b"1" if done.wait(10) else b"0")
        finally:
            os._exit(0)
    os.close(write)
    try:
        assert os.read(read, 1) == b"1"
    finally:
        os.close(read)
        os.waitpid(pid, 0)
