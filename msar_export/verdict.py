"""One metric and one tolerance model for every numerical comparison.

Metric, for one output over a whole seeded input set (`rel_err`, `discrepancy`):

    error(got, ref) = max |got - ref| / max |ref|          (float64; inf if a value is not finite)

Reference: the eager PyTorch model run in **float64**.  A fixed tolerance
between two float32 implementations cannot work at depth: float32 eager is
itself 9e-6 / 5e-5 / 1e-4 away from float64 at 4 / 8 / 16 blocks on random
d_model-128 checkpoints, so any bar tight enough to catch a fault at 2 blocks
fails faithful exports at 16.  The model asks instead whether a backend is as
close to float64 as float32 (or the backend's precision p) can be:

    pass  <=>  error(backend_p, eager_f64) <= MULTIPLE * error(eager_p, eager_f64) + FLOOR[p]

`MULTIPLE` allows for a different but equally good order of rounding
(ONNX Runtime measured 0.7-1.8x eager's own error at 4-16 blocks); `FLOOR[p]`
(unit roundoffs of p, below) covers shallow models whose eager error is near
zero.  A real
fault is judged against the same bar: a 2% change to one source's conv taps
moves the logits by ~1e-3 relative, 30-100x the bar at 12-16 blocks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

PRECISIONS = ("float32", "float16", "bfloat16")  # the one list: --dtype, export, build, check
# The ones numpy holds, so a decode cache can be fed and ONNX Runtime's CPU provider run them:
# not bfloat16.
NUMPY_DTYPES = {"float32": np.float32, "float16": np.float16}
# Unit roundoff of each storage format (half the spacing of numbers near 1).
UNIT_ROUNDOFF = {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}
MULTIPLE = 4.0
# float32: 128 u = 7.6e-6, the old fixed 1e-5 bar's size at shallow depth, where ONNX
#   Runtime's other summation order measured 6.7e-6 against float64 with eager at 1.1e-6
#   (2 blocks, attnres); a real fault shows >= 1e-3.
# float16 / bfloat16: 8 u (3.9e-3 / 3.1e-2): eager's own error at these precisions is
#   already many u, so the multiple carries the bound.
FLOOR = {"float32": 128 * UNIT_ROUNDOFF["float32"], "float16": 8 * UNIT_ROUNDOFF["float16"],
         "bfloat16": 8 * UNIT_ROUNDOFF["bfloat16"]}

# Served answers against a run of the same graph in the same runtime at batch 1, for when
# no float64 reference is at hand (the load test without --checkpoint): the two differ
# only in summation order (batching), far below a real fault's >= 1e-3.
SAME_GRAPH = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 5e-2}


@dataclass(frozen=True)
class Discrepancy:
    """One output against its reference over a whole input set: the metric's two halves."""

    max_abs: float  # max |got - ref| over every batch (over the finite ones: see `finite`)
    ref_max_abs: float  # max |ref| over every batch: the metric's denominator
    finite: bool  # every value of `got` and `ref` is finite

    @property
    def rel_err(self) -> float:
        """The metric: max_abs / ref_max_abs; inf when a value is NaN or Inf."""
        if not self.finite:
            return float("inf")
        return self.max_abs / max(self.ref_max_abs, 1e-30)


def discrepancy(pairs) -> Discrepancy:
    """The metric over (got, ref) pairs of arrays (batches of different shapes), in float64:
    one output over a seeded input set is judged by its worst batch against its largest
    reference value, so one absolute bound per output holds for every batch."""
    max_abs, ref_max, finite = 0.0, 0.0, True
    for got, ref in pairs:
        got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
        if got.shape != ref.shape:
            raise ValueError(f"shapes differ: {got.shape} vs reference {ref.shape}")
        ref_max = float(np.max([ref_max, np.abs(ref).max()]))  # NaN propagates
        if not (np.isfinite(got).all() and np.isfinite(ref).all()):
            finite = False
            continue
        max_abs = max(max_abs, float(np.abs(got - ref).max()))
    return Discrepancy(max_abs, ref_max, finite)


def rel_err(got, ref) -> float:
    """max |got - ref| / max |ref| in float64; inf when `got` or `ref` has a NaN or Inf
    (a NaN reference is no reference: nothing can be judged close to it)."""
    return discrepancy([(got, ref)]).rel_err


def bound(eager_error: float, precision: str) -> float:
    """The largest error against float64 that a backend at `precision` may have."""
    return MULTIPLE * eager_error + FLOOR[precision]


def within(error, limit) -> bool:
    """The one pass test of every comparison: `error <= limit` with both finite.

    An infinite bound comes from a reference that is itself NaN or Inf (the eager
    model overflowed); `inf <= inf` would call an all-NaN output a pass."""
    try:
        error, limit = float(error), float(limit)
    except (TypeError, ValueError):  # None: the output was missing or not comparable
        return False
    return math.isfinite(error) and math.isfinite(limit) and error <= limit


@dataclass(frozen=True)
class Verdict:
    """One output of one backend against the float64 eager reference."""

    error: float  # backend vs float64
    eager_error: float  # eager at the same precision vs float64
    precision: str

    @property
    def bound(self) -> float:
        return bound(self.eager_error, self.precision)

    @property
    def passed(self) -> bool:
        return within(self.error, self.bound)

    def describe(self, backend: str = "backend") -> str:
        return (f"{backend} vs float64 {self.error:.2e}, eager {self.precision} vs float64 {self.eager_error:.2e}, "
                f"bound {MULTIPLE:g} x eager + {FLOOR[self.precision]:.1e} = {self.bound:.2e}")


def judge(got, eager_p, ref64, precision: str) -> Verdict:
    """Verdict for `got` (a backend at `precision`), with `eager_p` the eager
    model's output at that precision and `ref64` its float64 output."""
    return Verdict(rel_err(got, ref64), rel_err(eager_p, ref64), precision)
