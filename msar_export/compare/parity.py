"""Layer-by-layer parity: eager PyTorch (the reference) vs ONNX Runtime vs TensorRT.

Every backend runs the same seeded token batches through Polygraphy's
`Comparator.run`; `Comparator.compare_accuracy` with a `SimpleCompareFunc`
(per-output `atol = tolerance * max|reference|`, `rtol = 0`, `max` statistic)
gives each output's verdict, and this module adds what Polygraphy does not:
NaN/Inf always fail, no output or batch may go missing unnoticed, and the
first layer (in depth order h_1 .. h_{L+1}, logits) that fails is named.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np

from ..errors import InputError, MsarError
from ..graph_spec import INPUT_IDS, LOGITS
from ..runners.common import layer_order, output_names, quiet_polygraphy
from ..verdict import within
from .inputs import check_shapes, decode_batches, default_shapes, token_batches
from .preflight import GraphInfo, check_engine_path, inspect_onnx
from .result import REFERENCE, BackendResult, LayerResult, ParityResult, reference_scales, to_f64
from .tolerances import Tolerance, fixed, from_eager, looser

# -- running ---------------------------------------------------------------------------

def run_runner(runner, feeds, verbose: bool = False) -> list:
    """Comparator.run over one runner -> its list of IterationResult (one per feed)."""
    from polygraphy.comparator import Comparator

    with quiet_polygraphy(verbose):
        results = Comparator.run([runner], data_loader=feeds)
    return list(results[runner.name])


def run_backend(runner, feeds, verbose: bool = False):
    """Like run_runner, but a backend that fails to build or run is a verdict, not a crash."""
    t0 = time.perf_counter()
    try:
        return run_runner(runner, feeds, verbose), "", time.perf_counter() - t0
    except MsarError:
        raise
    except Exception as e:  # ONNX Runtime / TensorRT / Polygraphy errors: the backend did not produce outputs
        text = " ".join(str(e).split()) or type(e).__name__
        return None, f"{type(e).__name__}: {text[:400]}", time.perf_counter() - t0


# -- comparing -------------------------------------------------------------------------

def _exact_output(name, index, iter_result):
    """Polygraphy's default matching falls back to substrings and positions
    ('hidden.1' would match 'hidden.10'); a parity check compares names exactly."""
    return [name] if name in iter_result else None


def polygraphy_verdicts(ref_iters, got_iters, backend: str, atol: dict[str, float], verbose: bool = False):
    """Per output: did Polygraphy's SimpleCompareFunc pass it in every batch?"""
    from polygraphy.comparator import Comparator, RunResults, SimpleCompareFunc

    runs = RunResults()
    runs.append((REFERENCE, ref_iters))
    runs.append((backend, got_iters))
    func = SimpleCompareFunc(atol=atol, rtol=0.0, check_error_stat="max", find_output_func=_exact_output)
    with quiet_polygraphy(verbose), np.errstate(all="ignore"):  # NaN/Inf are judged below, not warned about
        acc = Comparator.compare_accuracy(runs, compare_func=func)[0]
    per_iter = acc[(REFERENCE, backend)]
    if len(per_iter) != len(ref_iters):
        return {n: False for n in atol}
    return {n: all(n in it and bool(it[n]) for it in per_iter) for n in atol}


def output_errors(ref_iters, got_iters, names) -> dict[str, float]:
    """{output: error} of one run against the reference, over every batch (the same metric)."""
    scales = reference_scales(ref_iters, names)
    out = {}
    for n in names:
        worst = 0.0
        for ref_it, got_it in zip(ref_iters, got_iters):
            got = to_f64(got_it[n])
            worst = float("inf") if not np.isfinite(got).all() else max(worst, float(np.abs(got - to_f64(ref_it[n])).max()))
        out[n] = worst / scales[n] if scales[n] > 0 else (0.0 if worst == 0 else float("inf"))
    return out


