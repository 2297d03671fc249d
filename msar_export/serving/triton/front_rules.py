"""What the validating front (front.py) lets through to tritonserver: an allow-list.

Only these reach Triton, everything else is refused with one line:
- HTTP: GET of health (`/v2/health/live|ready`), server metadata (`/v2`), and the served
  models' metadata, readiness, config and statistics; POST of `/v2/models/M[/versions/V]/infer`
  for a served model M.  The request target must be origin-form (`/v2/...`, no query): an
  absolute-form target (`POST http://host/v2/...`) was forwarded unchecked.  Triton's own
  `generate` / `generate_stream`, shared-memory, repository, trace and logging endpoints are
  never forwarded.
- gRPC: the same services by method name (ModelInfer for served models only).
- An infer body is parsed strictly: duplicate JSON keys are refused (Python kept the last
  `"shape"`, Triton the first: a [1, 10**12] shape passed the check and killed the server),
  so are NaN / Infinity literals, keys outside the KServe fields we check, and any
  `parameters` other than the binary-data ones (a `shared_memory_region` makes Triton read
  or write memory the front never sees).
"""

from __future__ import annotations

import math
import re

from ...errors import MsarError
from ...untrusted import loads_json

DTYPE_BYTES = {"BOOL": 1, "UINT8": 1, "INT8": 1, "UINT16": 2, "INT16": 2, "FP16": 2, "BF16": 2, "UINT32": 4,
               "INT32": 4, "FP32": 4, "UINT64": 8, "INT64": 8, "FP64": 8}
INT_RANGE = {"UINT8": (0, 2**8 - 1), "INT8": (-2**7, 2**7 - 1), "UINT16": (0, 2**16 - 1), "INT16": (-2**15, 2**15 - 1),
             "UINT32": (0, 2**32 - 1), "INT32": (-2**31, 2**31 - 1), "UINT64": (0, 2**64 - 1),
             "INT64": (-2**63, 2**63 - 1)}
MAX_RANK = 8
STUB_DEAD = re.compile(r"Stub process .* is not healthy|stub process .* died", re.I)
# Names as Triton's model repository allows them; anything percent-encoded is refused.
_NAME = r"[A-Za-z0-9_.-]{1,128}"
_MODEL = re.compile(rf"^/v2/models/(?P<model>{_NAME})(?:/versions/[0-9]{{1,9}})?(?P<rest>/ready|/config|/stats|/infer)?$")
HTTP_OPEN = {"/v2", "/v2/health/live", "/v2/health/ready"}  # GET, no model named
FRONT_STATS = "/v2/front/stats"  # GET: the front's own counters (answered by the front, never forwarded)
# Fields of a KServe v2 JSON request that the checks below understand; any other is refused.
REQUEST_KEYS = {"id", "inputs", "outputs", "parameters"}
INPUT_KEYS = {"name", "shape", "datatype", "data", "parameters"}
OUTPUT_KEYS = {"name", "parameters"}
PARAMETERS = {"request": {"binary_data_output"}, "input": {"binary_data_size"}, "output": {"binary_data"}}
GRPC_OPEN = {"ServerLive", "ServerReady", "ServerMetadata"}
# The one request parameter let through: Triton's C++ client (perf_analyzer) sends it with every
# gRPC ModelInfer; it only shapes the responses of decoupled (streaming) models, which we do not serve.
GRPC_REQUEST_PARAMETERS = {"triton_enable_empty_final_response": "bool_param"}
GRPC_MODEL = {"ModelReady", "ModelMetadata", "ModelConfig", "ModelStatistics", "ModelInfer"}


