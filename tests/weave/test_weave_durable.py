"""backend="weave" through the durable log, against Weave's own trace server stopped and restarted:
every span recorded while it was down becomes a Weave call once it is back (same process), and
what a process left is delivered by the next one with the same trace dir. Call ids are span ids,
so a span sent twice (at-least-once) is still one call."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from http.server import ThreadingHTTPServer

import pytest
from _common import API_KEY, PROJECT_ID

from otel_verl import RolloutTraceConfig, get_tracer, rollout_trace_attr


def _stop(shim) -> int:
    """Stop listening, and drop the connections already open (a stopped server answers nothing
    on them either)."""
    handler = shim.httpd.RequestHandlerClass
    if not hasattr(handler, "_serving_do_post"):
        handler._serving_do_post = handler.do_POST

        def do_post(self) -> None:
            if getattr(shim, "down", False):
                self.close_connection = True
                with contextlib.suppress(OSError):
                    self.connection.shutdown(socket.SHUT_RDWR)
                return
            handler._serving_do_post(self)

        handler.do_POST = do_post
    shim.down = True
    port = shim.httpd.server_address[1]
    shim.httpd.shutdown()
    shim.httpd.server_close()
    return port


def _restart(shim, port: int) -> None:
    handler = shim.httpd.RequestHandlerClass
    for _ in range(50):
        try:
            shim.httpd = ThreadingHTTPServer(("127.0.0.1", port), handler)
            break
        except OSError:
            time.sleep(0.1)
    shim.httpd.daemon_threads = True
    shim.down = False
    threading.Thread(target=shim.httpd.serve_forever, daemon=True).start()


def _init(shim, trace_dir) -> None:
    RolloutTraceConfig.init(PROJECT_ID, "durable", "weave", weave_base_url=shim.url,
                            trace_dir=str(trace_dir), export_timeout_s=1.0,
                            schedule_delay_s=0.1, export_delay_s=0.3)


def _record(n: int, step: int) -> set[str]:
    tracer = get_tracer()
    ids = set()
    with rollout_trace_attr(step=step, sample_index=0, rollout_n=0, name="traj"):
        for i in range(n):
            with tracer.start_as_current_span(f"turn{i}") as span:
                pass
            ids.add(format(span.get_span_context().span_id, "016x"))
    return ids


def _call_ids(shim) -> set[str]:
    return {call.id for call in shim.calls(PROJECT_ID)}


def _wait(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


@pytest.fixture
def api_key(monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", API_KEY)


def test_weave_stopped_and_restarted_loses_nothing(weave_server, api_key, tmp_path):
    _init(weave_server, tmp_path)
    ids = _record(20, step=0)
    assert RolloutTraceConfig.flush(10)
    assert _call_ids(weave_server) >= ids
    port = _stop(weave_server)
    down = set()
    for step in range(1, 6):
        down |= _record(40, step=step)
    assert _wait(lambda: RolloutTraceConfig.stats()["retries"] >= 1, 10)
    assert RolloutTraceConfig.stats()["spool_pending"] > 0
    _restart(weave_server, port)
    assert _wait(lambda: _call_ids(weave_server) >= ids | down, 30)
    assert RolloutTraceConfig.flush(10)
    print(f"weave restart: recorded {len(ids | down)}, calls {len(_call_ids(weave_server))}, "
          f"lost {len((ids | down) - _call_ids(weave_server))}")


def test_the_next_process_delivers_to_weave_what_an_earlier_one_left(weave_server, api_key,
                                                                   tmp_path):
    port = _stop(weave_server)
    _init(weave_server, tmp_path)
    ids = _record(50, step=0)
    RolloutTraceConfig.flush(0.5)
    RolloutTraceConfig.shutdown(1.0)  # the server is still down: the spans stay in the log
    # a sender inside an export when its shutdown ran out stops after that export: wait for it,
    # or the "earlier process" could still deliver once the server is back (a process that
    # exits takes its threads with it)
    assert _wait(lambda: not any(t.name == "otel_verl-deliver" and t.is_alive()
                                 for t in threading.enumerate()), 30), "the sender never stopped"
    _restart(weave_server, port)
    RolloutTraceConfig.reset()
    _init(weave_server, tmp_path)  # "the next process": same trace dir, same backend
    assert _wait(lambda: _call_ids(weave_server) >= ids, 30)
    # the server stores the calls before its answer reaches the sender, which counts them then
    assert _wait(lambda: RolloutTraceConfig.stats()["recovered"] >= 50, 10), \
        RolloutTraceConfig.stats()


def test_a_call_weaves_server_refuses_is_quarantined_at_once_with_no_strikes(
        weave_server, api_key, tmp_path, monkeypatch):
    """Weave's own server refuses the one call whose payload is declared JSON and is not
    (pydantic: 400); the Weave exporter says so (``export_detailed``: rejected), and the durable
    log moves that span to quarantine/ at once: one export for the whole backlog, no probing
    (no second export, no canary, no strikes, no backoff), every other span a Weave call."""
    from otel_weave_exporter import WeaveSpanExporter

    calls = {"export": 0, "export_detailed": 0}
    for name in calls:
        real = getattr(WeaveSpanExporter, name)

        def counted(self, spans, _real=real, _name=name):
            calls[_name] += 1
            return _real(self, spans)

        monkeypatch.setattr(WeaveSpanExporter, name, counted)
    port = _stop(weave_server)  # the spans wait in the log: one backlog, one request
    _init(weave_server, tmp_path)
    tracer = get_tracer()
    good = _record(9, step=0)
    with rollout_trace_attr(step=0, sample_index=1, rollout_n=0, name="traj"):
        with tracer.start_as_current_span("bad", attributes={
                "output.value": "{oops", "output.mime_type": "application/json"}):
            pass
    good |= _record(9, step=1)
    RolloutTraceConfig.flush(0.5)
    assert _wait(lambda: RolloutTraceConfig.stats()["retries"] >= 1, 10)
    before = len(weave_server.requests)
    calls.update(export=0, export_detailed=0)
    retries = RolloutTraceConfig.stats()["retries"]
    _restart(weave_server, port)
    assert _wait(lambda: RolloutTraceConfig.stats()["quarantined"] == 1, 15)
    assert RolloutTraceConfig.flush(10)
    stats = RolloutTraceConfig.stats()
    assert _call_ids(weave_server) >= good
    assert "bad" not in {call.op_name for call in weave_server.calls(PROJECT_ID)}
    assert stats["quarantined"] == 1 and stats["spool_pending"] == 0
    assert stats["retries"] == retries  # not one failed attempt once the server was back
    assert calls == {"export": 0, "export_detailed": 1}  # no probe: the one request said it all
    sent = weave_server.requests[before:]
    refused = [r for r in sent if r.get("status") == 400]
    # the Weave exporter's own halving, nothing more: 21 calls (two trajectories of 9 turns,
    # the bad one): one refused request per level (21, 11, 6, 3, 2, 1) and one accepted half
    # beside each, 11 requests at most (the strikes would add probes and retries)
    assert 1 <= len(refused) <= 6 and len(sent) <= 11
    (quarantine,) = (tmp_path / "spool").rglob("quarantine/*.jsonl")
    assert b'"bad"' in quarantine.read_bytes()
