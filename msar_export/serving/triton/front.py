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
import math
import os
import re
import sys
import threading

HOST = "127.0.0.1"
DTYPE_BYTES = {"BOOL": 1, "UINT8": 1, "INT8": 1, "UINT16": 2, "INT16": 2, "FP16": 2, "BF16": 2, "UINT32": 4,
               "INT32": 4, "FP32": 4, "UINT64": 8, "INT64": 8, "FP64": 8}
INT_RANGE = {"UINT8": (0, 2**8 - 1), "INT8": (-2**7, 2**7 - 1), "UINT16": (0, 2**16 - 1), "INT16": (-2**15, 2**15 - 1),
             "UINT32": (0, 2**32 - 1), "INT32": (-2**31, 2**31 - 1), "UINT64": (0, 2**64 - 1),
             "INT64": (-2**63, 2**63 - 1)}
MAX_RANK = 8
STUB_DEAD = re.compile(r"Stub process .* is not healthy|stub process .* died", re.I)
INFER_PATH = re.compile(r"^/v2/models/[^/]+(/versions/[^/]+)?/infer$")


class Refused(ValueError):
    """The request is malformed: answered 400 / INVALID_ARGUMENT, never forwarded."""


def element_count(shape, name: str, max_elements: int) -> int:
    if not isinstance(shape, (list, tuple)) or len(shape) > MAX_RANK:
        raise Refused(f"input '{name}': shape must be a list of at most {MAX_RANK} dimensions")
    n = 1
    for d in shape:
        if isinstance(d, bool) or not isinstance(d, int) or d < 0:
            raise Refused(f"input '{name}': shape {shape} must hold non-negative integers")
        n *= d
        if n > max_elements:
            raise Refused(f"input '{name}': shape {shape} has more than {max_elements:,} elements, "
                          "the most this server accepts")
    return n


def _flat_values(data, name: str, limit: int) -> list:
    """JSON `data` flattened (any nesting), refused as soon as it holds more than `limit` values."""
    out, stack = [], [data]
    while stack:
        x = stack.pop()
        if isinstance(x, list):
            stack.extend(reversed(x))
        else:
            out.append(x)
            if len(out) > limit:
                raise Refused(f"input '{name}': more data values than its shape holds")
    return out


def check_json_values(values: list, dtype: str, name: str) -> None:
    if dtype in INT_RANGE:
        lo, hi = INT_RANGE[dtype]
        for v in values:
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                raise Refused(f"input '{name}': {v!r} is not a {dtype} value (range [{lo}, {hi}])")
    elif dtype == "BOOL":
        if not all(isinstance(v, bool) for v in values):
            raise Refused(f"input '{name}': BOOL data must be true/false")
    elif dtype in DTYPE_BYTES:
        for v in values:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise Refused(f"input '{name}': {v!r} is not a finite {dtype} value")


def check_http_infer(body: bytes, header_length: int | None, max_elements: int) -> None:
    """Raise Refused unless `body` is a well-formed KServe v2 infer request within the limits."""
    if header_length is not None and not 0 <= header_length <= len(body):
        raise Refused("Inference-Header-Content-Length is larger than the body")
    head = body if header_length is None else body[:header_length]
    binary = len(body) - len(head)
    try:
        req = json.loads(head)
    except (ValueError, RecursionError):
        raise Refused("the request is not valid JSON") from None
    inputs = req.get("inputs") if isinstance(req, dict) else None
    if not isinstance(inputs, list) or not inputs:
        raise Refused("the request has no 'inputs' list")
    total = 0
    for inp in inputs:
        if not isinstance(inp, dict) or not isinstance(inp.get("name"), str):
            raise Refused("each input must be an object with a 'name'")
        name, dtype = inp["name"], inp.get("datatype")
        if dtype not in DTYPE_BYTES:
            raise Refused(f"input '{name}': datatype {dtype!r} is not one this server takes")
        n = element_count(inp.get("shape"), name, max_elements)
        params = inp.get("parameters") or {}
        size = params.get("binary_data_size") if isinstance(params, dict) else None
        if size is not None:
            if isinstance(size, bool) or not isinstance(size, int) or size != n * DTYPE_BYTES[dtype]:
                raise Refused(f"input '{name}': binary_data_size {size!r} is not {n} x {DTYPE_BYTES[dtype]} bytes "
                              f"for shape {inp['shape']}")
            total += size
        else:
            values = _flat_values(inp.get("data"), name, n)
            if len(values) != n:
                raise Refused(f"input '{name}': {len(values)} data values for shape {inp['shape']} ({n} elements)")
            check_json_values(values, dtype, name)
    if total != binary:
        raise Refused(f"the binary inputs declare {total} bytes but the body carries {binary}")


