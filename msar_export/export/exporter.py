"""`msar-export export`: checkpoint -> ONNX (custom-op or decomposed, prefill or decode)."""

from __future__ import annotations

import contextlib
import gc
import io
import logging
import os
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import onnx_ir as ir
import torch

from ..checkpoint import load_checkpoint
from ..errors import InputError
from ..memory import return_freed_memory
from ..fileio import check_output_file
from .contracts import CONTRACTS, DOMAIN, DOMAIN_VERSION
from .functions import function_body
from ..graph_spec import (HIDDEN, META_CHECKPOINT, META_CONFIG, META_DECOMPOSED, META_DTYPE, META_GRAPH,
                          META_MIXER_OP, GraphSpec)
from .graphs import DecodeGraph, PrefillGraph, example_inputs
from .optimize import optimize_model, remove_identity_casts, separate_consumed_outputs
from .save import EXTERNAL_DATA_ABOVE, save_model, weight_bytes

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class ExportOptions:
    decode: bool = False
    decomposed: bool = False
    dtype: str = "float32"
    opset: int = 18
    # msar prefill: "fused" = one FusedMixer node per mixer (views recomputed from
    # raw sources inside the op: the TensorRT plugin's fast path); "retrieval" =
    # views expanded once per source in standard ops + DepthRetrieval nodes
    # (faster in ONNX Runtime, whose inlined function bodies cannot share work).
    mixer_op: str = "fused"
    # Weights in `<output>.data` beside the .onnx file; always so over protobuf's 2 GB.
    external_data: bool = False

    def __post_init__(self):
        if self.mixer_op not in ("fused", "retrieval"):
            raise InputError(f"--mixer-op must be fused or retrieval, got {self.mixer_op!r}")
        if self.dtype not in DTYPES:
            raise InputError(f"--dtype must be one of {list(DTYPES)}, got {self.dtype!r}")
        if not 18 <= self.opset <= 23:
            raise InputError(f"--opset {self.opset} is not supported; use 18..23")


@dataclass
class ExportReport:
    path: Path
    options: ExportOptions
    custom_ops: dict[str, int] = field(default_factory=dict)
    parameters: int = 0
    file_bytes: int = 0
    export_seconds: float = 0.0
    peak_rss_mb: float = 0.0  # trace + save
    validation: object | None = None
    peak_rss_validated_mb: float | None = None  # the whole run, validation included
    external_data: bool = False

    def summary(self) -> str:
        ops = ", ".join(f"{DOMAIN}::{k} x{v}" for k, v in sorted(self.custom_ops.items())) or "none"
        kind = ("decode" if self.options.decode else "prefill") + (", decomposed" if self.options.decomposed else "")
        if self.custom_ops and not self.options.decode:
            kind += f", mixer-op {self.options.mixer_op}"
        if self.external_data:
            kind += f", weights in {self.path.name}.data"
        lines = [
            f"exported {self.path} ({kind}, {self.options.dtype}, opset {self.options.opset})",
            f"  custom ops: {ops}",
            f"  parameters: {self.parameters:,}   file: {self.file_bytes / 1e6:.2f} MB   "
            f"export: {self.export_seconds:.1f} s   peak RSS: {self.peak_rss_mb:.0f} MB"
            + ("" if self.peak_rss_validated_mb is None else f" ({self.peak_rss_validated_mb:.0f} MB with validation)"),
        ]
        if self.validation is not None:
            lines.append("  " + self.validation.summary())
        return "\n".join(lines)


