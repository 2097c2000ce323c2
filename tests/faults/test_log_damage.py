"""Poisoned, damaged and shared durable logs, on real files, sockets and processes (issue 25,
items 1-5): a process leaves a log (the backend refusing), the log is damaged on disk, and the
next process (a real one, sometimes with a failing ``open``) must deliver every span it can read,
keep what it cannot, and never deliver to the wrong backend or leak an endpoint's credentials.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _receiver import FaultyReceiver

HERE = Path(__file__).resolve().parent
PROTOCOL = "http/protobuf"


def _run(*args: str, timeout: float = 90) -> str:
    done = subprocess.run([sys.executable, str(HERE / "_log_child.py"), *args],
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
                          capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout + "\n" + done.stderr


def _stats(output: str) -> dict:
    for line in reversed(output.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise AssertionError(output[-2000:])


def _ids(path: Path) -> set[str]:
    return set(path.read_text().split()) if path.exists() else set()


def _leave(receiver: FaultyReceiver, traces: Path, ids: Path, n: int, poison: bool = False,
           endpoint: str | None = None) -> set[str]:
    receiver.set_mode("503")
    _run("leave", str(traces), endpoint or receiver.endpoint, PROTOCOL, str(n),
         "1" if poison else "0", str(ids))
    receiver.set_mode("ok")
    left = _ids(ids)
    assert left and list(traces.rglob("wal-*.jsonl")), "the first process left no log"
    return left


def _drain(receiver: FaultyReceiver, traces: Path, ids: Path, n: int, fail_opens: int = 0,
           error: str = "EIO", endpoint: str | None = None) -> tuple[dict, str]:
    output = _run("drain", str(traces), endpoint or receiver.endpoint, PROTOCOL, str(n), str(ids),
                  str(fail_opens), error)
    return _stats(output), output


def _wait(predicate, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not predicate():
        time.sleep(0.05)
    return predicate()


def test_a_refused_last_line_blocks_no_later_process(tmp_path, figure):
    with FaultyReceiver("http") as receiver:
        receiver.refuse_names = {"poison"}
        old = _leave(receiver, tmp_path / "traces", tmp_path / "old", 50, poison=True)
        stats1, _ = _drain(receiver, tmp_path / "traces", tmp_path / "own1", 100)
        stats2, _ = _drain(receiver, tmp_path / "traces", tmp_path / "own2", 200)
        own = _ids(tmp_path / "own1") | _ids(tmp_path / "own2")
        got = receiver.ids()
        lost = len((old | own) - got)
        quarantined = stats1.get("quarantined", 0) + stats2.get("quarantined", 0)
        figure(fault="refused last line of a dead log", recorded=len(old | own),
               received=len((old | own) & got), lost=lost, allowed=0,
               duplicates=receiver.duplicates(), note=f"quarantined {quarantined}")
        assert lost == 0
        assert quarantined == 1
        assert list((tmp_path / "traces").rglob("quarantine/*.jsonl"))


def _segment(traces: Path) -> Path:
    (segment,) = traces.rglob("wal-*.jsonl")
    return segment


def _damage_cursor(traces: Path, text: str) -> None:
    segment = _segment(traces)
    seq = int(segment.stem.rsplit("-", 1)[1])
    cursor = segment.with_name(segment.name.rsplit("-", 1)[0] + ".cursor")
    cursor.write_text(text.format(seq=seq))


DAMAGE = {
    "cursor past the last segment": lambda t: _damage_cursor(t, "{seq}9 0"),
    "cursor past the size": lambda t: _damage_cursor(t, "{seq} 999999999"),
    "negative cursor": lambda t: _damage_cursor(t, "{seq} -5"),
    "garbage cursor": lambda t: _damage_cursor(t, "\x00\xfe garbage"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_cursor_loses_nothing(damage, tmp_path, figure):
    with FaultyReceiver("http") as receiver:
        traces = tmp_path / "traces"
        old = _leave(receiver, traces, tmp_path / "old", 300)
        DAMAGE[damage](traces)
        stats, output = _drain(receiver, traces, tmp_path / "own", 20)
        own = _ids(tmp_path / "own")
        lost = len((old | own) - receiver.ids())
        figure(fault=damage, recorded=len(old | own), received=len((old | own) & receiver.ids()),
               lost=lost, allowed=0, duplicates=receiver.duplicates(),
               note=f"cursor resets {stats.get('log_cursor_resets')}")
        assert lost == 0
        assert stats["log_cursor_resets"] == 1 and "cursor" in output


@pytest.mark.parametrize("error, fail_opens", [("EIO", 2), ("EMFILE", 3)])
def test_a_transient_open_error_keeps_the_log_and_delivers_it(error, fail_opens, tmp_path,
                                                              figure):
    with FaultyReceiver("http") as receiver:
        traces = tmp_path / "traces"
        old = _leave(receiver, traces, tmp_path / "old", 300)
        stats, output = _drain(receiver, traces, tmp_path / "own", 20, fail_opens=fail_opens,
                               error=error)
        own = _ids(tmp_path / "own")
        assert own <= receiver.ids()
        by_itself = len(old & receiver.ids())
        if by_itself < len(old):  # not read again in time: kept for the next process
            assert list(traces.rglob("wal-*.jsonl")), "an unread log was deleted"
            _drain(receiver, traces, tmp_path / "own", 1)
            own = _ids(tmp_path / "own")
        lost = len((old | own) - receiver.ids())
        figure(fault=f"{error} on open x{fail_opens}", recorded=len(old | own),
               received=len((old | own) & receiver.ids()), lost=lost, allowed=0,
               duplicates=receiver.duplicates(),
               note=f"read errors {stats.get('log_read_errors')}; {by_itself} of {len(old)} "
                    "delivered by the process itself, the rest by the next")
        assert lost == 0
        assert stats["log_read_errors"] >= 1 and "kept" in output


def test_an_unreadable_segment_is_kept_and_delivered_once_it_reads(tmp_path, figure):
    with FaultyReceiver("http") as receiver:
        traces = tmp_path / "traces"
        old = _leave(receiver, traces, tmp_path / "old", 300)
        stats, output = _drain(receiver, traces, tmp_path / "own", 20, fail_opens=-1)
        own = _ids(tmp_path / "own")
        assert own <= receiver.ids()  # the unreadable log holds back nobody else
        assert _segment(traces).stat().st_size > 0, "an unread log was deleted"
        assert stats["log_read_errors"] >= 1 and "kept" in output
        _drain(receiver, traces, tmp_path / "own2", 5)  # the disk is fine again
        own |= _ids(tmp_path / "own2")
        lost = len((old | own) - receiver.ids())
        figure(fault="unreadable segment (EIO on every open)", recorded=len(old | own),
               received=len((old | own) & receiver.ids()), lost=lost, allowed=0,
               duplicates=receiver.duplicates(), note="kept, delivered by the next process")
        assert lost == 0


def test_damaged_records_are_detected_counted_and_kept(tmp_path, figure):
    with FaultyReceiver("http") as receiver:
        traces = tmp_path / "traces"
        old = _leave(receiver, traces, tmp_path / "old", 100)
        segment = _segment(traces)
        lines = segment.read_bytes().splitlines(keepends=True)
        data = bytearray(lines[10])
        data[len(data) // 2] ^= 0x01  # a flipped bit in the middle (the JSON may stay valid)
        lines[10] = bytes(data)
        lines.insert(20, b'{"resourceSpans": "garbage"}\n')
        segment.write_bytes(b"".join(lines))
        stats, output = _drain(receiver, traces, tmp_path / "own", 20)
        own = _ids(tmp_path / "own")
        got = receiver.ids()
        lost = len((old | own) - got)
        kept = list(traces.rglob("damaged/*.damaged"))
        figure(fault="a flipped bit and a garbage line", recorded=len(old | own),
               received=len((old | own) & got), lost=lost, allowed=1,
               duplicates=receiver.duplicates(),
               note=f"damaged {stats.get('log_damaged')} (kept in damaged/)")
        assert stats["log_damaged"] == 2 and "damaged" in output
        assert lost == 1  # the flipped record: kept aside, never delivered altered
        assert len(kept) == 1 and kept[0].read_bytes().count(b"\n") == 2


def test_two_endpoints_sharing_a_long_prefix_never_share_a_log(tmp_path, figure):
    with FaultyReceiver("http") as receiver:
        base = f"{receiver.endpoint}/{'p' * 130}"
        one, two = base + "/team-one", base + "/team-two"
        traces = tmp_path / "traces"
        old = _leave(receiver, traces, tmp_path / "old", 200, endpoint=one)
        _drain(receiver, traces, tmp_path / "own", 10, endpoint=two)
        at_two = set().union(*(c for p, c in receiver.by_path.items() if "team-two" in p))
        wrong = len(old & at_two)
        _drain(receiver, traces, tmp_path / "own1", 1, endpoint=one)
        at_one = set().union(*(c for p, c in receiver.by_path.items() if "team-one" in p))
        lost = len(old - at_one)
        figure(fault="two endpoints, one 120-char prefix", recorded=len(old),
               received=len(old & at_one), lost=lost, allowed=0, duplicates=0,
               note=f"{wrong} delivered to the other endpoint")
        assert wrong == 0 and lost == 0
        assert len({p.name for p in (traces / "spool").iterdir()}) == 2


def test_credentials_in_the_endpoint_never_name_a_folder(tmp_path):
    with FaultyReceiver("http") as receiver:
        host = receiver.endpoint.split("://", 1)[1]
        secrets = ("hunter2pw", "K3Yv4lue", "sk-abcdefghijklmnop1234")
        traces = tmp_path / "traces"
        for endpoint in (f"http://alice:hunter2pw@{host}", f"{receiver.endpoint}?api_key=K3Yv4lue",
                         f"{receiver.endpoint}/sk-abcdefghijklmnop1234"):
            _leave(receiver, traces, tmp_path / "ids", 3, endpoint=endpoint)
        names = [str(p.relative_to(traces)) for p in traces.rglob("*")]
        assert names
        leaked = [n for n in names for s in secrets if s in n or "alice" in n]
        assert not leaked, leaked


def test_a_backlog_at_shutdown_with_slow_redaction_and_a_stalled_backend_loses_nothing(
        tmp_path, figure):
    with FaultyReceiver("http") as receiver:
        traces = tmp_path / "traces"
        receiver.set_mode("hang")
        receiver.keep_bodies = True
        stats = _stats(_run("backlog", str(traces), receiver.endpoint, PROTOCOL, "600",
                            str(tmp_path / "ids")))
        receiver.set_mode("ok")
        ids = _ids(tmp_path / "ids")
        _drain(receiver, traces, tmp_path / "own", 1)
        got = receiver.ids()
        lost = len(ids - got)
        figure(fault="backlog at shutdown, slow redaction, backend stalled", recorded=len(ids),
               received=len(ids & got), lost=lost, allowed=0, duplicates=receiver.duplicates(),
               note=f"kept in the log at shutdown {stats.get('kept_in_log_at_shutdown')}, "
                    f"abandoned {stats.get('abandoned_at_shutdown', 0)}")
        assert stats.get("kept_in_log_at_shutdown", 0) > 0
        assert stats.get("abandoned_at_shutdown", 0) == 0
        assert lost == 0
        assert not any(b"sk-" + b"A" * 40 in body for body in receiver.bodies), "sent unredacted"
