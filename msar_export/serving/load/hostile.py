"""Malformed requests the load test mixes between good ones: each one took a real
Triton down or was answered wrongly before the validating front (front.py).  Each
must be refused (HTTP 4xx, gRPC INVALID_ARGUMENT) and change nothing after it."""

from __future__ import annotations

import http.client
import json
from urllib.parse import urlparse


def _json(inputs) -> tuple[bytes, dict]:
    return json.dumps({"inputs": inputs}).encode(), {"Content-Type": "application/json"}


def _binary(shape, nbytes: int) -> tuple[bytes, dict]:
    head = json.dumps({"inputs": [{"name": "input_ids", "shape": shape, "datatype": "INT64",
                                   "parameters": {"binary_data_size": nbytes}}]}).encode()
    return head + b"\0" * nbytes, {"Inference-Header-Content-Length": str(len(head))}


HTTP_CASES = [
    ("logits", "json shape [1, 10**12], 4 values",
     _json([{"name": "input_ids", "shape": [1, 10**12], "datatype": "INT64", "data": [1, 2, 3, 4]}])),
    ("logits", "binary shape [1, 2**61], 0 bytes", _binary([1, 2**61], 0)),
    ("logits", "binary size that does not match the shape", _binary([1, 4], 8)),
    ("generate", "max_new_tokens 2**32+5 (narrowed to 5 by Triton)",
     _json([{"name": "input_ids", "shape": [1, 3], "datatype": "INT64", "data": [1, 2, 3]},
            {"name": "max_new_tokens", "shape": [1, 1], "datatype": "INT32", "data": [2**32 + 5]}])),
    ("logits", "negative dimension", _json([{"name": "input_ids", "shape": [1, -1], "datatype": "INT64", "data": []}])),
    ("logits", "not JSON", (b"{" * 100000, {"Content-Type": "application/json"})),
    # Issue 22: requests that got past the front.  Python keeps a duplicate key's last value,
    # Triton its first: the check saw [1, 4], Triton allocated for [1, 10**12].
    ("logits", "duplicate 'shape' key, the first one huge",
     (b'{"inputs": [{"name": "input_ids", "shape": [1, 1000000000000], "shape": [1, 4], "datatype": "INT64", '
      b'"data": [1, 2, 3, 4]}]}', {"Content-Type": "application/json"})),
    ("generate", "duplicate 'data' key, max_new_tokens 2**32+5 first",
     (b'{"inputs": [{"name": "input_ids", "shape": [1, 3], "datatype": "INT64", "data": [1, 2, 3]}, '
      b'{"name": "max_new_tokens", "shape": [1, 1], "datatype": "INT32", "data": [4294967301], "data": [4]}]}',
      {"Content-Type": "application/json"})),
    ("absolute:logits", "absolute-form request target",
     _json([{"name": "input_ids", "shape": [1, 10**12], "datatype": "INT64", "data": [1, 2, 3, 4]}])),
    ("/v2/models/generate/generate", "Triton's generate endpoint", (b'{"input_ids": [1], "max_new_tokens": 5}', {})),
    ("/v2/models/generate/generate_stream", "Triton's streaming generate endpoint", (b'{"input_ids": [1]}', {})),
    ("/v2/systemsharedmemory/region/r/register", "shared-memory registration",
     (b'{"key": "/msar_x", "offset": 0, "byte_size": 64}', {})),
    ("logits", "an output into a shared-memory region",
     (b'{"inputs": [{"name": "input_ids", "shape": [1, 1], "datatype": "INT64", "data": [1]}], "outputs": '
      b'[{"name": "logits", "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 64}}]}', {})),
    ("/v2/repository/models/logits/unload", "model unload", (b"{}", {})),
]


def grpc_cases():
    from tritonclient.grpc import service_pb2

    out = []
    for desc, shape, raw in (("shape [1, 2**61], 0 bytes", [1, 2**61], b""), ("8 bytes for shape [1, 4]", [1, 4], b"\0" * 8)):
        req = service_pb2.ModelInferRequest(model_name="logits")
        t = req.inputs.add()
        t.name, t.datatype = "input_ids", "INT64"
        t.shape.extend(shape)
        req.raw_input_contents.append(raw)
        out.append((desc, req))
    good = service_pb2.ModelInferRequest(model_name="logits")
    t = good.inputs.add()
    t.name, t.datatype = "input_ids", "INT64"
    t.shape.extend([1, 1])
    good.raw_input_contents.append(b"\1" + b"\0" * 7)
    shm = service_pb2.ModelInferRequest()
    shm.CopyFrom(good)
    o = shm.outputs.add()
    o.name = "logits"
    o.parameters["shared_memory_region"].string_param = "r"  # Triton would write the output there
    other = service_pb2.ModelInferRequest()
    other.CopyFrom(good)
    other.model_name = "not_served"
    return out + [("output into a shared-memory region", shm), ("a model that is not served", other)]


def send_http(base_url: str, k: int, timeout: float = 30) -> tuple[bool, str]:
    """Case k (cycled); (refused as it must be, what happened)."""
    where, desc, (body, headers) = HTTP_CASES[k % len(HTTP_CASES)]
    if where.startswith("/"):
        target = where
    else:  # a model's infer endpoint, as a path or (absolute:) as the full URL in the request line
        target = f"/v2/models/{where.removeprefix('absolute:')}/infer"
        target = base_url + target if where.startswith("absolute:") else target
    u = urlparse(base_url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    try:  # http.client sends the target as given: urllib would rewrite an absolute one
        conn.request("POST", target, body=body, headers=headers)
        status = conn.getresponse().status
    except (OSError, http.client.HTTPException) as e:
        return False, f"{desc}: {type(e).__name__}"
    finally:
        conn.close()
    return 400 <= status < 500, f"{desc}: {status}"


def send_grpc(address: str, k: int, timeout: float = 30) -> tuple[bool, str]:
    import grpc
    from tritonclient.grpc import service_pb2_grpc

    cases = grpc_cases()
    desc, req = cases[k % len(cases)]
    with grpc.insecure_channel(address) as ch:
        try:
            service_pb2_grpc.GRPCInferenceServiceStub(ch).ModelInfer(req, timeout=timeout)
            return False, f"{desc}: answered"
        except grpc.RpcError as e:
            return e.code() == grpc.StatusCode.INVALID_ARGUMENT, f"{desc}: {e.code().name}"