def check_grpc_infer(raw: bytes, max_elements: int) -> None:
    from tritonclient.grpc import service_pb2

    req = service_pb2.ModelInferRequest()
    try:
        req.ParseFromString(raw)
    except Exception:
        raise Refused("the request is not a ModelInferRequest") from None
    if not req.inputs:
        raise Refused("the request has no inputs")
    if req.raw_input_contents and len(req.raw_input_contents) != len(req.inputs):
        raise Refused(f"{len(req.raw_input_contents)} raw input contents for {len(req.inputs)} inputs")
    typed = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
             "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
             "UINT64": "uint64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents"}
    for k, inp in enumerate(req.inputs):
        if inp.datatype not in DTYPE_BYTES:
            raise Refused(f"input '{inp.name}': datatype {inp.datatype!r} is not one this server takes")
        n = element_count(list(inp.shape), inp.name, max_elements)
        if req.raw_input_contents:
            got, want = len(req.raw_input_contents[k]), n * DTYPE_BYTES[inp.datatype]
            if got != want:
                raise Refused(f"input '{inp.name}': {got} bytes for shape {list(inp.shape)} ({want} expected)")
        else:
            field = typed.get(inp.datatype)
            got = len(getattr(inp.contents, field)) if field else -1
            if got != n:
                raise Refused(f"input '{inp.name}': {max(got, 0)} values for shape {list(inp.shape)} ({n} elements)")
            lo_hi = INT_RANGE.get(inp.datatype)
            if lo_hi and inp.datatype in ("INT8", "INT16", "UINT8", "UINT16"):
                vals = getattr(inp.contents, field)
                if any(not lo_hi[0] <= v <= lo_hi[1] for v in vals):
                    raise Refused(f"input '{inp.name}': a value is outside the range of {inp.datatype}")


# -- the processes -----------------------------------------------------------------------

class Front:
    def __init__(self, upstream_http: int, upstream_grpc: int, max_elements: int, max_body: int):
        self.upstream_http, self.upstream_grpc = upstream_http, upstream_grpc
        self.max_elements, self.max_body = max_elements, max_body
        self.dead = threading.Event()
        self.why = ""

    def stub_died(self, text: str) -> None:
        if STUB_DEAD.search(text) and not self.dead.is_set():
            self.why = text.strip().splitlines()[0][:300]
            self.dead.set()


def http_handler(front: Front):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Headers and body go out in two writes; with Nagle on, the body waits for the
        # client's delayed ACK (40 ms per request on loopback, measured: 8x fewer req/s).
        disable_nagle_algorithm = True

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
            if close:
                self.close_connection = True
            self._reply(code, json.dumps({"error": msg}).encode(), [("Content-Type", "application/json")]
                        + ([("Connection", "close")] if close else []))

        def _forward(self, body: bytes | None):
            hop = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}
            headers = {k: v for k, v in self.headers.items() if k.lower() not in hop}
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
            self._reply(r.status, data, [(k, v) for k, v in r.getheaders() if k.lower() not in hop])

        def do_GET(self):
            self._forward(None)

        def finish(self):
            conn = getattr(self, "_upstream", None)
            if conn is not None:
                conn.close()
            super().finish()

        def do_POST(self):
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
            if INFER_PATH.match(self.path.split("?")[0]):
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
            if method.endswith("/ModelStreamInfer"):
                return None  # streaming is not offered through the front: UNIMPLEMENTED
            call = channel.unary_unary(method)

            def handle(raw, context):
                if method.endswith("/ModelInfer"):
                    try:
                        check_grpc_infer(raw, front.max_elements)
                    except Refused as e:
                        context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
                try:
                    return call(raw, timeout=600, metadata=context.invocation_metadata())
                except grpc.RpcError as e:
                    front.stub_died(e.details() or "")
                    context.abort(e.code(), e.details() or "")

            return grpc.unary_unary_rpc_method_handler(handle)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=64), handlers=[Proxy()],
                         options=[("grpc.max_receive_message_length", front.max_body)])
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
    a = p.parse_args(argv)
    front = Front(a.upstream_http, a.upstream_grpc, a.max_elements, a.max_body or 16 * a.max_elements + (1 << 20))
    httpd = http.server.ThreadingHTTPServer((HOST, a.http), http_handler(front))
    httpd.daemon_threads = True
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