def peak_rss_mb() -> float:
    """This process's peak RSS.  VmHWM, not ru_maxrss: after fork+exec the latter
    still holds the parent's peak, which made a child's export look huge."""
    try:
        with open("/proc/self/status") as f:
            return next(int(ln.split()[1]) for ln in f if ln.startswith("VmHWM:")) / 1024
    except (OSError, StopIteration, ValueError):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def trace_to_ir(model, opts: ExportOptions) -> ir.Model:
    """Run torch.onnx (dynamo) on the prefill or decode graph of `model`."""
    graph_cls = DecodeGraph if opts.decode else PrefillGraph
    # --decomposed traces the custom-op graph too and inlines the function bodies
    # afterwards (inline_functions): torch.export then sees one node per mixer,
    # not one group per (mixer, source) pair, which made its time quadratic in depth.
    module = graph_cls(model, custom_ops=True, fused=opts.mixer_op == "fused").eval()
    spec = GraphSpec(model.cfg, opts.decode)
    in_names, out_names = spec.input_names, spec.output_names
    # The exporter prints progress and warnings of its own; keep the CLI's output ours.
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), _quiet_torch_logs():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            module, example_inputs(model, opts.decode), dynamo=True, input_names=in_names, output_names=out_names,
            dynamic_shapes=spec.torch_dynamic_shapes(), opset_version=opts.opset, optimize=False,
            external_data=False,
        )
    # torch.onnx's own optimize step, less one rule whose matching is quadratic in depth.
    model = optimize_model(program.model)
    separate_consumed_outputs(model)
    return model


@contextlib.contextmanager
def _quiet_torch_logs():
    loggers = [logging.getLogger(n) for n in ("torch.onnx", "torch.export", "torch._dynamo", "torch.fx")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, lv in zip(loggers, levels):
            lg.setLevel(lv)


def attach_functions(model: ir.Model, cfg, opset: int) -> dict[str, int]:
    """Give every msar node its overload and the model a function body for it."""
    counts: dict[str, int] = {}
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        if node.domain != DOMAIN:
            continue
        contract = CONTRACTS[node.op_type]
        n = len(node.inputs) - contract.n_fixed_inputs
        node.overload = contract.overload(n)
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
        key = (DOMAIN, node.op_type, node.overload)
        if key in model.functions:
            continue
        model.functions[key] = function_body(contract, n, cfg, opset)
    if counts:
        model.opset_imports[DOMAIN] = DOMAIN_VERSION
        # Functions in a stable order: (op, arity) rather than discovery order.
        ordered = sorted(model.functions.items(), key=lambda kv: (kv[0][1], int(kv[0][2][1:])))
        model.functions.clear()
        model.functions.update(ordered)
    return counts


def inline_functions(model: ir.Model) -> None:
    """`--decomposed`: replace every msar node by its function body (standard ops)."""
    import onnx_ir.passes.common as common_passes

    if not model.functions:
        return
    # Every inlined node copies its call node's metadata; keep only the scopes
    # (name_hidden_states reads them), not ~1 KB of fx_node / stack trace per node.
    for node in model.graph:
        if node.domain == DOMAIN:
            for key in [k for k in node.metadata_props if k != "pkg.torch.onnx.name_scopes"]:
                del node.metadata_props[key]
    common_passes.InlinePass()(model)
    model.functions.clear()
    model.opset_imports.pop(DOMAIN, None)
    remove_identity_casts(model)
    # Inlined `eps` arrives as Constant(value_float), which fp16 converters do
    # not retype (they convert tensors only); as initializers they do.
    common_passes.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0)(model)


def name_dims(model: ir.Model, spec) -> None:
    """Every input's axes as the graph spec names them (torch.export calls the mask's
    AUTO length s0 or similar; the spec calls it `past + seq`)."""
    ports = {p.name: p for p in spec.inputs}
    for v in model.graph.inputs:
        if v.name in ports and v.shape is not None:
            v.shape = ir.Shape(list(ports[v.name].axes))


def name_hidden_states(model: ir.Model, n_sublayers: int) -> None:
    """Rename each mixer output h_l to `hidden.{l}` so parity checks can find it.

    h_l is the one value that enters RMSNorm_l from outside (h_{L+1} enters the
    final norm); the exporter's name scopes say which nodes belong to a norm."""
    scopes = {f"'model.layers.{l}.norm'": l for l in range(1, n_sublayers + 1)}
    scopes["'model.final_norm'"] = n_sublayers + 1

    def scope_of(node) -> str | None:
        names = node.metadata_props.get("pkg.torch.onnx.name_scopes", "")
        return next((sc for sc in scopes if sc in names), None)

    found: dict[int, ir.Value] = {}
    for node in model.graph:
        scope = scope_of(node)
        if scope is None:
            continue
        for v in node.inputs:
            if v is None or v.is_initializer() or v.const_value is not None:
                continue
            if v.producer() is None or scope_of(v.producer()) != scope:
                found.setdefault(scopes[scope], v)
    for l, v in found.items():
        if v.is_graph_output():
            continue
        v.name = HIDDEN.format(l)


