"""Fork under a busy export queue on real sockets and processes (issue 25, item 7).

- ``os.fork()`` while the backend refuses every request (the durable log's sender retrying a
  backlog) returns at once; the parent still delivers all its spans, the child starts empty and
  delivers only its own, nothing is sent twice.
"""

from __future__ import annotations

import json
import os
import select
import time
from pathlib import Path

from _receiver import FaultyReceiver
from test_faults import record, wait_for

from otel_verl import RolloutTraceConfig

#: a fork that waited on export took the flush's whole second (1.0 s measured); one that waits
#: for nothing takes milliseconds. The bound is generous for a loaded machine.
FORK_BOUND_S = 0.5
#: how long the backend stays busy (refusing) around the forks
BUSY_S = 3.0


def _child(go_fd: int, result: Path, label: str) -> None:
    """In a forked child: report the inherited state, wait for the backend to answer, record
    and deliver the child's own spans, report their ids."""
    stats = RolloutTraceConfig.stats()
    out: dict[str, object] = {"pending": stats.get("pending", 0),
                              "spool_pending": stats.get("spool_pending", 0)}
    select.select([go_fd], [], [], 60)
    ids = record(5, step=int(label))
    out["ids"] = sorted(ids)
    out["flushed"] = RolloutTraceConfig.flush(20)
    out["stats"] = RolloutTraceConfig.stats()
    result.write_text(json.dumps(out))


def test_fork_under_a_busy_queue_waits_for_nothing(tmp_path, figure):
    with FaultyReceiver("http") as receiver:
        receiver.set_mode("503")  # every request refused: the sender retries a backlog
        RolloutTraceConfig.init("faults", "e", "otlp", trace_dir=str(tmp_path),
                                otlp_endpoint=receiver.endpoint, otlp_protocol="http/protobuf",
                                export_timeout_s=1.0, schedule_delay_s=0.2, export_delay_s=0.2)
        busy_since = time.monotonic()
        ids = record(300)
        assert wait_for(lambda: RolloutTraceConfig.stats().get("retries", 0) >= 1, 10)
        assert RolloutTraceConfig.stats()["spool_pending"] > 0  # the queue is busy
        ids |= record(50, step=1)  # and more waits in the processor's queue

        forks: list[float] = []
        children: list[tuple[int, int, Path]] = []
        for n in range(3):
            read_fd, write_fd = os.pipe()
            result = tmp_path / f"child{n}.json"
            start = time.monotonic()
            pid = os.fork()
            if pid == 0:  # the child: never returns into pytest
                code = 1
                try:
                    os.close(write_fd)
                    _child(read_fd, result, str(10 + n))
                    code = 0
                finally:
                    os._exit(code)
            forks.append(time.monotonic() - start)
            os.close(read_fd)
            children.append((pid, write_fd, result))
            ids |= record(10, step=2 + n)  # the parent goes on recording between forks

        time.sleep(max(0.0, BUSY_S - (time.monotonic() - busy_since)))
        assert receiver.requests == 0  # busy the whole time: nothing was accepted yet
        receiver.set_mode("ok")
        child_ids: set[str] = set()
        for _, write_fd, _ in children:
            os.write(write_fd, b"go")
            os.close(write_fd)
        for pid, _, result in children:
            _, status = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(status) == 0
            got = json.loads(result.read_text())
            assert got["pending"] == 0 and got["spool_pending"] == 0  # the child starts empty
            assert got["flushed"] is True
            child_ids |= set(got["ids"])
        wait_for(lambda: receiver.ids() >= ids | child_ids, 30)
        assert RolloutTraceConfig.flush(10)
        lost = len((ids | child_ids) - receiver.ids())
        figure(fault="fork x3 while the backend refuses", recorded=len(ids | child_ids),
               received=len(receiver.ids()), lost=lost, allowed=0,
               duplicates=receiver.duplicates(),
               note="fork s: " + "/".join(f"{t:.3f}" for t in forks))
        assert max(forks) < FORK_BOUND_S, forks
        assert lost == 0
        assert receiver.ids() == ids | child_ids  # nothing but the parent's and the children's
        assert receiver.duplicates() == 0  # the child sent none of the parent's spans
