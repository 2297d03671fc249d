"""Running a parity check's backends: every runner goes through Polygraphy's
`Comparator.run` (its outputs are Polygraphy `IterationResult`s, the golden
files' format), and the eager model runs in float64 for the reference and at each
precision a bound needs."""

from __future__ import annotations

import contextlib
import sys
import time

from ..errors import MsarError
from ..runners.common import quiet_polygraphy
from .result import REFERENCE


def run_runner(runner, feeds, verbose: bool = False) -> list:
    """Comparator.run over one runner -> its list of IterationResult (one per feed).
    verbose: Polygraphy's own log, on stderr (stdout carries the report alone)."""
    from polygraphy.comparator import Comparator

    with quiet_polygraphy(verbose), contextlib.redirect_stdout(sys.stderr):
        results = Comparator.run([runner], data_loader=feeds)
    return list(results[runner.name])


def run_backend(runner, feeds, verbose: bool = False):
    """Like run_runner, but a backend that fails to build or run is a verdict, not a crash:
    (iterations or None, why not, seconds)."""
    t0 = time.perf_counter()
    try:
        return run_runner(runner, feeds, verbose), "", time.perf_counter() - t0
    except MsarError:
        raise
    except Exception as e:  # ONNX Runtime / TensorRT / Polygraphy errors: the backend did not produce outputs
        text = " ".join(str(e).split()) or type(e).__name__
        return None, f"{type(e).__name__}: {text[:400]}", time.perf_counter() - t0


def at_precision(model, precision: str):
    """`model` with every weight converted to `precision` in memory: the model
    `load_checkpoint(dtype=...)` reads (float32 holds every value a float32, float16 or
    bfloat16 file holds, so one rounding either way), without reading the checkpoint
    again or holding a second float32 copy."""
    import torch

    dtype = getattr(torch, precision)
    with torch.device("meta"):  # no initialisation: every tensor comes from `model`
        low = type(model)(model.cfg)
    low.load_state_dict({k: v.to(dtype) for k, v in model.state_dict().items()}, strict=True, assign=True)
    return low.eval()


def eager_runs(plan, say, verbose: bool = False) -> tuple[list, dict[str, list]]:
    """(the float64 reference's iterations, {precision: the eager model's iterations at it})
    for the precisions in `plan.bound_precisions`."""
    from ..model.precision import float64_one_sublayer_at_a_time
    from ..runners.eager import TorchRunner

    model, feeds, cache = plan.model, plan.feeds, plan.cache_dtype
    bounds = f" and {', '.join(plan.bound_precisions)} (the bounds)" if plan.bound_precisions else ""
    say(f"eager-torch: running {len(feeds)} batches {['%dx%d' % s for s in plan.shapes]} in float64 "
        f"(the reference){bounds}")
    with float64_one_sublayer_at_a_time(model):
        ref = run_runner(TorchRunner(model, name=REFERENCE, decode_cache_dtype=cache), feeds, verbose)
    runs = {}
    for p in plan.bound_precisions:
        name = "eager-torch" if p == "float32" else f"eager-torch-{p}"
        at_p = model if p == "float32" else at_precision(model, p)
        runs[p] = run_runner(TorchRunner(at_p, name=name, decode_cache_dtype=cache), feeds, verbose)
    return ref, runs