def describe(model: ir.Model, cfg, opts: ExportOptions, source_name: str) -> None:
    model.producer_name = "msar-export"
    from .. import __version__

    model.producer_version = __version__
    model.graph.name = f"msar_lm_{cfg.residual}_{'decode' if opts.decode else 'prefill'}"
    model.metadata_props.update({
        META_CONFIG: cfg.to_json().strip(),
        META_GRAPH: "decode" if opts.decode else "prefill",
        META_DECOMPOSED: str(opts.decomposed).lower(),
        META_DTYPE: opts.dtype,
        META_MIXER_OP: "none" if opts.decomposed else opts.mixer_op,
        META_CHECKPOINT: source_name,
    })


def export_model(model, out: str | os.PathLike, opts: ExportOptions = ExportOptions(), source_name: str = "",
                 validate: bool = True) -> ExportReport:
    """Export an in-memory MSARLM (library API behind the CLI); converts it to opts.dtype in place."""
    return _export(lambda dtype: model.to(dtype), out, opts, source_name, validate, owns_model=False)


def _export(load, out, opts: ExportOptions, source_name: str, validate: bool, owns_model: bool) -> ExportReport:
    """`load(dtype)` gives the model in `dtype` (again in float32 for validation, after the
    file is written and the exported weights are gone: the two never live at once)."""
    out = check_output_file(out)  # before minutes of tracing, not after
    t0 = time.perf_counter()
    model = load(DTYPES[opts.dtype]).eval()  # converted as read: never both precisions of every weight
    cfg, n_params = model.cfg, sum(p.numel() for p in model.parameters())
    with torch.no_grad():
        onnx_model = trace_to_ir(model, opts)
    # torch.onnx's graph keeps inputs it removed (a zero-count entry in onnx_ir's
    # _GraphIO ref counter), and with them about two thirds of the parameters, past
    # every del and gc: a model we loaded ourselves is emptied in place after saving.
    owned = list(model.parameters()) if owns_model else []
    del model
    counts = attach_functions(onnx_model, cfg, opts.opset)
    if opts.decomposed:
        inline_functions(onnx_model)
        counts = {}
    name_dims(onnx_model, GraphSpec(cfg, opts.decode))
    name_hidden_states(onnx_model, cfg.n_sublayers)
    describe(onnx_model, cfg, opts, source_name)
    gc.collect()  # the exported program and its module hold references to the weights until collected
    external = opts.external_data or weight_bytes(onnx_model) > EXTERNAL_DATA_ABOVE
    size = save_model(onnx_model, out, release=True, external_data=external)
    del onnx_model
    for p in owned:
        p.data = torch.empty(0, dtype=p.dtype)
    del owned
    return_freed_memory()
    report = ExportReport(out, opts, counts, n_params, size, time.perf_counter() - t0, peak_rss_mb(),
                          external_data=external)
    if validate:
        from .validate import validate_export

        # A loader, not a model: validation frees the model before ONNX Runtime loads the file.
        report.validation = validate_export(out, lambda: load(torch.float32).eval(), opts)  # judged against float64
        report.peak_rss_validated_mb = peak_rss_mb()
    return report


def export_checkpoint(checkpoint: str | os.PathLike, out: str | os.PathLike, opts: ExportOptions = ExportOptions(),
                      trust_pickle: bool = False, validate: bool = True) -> ExportReport:
    def load(dtype):
        return load_checkpoint(checkpoint, dtype=dtype, trust_pickle=trust_pickle)

    return _export(load, out, opts, Path(checkpoint).name, validate, owns_model=True)
