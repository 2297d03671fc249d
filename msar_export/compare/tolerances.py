"""Tolerances of a parity check (reasoning in docs/parity.md).

The metric for one output (`logits` or `hidden.{l}`) over the whole seeded
input set is

    error = max |backend - reference| / max |reference|

with the eager model in float64 as the reference, and an output passes when
error <= tolerance and every value is finite.  The tolerance of each output is
msar_export.verdict's bound: a multiple of the eager model's own error at the
backend's precision on that output, plus a floor (`from_eager`).  `--tol`
replaces it by one fixed number (`fixed`).  The report's `polygraphy run` command
repeats the check as a per-output absolute tolerance, atol = tolerance * max |reference|,
with rtol = 0 and the `max` statistic.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..graph_spec import LOGITS
from ..verdict import FLOOR, MULTIPLE, PRECISIONS, UNIT_ROUNDOFF, bound  # noqa: F401  (one definition, in msar_export.verdict)


@dataclass(frozen=True)
class Tolerance:
    """Relative tolerances (error as defined above) for the mixer outputs and the logits."""

    hidden: float
    logits: float
    source: str = "--tol"
    # The verdict model's bound per output, and the eager error it was made from.
    per_output: tuple = ()  # ((name, bound), ...)
    eager: tuple = ()  # ((name, eager error at the precision vs float64), ...)

    def for_output(self, name: str) -> float:
        bounds = dict(self.per_output)
        if name in bounds:
            return bounds[name]
        return self.logits if name == LOGITS else self.hidden

    def eager_error(self, name: str) -> float | None:
        return dict(self.eager).get(name)

    def to_dict(self) -> dict:
        out = {"hidden": self.hidden, "logits": self.logits, "source": self.source}
        if self.per_output:
            out["per_output"] = dict(self.per_output)
            out["eager_error"] = dict(self.eager)
        return out


def from_eager(eager_errors: dict[str, float], precision: str) -> Tolerance:
    """The verdict model's tolerance: each output's bound from the eager model's own
    error at `precision` against float64 on that output."""
    bounds = {n: bound(e, precision) for n, e in eager_errors.items()}
    hidden = max((b for n, b in bounds.items() if n != LOGITS), default=FLOOR[precision])
    return Tolerance(hidden=hidden, logits=bounds.get(LOGITS, FLOOR[precision]),
                     source=f"{MULTIPLE:g} x eager {precision} vs float64 + {FLOOR[precision]:.1e}",
                     per_output=tuple(bounds.items()), eager=tuple(eager_errors.items()))


def looser(a: str, b: str) -> str:
    """The lower of two precisions (whose bounds are the looser)."""
    return max(a, b, key=PRECISIONS.index)


def fixed(tol: float) -> Tolerance:
    """`--tol X`: one bound for every output instead of the verdict model's."""
    return Tolerance(hidden=tol, logits=tol, source="--tol")
