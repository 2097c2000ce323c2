"""CPU isolation for benches that run an engine and a client on one machine, stdlib only (Linux).

A bench that runs vLLM's CPU engine and its own client side by side measures the scheduler as
much as the client when both share every core: the client's event loop waits for a slot the
engine's threads hold. These helpers give each side its own cores and show that it held:

- ``parse_cpu_list("0-3,8")`` -> ``frozenset({0, 1, 2, 3, 8})`` and ``format_cpu_list`` back
  (the kernel's and ``taskset -c``'s list syntax);
- ``split_cpus(engine, client, allowed)``: the two sides' sets, the missing one being the rest
  of ``allowed``; disjoint, non-empty, inside ``allowed``, or ``ValueError``;
- ``pin_tasks(pid, cpus)``: every thread of a process (``sched_setaffinity(0)`` moves only the
  calling thread); ``tasks_outside(pids, cpus)``: the threads whose affinity is not inside
  ``cpus`` (empty when the isolation held);
- ``group_pids(pgid)``: the processes of a process group; ``cpu_busy_s()``: busy seconds per
  CPU since boot (``/proc/stat``), for the cores busy on each side.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

__all__ = ["cpu_busy_s", "format_cpu_list", "group_pids", "parse_cpu_list", "pin_tasks",
           "split_cpus", "tasks_outside"]


def _digits(s: str) -> bool:
    s = s.strip()
    return s.isascii() and s.isdigit()


def parse_cpu_list(text: str) -> frozenset[int]:
    """``"0-3,8"`` -> ``{0, 1, 2, 3, 8}``; spaces around items allowed; ``ValueError`` on
    anything else (empty, negative, a reversed range, junk)."""
    cpus: set[int] = set()
    items = [item.strip() for item in text.split(",")]
    if not text.strip() or any(not item for item in items):
        raise ValueError(f"bad CPU list {text!r}: empty item")
    for item in items:
        lo_s, sep, hi_s = item.partition("-")
        if not _digits(lo_s) or (sep and not _digits(hi_s)):
            raise ValueError(f"bad CPU list {text!r}: {item!r} is not N or N-M")
        lo = int(lo_s)
        hi = int(hi_s) if sep else lo
        if hi < lo:
            raise ValueError(f"bad CPU list {text!r}: reversed range {item!r}")
        cpus.update(range(lo, hi + 1))
    return frozenset(cpus)


def format_cpu_list(cpus: Iterable[int]) -> str:
    """``{0, 1, 2, 3, 8}`` -> ``"0-3,8"`` (runs of consecutive ids as ranges)."""
    xs = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        parts.append(str(xs[i]) if i == j else f"{xs[i]}-{xs[j]}")
        i = j + 1
    return ",".join(parts)


def split_cpus(engine: str | None, client: str | None,
               allowed: Iterable[int]) -> tuple[frozenset[int], frozenset[int]]:
    """The engine's and the client's CPU sets from their lists (one may be None: it gets the
    rest of ``allowed``). Both must be non-empty, disjoint and inside ``allowed``."""
    allowed = frozenset(allowed)
    if engine is None and client is None:
        raise ValueError("give the engine's CPUs, the client's, or both")
    eng = parse_cpu_list(engine) if engine is not None else None
    cli = parse_cpu_list(client) if client is not None else None
    if eng is None:
        assert cli is not None
        eng = allowed - cli
    if cli is None:
        cli = allowed - eng
    for side, cpus in (("engine", eng), ("client", cli)):
        if not cpus:
            raise ValueError(f"the {side} gets no CPU (allowed: {format_cpu_list(allowed)})")
        if not cpus <= allowed:
            raise ValueError(f"the {side}'s CPUs {format_cpu_list(cpus - allowed)} are not "
                             f"allowed here (allowed: {format_cpu_list(allowed)})")
    if eng & cli:
        raise ValueError(f"engine and client share CPUs {format_cpu_list(eng & cli)}")
    return eng, cli


def _tids(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


def pin_tasks(pid: int, cpus: Iterable[int]) -> int:
    """Set the affinity of every thread of ``pid`` to ``cpus``; returns how many were pinned
    (threads that end meanwhile are skipped)."""
    cpus = set(cpus)
    n = 0
    for tid in _tids(pid):
        try:
            os.sched_setaffinity(tid, cpus)
            n += 1
        except (ProcessLookupError, PermissionError):
            continue
    return n


def tasks_outside(pids: Iterable[int], cpus: Iterable[int]) -> tuple[int, list[str]]:
    """``(threads checked, descriptions of those allowed to run outside cpus)``."""
    cpus = frozenset(cpus)
    checked, outside = 0, []
    for pid in pids:
        for tid in _tids(pid):
            try:
                mask = os.sched_getaffinity(tid)
            except (ProcessLookupError, PermissionError, OSError):
                continue
            checked += 1
            if not mask <= cpus:
                try:
                    with open(f"/proc/{pid}/task/{tid}/comm") as fh:
                        comm = fh.read().strip()
                except OSError:
                    comm = "?"
                outside.append(f"{pid}/{tid} ({comm}) on {format_cpu_list(mask)}")
    return checked, outside


def group_pids(pgid: int) -> list[int]:
    """The processes whose process group is ``pgid``."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # fields after "(comm)": state ppid pgrp ...
            pids.append(int(entry))
    return pids


def cpu_busy_s() -> dict[int, float]:
    """Seconds each CPU has spent busy (not idle or iowait) since boot, by CPU id."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[int, float] = {}
    with open("/proc/stat") as fh:
        for line in fh:
            name, *rest = line.split()
            if name.startswith("cpu") and name[3:].isdigit():
                f = [int(x) for x in rest]
                out[int(name[3:])] = (sum(f[:8]) - f[3] - f[4]) / tick
    return out
