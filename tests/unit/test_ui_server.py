"""The viewer's HTTP server as a browser (or an attacker's page) meets it: a real server on
127.0.0.1 over a small store, reached with http.client and raw sockets.

- a ``Host`` that does not name the viewer (DNS rebinding) is refused on every route;
- the listen backlog holds 200 connections at once and all 200 are answered;
- idle connections are closed, and handler threads are bounded;
- query numbers out of range (or not numbers) are answered 400 with a short message, and an
  internal error is answered 500 without its text.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import otel_verl
from otel_verl import RolloutTraceConfig, rollout_trace_attr, rollout_trace_op
from otel_verl.ui import server as server_module
from otel_verl.ui import views
from otel_verl.ui._lake import LakeSource
from otel_verl.ui.server import UIServer

PROMPT = "What is the secret 3+4?"


@rollout_trace_op
def agent(prompt: str) -> str:
    return "The answer is 7."


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    trace_dir = tmp_path_factory.mktemp("store")
    RolloutTraceConfig.init("p", "exp", "file", trace_dir=str(trace_dir), processor="simple")
    for i, reward in enumerate([1.0, 0.0, 1.0, 0.0]):
        with rollout_trace_attr(step=1, sample_index=i // 2, rollout_n=i % 2):
            agent(PROMPT)
            otel_verl.record_reward(reward, name="exact")
    RolloutTraceConfig.shutdown()
    RolloutTraceConfig.reset()
    found = LakeSource(trace_dir, compact=False)
    yield found
    found.close()


class Running:
    """A UIServer serving from a thread (``start=False``: listening, not yet accepting)."""

    def __init__(self, index, start=True, **kwargs):
        self.srv = UIServer(index, port=0, poll_s=60.0, **kwargs)
        self.port = self.srv.server_address[1]
        self.thread = None
        if start:
            self.start()

    def start(self):
        self.thread = threading.Thread(target=self.srv.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)
        self.thread.start()

    def close(self):
        if self.thread is not None:
            self.srv.shutdown()
        self.srv.server_close()


@pytest.fixture
def running(index):
    made = []

    def make(**kwargs):
        made.append(Running(index, **kwargs))
        return made[-1]

    yield make
    for one in made:
        one.close()


def request(port, path, host=None, method="GET", timeout=20.0):
    """(status, body) of one request, with ``host`` as the Host header (default: the address)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.putrequest(method, path, skip_host=host is not None, skip_accept_encoding=True)
        if host is not None:
            conn.putheader("Host", host)
        conn.endheaders()
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def routes(index):
    key = index.trajectories()["rows"][0]["key"]
    return ["/", "/index.html", "/static/app.js", "/static/app.css", "/api/meta",
            "/api/overview", "/api/trajectories?step=1", f"/api/trajectory?key={key}",
            "/api/group?step=1&sample_index=0", "/api/prompt?sample_index=0", "/api/nothing",
            "/nothing"]


# --- Host ---------------------------------------------------------------------------------------

FOREIGN = ["evil.example", "evil.example:{port}", "EVIL.example.:{port}", "localhost.evil.example",
           "127.0.0.1.nip.io:{port}", "", "[::1", "localhost:{port}:1", "a b"]


def test_a_foreign_host_is_refused_on_every_route_with_no_data(index, running):
    one = running()
    store = index.trace_dir
    for path in routes(index):
        status, _ = request(one.port, path)
        assert status in (200, 404), path  # the viewer's own address works
        for host in FOREIGN:
            status, body = request(one.port, path, host=host.format(port=one.port))
            assert status == 403, (path, host)
            assert store.encode() not in body and b"secret" not in body and b"<html" not in body
        for method in ("HEAD", "POST"):
            status, _ = request(one.port, path, host="evil.example", method=method)
            assert status == 403, (method, path)


def test_the_viewers_own_names_are_answered_whatever_the_port(index, running):
    one = running()
    for host in (f"127.0.0.1:{one.port}", f"localhost:{one.port}", "LOCALHOST", "localhost.",
                 "localhost:9000", f"[::1]:{one.port}", "app.localhost:9000", "10.1.2.3:80"):
        status, body = request(one.port, "/api/meta", host=host)  # 9000: an ssh tunnel
        assert status == 200, host
        assert json.loads(body)["store"].endswith(index.trace_dir.rstrip("/").split("/")[-1])


