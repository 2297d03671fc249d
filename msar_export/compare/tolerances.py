"""Tolerance presets per precision (reasoning in docs/parity.md).

The metric for one output (`logits` or `hidden.{l}`) over the whole seeded
input set is

    error = max |backend - reference| / max |reference|

and an output passes when error <= tolerance and every value is finite.
Polygraphy checks it as a per-output absolute tolerance,
atol = tolerance * max |reference|, with rtol = 0 and the `max` statistic.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..verdict import PRECISIONS, UNIT_ROUNDOFF  # noqa: F401  (one definition, in msar_export.verdict)


@dataclass(frozen=True)
class Tolerance:
    """Relative tolerances (error as defined above) for the mixer outputs and the logits."""

    hidden: float
    logits: float
    source: str = "preset"

    def for_output(self, name: str) -> float:
        return self.logits if name == "logits" else self.hidden

    def to_dict(self) -> dict:
        return {"hidden": self.hidden, "logits": self.logits, "source": self.source}


# float32: reordered reductions only, measured <= 5e-6 (random weights, logits) and
#          <= 2e-6 (trained); the smallest export bug the tests inject shows 1e-3.
# float16: 20 unit roundoffs (u = 4.9e-4); trained checkpoints measure 1-2 u per layer.
# bfloat16: the same 20 u with u = 3.9e-3.
PRESETS: dict[str, Tolerance] = {
    "float32": Tolerance(hidden=1e-4, logits=1e-4, source="float32 preset"),
    "float16": Tolerance(hidden=1e-2, logits=1e-2, source="float16 preset"),
    "bfloat16": Tolerance(hidden=8e-2, logits=8e-2, source="bfloat16 preset"),
}


def looser(a: str, b: str) -> str:
    """The lower of two precisions (whose preset is the looser)."""
    return max(a, b, key=PRECISIONS.index)


def preset(precision: str, override: float | None = None) -> Tolerance:
    if override is not None:
        return Tolerance(hidden=override, logits=override, source="--tol")
    return PRESETS[precision]
