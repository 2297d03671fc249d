"""Validation right after export (like Optimum's validate step): the ONNX
checker, strict shape inference, and ONNX Runtime against the eager model at
shapes other than the ones the graph was traced at."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..errors import first_line

# Max abs error over max abs logit, ORT vs eager in the same dtype.  fp32: both
# sides are float32 implementations of one graph, ~1e-6 apart in practice; the
# project's acceptance bar is 1e-5.  fp16: one fp16 rounding of every stored
# activation (2^-11 ~ 5e-4) compounded over the depth of the model.
TOLERANCE = {"float32": 1e-5, "float16": 1e-2, "bfloat16": 5e-2}


@dataclass
class ValidationResult:
    checks: list[str] = field(default_factory=list)
    max_rel_err: float | None = None
    tolerance: float = 0.0
    shapes: str = ""
    failures: list[str] = field(default_factory=list)
    skipped: str = ""

    @property
    def passed(self) -> bool:
        return not self.failures

    def summary(self) -> str:
        head = "validation: " + ("PASS" if self.passed else "FAIL")
        parts = [", ".join(self.checks)]
        if self.max_rel_err is not None:
            parts.append(f"ORT vs eager max|err|/max|ref| = {self.max_rel_err:.2e} (tol {self.tolerance:.0e}) at {self.shapes}")
        if self.skipped:
            parts.append(f"ORT run skipped: {self.skipped}")
        parts += [f"failed: {f}" for f in self.failures]
        return head + " - " + "; ".join(p for p in parts if p)


def rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    if not np.isfinite(got).all():
        return float("inf")
    return float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30))


def _static_checks(path: Path, res: ValidationResult) -> None:
    import onnx

    try:
        onnx.checker.check_model(str(path), full_check=True)
        res.checks.append("onnx.checker full")
    except Exception as e:
        res.failures.append(f"onnx.checker: {first_line(e)}")
    try:
        inferred = onnx.shape_inference.infer_shapes(onnx.load(str(path), load_external_data=False),
                                                     check_type=True, strict_mode=True, data_prop=True)
        out = {o.name: o for o in inferred.graph.output}
        rank = len(out["logits"].type.tensor_type.shape.dim)
        if rank != 3:
            res.failures.append(f"shape inference gives logits rank {rank}, expected 3")
        res.checks.append("strict shape inference")
    except Exception as e:
        res.failures.append(f"shape inference: {first_line(e)}")


def _eager_reference(model, ids: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        return model(ids).float().numpy()


def validate_export(path: Path, model, opts, batch: int = 3, seq: int | None = None) -> ValidationResult:
    """Check the file at `path` against `model` (already in the export dtype)."""
    res = ValidationResult(tolerance=TOLERANCE[opts.dtype])
    _static_checks(path, res)
    cfg = model.cfg
    seq = seq or max(19, cfg.kmax + 7)  # traced at (2, 5); cover the widest conv window
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(7))
    if opts.dtype == "bfloat16":
        res.skipped = "ONNX Runtime's CPU provider has no bfloat16 kernels for this graph and numpy cannot feed bf16 caches"
        return res
    from ..runtime import OrtDecoder, OrtModel

    ref = _eager_reference(model, ids)
    if opts.decode:
        dec = OrtDecoder(path, threads=2)
        split = seq - 4  # prefill, then single-token steps
        mask = np.ones((batch, split), np.int64)
        pos = np.broadcast_to(np.arange(split), (batch, split))
        logits, cache = dec.step(ids[:, :split].numpy(), mask, pos, dec.empty_cache(batch))
        outs = [logits]
        for t in range(split, seq):
            mask = np.ones((batch, t + 1), np.int64)
            logits, cache = dec.step(ids[:, t : t + 1].numpy(), mask, np.full((batch, 1), t), cache)
            outs.append(logits)
        got = np.concatenate(outs, axis=1)
        res.shapes = f"prefill {batch}x{split} + {seq - split} decode steps"
    else:
        got = OrtModel(path, threads=2).session.run(["logits"], {"input_ids": ids.numpy()})[0]
        res.shapes = f"input_ids {batch}x{seq}"
    res.max_rel_err = rel_err(got, ref)
    if not res.max_rel_err <= res.tolerance:
        res.failures.append(f"ORT vs eager error {res.max_rel_err:.2e} exceeds {res.tolerance:.0e}")
    return res
