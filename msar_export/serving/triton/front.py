"""A validating front for tritonserver: every request is checked before Triton sees it.

Triton parses KServe v2 requests itself and trusts their shapes: an HTTP JSON input
of shape [1, 10**12] with four values makes it allocate terabytes (std::bad_alloc,
the server aborts), and a shape [1, 2**61] with no bytes kills the Python backend
stub for good while /v2/health/ready keeps answering 200.  So `msar-export serve`
puts tritonserver on private loopback ports and this process on the public ones:

- HTTP: bodies over `max_body` are refused unread (413); an infer request's JSON
  header is parsed, and each input's shape must be non-negative integers with at
  most `max_elements` elements, its JSON data exactly that many values (integers in
  the range of the declared type: no silent narrowing of 2**32+5 to 5), or its
  binary size exactly elements x element size, the binary parts adding up to the
  body.  Anything else is 400 with one line; good requests go through unchanged.
- gRPC: the same rules on ModelInferRequest (raw contents or typed contents).
- `GET /v2/front/stats` answers this front's own counters per protocol: requests answered
  by Triton (infer requests among them), refused here, and answered with an error by Triton
  (or not at all), so a load generator's run can be shown to have had none refused.
- A reply saying the backend stub is no longer healthy makes this front exit with
  status 3 and one line, so `serve` stops the server instead of answering errors
  forever behind a "ready" health check.

Runs in .venv-triton (grpcio and Triton's protobufs are there): `python -m
msar_export.serving.triton.front --http PORT --grpc PORT --upstream-http PORT
--upstream-grpc PORT --max-elements N`.
"""

from __future__ import annotations

import argparse
import http.client
import http.server
import json
import os
import re
import socket
import sys
import threading
import time

from .front_rules import Refused, check_grpc_infer, check_http_infer, grpc_allowed, http_route

HOST = "127.0.0.1"
STUB_DEAD = re.compile(r"Stub process .* is not healthy|stub process .* died", re.I)
# A connection that has not sent a complete request within IDLE_S is closed, and at most
# MAX_CONNECTIONS are held: 1,100 idle connections once made 1,109 threads.  At the cap the
# longest-waiting connection without a request in progress makes room for the new one,
# so a slow-client flood cannot keep a good request out.
IDLE_S = 15.0
MAX_CONNECTIONS = 256
# Headers that two parsers may read differently when repeated (the first or the last).
SINGLE_HEADERS = ("content-length", "inference-header-content-length", "transfer-encoding", "host")
OUTCOMES = ("answered", "infer_answered", "refused", "upstream_errors")


# -- the processes -----------------------------------------------------------------------

class Front:
    def __init__(self, upstream_http: int, upstream_grpc: int, max_elements: int, max_body: int,
                 models=(), upstream_header: tuple[str, str] | None = None):
        self.upstream_http, self.upstream_grpc = upstream_http, upstream_grpc
        self.max_elements, self.max_body = max_elements, max_body
        self.models = frozenset(models)
        # Sent with every forwarded request when Triton's APIs are restricted to holders of a key.
        self.upstream_header = upstream_header
        self.dead = threading.Event()
        self.why = ""
        self.lock = threading.Lock()
        self.counts = {p: dict.fromkeys(OUTCOMES, 0) for p in ("http", "grpc")}

    def count(self, protocol: str, outcome: str, infer: bool = False) -> None:
        with self.lock:
            self.counts[protocol][outcome] += 1
            if infer and outcome == "answered":
                self.counts[protocol]["infer_answered"] += 1

    def stats(self, turned_away: int = 0) -> dict:
        with self.lock:
            out = {p: dict(c) for p, c in self.counts.items()}
        out["http"]["refused"] += turned_away  # connections refused at the cap (503) are refusals too
        return out

    def stub_died(self, text: str) -> None:
        if STUB_DEAD.search(text) and not self.dead.is_set():
            self.why = text.strip().splitlines()[0][:300]
            self.dead.set()


