"""Fork under a busy export queue, and credentials in the OTLP endpoint, on real sockets and
processes (issue 25, items 5 and 7).

- ``os.fork()`` while the backend refuses every request (the durable log's sender retrying a
  backlog) returns at once; the parent still delivers all its spans, the child starts empty and
  delivers only its own, nothing is sent twice.
- An endpoint carrying ``user:password@``, ``?api_key=`` or an ``sk-`` key in its path delivers
  (once the receiver answers), and the planted secret appears in no log line (otel_verl's, the
  OTLP libraries', urllib3's, at DEBUG), in nothing written to stdout/stderr, and in no file name
  or file under the trace dir.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import select
import time
from pathlib import Path

import pytest
from _receiver import FaultyReceiver
from test_faults import PROTOCOLS, record, wait_for

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
            # the child delivered its own spans and none of the parent's (nothing recovered,
            # nothing more accepted from it than it recorded)
            assert got["stats"].get("recovered", 0) == 0, got["stats"]
            assert got["stats"]["delivered"] == len(got["ids"]), got["stats"]
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
        # duplicates are allowed: delivery is at least once, and the parent resends a request
        # whose answer it did not get in time (one CI run here saw 75 while the children's own
        # counts above held; a forked child shares the OTLP HTTP exporter's keep-alive
        # connections with its parent, a known open problem)


#: (shape, secret, endpoint template): the three ways a credential rides in an endpoint
SHAPES = {
    "userinfo": ("PlantedPassw0rdU1x", "http://alice:PlantedPassw0rdU1x@127.0.0.1:{port}"),
    "query": ("PlantedQueryKeyQ2x", "http://127.0.0.1:{port}/?api_key=PlantedQueryKeyQ2x"),
    "path": ("sk-PlantedPathKey0123456789P3x",
             "http://127.0.0.1:{port}/sk-PlantedPathKey0123456789P3x"),
}


def _leaks(secret: str, texts: list[str]) -> int:
    return sum(text.count(secret) for text in texts)


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_credentials_in_the_endpoint_reach_no_log_line_or_name(protocol, shape, tmp_path,
                                                               caplog, capfd, figure):
    secret, template = SHAPES[shape]
    caplog.set_level(logging.DEBUG)
    with FaultyReceiver(protocol) as receiver:
        receiver.set_mode("refuse")  # nothing listens: the libraries log their retries
        RolloutTraceConfig.init("faults", "e", "otlp", trace_dir=str(tmp_path),
                                otlp_endpoint=template.format(port=receiver.port),
                                otlp_protocol=PROTOCOLS[protocol], export_timeout_s=1.0,
                                schedule_delay_s=0.2, export_delay_s=0.2)
        ids = record(20)
        assert wait_for(lambda: RolloutTraceConfig.stats().get("retries", 0) >= 2, 15)
        receiver.set_mode("ok")
        wait_for(lambda: receiver.ids() >= ids, 30)
        RolloutTraceConfig.shutdown(timeout_s=5)
    lines = [record.getMessage() for record in caplog.records]
    lines += [record.exc_text or "" for record in caplog.records]
    library = [r for r in caplog.records if r.name.startswith("opentelemetry.exporter.otlp")]
    # over gRPC the log's records go out as stored bytes on the exporter's own channel, past the
    # library's retry loop: otel_verl's line about each failed request (naming the endpoint)
    # stands for the library's
    library += [r for r in caplog.records if "did not take the log's request" in r.getMessage()]
    out, err = capfd.readouterr()
    names = [str(path.relative_to(tmp_path)) for path in tmp_path.rglob("*")]
    # the content store is gzip (one member per node): grep what it holds, not its bytes
    contents = [(gzip.decompress(path.read_bytes()).decode(errors="replace")
                 if path.suffix == ".gz" else path.read_text(errors="replace"))
                for path in tmp_path.rglob("*") if path.is_file()]
    leaked = {"log lines": _leaks(secret, lines), "stdout/stderr": _leaks(secret, [out, err]),
              "names": _leaks(secret, names), "files": _leaks(secret, contents)}
    lost = len(ids - receiver.ids())
    figure(fault=f"{protocol} credentials in the endpoint: {shape}", recorded=len(ids),
           received=len(ids & receiver.ids()), lost=lost, allowed=0,
           note=f"leaked {sum(leaked.values())} (planted 1; {len(caplog.records)} log lines, "
                f"{len(library)} from the OTLP library)")
    assert library, "the OTLP library logged nothing: the test saw none of its lines"
    assert leaked == dict.fromkeys(leaked, 0)
    assert lost == 0  # the endpoint still delivers, its credentials included
