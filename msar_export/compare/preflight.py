"""Everything that makes a parity check meaningless is refused up front, as an
MsarError (the CLI prints one line and exits 2): a missing file, a file that is
not ONNX, a graph exported from another model, a graph without `hidden.{l}`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..config import MSARConfig
from ..errors import EngineError, OnnxModelError
from ..graph_file import ExportedGraph
from ..graph_spec import GraphSpec
from ..runners.common import INPUT_NAME, LOGITS_NAME, hidden_name


@dataclass(frozen=True)
class GraphInfo:
    path: Path
    cfg: MSARConfig
    precision: str  # msar.dtype: the precision the graph computes in
    decomposed: bool
    decode: bool = False  # the decode graph: fed a past from eager, compared on the new tokens
    exported: ExportedGraph | None = None  # the file as opened (once): the runners start from it


def _config_diff(graph: MSARConfig, ckpt: MSARConfig) -> list[str]:
    g, c = graph.to_dict(), ckpt.to_dict()
    return [f"{k}: graph {g[k]!r} vs checkpoint {c[k]!r}" for k in g if g[k] != c[k]]


def inspect_onnx(path, ckpt_cfg: MSARConfig) -> GraphInfo:
    """Check that the graph at `path` is a prefill or decode graph of a model with `ckpt_cfg`."""
    from ..checkpoint import expected_shapes

    path = Path(path)
    graph = ExportedGraph.open(path, label="--onnx ")
    proto = graph.proto
    graph_cfg = graph.config
    diff = _config_diff(graph_cfg, ckpt_cfg)
    if diff:
        raise OnnxModelError(f"--onnx {path} was exported from a different model than this checkpoint "
                             f"({'; '.join(diff[:3])}{'; ...' if len(diff) > 3 else ''})")
    decode = graph.decode
    inits = graph.initializers
    inputs = graph.inputs
    if decode:
        spec = GraphSpec(ckpt_cfg, decode=True)
        want = spec.input_names
        if [v.name for v in inputs] != want:
            raise OnnxModelError(f"--onnx {path}: decode graph inputs are {[v.name for v in inputs]}, expected {want}")
        cache = next(v for v in inputs if v.name == spec.cache_inputs[0].name).type.tensor_type.elem_type
        if cache not in (1, 10):  # FLOAT, FLOAT16: what numpy can feed
            raise OnnxModelError(f"--onnx {path}: a bfloat16 decode graph's cache cannot be fed from numpy; "
                                 "check its float32 export (or the prefill graph)")
    elif [v.name for v in inputs] != [INPUT_NAME]:
        raise OnnxModelError(f"--onnx {path}: graph inputs are {[v.name for v in inputs]}, expected ['{INPUT_NAME}']")
    tt = inputs[0].type.tensor_type
    if tt.elem_type != 7 or len(tt.shape.dim) != 2:  # 7 = INT64
        raise OnnxModelError(f"--onnx {path}: input '{INPUT_NAME}' must be int64 [batch, seq]")
    outs = {v.name: v for v in proto.graph.output}
    if LOGITS_NAME not in outs:
        raise OnnxModelError(f"--onnx {path}: no '{LOGITS_NAME}' output (outputs: {sorted(outs)})")
    dims = outs[LOGITS_NAME].type.tensor_type.shape.dim
    if len(dims) == 3 and dims[2].HasField("dim_value") and dims[2].dim_value != ckpt_cfg.vocab_size:
        raise OnnxModelError(f"--onnx {path}: logits have {dims[2].dim_value} entries per token but the checkpoint's "
                             f"vocabulary has {ckpt_cfg.vocab_size}")
    for name, shape in expected_shapes(ckpt_cfg).items():
        t = inits.get(f"model.{name}")
        if t is not None and tuple(t.dims) != tuple(shape):
            raise OnnxModelError(f"--onnx {path}: weight '{name}' has shape {list(t.dims)} in the graph but "
                                 f"{list(shape)} in the checkpoint")
    produced = {o for n in proto.graph.node for o in n.output}
    missing = [hidden_name(l) for l in range(1, ckpt_cfg.n_sublayers + 2) if hidden_name(l) not in produced]
    if missing:
        raise OnnxModelError(f"--onnx {path}: no value named {missing[0]} (of {len(missing)} mixer outputs missing); "
                             "re-export with this msar-export, which names every mixer output hidden.{l}")
    precision = graph.precision or "float32"
    if precision not in ("float32", "float16", "bfloat16"):
        raise OnnxModelError(f"--onnx {path}: unknown msar.dtype {precision!r}")
    return GraphInfo(path, graph_cfg, precision, graph.decomposed, decode, graph)


def check_engine_path(engine) -> Path:
    path = Path(engine)
    if not path.is_file():
        raise EngineError(f"--engine {path}: no such file (give a serialised TensorRT engine, e.g. model.plan)")
    if path.stat().st_size == 0:
        raise EngineError(f"--engine {path}: the file is empty")
    return path
