"""Issue 22, section 1: the validating front is an allow-list.  The front's HTTP side runs here
against a recording stand-in for tritonserver, so each case proves that nothing reached the
upstream (the real-server runs are in test_serving.py and the load test's --hostile-every)."""

from __future__ import annotations

import http.client
import http.server
import json
import socket
import threading
import time

import pytest

from msar_export.serving.load.hostile import HTTP_CASES, send_http
from msar_export.serving.triton import front as front_mod
from msar_export.serving.triton.front_rules import Refused, check_http_infer, http_route

MODELS = {"logits", "generate"}
GOOD = json.dumps({"inputs": [{"name": "input_ids", "shape": [1, 4], "datatype": "INT64", "data": [1, 2, 3, 4]}],
                   "outputs": [{"name": "logits", "parameters": {"binary_data": False}}]}).encode()


@pytest.fixture
def fronted():
    """(front base URL, list of (method, path, body) the upstream received)."""
    seen = []

    class Upstream(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def _ok(self):
            n = int(self.headers.get("Content-Length", "0"))
            seen.append((self.command, self.path, self.rfile.read(n)))
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        do_GET = do_POST = _ok

    up = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    threading.Thread(target=up.serve_forever, daemon=True).start()
    front = front_mod.Front(up.server_address[1], 0, 1 << 16, 1 << 20, models=MODELS)
    srv = front_mod.BoundedHTTPServer(("127.0.0.1", 0), front_mod.http_handler(front), max_connections=8)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", seen, srv
    srv.shutdown()
    up.shutdown()


def _post(base, target, body, headers=()):
    port = int(base.rsplit(":", 1)[1])
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.putrequest("POST", target, skip_accept_encoding=True)
    for k, v in headers:
        c.putheader(k, v)
    if not any(k.lower() == "content-length" for k, _ in headers):
        c.putheader("Content-Length", str(len(body)))
    c.endheaders(body)
    r = c.getresponse()
    out = r.status, r.read()
    c.close()
    return out


def test_every_hostile_form_is_refused_and_never_reaches_triton(fronted):
    base, seen, _ = fronted
    for k, (_, desc, _) in enumerate(HTTP_CASES):
        refused, what = send_http(base, k)
        assert refused, what
    assert seen == [], f"forwarded: {[s[:2] for s in seen]}"
    # Negative control: a good request and the health check are forwarded unchanged.
    assert _post(base, "/v2/models/logits/infer", GOOD)[0] == 200
    c = http.client.HTTPConnection("127.0.0.1", int(base.rsplit(":", 1)[1]), timeout=10)
    c.request("GET", "/v2/health/ready")
    assert c.getresponse().status == 200
    c.close()
    assert [s[:2] for s in seen] == [("POST", "/v2/models/logits/infer"), ("GET", "/v2/health/ready")]
    assert seen[0][2] == GOOD


def test_duplicate_keys_anywhere_in_the_body_are_refused():
    dup_top = b'{"inputs": [], "inputs": [{"name": "input_ids", "shape": [1, 1], "datatype": "INT64", "data": [1]}]}'
    dup_param = (b'{"inputs": [{"name": "input_ids", "shape": [1, 1], "datatype": "INT64", "data": [1], '
                 b'"parameters": {"binary_data_size": 8, "binary_data_size": 0}}]}')
    for body in (dup_top, dup_param, b'{"inputs": [{"name": "a", "name": "b", "shape": [1], "datatype": "INT64", '
                                     b'"data": [1]}]}'):
        with pytest.raises(Refused, match="duplicate key"):
            check_http_infer(body, None, 1 << 10)
    check_http_infer(GOOD, None, 1 << 10)  # control
    with pytest.raises(Refused, match="not JSON"):
        check_http_infer(GOOD.replace(b"[1, 2, 3, 4]", b"[1, 2, 3, NaN]"), None, 1 << 10)


def test_only_allowed_routes_pass():
    allowed = [("POST", "/v2/models/logits/infer"), ("POST", "/v2/models/generate/versions/1/infer"),
               ("GET", "/v2/health/ready"), ("GET", "/v2/health/live"), ("GET", "/v2"), ("GET", "/v2/models/logits"),
               ("GET", "/v2/models/logits/ready"), ("GET", "/v2/models/logits/config")]
    for method, target in allowed:
        http_route(method, target, MODELS)
    refused = [("POST", "http://127.0.0.1:8000/v2/models/logits/infer"), ("POST", "//x/v2/models/logits/infer"),
               ("POST", "/v2/models/generate/generate"), ("POST", "/v2/models/generate/generate_stream"),
               ("POST", "/v2/models/other/infer"), ("POST", "/v2/models/logits/infer?x=1"),
               ("POST", "/v2/models/logit%73/infer"), ("GET", "/v2/models/logits/infer"),
               ("POST", "/v2/systemsharedmemory/region/r/register"), ("GET", "/v2/systemsharedmemory/status"),
               ("POST", "/v2/cudasharedmemory/region/r/register"), ("POST", "/v2/repository/index"),
               ("POST", "/v2/repository/models/logits/load"), ("POST", "/v2/trace/setting"), ("POST", "/v2/logging"),
               ("POST", "/v2/health/ready"), ("DELETE", "/v2/models/logits")]
    for method, target in refused:
        with pytest.raises(Refused):
            http_route(method, target, MODELS)


def test_repeated_length_headers_are_refused(fronted):
    base, seen, _ = fronted
    status, _ = _post(base, "/v2/models/logits/infer", GOOD,
                      [("Content-Length", str(len(GOOD))), ("Content-Length", "0")])
    assert status == 400 and seen == []


def test_idle_connections_are_capped_and_good_requests_still_answered(fronted):
    base, seen, srv = fronted
    port = int(base.rsplit(":", 1)[1])
    before = threading.active_count()
    idle = []
    for _ in range(40):  # 5x the cap, each holding a connection without sending a request
        s = socket.create_connection(("127.0.0.1", port))
        idle.append(s)
    partial = socket.create_connection(("127.0.0.1", port))
    partial.sendall(b"POST /v2/models/logits/infer HTTP/1.1\r\nContent-Length: 100\r\n")  # slowloris
    idle.append(partial)
    time.sleep(0.5)
    for _ in range(3):
        assert _post(base, "/v2/models/logits/infer", GOOD)[0] == 200
    assert len(srv.live) <= srv.max_connections
    assert threading.active_count() - before <= srv.max_connections + 2, "a thread per idle connection"
    for s in idle:
        s.close()


def test_idle_connections_time_out(monkeypatch):
    monkeypatch.setattr(front_mod, "IDLE_S", 0.3)
    front = front_mod.Front(1, 0, 16, 1 << 10, models=MODELS)
    srv = front_mod.BoundedHTTPServer(("127.0.0.1", 0), front_mod.http_handler(front))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        s = socket.create_connection(srv.server_address)
        s.settimeout(5)
        t0 = time.monotonic()
        assert s.recv(10) == b""  # closed by the front, not by us
        assert time.monotonic() - t0 < 3
    finally:
        srv.shutdown()


def test_front_counts_what_it_passed_on_and_what_it_refused(fronted):
    """GET /v2/front/stats (answered by the front itself, never forwarded): the counters
    `loadtest --perf-analyzer` judges a run by."""
    base, seen, _ = fronted

    def stats():
        c = http.client.HTTPConnection("127.0.0.1", int(base.rsplit(":", 1)[1]), timeout=10)
        c.request("GET", "/v2/front/stats")
        r = c.getresponse()
        out = r.status, json.loads(r.read())
        c.close()
        return out

    status, before = stats()
    assert status == 200 and before["http"] == {"answered": 0, "infer_answered": 0, "refused": 0, "upstream_errors": 0}
    assert _post(base, "/v2/models/logits/infer", GOOD)[0] == 200
    assert _post(base, "/v2/models/logits/infer", GOOD.replace(b"[1, 4]", b"[1, 5]"))[0] == 400  # 4 values, 5 elements
    _, after = stats()
    assert after["http"] == {"answered": 1, "infer_answered": 1, "refused": 1, "upstream_errors": 0}, after
    assert after["grpc"] == before["grpc"] and len(seen) == 1
    assert _post(base, "/v2/front/stats", b"")[0] == 405  # read-only