def compare_backend(ref_iters, got_iters, names, tol: Tolerance, backend: str, precision: str,
                    optional: tuple[str, ...] = (), verbose: bool = False) -> BackendResult:
    """Compare one backend's outputs with the reference's, output by output in depth order.

    names: outputs to compare (depth order). optional: outputs a backend may lack
    (a user's engine without hidden.{l}); any other missing output fails."""
    result = BackendResult(backend, "pass", precision, tol)
    if got_iters is None or len(got_iters) != len(ref_iters):
        n = 0 if got_iters is None else len(got_iters)
        result.status, result.reason = "fail", f"returned {n} of {len(ref_iters)} batches"
        return result
    scales = reference_scales(ref_iters, names)
    present = [n for n in names if all(n in it for it in got_iters)]
    atol = {n: tol.for_output(n) * scales[n] for n in present}
    verdicts = polygraphy_verdicts(ref_iters, got_iters, backend, atol, verbose) if present else {}
    for n in names:
        lr = LayerResult(n, "pass", tol.for_output(n), scales[n], eager_error=tol.eager_error(n))
        result.layers.append(lr)
        if n not in present:
            lr.status = "missing" if n in optional else "fail"
            lr.reason = f"not an output of {backend}"
            continue
        max_abs, max_rel, finite, reason = 0.0, 0.0, True, ""
        for ref_it, got_it in zip(ref_iters, got_iters):
            ref, got = to_f64(ref_it[n]), to_f64(got_it[n])
            finite &= bool(np.isfinite(got).all() and np.isfinite(ref).all())
            if got.shape != ref.shape:
                reason = f"shape {list(got.shape)} != reference {list(ref.shape)}"
                max_abs = max_rel = float("inf")
                continue
            diff = np.abs(got - ref)
            max_abs = max(max_abs, float(np.max(diff)))
            max_rel = max(max_rel, float(np.max(diff / np.maximum(np.abs(ref), np.finfo(np.float64).tiny))))
        lr.finite = finite
        if finite and not reason:
            lr.max_abs, lr.max_rel = max_abs, max_rel
            lr.error = max_abs / scales[n] if scales[n] > 0 else (0.0 if max_abs == 0 else float("inf"))
        ok = finite and not reason and within(lr.error, lr.tolerance) and verdicts.get(n, False)
        if not ok:
            lr.status = "fail"
            lr.reason = reason or ("NaN or Inf in the output" if not finite else
                                   f"error {lr.error:.3g} > tolerance {lr.tolerance:.3g}")
    if any(lr.status == "fail" for lr in result.layers):
        result.status = "fail"
    return result


# -- the check -------------------------------------------------------------------------

@dataclass(frozen=True)
class CheckOptions:
    """How to check.  dtype: the precision TensorRT runs in (default and floor: the
    graph's msar.dtype); ONNX Runtime runs the graph as exported and is judged at the
    graph's own precision.  Each output's bound is msar_export.verdict's, from the eager
    model's own error at that precision against float64 (the reference); tol: one fixed
    bound instead.  engine: a serialised engine; without it, and with `tensorrt` true, an
    engine is built from the graph when a TensorRT is installed.  shapes: token batch
    shapes (default: compare.inputs.default_shapes)."""

    engine: str | os.PathLike | None = None
    plugins: tuple = ()
    dtype: str | None = None
    tol: float | None = None
    shapes: list | None = None
    seed: int = 0
    tensorrt: bool = True
    providers: tuple = ("cpu",)
    ort_ops: tuple = (None,)  # msar nodes in ORT, one backend each: None (MSAR_ORT_OPS), "native", "function"
    trust_pickle: bool = False
    verbose: bool = False


