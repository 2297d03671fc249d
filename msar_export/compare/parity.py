"""Layer-by-layer parity: eager PyTorch (the reference) vs ONNX Runtime vs TensorRT.

`check_parity` carries out the plan preflight made (`preflight.plan_check`): the
eager model runs in float64 (the reference) and at each precision a bound needs,
each backend runs the same feeds (`runs.py`), and every output of every backend is
judged by one metric and one pass test, msar_export.verdict's (`compare_backend`):
the same number decides the verdict, makes the bound and fills the table.  NaN or
Inf always fails, no output or batch may go missing unnoticed, and the first layer
(in depth order h_1 .. h_{L+1}, logits) that fails is named.  Polygraphy's own
comparator decides nothing here: the report gives the `polygraphy run` command that
repeats the ONNX check from the golden files (compare.report).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from ..log import silent
from ..verdict import discrepancy, within
from .preflight import CheckPlan, plan_check
from .result import REFERENCE, BackendResult, LayerResult, ParityResult, max_elementwise_rel, reference_scales, to_f64
from .runs import eager_runs, run_backend
from .tolerances import Tolerance, fixed, from_eager

# -- comparing -------------------------------------------------------------------------


def over(error: float, tolerance: float) -> str:
    """'error X > tolerance Y', each printed with as many digits as it takes to tell them apart."""
    if not math.isfinite(tolerance):
        return f"tolerance {tolerance} is not a finite bound"
    for digits in range(3, 18):
        x, y = f"{error:.{digits}g}", f"{tolerance:.{digits}g}"
        if x != y:
            break
    return f"error {x} > tolerance {y}"


def _pairs(name, ref_iters, got_iters):
    return ((to_f64(got[name]), to_f64(ref[name])) for ref, got in zip(ref_iters, got_iters))


def _judge(name, ref_iters, got_iters, tol: Tolerance, backend: str, optional) -> LayerResult:
    """One output of one backend over every batch: verdict.discrepancy, passed by verdict.within."""
    lr = LayerResult(name, "pass", tol.for_output(name), 0.0, eager_error=tol.eager_error(name))
    if not all(name in it for it in got_iters):
        lr.ref_max_abs = reference_scales(ref_iters, [name])[name]
        lr.status, lr.reason = "missing" if name in optional else "fail", f"not an output of {backend}"
        return lr
    for ref, got in zip(ref_iters, got_iters):
        if tuple(got[name].shape) != tuple(ref[name].shape):
            lr.ref_max_abs = reference_scales(ref_iters, [name])[name]
            lr.status, lr.reason = "fail", f"shape {list(got[name].shape)} != reference {list(ref[name].shape)}"
            return lr
    d = discrepancy(_pairs(name, ref_iters, got_iters))
    lr.ref_max_abs, lr.finite = d.ref_max_abs, d.finite
    if d.finite:
        lr.max_abs, lr.error = d.max_abs, d.rel_err
        lr.max_elementwise_rel = max_elementwise_rel(_pairs(name, ref_iters, got_iters))
    if not within(d.rel_err, lr.tolerance):
        lr.status = "fail"
        lr.reason = "NaN or Inf in the output" if not d.finite else over(d.rel_err, lr.tolerance)
    return lr


def compare_backend(ref_iters, got_iters, names, tol: Tolerance, backend: str, precision: str,
                    optional: tuple[str, ...] = ()) -> BackendResult:
    """Compare one backend's outputs with the reference's, output by output in depth order.

    names: outputs to compare (depth order). optional: outputs a backend may lack
    (a user's engine without hidden.{l}); any other missing output fails."""
    result = BackendResult(backend, "pass", precision, tol)
    if got_iters is None or len(got_iters) != len(ref_iters):
        n = 0 if got_iters is None else len(got_iters)
        result.status, result.reason = "fail", f"returned {n} of {len(ref_iters)} batches"
        return result
    result.layers = [_judge(n, ref_iters, got_iters, tol, backend, optional) for n in names]
    if any(lr.status == "fail" for lr in result.layers):
        result.status = "fail"
    return result


# -- the check -------------------------------------------------------------------------

@dataclass(frozen=True)
class CheckOptions:
    """How to check.  dtype: the precision a given --engine computes in (default and
    floor: the graph's msar.dtype); an engine built here is strongly typed and computes
    in the graph's own precision, as ONNX Runtime does.  Each output's bound is
    msar_export.verdict's, from the eager model's own error at that precision against
    float64 (the reference); tol: one fixed bound instead.  engine: a serialised engine;
    without it, and with `tensorrt` true, an engine is built from the graph when a
    TensorRT is installed.  shapes: token batch shapes (default:
    compare.inputs.default_shapes)."""

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
    progress: called with one line per step (the CLI prints them on stderr).
    compare.report.write_report saves what it found.  Bad input raises MsarError."""
    import dataclasses

    o = dataclasses.replace(opts or CheckOptions(), **overrides)
    say = progress or silent
    plan = plan_check(checkpoint, onnx, o)
    ref_iters, eager = eager_runs(plan, say, o.verbose)

    def tolerance_at(precision: str) -> Tolerance:
        """--tol, or the verdict model's bound from the eager model's own error at `precision`."""
        if plan.tol is not None:
            return fixed(plan.tol)
        return from_eager({n: discrepancy(_pairs(n, ref_iters, eager[precision])).rel_err for n in plan.layers},
                          precision)

    backends = [_onnxrt(plan, name, ort_ops, ref_iters, tolerance_at(plan.graph.precision), say, o)
                for name, ort_ops in plan.ort]
    trt = plan.tensorrt
    backends.append(_tensorrt(plan, ref_iters, None if trt.skip else tolerance_at(trt.precision), say, o.verbose))

    from polygraphy.comparator import RunResults

    golden = RunResults()
    golden.append((REFERENCE, ref_iters))
    return ParityResult(plan.checkpoint, plan.onnx, None if plan.engine is None else str(o.engine), plan.shapes,
                        plan.seed, backends, plan.layers, plan.feeds, golden)


def _run_and_compare(name, runner, plan: CheckPlan, ref_iters, tol, precision, optional, verbose) -> BackendResult:
    got, err, secs = run_backend(runner, plan.feeds, verbose)
    if got is None:
        return BackendResult(name, "error", precision, tol, reason=err, seconds=secs)
    res = compare_backend(ref_iters, got, plan.layers, tol, name, precision, optional)
    res.seconds = secs
    return res


def _onnxrt(plan: CheckPlan, name, ort_ops, ref_iters, tol, say, o) -> BackendResult:
    """ONNX Runtime runs the graph exactly as exported: judged at the graph's own precision."""
    from ..runners.onnxrt import onnxrt_runner
    from ..runners.ort_runner import resolve_ort_ops

    graph = plan.graph
    how = "native msar kernels" if resolve_ort_ops(ort_ops) is not None else "msar function bodies"
    say(f"{name}: running {graph.path.name} ({graph.precision}, {how})")
    runner = onnxrt_runner(graph.exported or graph.path, plan.layers, providers=o.providers, name=name,
                           ort_ops=ort_ops)
    return _run_and_compare(name, runner, plan, ref_iters, tol, graph.precision, (), o.verbose)


def _tensorrt(plan: CheckPlan, ref_iters, tol, say, verbose) -> BackendResult:
    """The engine given (--engine), or one built from the graph with every hidden.{l} marked."""
    from ..runners.trt import trt_runner_from_engine, trt_runner_from_onnx

    trt = plan.tensorrt
    if trt.skip is not None:
        return BackendResult("tensorrt", "skipped", reason=trt.skip)
    if plan.engine is not None:
        say(f"tensorrt: running engine {plan.engine.name}")
        runner = trt_runner_from_engine(plan.engine, plan.plugins, backend=trt.backend)
    else:
        say(f"tensorrt: building an engine from {plan.graph.path.name} ({trt.precision}) with hidden.{{l}} marked")
        runner = trt_runner_from_onnx(plan.graph.exported or plan.graph.path, plan.layers, trt.precision,
                                      trt.max_shape, plan.plugins, backend=trt.backend)
    res = _run_and_compare("tensorrt", runner, plan, ref_iters, tol, trt.precision, trt.optional, verbose)
    if res.status == "pass" and any(lr.status == "missing" for lr in res.layers):
        res.reason = "logits only: the engine has no hidden.{l} outputs, so a failure could not be located"
    return res

