"""The plan of a parity check, made once before anything slow runs (`plan_check`).

Everything that makes a check meaningless is refused here, as an MsarError (the CLI
prints one line and exits 2): a missing file, a file that is not ONNX, a graph
exported from another model, a graph without `hidden.{l}`, an engine whose build
record does not match, a `--dtype` the engine to be built cannot compute in."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..config import MSARConfig
from ..engines.backends import Backend
from ..errors import EngineError, InputError, OnnxModelError
from ..graph_file import ExportedGraph
from ..graph_spec import INPUT_IDS, LOGITS, GraphSpec
from ..verdict import NUMPY_DTYPES, PRECISIONS
from .inputs import check_shapes, decode_batches, default_shapes, token_batches
from .tolerances import looser


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
    names = graph.input_names
    if decode:
        spec = GraphSpec(ckpt_cfg, decode=True)
        want = spec.input_names
        if names != want:
            raise OnnxModelError(f"--onnx {path}: decode graph inputs are {names}, expected {want}")
        from onnx.helper import np_dtype_to_tensor_dtype

        fed = {np_dtype_to_tensor_dtype(np.dtype(t)) for t in NUMPY_DTYPES.values()}
        if graph.inputs[names.index(spec.cache_inputs[0].name)].elem_type not in fed:
            raise OnnxModelError(f"--onnx {path}: a bfloat16 decode graph's cache cannot be fed from numpy; "
                                 "check its float32 export (or the prefill graph)")
    elif names != [INPUT_IDS]:
        raise OnnxModelError(f"--onnx {path}: graph inputs are {names}, expected ['{INPUT_IDS}']")
    ids = graph.inputs[0]
    if ids.elem_type != 7 or len(ids.dims) != 2:  # 7 = INT64
        raise OnnxModelError(f"--onnx {path}: input '{INPUT_IDS}' must be int64 [batch, seq]")
    outs = {t.name: t for t in graph.outputs}
    if LOGITS not in outs:
        raise OnnxModelError(f"--onnx {path}: no '{LOGITS}' output (outputs: {sorted(outs)})")
    dims = outs[LOGITS].dims
    if len(dims) == 3 and isinstance(dims[2], int) and dims[2] != ckpt_cfg.vocab_size:
        raise OnnxModelError(f"--onnx {path}: logits have {dims[2]} entries per token but the checkpoint's "
                             f"vocabulary has {ckpt_cfg.vocab_size}")
    for name, shape in expected_shapes(ckpt_cfg).items():
        t = inits.get(f"model.{name}")
        if t is not None and tuple(t.dims) != tuple(shape):
            raise OnnxModelError(f"--onnx {path}: weight '{name}' has shape {list(t.dims)} in the graph but "
                                 f"{list(shape)} in the checkpoint")
    produced = {o for n in proto.graph.node for o in n.output}
    missing = [n for n in GraphSpec(ckpt_cfg, decode).hidden_names if n not in produced]
    if missing:
        raise OnnxModelError(f"--onnx {path}: no value named {missing[0]} (of {len(missing)} mixer outputs missing); "
                             "re-export with this msar-export, which names every mixer output hidden.{l}")
    precision = graph.precision or "float32"
    if precision not in PRECISIONS:
        raise OnnxModelError(f"--onnx {path}: unknown msar.dtype {precision!r}")
    return GraphInfo(path, graph_cfg, precision, graph.decomposed, decode, graph)


def check_engine_path(engine) -> Path:
    path = Path(engine)
    if not path.is_file():
        raise EngineError(f"--engine {path}: no such file (give a serialised TensorRT engine, e.g. model.plan)")
    if path.stat().st_size == 0:
        raise EngineError(f"--engine {path}: the file is empty")
    return path


# -- the plan ------------------------------------------------------------------------------

@dataclass(frozen=True)
class TensorRTPlan:
    """What the TensorRT backend does in this check: run (skip is None) or why not."""

    skip: str | None
    backend: Backend | None = None
    precision: str | None = None  # what the engine computes in, and is judged at
    optional: tuple = ()  # outputs the engine may lack (a shipped engine: every hidden.{l})
    max_shape: tuple | None = None  # the in-memory engine's profile maximum (batch, seq)


@dataclass(frozen=True)
class CheckPlan:
    """Everything a parity check does, decided before the first backend runs: the
    inputs, the outputs in depth order, each backend with the precision it is judged
    at, and the precisions the eager model must run at for their bounds."""

    checkpoint: str
    onnx: str
    model: object  # the MSARLM in float32, loaded once
    graph: GraphInfo
    engine: Path | None
    meta: object  # the engine's build record (engines.metadata.EngineMetadata) or None
    plugins: list
    shapes: list
    seed: int
    feeds: list
    layers: list  # hidden.1 .. hidden.{L+1}, logits: the order "first bad layer" follows
    cache_dtype: object  # decode graphs: numpy dtype of the past; None for prefill
    ort: tuple  # ((backend name, ort_ops), ...)
    tensorrt: TensorRTPlan
    tol: float | None  # --tol: one fixed bound instead of the verdict model's
    bound_precisions: tuple  # the eager runs the bounds need (none with --tol)


def plan_check(checkpoint, onnx, o) -> CheckPlan:
    """Read and check every input of a parity check (`o`: CheckOptions); MsarError for bad
    input, before anything slow runs."""
    import torch

    from ..checkpoint import load_checkpoint
    from ..runners.trt import check_plugin_paths

    if o.dtype is not None and o.dtype not in PRECISIONS:
        raise InputError(f"--dtype must be one of {', '.join(PRECISIONS)}, got {o.dtype!r}")
    if o.tol is not None and not (o.tol > 0 and math.isfinite(o.tol)):
        raise InputError(f"--tol must be a positive number, got {o.tol!r}")
    model = load_checkpoint(checkpoint, dtype=torch.float32, trust_pickle=o.trust_pickle)
    cfg = model.cfg
    graph = inspect_onnx(onnx, cfg)
    engine = check_engine_path(o.engine) if o.engine is not None else None
    plugins = check_plugin_paths(o.plugins)
    if engine is not None and not o.tensorrt:
        raise InputError("--engine and --no-trt contradict each other; drop one")
    shapes = check_shapes(o.shapes if o.shapes is not None else default_shapes(cfg), cfg)
    meta = _engine_record(engine, graph, plugins, shapes) if engine is not None else None
    hidden = GraphSpec(cfg, graph.decode).hidden_names
    trt = _tensorrt_plan(o, graph, engine, meta, shapes, hidden)
    cache_dtype = NUMPY_DTYPES.get(graph.precision, np.float32) if graph.decode else None
    feeds = decode_batches(model, shapes, cache_dtype, o.seed) if graph.decode else token_batches(cfg, shapes, o.seed)
    ort = tuple(("onnxrt" if len(o.ort_ops) == 1 else f"onnxrt-{ops}", ops) for ops in o.ort_ops)
    wanted = [graph.precision] * bool(ort) + [trt.precision] * (trt.skip is None)
    bounds = () if o.tol is not None else tuple(p for p in PRECISIONS if p in wanted)
    return CheckPlan(str(checkpoint), str(onnx), model, graph, engine, meta, plugins, shapes, o.seed, feeds,
                     [*hidden, LOGITS], cache_dtype, ort, trt, o.tol, bounds)


def _engine_record(engine: Path, graph: GraphInfo, plugins, shapes):
    """The engine's build record must name this ONNX file and these plugin libraries, and every
    check shape must lie in its profile (pure Python: checked whether or not it can run here)."""
    from ..engines.metadata import check_input_shapes, verify_engine_metadata

    meta = verify_engine_metadata(engine, graph.path, plugins)
    if not graph.decode:
        for shape in shapes:
            check_input_shapes(meta, {INPUT_IDS: tuple(shape)})
    return meta


def _tensorrt_plan(o, graph: GraphInfo, engine: Path | None, meta, shapes, hidden) -> TensorRTPlan:
    from ..engines.onnx_info import tensorrt_refusal
    from ..runners.trt import choose_backend, engine_not_run_reason, tensorrt_unavailable

    if not o.tensorrt:
        return TensorRTPlan("--no-trt")
    if engine is not None:
        # A shipped engine may expose only the logits; --dtype names its precision, never
        # stricter than the graph's (an engine from an fp16 graph is fp16).
        return TensorRTPlan(engine_not_run_reason(engine, meta), meta.backend,
                            looser(o.dtype or graph.precision, graph.precision), tuple(hidden))
    if graph.decode:
        return TensorRTPlan("decode graphs are checked on ONNX Runtime only (no in-memory engine profile for the "
                            "past inputs)")
    refusal = tensorrt_refusal(graph.exported)  # a --mixer-op scored file: ONNX Runtime only
    if refusal is not None:
        return TensorRTPlan(refusal)
    # The engine built here is strongly typed: it computes in the graph's precision, which
    # --dtype cannot change (refused on every machine, whether or not TensorRT is installed).
    if o.dtype is not None and looser(o.dtype, graph.precision) != graph.precision:
        raise InputError(f"--dtype {o.dtype}: the engine check builds from {graph.path.name} is strongly typed and "
                         f"computes in the graph's {graph.precision}; give --engine built from a {o.dtype} export, "
                         "or drop --dtype")
    max_shape = (max(b for b, _ in shapes), max(t for _, t in shapes))
    return TensorRTPlan(tensorrt_unavailable(), choose_backend(), graph.precision, (), max_shape)