class BoundedHTTPServer(http.server.ThreadingHTTPServer):
    """ThreadingHTTPServer with a connection cap; at the cap the connection that has waited
    longest without a request in progress is closed to make room (see MAX_CONNECTIONS)."""

    daemon_threads = True
    # The listen backlog (socketserver's default is 5): perf_analyzer opens its 16 connections at
    # once, the kernel's accept queue overflowed (TcpExtListenOverflows) and 2 of 3 runs at
    # concurrency 16 failed with "Failure when receiving data from the peer".
    request_queue_size = MAX_CONNECTIONS

    def __init__(self, *args, max_connections: int = MAX_CONNECTIONS, **kw):
        super().__init__(*args, **kw)
        self.max_connections = max_connections
        self.lock = threading.Lock()
        self.live: dict = {}  # socket -> monotonic time it became idle, or None while busy
        self.turned_away = 0

    def process_request(self, request, client_address):
        with self.lock:
            if len(self.live) >= self.max_connections:
                idle = [(t, sock) for sock, t in self.live.items() if t is not None]
                if not idle:
                    self.turned_away += 1
                    request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\n"
                                    b"Content-Length: 0\r\n\r\n")
                    self.shutdown_request(request)
                    return
                victim = min(idle, key=lambda x: x[0])[1]
                del self.live[victim]
                try:
                    victim.shutdown(socket.SHUT_RDWR)  # its handler reads EOF and ends
                except OSError:
                    pass
            self.live[request] = time.monotonic()
        super().process_request(request, client_address)

    def handle_error(self, request, client_address):
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return  # a client that went away or idled out: nothing to report
        super().handle_error(request, client_address)

    def mark(self, request, idle: bool) -> None:
        with self.lock:
            if request in self.live:
                self.live[request] = time.monotonic() if idle else None

    def shutdown_request(self, request):
        with self.lock:
            self.live.pop(request, None)
        super().shutdown_request(request)


def http_handler(front: Front):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Headers and body go out in two writes; with Nagle on, the body waits for the
        # client's delayed ACK (40 ms per request on loopback, measured: 8x fewer req/s).
        disable_nagle_algorithm = True
        timeout = IDLE_S  # a socket read that waits longer ends the connection

        def handle_one_request(self):
            self.server.mark(self.connection, idle=True)  # evictable until a whole request is read
            super().handle_one_request()

        def log_message(self, *args):  # the server log is Triton's
            pass

        def _reply(self, code: int, body: bytes, headers=()):
            self.send_response(code)
            for k, v in headers:
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _refuse(self, code: int, msg: str, close: bool = False):
            front.count("http", "refused" if code < 500 else "upstream_errors")
            if close:
                self.close_connection = True
            self._reply(code, json.dumps({"error": msg}).encode(), [("Content-Type", "application/json")]
                        + ([("Connection", "close")] if close else []))

        def _forward(self, body: bytes | None):
            hop = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}
            headers = {k: v for k, v in self.headers.items() if k.lower() not in hop}
            if front.upstream_header:
                headers[front.upstream_header[0]] = front.upstream_header[1]
            # One upstream connection per client connection (this handler's thread), kept
            # alive: a new TCP connection per request cost about a fifth of the throughput.
            for attempt in (0, 1):
                conn = getattr(self, "_upstream", None)
                if conn is None:
                    conn = self._upstream = http.client.HTTPConnection(HOST, front.upstream_http, timeout=600)
                try:
                    conn.request(self.command, self.path, body=body, headers=headers)
                    r = conn.getresponse()
                    data = r.read()
                    break
                except (OSError, http.client.HTTPException) as e:
                    conn.close()
                    self._upstream = None
                    if attempt == 1 or not isinstance(e, (ConnectionError, http.client.RemoteDisconnected)):
                        return self._refuse(502, f"tritonserver did not answer ({type(e).__name__})")
            if r.status >= 400:
                front.stub_died(data.decode(errors="replace"))
            front.count("http", "answered" if r.status < 400 else "upstream_errors", infer=self.command == "POST")
            self._reply(r.status, data, [(k, v) for k, v in r.getheaders() if k.lower() not in hop])

        def _allowed(self) -> str | None:
            """The route kind ('infer' / 'read'), or None after refusing the request."""
            repeated = [h for h in SINGLE_HEADERS if len(self.headers.get_all(h) or ()) > 1]
            if repeated:  # two Content-Lengths: which one Triton believes is not ours to guess
                self._refuse(400, f"header {repeated[0]} given more than once", close=True)
                return None
            try:
                kind = http_route(self.command, self.path, front.models)
            except Refused as e:
                self._refuse(e.status, str(e), close=True)  # any body it sent stays unread
                return None
            self.server.mark(self.connection, idle=False)
            return kind

        def do_GET(self):
            kind = self._allowed()
            if kind == "front":
                self._reply(200, json.dumps(front.stats(self.server.turned_away)).encode(),
                            [("Content-Type", "application/json")])
            elif kind:
                self._forward(None)

        def do_HEAD(self):  # never allowed: refused by http_route with 405, not BaseHTTPRequestHandler's 501 page
            self._allowed()

        do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_HEAD

        def finish(self):
            conn = getattr(self, "_upstream", None)
            if conn is not None:
                conn.close()
            super().finish()

        def do_POST(self):
            kind = self._allowed()
            if kind is None:
                return
            if self.headers.get("Transfer-Encoding"):
                return self._refuse(411, "send a Content-Length (chunked requests are not accepted)", close=True)
            try:
                length = int(self.headers.get("Content-Length", "0"))
            except ValueError:
                return self._refuse(400, "Content-Length is not a number", close=True)
            if not 0 <= length <= front.max_body:
                return self._refuse(413, f"request body of {length} bytes is over this server's "
                                         f"{front.max_body:,}-byte limit", close=True)
            body = self.rfile.read(length)
            if len(body) != length:
                return self._refuse(400, "the body is shorter than its Content-Length", close=True)
            hl = self.headers.get("Inference-Header-Content-Length")
            try:
                check_http_infer(body, None if hl is None else int(hl), front.max_elements)
            except ValueError as e:  # Refused, or a non-integer header length
                return self._refuse(400, str(e) if isinstance(e, Refused) else "bad Inference-Header-Content-Length")
            self._forward(body)

    return Handler


