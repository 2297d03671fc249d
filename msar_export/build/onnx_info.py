"""What the engine builder needs to know about an exported ONNX file: inputs
and their symbolic dims, graph kind, precision, the msar custom nodes - and
the model bytes the TensorRT parser gets, with the msar function bodies taken
out so every msar node reaches its plugin.

Why strip the bodies: the TensorRT ONNX parser imports a node whose op_type
matches a model-local function *as that function* (onnx-tensorrt
ModelImporter: local functions come before the plugin fallback), and it keys
local functions by name only, while the exporter registers one overload per
source count (`n1`, `n2`, ...) under the same name. Without the bodies the
parser falls back to the plugin registry (name = op_type, plugin_version,
plugin_namespace attributes), which is what `--plugins` asks for.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import OnnxModelError
from ..export.contracts import DOMAIN
from ..graph_spec import META_CONFIG, META_DTYPE, META_GRAPH
from ..onnx_file import inspect_onnx


@dataclass
class OnnxInfo:
    path: Path
    inputs: list[tuple[str, list]]  # (name, dims: int or symbolic str)
    graph: str  # "prefill" | "decode" (msar.graph metadata; "prefill" if absent)
    dtype: str | None  # msar.dtype metadata
    max_seq_len: int
    custom_ops: dict[str, int] = field(default_factory=dict)  # op_type -> count (main graph)
    parser_bytes: bytes = b""  # the model for the TensorRT parser (msar function bodies removed)


def read_onnx(path: str | os.PathLike) -> OnnxInfo:
    path = Path(path)
    model = inspect_onnx(path)  # OnnxModelError for a missing, empty, truncated or non-ONNX file
    meta = {p.key: p.value for p in model.metadata_props}
    max_seq_len = 512
    if META_CONFIG in meta:
        try:
            max_seq_len = int(json.loads(meta[META_CONFIG]).get("max_seq_len", max_seq_len))
        except (ValueError, TypeError, AttributeError, RecursionError):
            pass

    initializers = {t.name for t in model.graph.initializer}
    inputs = []
    for v in model.graph.input:
        if v.name in initializers:
            continue
        dims = []
        for i, d in enumerate(v.type.tensor_type.shape.dim):
            if d.HasField("dim_value"):
                dims.append(int(d.dim_value))
            elif d.dim_param:
                dims.append(d.dim_param)
            else:
                raise OnnxModelError(f"input {v.name!r} has an unnamed dynamic dimension (axis {i}); "
                                     "re-export the model with msar-export")
        inputs.append((v.name, dims))

    custom = {}
    for node in model.graph.node:
        if node.domain == DOMAIN:
            custom[node.op_type] = custom.get(node.op_type, 0) + 1
    kept = [f for f in model.functions if f.domain != DOMAIN]
    del model.functions[:]
    model.functions.extend(kept)

    return OnnxInfo(path=path, inputs=inputs, graph=meta.get(META_GRAPH, "prefill"), dtype=meta.get(META_DTYPE),
                    max_seq_len=max_seq_len, custom_ops=custom, parser_bytes=model.SerializeToString())
