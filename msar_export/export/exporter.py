"""`msar-export export`: checkpoint -> ONNX (custom-op or decomposed, prefill or decode)."""

from __future__ import annotations

import contextlib
import gc
import io
import logging
import os
import time
import warnings
from pathlib import Path

import onnx_ir as ir
import torch

from ..checkpoint import load_checkpoint
from ..errors import MsarError
from ..memory import return_freed_memory
from ..verdict import PRECISIONS
from ..fileio import check_outputs
from ..contracts import CONTRACTS, DOMAIN, DOMAIN_VERSION
from .functions import function_body
from ..graph_spec import (HIDDEN, META_CHECKPOINT, META_CONFIG, META_DECOMPOSED, META_DTYPE, META_GRAPH,
                          META_MIXER_OP, GraphSpec)
from .graphs import DecodeGraph, PrefillGraph, example_inputs
from .optimize import optimize_model, remove_identity_casts, separate_consumed_outputs
from .report import ExportOptions, ExportReport, peak_rss_mb  # noqa: F401  (re-exported)
from .save import EXTERNAL_DATA_ABOVE, save_model, weight_bytes

DTYPES = {p: getattr(torch, p) for p in PRECISIONS}  # the precisions are torch's names


def trace_to_ir(model, opts: ExportOptions, weights=None) -> ir.Model:
    """Run torch.onnx (dynamo) on the prefill or decode graph of `model`.
    weights: a `weightless.LazyWeights` when `model` is fake; its loaders replace the fake
    initializers before the optimiser, whose constant folding reads the small ones."""
    graph_cls = DecodeGraph if opts.decode else PrefillGraph
    # --decomposed traces the custom-op graph too and inlines the function bodies
    # afterwards (inline_functions): torch.export then sees one node per mixer,
    # not one group per (mixer, source) pair, which made its time quadratic in depth.
    module = graph_cls(model, custom_ops=True, mixer_op=opts.mixer_op).eval()
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
    if weights is not None:
        weights.attach(program.model)
    # torch.onnx's own optimize step, less one rule whose matching is quadratic in depth.
    try:
        model = optimize_model(program.model)
    except Exception as e:
        # A lazy weight the optimiser folds is read here: its CheckpointError (NaN, a short
        # file) arrives wrapped in onnx_ir's PassErrors, and is the user's one line.
        user_error = _msar_error_in(e)
        if user_error is None:
            raise
        raise user_error from None
    separate_consumed_outputs(model)
    return model


def _msar_error_in(e: BaseException | None) -> MsarError | None:
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, MsarError):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


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


def _export(load, out, opts: ExportOptions, source_name: str, validate: bool, owns_model: bool,
            defer_validation: bool = False, inputs=(), weights=None) -> ExportReport:
    """`load(dtype)` gives the model in `dtype`.  With validation the model is loaded in
    float32, its reference logits computed (float64 and opts.dtype) and the weights
    converted in place before tracing: nothing is reloaded for validation.
    defer_validation: leave the ONNX Runtime run to the caller (report.reference)."""
    from .validate import reference_logits

    if weights is not None:
        return _export_weightless(weights, out, opts, source_name, validate, defer_validation, inputs)
    # The whole output set, before minutes of tracing: the file, its data file, never an input.
    out = check_outputs([out, Path(str(out) + ".data")], inputs)[0]
    t0 = time.perf_counter()
    if validate:
        model = load(torch.float32).eval()  # converted to opts.dtype in place, one tensor at a time
        t_ref = time.perf_counter()
        reference = reference_logits(model, opts.dtype)
        t0 += time.perf_counter() - t_ref  # export seconds: load, trace and save, as without validation
    else:
        model = load(DTYPES[opts.dtype]).eval()  # converted as read: never both precisions of every weight
        reference = None
    cfg, n_params = model.cfg, sum(p.numel() for p in model.parameters())
    with torch.no_grad():
        onnx_model = trace_to_ir(model, opts)
    # torch.onnx's graph keeps inputs it removed (a zero-count entry in onnx_ir's
    # _GraphIO ref counter), and with them about two thirds of the parameters, past
    # every del and gc: a model we loaded ourselves is emptied in place after saving.
    owned = list(model.parameters()) if owns_model else []
    del model
    counts, external, size = finish_and_save(onnx_model, cfg, opts, source_name, out)
    for p in owned:
        p.data = torch.empty(0, dtype=p.dtype)
    del owned
    return _report(ExportReport(out, opts, counts, n_params, size, time.perf_counter() - t0, 0.0,
                                external_data=external), reference, validate and not defer_validation)


