"""Validation right after export (like Optimum's validate step): the ONNX
checker, strict shape inference, and ONNX Runtime against the eager model in
float64 at shapes other than the ones the graph was traced at, judged by the
tolerance model of `msar_export.verdict`."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..errors import first_line
from ..graph_spec import LOGITS
from ..memory import return_freed_memory
from ..model.precision import float64_one_sublayer_at_a_time
from ..onnx_wire import load_without_weights
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
    """The checker and strict shape inference, on the file without its weights (which
    neither reads; checking a whole single-file model held it 3-4 times over)."""
    import onnx

    skeleton = load_without_weights(path)
    # The checker resolves the skeleton's references to the weights from the folder of the
    # file it is given, so it gets a copy of the skeleton beside the model.
    with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", suffix=".skeleton") as f:
        f.write(skeleton.SerializeToString())
        f.flush()
        try:
            onnx.checker.check_model(f.name, full_check=True)
            res.checks.append("onnx.checker full")
        except Exception as e:
            res.failures.append(f"onnx.checker: {first_line(e)}")
    try:
        inferred = onnx.shape_inference.infer_shapes(skeleton, check_type=True, strict_mode=True, data_prop=True)
        out = {o.name: o for o in inferred.graph.output}
        rank = len(out[LOGITS].type.tensor_type.shape.dim)
        if rank != 3:
            res.failures.append(f"shape inference gives logits rank {rank}, expected 3")
        res.checks.append("strict shape inference")
    except Exception as e:
        res.failures.append(f"shape inference: {first_line(e)}")


def _eager_logits(model, ids: torch.Tensor, dtype: torch.dtype) -> np.ndarray:
    """The eager model's logits with its weights in `dtype` (converted in place)."""
    model.to(dtype)
    with torch.no_grad():
        return model(ids).float().numpy()


def validate_export(path: Path, model, opts, batch: int = 3, seq: int | None = None) -> ValidationResult:
    """Check the file at `path` against `model` (the checkpoint's weights, any dtype;
    converted in place and left in the export dtype), or against `model()` when
    it is a loader, which is freed before ONNX Runtime loads the file: ORT's logits
    against the eager model in float64, judged by msar_export.verdict against the
    eager model's own error at the export precision."""
    from .exporter import DTYPES

    res = ValidationResult()
    _static_checks(path, res)
    if not isinstance(model, torch.nn.Module):
        model = model()
    cfg = model.cfg
    seq = seq or max(19, cfg.kmax + 7)  # traced at (2, 5); cover the widest conv window
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(7))
    if opts.dtype == "bfloat16":
        model.to(DTYPES[opts.dtype])
        res.skipped = "ONNX Runtime's CPU provider has no bfloat16 kernels for this graph and numpy cannot feed bf16 caches"
        return res
    from ..runtime import OrtDecoder, OrtModel

    with float64_one_sublayer_at_a_time(model), torch.no_grad():
        ref64 = model(ids).numpy()  # first: float64 of the stored weights, not of rounded ones
    eager_p = _eager_logits(model, ids, DTYPES[opts.dtype])
    del model  # the caller's loader gave the only reference: ORT's copy of the weights comes next
    return_freed_memory()
    if opts.decode:
        dec = OrtDecoder(path, threads=2, low_memory=True)
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
        got = OrtModel(path, threads=2, low_memory=True).ort.logits(ids.numpy())
        res.shapes = f"input_ids {batch}x{seq}"
    res.verdict = judge(got, eager_p, ref64, opts.dtype)
    if not res.verdict.passed:
        res.failures.append(f"ORT's error against float64 {res.verdict.error:.2e} exceeds the bound "
                            f"{res.verdict.bound:.2e} (eager {opts.dtype} is {res.verdict.eager_error:.2e} away)")
    return res