class Refused(ValueError):
    """The request is malformed or not allowed: answered 4xx / INVALID_ARGUMENT, never forwarded."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def http_route(method: str, target: str, models) -> str:
    """'infer' or 'read' for an allowed request; Refused (400 / 403 / 404 / 405) otherwise."""
    if not target.startswith("/") or target.startswith("//"):
        raise Refused("the request target must be a path such as /v2/models/NAME/infer (origin-form)")
    if "?" in target or "#" in target or "%" in target:
        raise Refused("the request target must be a plain path, without a query or escapes")
    if target in HTTP_OPEN:
        kind = "read"
    elif target == FRONT_STATS:
        kind = "front"
    else:
        m = _MODEL.match(target)
        if m is None:
            raise Refused(f"{target}: not an endpoint this server offers (infer, health and metadata only)", 403)
        if m["model"] not in models:
            raise Refused(f"{target}: no served model {m['model']!r} (served: {', '.join(sorted(models))})", 404)
        kind = "infer" if m["rest"] == "/infer" else "read"
    want = "POST" if kind == "infer" else "GET"
    if method != want:
        raise Refused(f"{method} {target}: this endpoint takes {want} only", 405)
    return kind


def grpc_allowed(method: str, raw: bytes, models) -> str | None:
    """None if the full gRPC method name and its request are allowed, else why not."""
    service, _, name = method.rpartition("/")
    if service != "/inference.GRPCInferenceService" or name not in GRPC_OPEN | GRPC_MODEL:
        return f"{method} is not offered by this server (infer, health and metadata only)"
    if name in GRPC_MODEL and raw is not None:  # raw None: the method name alone
        from tritonclient.grpc import service_pb2

        req = getattr(service_pb2, f"{name}Request")()
        try:
            req.ParseFromString(raw)
        except Exception:
            return f"the request is not a {name}Request"
        model = req.model_name if name == "ModelInfer" else req.name
        if model not in models and not (name == "ModelStatistics" and model == ""):
            return f"no served model {model!r} (served: {', '.join(sorted(models))})"
    return None


class _NotJson(MsarError):
    pass


def _only(obj: dict, allowed: set, what: str) -> None:
    extra = sorted(set(obj) - allowed)
    if extra:
        raise Refused(f"{what}: field(s) {extra} are not accepted by this server")


def _parameters(obj: dict, kind: str, what: str) -> dict:
    params = obj.get("parameters", {})
    if not isinstance(params, dict):
        raise Refused(f"{what}: 'parameters' must be an object")
    _only(params, PARAMETERS[kind], f"{what} parameters")  # shared_memory_region & co. never pass
    for k, v in params.items():
        ok = isinstance(v, int) and not isinstance(v, bool) if k == "binary_data_size" else isinstance(v, bool)
        if not ok:
            raise Refused(f"{what}: parameter {k} has the wrong type")
    return params


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
    try:  # duplicate keys and NaN refused: the one strict JSON reader (untrusted.loads_json)
        req = loads_json(head, "the request", _NotJson)
    except _NotJson as e:
        raise Refused(str(e)) from None
    if not isinstance(req, dict):
        raise Refused("the request must be a JSON object")
    _only(req, REQUEST_KEYS, "the request")
    _parameters(req, "request", "the request")
    inputs = req.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise Refused("the request has no 'inputs' list")
    outputs = req.get("outputs", [])
    if not isinstance(outputs, list) or not all(isinstance(o, dict) and isinstance(o.get("name"), str) for o in outputs):
        raise Refused("'outputs' must be a list of objects with a 'name'")
    for out in outputs:
        _only(out, OUTPUT_KEYS, f"output '{out['name']}'")
        _parameters(out, "output", f"output '{out['name']}'")
    total = 0
    for inp in inputs:
        if not isinstance(inp, dict) or not isinstance(inp.get("name"), str):
            raise Refused("each input must be an object with a 'name'")
        name, dtype = inp["name"], inp.get("datatype")
        _only(inp, INPUT_KEYS, f"input '{name}'")
        if dtype not in DTYPE_BYTES:
            raise Refused(f"input '{name}': datatype {dtype!r} is not one this server takes")
        n = element_count(inp.get("shape"), name, max_elements)
        size = _parameters(inp, "input", f"input '{name}'").get("binary_data_size")
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
    # Parameters carry shared-memory regions, sequence control and priorities: none is checked here.
    odd = [k for k, v in req.parameters.items() if v.WhichOneof("parameter_choice") != GRPC_REQUEST_PARAMETERS.get(k)]
    if odd or any(t.parameters for t in [*req.inputs, *req.outputs]):
        raise Refused("request parameters (shared memory, sequences, priorities) are not accepted by this server")
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


