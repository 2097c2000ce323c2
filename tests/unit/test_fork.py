"""The one after-fork registry (otel_verl._fork), with a real os.fork()."""

from __future__ import annotations

import gc
import os

import pytest

from otel_verl import _errors, _fork


@pytest.fixture
def registry(monkeypatch):
    """Registrations made by the test go to a copy of the registry, dropped afterwards; the
    package's own callbacks stay in it (they run in the child as they would in production)."""
    monkeypatch.setattr(_fork, "_CALLBACKS", list(_fork._CALLBACKS))
    reported: list[str] = []
    monkeypatch.setattr(_errors, "internal_error",
                        lambda exc, where: reported.append(f"{where}: {exc}"))
    return reported


def _in_child(ran: list[str], reported: list[str]) -> list[str]:
    """Fork; the child sends back what its after-fork callbacks did. Returns those lines."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report and leave at once (no pytest teardown here)
        try:
            os.close(read_fd)
            os.write(write_fd, "\n".join(ran + ["--"] + reported).encode())
        finally:
            os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        out = pipe.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return out.split("\n")


def test_callbacks_run_in_the_child_in_order_and_one_that_raises_stops_nothing(registry):
    ran: list[str] = []

    def failing() -> None:
        ran.append("second")
        raise RuntimeError("boom")

    _fork.register_after_in_child(lambda: ran.append("first"), "first")
    _fork.register_after_in_child(failing, "second")
    _fork.register_after_in_child(lambda: ran.append("third"), "third")

    lines = _in_child(ran, registry)

    assert lines == ["first", "second", "third", "--",
                     "resetting second in a forked child: boom"]
    assert ran == [] and registry == []  # nothing ran in the parent


def test_strict_mode_raises_only_after_every_callback_ran(registry, monkeypatch):
    def strict(exc, where):
        raise exc

    monkeypatch.setattr(_errors, "internal_error", strict)
    ran: list[str] = []

    def failing() -> None:
        ran.append("failing")
        raise RuntimeError("boom")

    _fork.register_after_in_child(failing, "failing")
    _fork.register_after_in_child(lambda: ran.append("after"), "after")

    with pytest.raises(RuntimeError, match="boom"):
        _fork._run_after_in_child()  # what the child runs; called here to see the raise
    assert ran == ["failing", "after"]


class _Thing:
    def __init__(self, name: str, fails: bool = False) -> None:
        self.name = name
        self.fails = fails


def test_live_instances_are_reset_in_the_child_held_weakly(registry):
    ran: list[str] = []

    def reset(thing: _Thing) -> None:
        ran.append(thing.name)
        if thing.fails:
            raise RuntimeError(f"{thing.name} failed")

    live: _fork.LiveInstances[_Thing] = _fork.LiveInstances("things", reset)
    kept = [_Thing("a"), _Thing("b", fails=True), _Thing("c")]
    for thing in kept:
        live.add(thing)
    gone = _Thing("gone")
    live.add(gone)
    del gone
    gc.collect()
    assert len(live) == 3  # a weak reference only: the collected one left the set

    lines = _in_child(ran, registry)

    sep = lines.index("--")
    assert sorted(lines[:sep]) == ["a", "b", "c"]  # every live one, the failing one included
    assert lines[sep + 1:] == ["resetting things in a forked child: b failed"]
    assert ran == [] and registry == []


def test_the_parents_calls_in_flight_are_not_kept_in_the_child(registry):
    """The parent's calls in flight never end in a forked child: their placeholders (and the
    lists they hold) are not kept there (``_capture._IN_FLIGHT_REFS``); the parent keeps its own."""
    from otel_verl import _capture

    ran: list[str] = []  # registered after the package's own callbacks: sees what they left
    _fork.register_after_in_child(lambda: ran.append(str(len(_capture._IN_FLIGHT_REFS))),
                                  "the probe")
    key = 0x5EED
    _capture._IN_FLIGHT_REFS[key] = _capture.PendingRefs()
    try:
        lines = _in_child(ran, registry)
        assert key in _capture._IN_FLIGHT_REFS
    finally:
        _capture._IN_FLIGHT_REFS.pop(key, None)
    assert lines == ["0", "--"]