def serve_grpc(front: Front, port: int):
    from concurrent import futures

    import grpc

    channel = grpc.insecure_channel(f"{HOST}:{front.upstream_grpc}", options=[
        ("grpc.max_send_message_length", front.max_body), ("grpc.max_receive_message_length", -1)])

    class Proxy(grpc.GenericRpcHandler):
        def service(self, details):
            method = details.method
            if grpc_allowed(method, None, front.models) is not None:
                front.count("grpc", "refused")
                return None  # streaming, shared memory, repository, trace, logging: UNIMPLEMENTED
            call = channel.unary_unary(method)
            extra = (front.upstream_header,) if front.upstream_header else ()

            def handle(raw, context):
                why = grpc_allowed(method, raw, front.models)
                if why is not None:
                    front.count("grpc", "refused")
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, why)
                if method.endswith("/ModelInfer"):
                    try:
                        check_grpc_infer(raw, front.max_elements)
                    except Refused as e:
                        front.count("grpc", "refused")
                        context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
                try:
                    reply = call(raw, timeout=600, metadata=(*context.invocation_metadata(), *extra))
                except grpc.RpcError as e:
                    front.count("grpc", "upstream_errors")
                    front.stub_died(e.details() or "")
                    context.abort(e.code(), e.details() or "")
                front.count("grpc", "answered", infer=method.endswith("/ModelInfer"))
                return reply

            return grpc.unary_unary_rpc_method_handler(handle)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=64), handlers=[Proxy()],
                         options=[("grpc.max_receive_message_length", front.max_body),
                                  ("grpc.max_connection_idle_ms", int(IDLE_S * 1000)),
                                  ("grpc.max_concurrent_streams", 64)])
    server.add_insecure_port(f"{HOST}:{port}")
    server.start()
    return server


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="msar-export-front")
    p.add_argument("--http", type=int, required=True)
    p.add_argument("--grpc", type=int, required=True)
    p.add_argument("--upstream-http", type=int, required=True)
    p.add_argument("--upstream-grpc", type=int, required=True)
    p.add_argument("--max-elements", type=int, default=1 << 22)
    p.add_argument("--max-body", type=int, default=0, help="bytes (default: 8 x max-elements x 2 + 1 MiB)")
    p.add_argument("--models", required=True, help="comma-separated served models: the only ones reachable")
    p.add_argument("--max-connections", type=int, default=MAX_CONNECTIONS)
    a = p.parse_args(argv)
    front = Front(a.upstream_http, a.upstream_grpc, a.max_elements, a.max_body or 16 * a.max_elements + (1 << 20),
                  models=[m for m in a.models.split(",") if m])
    httpd = BoundedHTTPServer((HOST, a.http), http_handler(front), max_connections=a.max_connections)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    grpcd = serve_grpc(front, a.grpc)
    print(f"front ready: http {a.http} grpc {a.grpc} -> tritonserver http {a.upstream_http} grpc {a.upstream_grpc}",
          flush=True)
    front.dead.wait()
    print(f"msar-export front: error: a model's backend stub died ({front.why}); stopping the server rather "
          "than answering errors behind a ready health check", file=sys.stderr, flush=True)
    grpcd.stop(0)
    httpd.shutdown()
    os._exit(3)


if __name__ == "__main__":
    sys.exit(main())
