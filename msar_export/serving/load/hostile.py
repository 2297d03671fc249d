"""Malformed requests the load test mixes between good ones: each one took a real
Triton down or was answered wrongly before the validating front (front.py).  Each
must be refused (HTTP 4xx, gRPC INVALID_ARGUMENT) and change nothing after it."""

from __future__ import annotations

import json
import urllib.error
import urllib.request


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
    return out


def send_http(base_url: str, k: int, timeout: float = 30) -> tuple[bool, str]:
    """Case k (cycled); (refused as it must be, what happened)."""
    model, desc, (body, headers) = HTTP_CASES[k % len(HTTP_CASES)]
    req = urllib.request.Request(f"{base_url}/v2/models/{model}/infer", data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return False, f"{desc}: answered {r.status}"
    except urllib.error.HTTPError as e:
        return 400 <= e.code < 500, f"{desc}: {e.code}"
    except OSError as e:
        return False, f"{desc}: {type(e).__name__}"


def send_grpc(address: str, k: int, timeout: float = 30) -> tuple[bool, str]:
    import grpc
    from tritonclient.grpc import service_pb2_grpc

    desc, req = grpc_cases()[k % 2]
    with grpc.insecure_channel(address) as ch:
        try:
            service_pb2_grpc.GRPCInferenceServiceStub(ch).ModelInfer(req, timeout=timeout)
            return False, f"{desc}: answered"
        except grpc.RpcError as e:
            return e.code() == grpc.StatusCode.INVALID_ARGUMENT, f"{desc}: {e.code().name}"
