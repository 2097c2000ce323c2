"""bench/_cpus.py: the CPU lists and the isolation check bench_rollout's --engine-cpus uses."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from _modules import load_file
from hypothesis import given
from hypothesis import strategies as st

_PATH = Path(__file__).resolve().parents[2] / "bench" / "_cpus.py"
cpus = load_file(_PATH, "bench_cpus")


@pytest.mark.parametrize(("text", "want"), [
    ("0", {0}), ("1", {1}), ("0-3,8", {0, 1, 2, 3, 8}), (" 2 - 4 , 7", {2, 3, 4, 7}),
    ("5,2-4", {2, 3, 4, 5}), ("3-3", {3}), ("1,1", {1}),
])
def test_parse_cpu_list_reads_the_kernel_syntax(text: str, want: set[int]) -> None:
    assert cpus.parse_cpu_list(text) == want


@pytest.mark.parametrize("text", ["", " ", ",", "1,", "-1", "3-1", "a", "1-", "1-2-3", "0x1",
                                  "1.5", "\u0661"])
def test_parse_cpu_list_refuses_what_is_not_a_list(text: str) -> None:
    with pytest.raises(ValueError):
        cpus.parse_cpu_list(text)


@given(st.frozensets(st.integers(0, 300), min_size=1))
def test_format_then_parse_is_the_identity(xs: frozenset[int]) -> None:
    text = cpus.format_cpu_list(xs)
    assert cpus.parse_cpu_list(text) == xs
    assert len(text.split(",")) <= len(xs)  # runs are written as ranges


@given(st.text(max_size=12))
def test_parse_cpu_list_either_parses_or_raises_value_error(text: str) -> None:
    try:
        got = cpus.parse_cpu_list(text)
    except ValueError:
        return
    assert got and all(isinstance(c, int) and c >= 0 for c in got)


def test_format_cpu_list_writes_runs_as_ranges() -> None:
    assert cpus.format_cpu_list({8, 0, 1, 2, 3, 10, 11}) == "0-3,8,10-11"


def test_split_cpus_gives_the_missing_side_the_rest() -> None:
    assert cpus.split_cpus("1", None, {0, 1}) == ({1}, {0})
    assert cpus.split_cpus(None, "0", {0, 1, 2, 3}) == ({1, 2, 3}, {0})
    assert cpus.split_cpus("2-3", "0", {0, 1, 2, 3}) == ({2, 3}, {0})


@pytest.mark.parametrize(("engine", "client", "allowed", "why"), [
    ("0-1", None, {0, 1}, "client gets no CPU"),
    ("1", "1", {0, 1}, "share"),
    ("1", "0-1", {0, 1}, "share"),
    ("4", None, {0, 1}, "not allowed"),
    (None, None, {0, 1}, "give"),
])
def test_split_cpus_refuses_overlap_empty_and_foreign_cpus(engine, client, allowed,
                                                          why: str) -> None:
    with pytest.raises(ValueError, match=why):
        cpus.split_cpus(engine, client, allowed)


def test_pin_tasks_moves_every_thread_and_tasks_outside_sees_it() -> None:
    # a child process with a second thread, so "every thread" is more than the main one
    import subprocess

    child = subprocess.Popen([sys.executable, "-c",
                              "import threading, time\n"
                              "threading.Thread(target=time.sleep, args=(30,)).start()\n"
                              "print('up', flush=True); time.sleep(30)"],
                             stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == b"up"
        allowed = sorted(os.sched_getaffinity(0))
        one = {allowed[-1]}
        checked, outside = cpus.tasks_outside([child.pid], set())
        assert checked == 2 and len(outside) == 2  # a thread outside is seen, by pid/tid
        assert all(f"{child.pid}/" in o for o in outside)
        assert cpus.pin_tasks(child.pid, one) == 2
        tids = [int(t) for t in os.listdir(f"/proc/{child.pid}/task")]
        assert [os.sched_getaffinity(t) for t in tids] == [one, one]  # both threads, not one
        checked, outside = cpus.tasks_outside([child.pid], one)
        assert (checked, outside) == (2, [])
        assert cpus.group_pids(os.getpgid(child.pid)).count(child.pid) == 1
    finally:
        child.kill()
        child.wait()


def test_cpu_busy_s_counts_each_allowed_cpu() -> None:
    busy = cpus.cpu_busy_s()
    assert set(os.sched_getaffinity(0)) <= set(busy)
    assert all(v >= 0 for v in busy.values())
    later = cpus.cpu_busy_s()  # it only grows
    assert all(later[c] >= busy[c] for c in busy)