def test_allowed_hosts_open_the_viewer_to_a_proxys_name(index, running):
    named = running(allowed_hosts=["viewer.internal"])
    assert request(named.port, "/api/meta", host="viewer.internal:443")[0] == 200
    assert request(named.port, "/api/meta", host="Viewer.Internal")[0] == 200
    assert request(named.port, "/api/meta", host="evil.example")[0] == 403
    anyone = running(allowed_hosts=["*"])
    assert request(anyone.port, "/api/meta", host="evil.example")[0] == 200


def test_a_request_naming_another_server_in_its_target_is_refused(index, running):
    one = running()
    with socket.create_connection(("127.0.0.1", one.port), timeout=20) as sock:
        sock.sendall(b"GET http://evil.example/api/meta HTTP/1.1\r\nHost: localhost\r\n\r\n")
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 403") and index.trace_dir.encode() not in answer


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(name=st.from_regex(r"[a-z][a-z0-9-]{0,12}(\.[a-z][a-z0-9-]{0,12}){1,3}", fullmatch=True))
def test_any_dns_name_not_allowed_is_refused(index, name):
    one = Running(index)
    try:
        status, body = request(one.port, "/api/meta", host=f"{name}:{one.port}")
    finally:
        one.close()
    if name == "localhost" or name.endswith(".localhost"):
        assert status == 200
    else:
        assert status == 403 and index.trace_dir.encode() not in body


# --- connections --------------------------------------------------------------------------------


def test_200_connections_at_once_are_all_held_and_answered(index, running):
    one = running(start=False)
    one.srv.idle_timeout_s = 120.0  # idle keep-alive connections would hold their threads long
    conns = []
    try:
        # nothing accepts yet: only the listen backlog holds these (a backlog of 5 held 6)
        for i in range(200):
            conn = http.client.HTTPConnection("127.0.0.1", one.port, timeout=5.0)
            try:
                conn.connect()
            except OSError as error:
                pytest.fail(f"connection {i} was not held by the listen backlog: {error!r}")
            conn.sock.settimeout(20.0)
            conn.request("GET", "/api/meta")
            conns.append(conn)
        one.start()
        statuses = []
        for conn in conns:  # keep-alive clients: idle ones must not hold the threads others need
            response = conn.getresponse()
            response.read()
            statuses.append(response.status)
        assert statuses == [200] * 200
    finally:
        for conn in conns:
            conn.close()


def test_200_concurrent_requests_from_threads_are_all_served(index, running):
    one = running()
    barrier = threading.Barrier(200)
    results: list[tuple[int | str, float]] = []

    def client():
        barrier.wait(timeout=60)
        began = time.monotonic()
        try:
            status: int | str = request(one.port, "/api/trajectories?step=1", timeout=30.0)[0]
        except OSError as error:
            status = repr(error)
        results.append((status, time.monotonic() - began))

    threads = [threading.Thread(target=client) for _ in range(200)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(90)
    statuses = [status for status, _ in results]
    assert statuses == [200] * 200, [s for s in statuses if s != 200][:5]


def _handler_threads(before):
    return [t for t in threading.enumerate()
            if t.ident not in before and "process_request_thread" in t.name]


def _wait_for(condition, deadline_s=20.0):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.02)
    return False


def test_idle_connections_are_closed(index, running):
    one = running()
    one.srv.idle_timeout_s = 0.3
    with socket.create_connection(("127.0.0.1", one.port), timeout=20) as silent:
        assert silent.recv(1) == b""  # never sent a request: closed by the server
    with socket.create_connection(("127.0.0.1", one.port), timeout=20) as kept:
        kept.sendall(b"GET /api/meta HTTP/1.1\r\nHost: localhost\r\n\r\n")
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            chunk = kept.recv(65536)
            assert chunk, "closed before the answer"
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 200")
        assert kept.recv(1) == b""  # a keep-alive connection left idle: closed too


