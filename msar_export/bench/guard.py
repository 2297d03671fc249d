"""The regression guard's measurement: msar/standard prefill time in ONNX Runtime on a small
model, native kernels and function bodies, medians of interleaved runs in one process.
`msar-export bench` records it in results.json ("guard"); tests/test_bench_guard.py measures
it again and fails when a ratio is more than GUARD_MARGIN above the recorded one, so a change
that makes MSAR dearer in ORT is noticed in the default test tier."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from ..config import MSARConfig

GUARD_MODEL = MSARConfig(d_model=128, n_blocks=4, n_heads=4, n_kv_heads=2, mlp_hidden=352, vocab_size=256,
                         max_seq_len=1024)
GUARD_SHAPE = (1, 256)
GUARD_MARGIN = 1.25  # ratios are side by side in one process; this absorbs the rest of the noise
# One thread: with two, ORT's workers share the cores with whatever else runs (a test suite, a
# build), and at this size the ratio swung from 1.05 (machine quiet) to 1.81 (loaded); on one
# thread it was 1.34 and 1.40 (2026-12-02).
GUARD_THREADS = 1


def guard_ratios(threads: int = GUARD_THREADS, repeats: int = 9) -> dict:
    import dataclasses

    from ..export import ExportOptions, export_model
    from ..runtime import OrtModel
    from .models import native_available, random_model
    from .timing import interleaved

    runs = {}
    with tempfile.TemporaryDirectory(prefix="msar-guard-") as tmp:
        for kind, opts in (("standard", ExportOptions(decomposed=True)), ("msar", ExportOptions())):
            path = Path(tmp) / f"{kind}.onnx"
            export_model(random_model(dataclasses.replace(GUARD_MODEL, residual=kind)), path, opts, validate=False)
            hows = ["ort"] if kind == "standard" else (["native", "function"] if native_available() else ["function"])
            for how in hows:
                ort_ops = None if how == "ort" else how
                runs[(kind, how)] = OrtModel(path, threads=threads, ort_ops=ort_ops).ort
    ids = np.random.default_rng(0).integers(0, GUARD_MODEL.vocab_size, GUARD_SHAPE)
    t = interleaved({k: (lambda g=g: g.logits(ids)) for k, g in runs.items()}, 2, repeats)
    std = t[("standard", "ort")].median_s
    out = {"model": f"d_model {GUARD_MODEL.d_model}, {GUARD_MODEL.n_blocks} blocks", "shape": list(GUARD_SHAPE),
           "threads": threads, "standard_ms": round(std * 1e3, 2)}
    for (kind, how), timing in t.items():
        if kind == "msar":
            out[f"msar/standard ({how})"] = round(timing.median_s / std, 3)
    return out


def regressions(measured: dict, recorded: dict, margin: float = GUARD_MARGIN) -> list[str]:
    """The ratios in both that grew by more than `margin`, described."""
    keys = [k for k in recorded if k.startswith("msar/standard") and k in measured]
    return [f"{k}: {measured[k]} now, {recorded[k]} recorded (> {margin}x)" for k in keys
            if measured[k] > margin * recorded[k]]
