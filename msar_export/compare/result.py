"""What a parity check found: per output, per backend, and the verdict (the data the
report renders; nothing here runs a backend)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..graph_spec import hidden_index
from .tolerances import Tolerance

REFERENCE = "eager-torch-float64"


@dataclass
class LayerResult:
    """One output of one backend, over all batches."""

    name: str  # "hidden.3" or "logits"
    status: str  # "pass" | "fail" | "missing" (not an output of this backend)
    tolerance: float
    ref_max_abs: float
    max_abs: float | None = None  # max |backend - reference|; None when not finite or missing
    error: float | None = None  # max_abs / ref_max_abs (verdict.rel_err): checked against `tolerance`
    # max over elements of |backend - reference| / |reference|: for information only, never
    # judged (it explodes where the reference crosses zero)
    max_elementwise_rel: float | None = None
    eager_error: float | None = None  # the eager model's own error at the backend's precision, same metric
    finite: bool = True
    reason: str = ""

    @property
    def layer(self) -> int | None:
        return hidden_index(self.name)

    @property
    def passed(self) -> bool:
        return self.status == "pass"


@dataclass
class BackendResult:
    name: str
    status: str  # "pass" | "fail" | "error" (did not run) | "skipped" (not available)
    precision: str | None = None
    tolerance: Tolerance | None = None
    layers: list[LayerResult] = field(default_factory=list)
    reason: str = ""
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return self.status == "pass"

    @property
    def first_bad(self) -> LayerResult | None:
        """The first layer in depth order whose error exceeds its tolerance (or is not finite)."""
        return next((r for r in self.layers if r.status == "fail"), None)

    def layer(self, name: str) -> LayerResult:
        return next(r for r in self.layers if r.name == name)


@dataclass
class ParityResult:
    checkpoint: str
    onnx: str
    engine: str | None
    shapes: list[tuple[int, int]]
    seed: int
    backends: list[BackendResult]
    layer_names: list[str]
    feeds: list = field(repr=False, default_factory=list)
    golden: object = field(repr=False, default=None)  # polygraphy RunResults of the reference

    @property
    def passed(self) -> bool:
        """True only if every backend that ran is within tolerance and at least one ran."""
        ran = [b for b in self.backends if b.status != "skipped"]
        return bool(ran) and all(b.passed for b in ran)

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1

    def backend(self, name: str) -> BackendResult:
        for b in self.backends:
            if b.name == name:
                return b
        raise KeyError(f"no backend {name!r} in this result (have {[b.name for b in self.backends]})")


def to_f64(x) -> np.ndarray:
    if hasattr(x, "detach"):  # a torch tensor (TrtRunner may hand those back)
        x = x.detach().float().cpu().numpy()
    return np.asarray(x).astype(np.float64)


def max_elementwise_rel(pairs) -> float:
    """max over elements of |got - ref| / |ref| (LayerResult.max_elementwise_rel; information only)."""
    tiny = np.finfo(np.float64).tiny
    return max(float(np.max(np.abs(got - ref) / np.maximum(np.abs(ref), tiny))) for got, ref in pairs)


def reference_scales(ref_iters, names) -> dict[str, float]:
    """max |reference| per output over all batches: the metric's denominator."""
    return {n: max(float(np.max(np.abs(to_f64(it[n])))) for it in ref_iters) for n in names}


def suspect(name: str) -> str:
    """Where to look when `name` is the first output to differ."""
    l = hidden_index(name)
    if l is None:
        return "the head: final_norm or lm_head (every h_l matches)"
    if l == 1:
        return "the embedding, mixer 1 (gate) or source 0's conv taps"
    kind = "attention" if (l - 1) % 2 == 1 else "MLP"
    return (f"mixer {l} (query, gate), source {l - 1}'s conv taps or sublayer {l - 1} ({kind}); "
            f"h_1..h_{l - 1} match")