def test_handler_threads_are_bounded_and_idle_ones_do_not_block_the_rest(index, running):
    before = {t.ident for t in threading.enumerate()}
    one = running(max_connections=4, idle_timeout_s=60.0)
    silent = [socket.create_connection(("127.0.0.1", one.port), timeout=20) for _ in range(12)]
    try:
        assert _wait_for(lambda: len(_handler_threads(before)) >= 4)
        time.sleep(0.3)  # room for more to start, were there no bound
        assert len(_handler_threads(before)) == 4
    finally:
        for sock in silent:
            sock.close()
    assert request(one.port, "/api/meta")[0] == 200  # the closed ones freed their threads
    assert _wait_for(lambda: len(_handler_threads(before)) <= 1)


# --- numbers ------------------------------------------------------------------------------------

NUMERIC = [("trajectories", "step"), ("trajectories", "sample_index"),
           ("trajectories", "rollout_n"), ("trajectories", "page"), ("trajectories", "page_size"),
           ("group", "step"), ("group", "sample_index"), ("prompt", "sample_index")]
FLOATS = [("trajectories", "reward_min"), ("trajectories", "reward_max")]
BOOLS = [("trajectories", "validate"), ("trajectories", "errors"), ("trajectories", "desc"),
         ("group", "validate"), ("prompt", "validate")]
BAD_INTS = [str(2**63), str(-(2**63) - 1), "1" + "0" * 400, "9" * 5000, "x", "1.5", "0x10"]


def _bad(port, route, query):
    base = {"group": "step=1&sample_index=0&", "prompt": "sample_index=0&"}.get(route, "")
    status, body = request(port, f"/api/{route}?{base}{query}")
    return status, body


@pytest.mark.parametrize(("route", "param"), NUMERIC)
def test_integers_out_of_range_answer_400_with_a_short_message(index, running, route, param):
    one = running()
    for value in BAD_INTS:
        status, body = _bad(one.port, route, f"{param}={value}")
        assert status == 400, (param, value[:20], body[:200])
        message = json.loads(body)["error"]
        assert message.startswith(f"{param}: an integer from ") and len(message) < 120
        assert "Error" not in message and "literal" not in message  # no exception text
    if param not in ("page", "page_size"):  # the int64 bounds themselves are fine
        for value in (2**63 - 1, -(2**63)):
            assert _bad(one.port, route, f"{param}={value}")[0] == 200
    else:
        assert _bad(one.port, route, f"{param}=-1")[0] == 400


@pytest.mark.parametrize(("route", "param"), FLOATS + BOOLS)
def test_bad_floats_and_booleans_answer_400(index, running, route, param):
    one = running()
    values = ["1e400", "-1e999", "nan", "inf", "x", "9" * 5000] if (route, param) in FLOATS \
        else ["maybe", "2", "9" * 5000]
    for value in values:
        status, body = _bad(one.port, route, f"{param}={value}")
        assert status == 400, (param, value[:20])
        assert param in json.loads(body)["error"]


def test_the_good_values_still_filter(index, running):
    one = running()
    status, body = request(one.port, "/api/trajectories?step=1&sample_index=1&reward_min=0.5"
                                     "&validate=false&desc=1&page=0&page_size=10")
    assert status == 200 and [r["reward"] for r in json.loads(body)["rows"]] == [1.0]


def test_an_internal_error_answers_500_without_its_text(index, running, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError(f"cannot read {index.trace_dir}/secret")

    monkeypatch.setattr(server_module, "overview_view", broken)
    one = running()
    status, body = request(one.port, "/api/overview")
    assert status == 500 and b"secret" not in body and b"RuntimeError" not in body
    assert request(one.port, "/api/meta")[0] == 200  # and the viewer goes on


def test_the_views_bad_request_answers_400(index, running, monkeypatch):
    error = getattr(views, "BadRequest", None)
    if error is None:  # the views' own exception for bad input, where the views define one
        error = type("BadRequest", (ValueError,), {})
        monkeypatch.setattr(views, "BadRequest", error, raising=False)

    def refuse(*args, **kwargs):
        raise error("step: out of range")

    monkeypatch.setattr(server_module, "overview_view", refuse)
    one = running()
    status, body = request(one.port, "/api/overview")
    assert status == 400 and json.loads(body)["error"] == "step: out of range"
