"""Validation right after export (like Optimum's validate step): the ONNX
checker, strict shape inference, and ONNX Runtime against the eager model in
float64 at shapes other than the ones the graph was traced at, judged by the
tolerance model of `msar_export.verdict`."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import first_line
from ..graph_spec import LOGITS
from ..memory import return_freed_memory
from ..onnx_wire import load_without_weights
from ..verdict import NUMPY_DTYPES, Verdict, judge, rel_err  # noqa: F401  (rel_err: the one metric, re-exported)

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


@dataclass
class Reference:
    """The eager model's logits on the validation inputs: in float64 (the reference) and at
    the export precision.  Computed while the weights are loaded for export, so
    validation never reloads the checkpoint; small (3 x 19 x vocab), saved as .npz to
    cross into the process that runs ONNX Runtime (handoff.py)."""

    ids: np.ndarray
    ref64: np.ndarray
    eager: np.ndarray

    def save(self, path: Path) -> None:
        np.savez(path, ids=self.ids, ref64=self.ref64, eager=self.eager)

    @classmethod
    def load(cls, path: Path) -> "Reference":
        with np.load(path) as z:
            return cls(z["ids"], z["ref64"], z["eager"])


def validation_ids(cfg, batch: int = 3, seq: int | None = None):
    """The token ids validation runs on (torch, fixed seed): (batch, seq), by default 3 x 19 or
    wider than the widest conv window; the graphs are traced at (2, 5)."""
    import torch

    seq = seq or max(19, cfg.kmax + 7)
    return torch.randint(0, cfg.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(7))


def reference_logits(model, dtype: str, batch: int = 3, seq: int | None = None) -> Reference | None:
    """The reference for validating an export of `model` (its stored weights) at `dtype`;
    leaves `model` converted in place to `dtype`.  None for bfloat16 (not run in ORT)."""
    import torch

    from ..model.precision import float64_one_sublayer_at_a_time

    if dtype not in NUMPY_DTYPES:
        model.to(getattr(torch, dtype))
        return None
    ids = validation_ids(model.cfg, batch, seq)
    with float64_one_sublayer_at_a_time(model), torch.no_grad():
        ref64 = model(ids).numpy()  # first: float64 of the stored weights, not of rounded ones
    model.to(getattr(torch, dtype))  # the export dtypes are torch's names
    with torch.no_grad():
        eager = model(ids).float().numpy()
    return_freed_memory()  # the float64 sublayers' heap, before tracing adds its own
    return Reference(ids.numpy(), ref64, eager)


def validate_file(path: Path, ref: Reference | None, decode: bool, dtype: str) -> ValidationResult:
    """The checker, shape inference and ORT's logits against `ref`, judged by
    msar_export.verdict against the eager model's own error at `dtype`.  Torch-free."""
    res = ValidationResult()
    _static_checks(path, res)
    if ref is None:
        res.skipped = "ONNX Runtime's CPU provider has no bfloat16 kernels for this graph and numpy cannot feed bf16 caches"
        return res
    from ..runners.ort_runner import THREADS
    from ..runtime import OrtDecoder, OrtModel

    ids = ref.ids
    batch, seq = ids.shape
    if decode:
        dec = OrtDecoder(path, threads=THREADS["validation"], low_memory=True)
        split = seq - 4  # prefill, then single-token steps
        mask = np.ones((batch, split), np.int64)
        pos = np.broadcast_to(np.arange(split), (batch, split))
        logits, cache = dec.step(ids[:, :split], mask, pos, dec.empty_cache(batch))
        outs = [logits]
        for t in range(split, seq):
            mask = np.ones((batch, t + 1), np.int64)
            logits, cache = dec.step(ids[:, t : t + 1], mask, np.full((batch, 1), t), cache)
            outs.append(logits)
        got = np.concatenate(outs, axis=1)
        res.shapes = f"prefill {batch}x{split} + {seq - split} decode steps"
    else:
        got = OrtModel(path, threads=THREADS["validation"], low_memory=True).ort.logits(ids)
        res.shapes = f"input_ids {batch}x{seq}"
    res.verdict = judge(got, ref.eager, ref.ref64, dtype)
    if not res.verdict.passed:
        res.failures.append(f"ORT's error against float64 {res.verdict.error:.2e} exceeds the bound "
                            f"{res.verdict.bound:.2e} (eager {dtype} is {res.verdict.eager_error:.2e} away)")
    return res