def check_parity(checkpoint: str | os.PathLike, onnx: str | os.PathLike, opts: CheckOptions | None = None,
                 progress=None, **overrides) -> ParityResult:
    """Compare the ONNX graph (and a TensorRT engine) with the eager checkpoint, layer by
    layer.  `overrides` are CheckOptions fields (check_parity(ck, path, tensorrt=False)).
    compare.report.write_report saves what it found.  Bad input raises MsarError."""
    import dataclasses

    import torch

    from ..checkpoint import load_checkpoint
    from ..runners.eager import TorchRunner
    from ..runners.onnxrt import onnxrt_runner
    from ..runners.trt import check_plugin_paths, choose_backend, engine_not_run_reason, tensorrt_unavailable

    o = dataclasses.replace(opts or CheckOptions(), **overrides)
    engine, dtype, tol, seed, tensorrt, verbose = o.engine, o.dtype, o.tol, o.seed, o.tensorrt, o.verbose
    say = progress or (lambda msg: None)
    if dtype is not None and dtype not in ("float32", "float16", "bfloat16"):
        raise InputError(f"--dtype must be float32, float16 or bfloat16, got {dtype!r}")
    if tol is not None and not (tol > 0 and np.isfinite(tol)):
        raise InputError(f"--tol must be a positive number, got {tol!r}")
    model = load_checkpoint(checkpoint, dtype=torch.float32, trust_pickle=o.trust_pickle)
    cfg = model.cfg
    graph: GraphInfo = inspect_onnx(onnx, cfg)
    engine_path = check_engine_path(engine) if engine is not None else None
    plugins = check_plugin_paths(o.plugins)
    if engine_path is not None and not tensorrt:
        raise InputError("--engine and --no-trt contradict each other; drop one")
    meta = None
    if engine_path is not None:
        # The engine's build record must name this ONNX file and these plugin
        # libraries (pure Python: checked whether or not the engine can run here).
        from ..engines.metadata import verify_engine_metadata

        meta = verify_engine_metadata(engine_path, graph.path, plugins)
        trt_backend = meta.builder.get("backend", "tensorrt")
        trt_skip = engine_not_run_reason(engine_path, meta)
    else:
        trt_backend = choose_backend()
        trt_skip = "--no-trt" if not tensorrt else tensorrt_unavailable()
    if graph.decode and trt_skip is None and engine_path is None:
        trt_skip = "decode graphs are checked on ONNX Runtime only (no in-memory engine profile for the past inputs)"
    shapes = check_shapes(o.shapes if o.shapes is not None else default_shapes(cfg), cfg)
    if meta is not None and not graph.decode:
        # Every check shape must lie inside the engine's profile.
        from ..engines.metadata import check_input_shapes

        for shape in shapes:
            check_input_shapes(meta, {INPUT_IDS: tuple(shape)})
    cache_dtype = None
    if graph.decode:
        cache_dtype = np.float16 if graph.precision == "float16" else np.float32
        feeds = decode_batches(model, shapes, cache_dtype, seed)
    else:
        feeds = token_batches(cfg, shapes, seed)
    names = output_names(cfg)
    order = layer_order(cfg)

    say(f"eager-torch: running {len(feeds)} batches {['%dx%d' % s for s in shapes]} in float64 and float32")
    from ..model.precision import float64_one_sublayer_at_a_time

    with float64_one_sublayer_at_a_time(model):
        ref_iters = run_runner(TorchRunner(model, name=REFERENCE, decode_cache_dtype=cache_dtype), feeds, verbose)
    eager_runs = {"float32": run_runner(TorchRunner(model, name="eager-torch", decode_cache_dtype=cache_dtype), feeds,
                                        verbose)}

    def tolerance_at(precision: str) -> Tolerance:
        """--tol, or the verdict model's bound from the eager model's own error at `precision`."""
        if tol is not None:
            return fixed(tol)
        if precision not in eager_runs:
            say(f"eager-torch: running in {precision} (the bound for {precision} backends)")
            low = load_checkpoint(checkpoint, dtype=getattr(torch, precision), trust_pickle=o.trust_pickle)
            eager_runs[precision] = run_runner(TorchRunner(low, name=f"eager-torch-{precision}",
                                                           decode_cache_dtype=cache_dtype), feeds, verbose)
        return from_eager(output_errors(ref_iters, eager_runs[precision], names), precision)

    backends = []

    # ONNX Runtime runs the graph exactly as exported, so it is judged at the graph's own
    # precision; --dtype is the precision TensorRT runs in, never stricter than the graph's.
    from ..runners.ort_runner import resolve_ort_ops

    for ort_ops in o.ort_ops:
        name = "onnxrt" if len(o.ort_ops) == 1 else f"onnxrt-{ort_ops}"
        how = "native msar kernels" if resolve_ort_ops(ort_ops) is not None else "msar function bodies"
        say(f"{name}: running {graph.path.name} ({graph.precision}, {how})")
        runner = onnxrt_runner(graph.exported or graph.path, names, providers=o.providers, name=name, ort_ops=ort_ops)
        got, err, secs = run_backend(runner, feeds, verbose)
        backends.append(_backend_result(name, ref_iters, got, err, secs, order, tolerance_at(graph.precision),
                                        graph.precision, (), verbose))
    trt_precision = looser(dtype or graph.precision, graph.precision)
    trt_tol = None if trt_skip is not None else tolerance_at(trt_precision)
    backends.append(_tensorrt(graph, engine_path, plugins, trt_precision, trt_tol, trt_skip, shapes, feeds, ref_iters,
                              order, names, say, verbose, trt_backend))

    from polygraphy.comparator import RunResults

    golden = RunResults()
    golden.append((REFERENCE, ref_iters))
    return ParityResult(str(checkpoint), str(onnx), None if engine is None else str(engine), shapes, seed, backends,
                        order, feeds, golden)


def _backend_result(name, ref_iters, got, err, secs, order, tol, precision, optional, verbose) -> BackendResult:
    if got is None:
        return BackendResult(name, "error", precision, tol, reason=err, seconds=secs)
    res = compare_backend(ref_iters, got, order, tol, name, precision, optional, verbose)
    res.seconds = secs
    return res


def _tensorrt(graph, engine_path, plugins, precision, tol, skip, shapes, feeds, ref_iters, order, names, say, verbose,
              backend="tensorrt"):
    """skip: why TensorRT does not run here (None: it does).  precision: --dtype,
    never stricter than the graph's own (an engine from an fp16 graph is fp16)."""
    from ..runners.trt import trt_runner_from_engine, trt_runner_from_onnx

    if skip is not None:
        return BackendResult("tensorrt", "skipped", reason=skip)
    if engine_path is not None:
        say(f"tensorrt: running engine {engine_path.name}")
        runner = trt_runner_from_engine(engine_path, plugins, backend=backend)
        optional = tuple(n for n in order if n != LOGITS)  # a shipped engine may expose only the logits
    else:
        say(f"tensorrt: building an engine from {graph.path.name} ({precision}) with hidden.{{l}} marked")
        max_shape = (max(b for b, _ in shapes), max(t for _, t in shapes))
        runner = trt_runner_from_onnx(graph.path, names, precision, max_shape, plugins, backend=backend)
        optional = ()
    got, err, secs = run_backend(runner, feeds, verbose)
    res = _backend_result("tensorrt", ref_iters, got, err, secs, order, tol, precision, optional, verbose)
    if res.status == "pass" and any(lr.status == "missing" for lr in res.layers):
        res.reason = "logits only: the engine has no hidden.{l} outputs, so a failure could not be located"
    return res
