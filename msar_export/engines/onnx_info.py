"""What the engine builder needs to know about an exported ONNX file: inputs
and their symbolic dims, graph kind, precision, the msar custom nodes - and
the model bytes the TensorRT parser gets, with the plugin ops' function bodies
taken out so every such node reaches its plugin.

Why strip the bodies: the TensorRT ONNX parser imports a node whose op_type
matches a model-local function *as that function* (onnx-tensorrt
ModelImporter: local functions come before the plugin fallback), and it keys
local functions by name only, while the exporter registers one overload per
source count (`n1`, `n2`, ...) under the same name. Without the bodies the
parser falls back to the plugin registry (name = op_type, plugin_version,
plugin_namespace attributes), which is what `--plugins` asks for.

An op without a plugin (contracts.OpContract.plugin False: SourceViews, StreamGate,
ConvState) has one body per file, so it keeps it and the parser imports it as standard
layers. A variadic op without a plugin read by nodes of several arities (ScoredMixer,
`--mixer-op scored`) has one body per arity under one name: the parser picks one body for every
node and refuses
the others (`node.input().size() == function.input().size()`, TensorRT-RTX 1.7),
so `build` refuses such a file before TensorRT is loaded and `check` plans no engine for it
(`tensorrt_refusal`).
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import OnnxModelError
from ..contracts import CONTRACTS, DOMAIN
from ..graph_file import ExportedGraph


@dataclass
class OnnxInfo:
    path: Path
    inputs: list[tuple[str, list]]  # (name, dims: int or symbolic str)
    graph: str  # "prefill" | "decode" (msar.graph metadata; "prefill" if absent)
    dtype: str | None  # msar.dtype metadata
    max_seq_len: int
    custom_ops: dict[str, int] = field(default_factory=dict)  # plugin op_type -> count (main graph)
    parser_bytes: bytes = b""  # the model for the TensorRT parser (plugin ops' function bodies removed)


def tensorrt_refusal(graph: ExportedGraph) -> str | None:
    """Why TensorRT's parser cannot import `graph`, in one line, or None: an op with no plugin and more
    than one function body (one per source count, which the parser cannot tell apart). A variadic op
    with one node per file (ConvState) has one body, which the parser imports."""
    plugin_less = {name for name, c in CONTRACTS.items() if not c.plugin}
    bodies = Counter(name for domain, name, _ in graph.functions if domain == DOMAIN and name in plugin_less)
    ops = sorted(op for op, count in bodies.items() if count > 1)
    if not ops:
        return None
    return (f"{graph.path.name} has {', '.join(f'msar::{op}' for op in ops)} nodes (an `export --mixer-op scored` "
            "file, for ONNX Runtime): TensorRT has no plugin for them and its parser cannot import their "
            "per-source-count function bodies; re-export with --mixer-op fused for TensorRT")


def unimportable(graph: ExportedGraph) -> None:
    """OnnxModelError with tensorrt_refusal's line, if it has one."""
    why = tensorrt_refusal(graph)
    if why is not None:
        raise OnnxModelError(why)


def read_onnx(graph: ExportedGraph | str | os.PathLike) -> OnnxInfo:
    """What the builder needs from `graph`, an opened ExportedGraph (or a path, opened here):
    its inputs, max_seq_len (msar.config, checked) and the parser's bytes, which keep the
    skeleton's references to the weights in the file itself (the parser reads them, given the path)."""
    if not isinstance(graph, ExportedGraph):
        graph = ExportedGraph.open(graph)  # OnnxModelError: missing, empty, truncated, not ONNX, data outside
    unimportable(graph)  # for a caller that did not ask tensorrt_refusal first
    inputs = []
    for v in graph.inputs:
        for i, d in enumerate(v.dims):
            if d is None:
                raise OnnxModelError(f"input {v.name!r} has an unnamed dynamic dimension (axis {i}); "
                                     "re-export the model with msar-export")
        inputs.append((v.name, list(v.dims)))
    # Plugin ops lose their bodies; a plugin-less op (SourceViews) keeps its one body, which the
    # parser imports as standard layers.
    plugin_ops = {op: n for op, n in graph.custom_ops.items() if op not in CONTRACTS or CONTRACTS[op].plugin}
    drop = {(DOMAIN, op) for op in CONTRACTS if CONTRACTS[op].plugin}
    return OnnxInfo(path=graph.path, inputs=inputs, graph=graph.kind, dtype=graph.precision,
                    max_seq_len=graph.max_seq_len, custom_ops=plugin_ops, parser_bytes=graph.model_bytes(drop_functions=drop))
