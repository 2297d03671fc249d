"""Validation right after export (like Optimum's validate step): the ONNX
checker, strict shape inference, and ONNX Runtime against the eager model in
float64 at shapes other than the ones the graph was traced at, judged by the
tolerance model of `msar_export.verdict`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..errors import first_line
from ..verdict import Verdict, judge, rel_err  # noqa: F401  (rel_err: the one metric, re-exported)

@dataclass
class ValidationResult:
    checks: list[str] = field(default_factory=list)
    verdict: Verdict | None = None
    shapes: str = ""
    failures: list[str] = field(default_factory=list)
    skipped: str = ""

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def max_rel_err(self) -> float | None:
        """ORT vs the float64 eager model (msar_export.verdict's metric)."""
        return None if self.verdict is None else self.verdict.error

    def summary(self) -> str:
        head = "validation: " + ("PASS" if self.passed else "FAIL")
        parts = [", ".join(self.checks)]
        if self.verdict is not None:
            parts.append(f"logits at {self.shapes}: {self.verdict.describe('ORT')}")
        if self.skipped:
            parts.append(f"ORT run skipped: {self.skipped}")
        parts += [f"failed: {f}" for f in self.failures]
        return head + " - " + "; ".join(p for p in parts if p)


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


def _eager_logits(model, ids: torch.Tensor, dtype: torch.dtype) -> np.ndarray:
    """The eager model's logits with its weights in `dtype` (converted in place)."""
    model.to(dtype)
    with torch.no_grad():
        return model(ids).to(torch.float64 if dtype == torch.float64 else torch.float32).numpy()


def validate_export(path: Path, model, opts, batch: int = 3, seq: int | None = None) -> ValidationResult:
    """Check the file at `path` against `model` (the checkpoint's weights, any dtype;
    converted in place and left in the export dtype): ORT's logits against the
    eager model in float64, judged by msar_export.verdict against the eager
    model's own error at the export precision."""
    from .exporter import DTYPES

    res = ValidationResult()
    _static_checks(path, res)
    cfg = model.cfg
    seq = seq or max(19, cfg.kmax + 7)  # traced at (2, 5); cover the widest conv window
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(7))
    if opts.dtype == "bfloat16":
        model.to(DTYPES[opts.dtype])
        res.skipped = "ONNX Runtime's CPU provider has no bfloat16 kernels for this graph and numpy cannot feed bf16 caches"
        return res
    from ..runtime import OrtDecoder, OrtModel

    ref64 = _eager_logits(model, ids, torch.float64)  # first: float64 of the stored weights, not of rounded ones
    eager_p = _eager_logits(model, ids, DTYPES[opts.dtype])
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
    res.verdict = judge(got, eager_p, ref64, opts.dtype)
    if not res.verdict.passed:
        res.failures.append(f"ORT's error against float64 {res.verdict.error:.2e} exceeds the bound "
                            f"{res.verdict.bound:.2e} (eager {opts.dtype} is {res.verdict.eager_error:.2e} away)")
    return res