def finish_and_save(onnx_model: ir.Model, cfg, opts: ExportOptions, source_name: str, out: Path):
    """Function bodies (or inlined), names, metadata; then the file, one weight at a time,
    each dropped once written.  Returns (custom-op counts, external data?, bytes written)."""
    counts = attach_functions(onnx_model, cfg, opts.opset)
    if opts.decomposed:
        inline_functions(onnx_model)
        counts = {}
    name_dims(onnx_model, GraphSpec(cfg, opts.decode))
    name_hidden_states(onnx_model, cfg.n_sublayers)
    describe(onnx_model, cfg, opts, source_name)
    gc.collect()  # the exported program and its module hold references to the weights until collected
    # weight_bytes counts shapes only: a lazy weight is not read to be measured
    external = opts.external_data or weight_bytes(onnx_model) > EXTERNAL_DATA_ABOVE
    size = save_model(onnx_model, out, release=True, external_data=external)
    return counts, external, size


def _export_weightless(weights, out, opts: ExportOptions, source_name: str, validate: bool,
                       defer_validation: bool, inputs) -> ExportReport:
    """The checkpoint path: traced from a fake model, each weight read from the checkpoint
    as it is written (weightless.py).  With validation, the reference is computed first,
    streamed from the checkpoint one sublayer at a time (reference.py)."""
    from .reference import streamed_reference
    from .weightless import fake_model

    out = check_outputs([out, Path(str(out) + ".data")], inputs)[0]
    t0 = time.perf_counter()
    reference = None
    if validate:
        t_ref = time.perf_counter()
        reference = streamed_reference(weights.files, weights.cfg, opts.dtype)
        t0 += time.perf_counter() - t_ref  # export seconds: trace and save, as without validation
    cfg = weights.cfg
    n_params = sum(e.nbytes // max(1, e.dtype.itemsize) for e in weights.files.entries.values())
    with torch.no_grad():
        onnx_model = trace_to_ir(fake_model(cfg, DTYPES[opts.dtype]), opts, weights)
    counts, external, size = finish_and_save(onnx_model, cfg, opts, source_name, out)
    del onnx_model
    return _report(ExportReport(out, opts, counts, n_params, size, time.perf_counter() - t0, 0.0,
                                external_data=external), reference, validate and not defer_validation)


def _report(report: ExportReport, reference, validate_now: bool) -> ExportReport:
    """The report of a saved export, its peak RSS taken after the freed memory went back."""
    return_freed_memory()
    report.peak_rss_mb = peak_rss_mb()
    report.reference = reference
    return finish_validation(report) if validate_now else report


def finish_validation(report: ExportReport) -> ExportReport:
    """ONNX Runtime on the written file against the reference computed before tracing."""
    from .validate import validate_file

    report.validation = validate_file(report.path, report.reference, report.options.decode, report.options.dtype)
    report.peak_rss_validated_mb = max(report.peak_rss_validated_mb or 0.0, peak_rss_mb())
    return report


def export_checkpoint(checkpoint: str | os.PathLike, out: str | os.PathLike, opts: ExportOptions = ExportOptions(),
                      trust_pickle: bool = False, validate: bool = True, exec_module: str | None = None) -> ExportReport:
    """A safetensors checkpoint (one file or shards) is exported weightless (weightless.py);
    a trusted pickle one is loaded whole.  With validation, a checkpoint over
    handoff.APART_ABOVE is validated in a separate torch-free image after the export, by a
    child this call waits for.  exec_module: for a caller whose process exists for this one
    export (the CLI): its large buffers are mapped from the start (memory.map_large_buffers)
    and, validating apart, the process is replaced by `python -m exec_module STATE`, which
    validates (handoff.validate_state) and reports: the call does not return."""
    from .handoff import exec_validation, validate_in_child, validates_apart

    def load(dtype):
        return load_checkpoint(checkpoint, dtype=dtype, trust_pickle=trust_pickle)

    apart = validate and validates_apart(checkpoint)  # ORT after the exporting image's memory is gone
    if apart and exec_module is not None:
        from ..memory import map_large_buffers

        map_large_buffers()
    weights = _lazy_weights(checkpoint, opts)
    report = _export(load, out, opts, Path(checkpoint).name, validate, owns_model=True, defer_validation=apart,
                     inputs=[checkpoint], weights=weights)
    if not apart:
        return report
    if exec_module is not None:
        exec_validation(report, exec_module)
    return validate_in_child(report)


def _lazy_weights(checkpoint, opts: ExportOptions):
    """LazyWeights over the checkpoint's validated headers; None for a pickle checkpoint."""
    from ..checkpoint import check_weight_files, read_config
    from ..weights import WeightFiles
    from .weightless import LazyWeights

    path = Path(checkpoint)
    files = WeightFiles.open(path) if path.is_dir() else None
    if files is None:
        return None  # not a folder, or pickle: load_checkpoint refuses or reads it, with its own messages
    cfg = read_config(path)
    check_weight_files(cfg, files)  # every header against the config, before tracing
    return LazyWeights(files, cfg, DTYPES[opts.dtype])
