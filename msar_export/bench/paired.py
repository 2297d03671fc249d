"""The goal ratios measured as pairs: a row and the standard model's row alternated, nothing
else between them, and the ratio taken per round (the median of the pairwise ratios, with
their spread).  The bench's big round-robin puts ~40 functions (eager, torch.compile, every
graph) between two calls of one row, so each row meets whatever state its predecessor left
(caches, spinning thread pools); a ratio of two such medians swung 20-30% run to run where the
pair scripts (scripts/prefill_pair.py, decode_pair.py) held within a few percent."""

from __future__ import annotations

import statistics

from .timing import interleaved_samples


def paired_ratio(fn, base, warmup: int, repeats: int) -> dict:
    """fn's time over base's, each round's pair taken back to back."""
    s = interleaved_samples({"fn": fn, "base": base}, warmup, repeats)
    r = sorted(a / b for a, b in zip(s["fn"], s["base"]))
    return {"median": round(statistics.median(r), 3), "min": round(r[0], 3), "max": round(r[-1], 3), "pairs": len(r)}


def paired_ratios(prefill_fns: dict, decode_fns: dict, shape, batches, warmup: int, repeats: int, log) -> dict:
    """Every ONNX Runtime row of attnres and msar against the standard model's ONNX Runtime row:
    prefill time at `shape`, and time per decode step (= standard/kind tokens/s) at each batch.
    Keys are those of run.ratios()."""
    out = {}
    base = prefill_fns.get(("standard", "ort", shape))
    for (kind, backend, s), fn in prefill_fns.items():
        if base is not None and kind != "standard" and s == shape and backend.startswith("ort"):
            log(f"  pair: {kind} {backend} prefill {shape[0]}x{shape[1]}")
            out[f"{kind}/standard prefill time in ORT ({backend})"] = paired_ratio(fn, base, warmup, repeats)
    for batch in batches:
        base = decode_fns.get(("standard", "ort", batch))
        for (kind, backend, b), fn in decode_fns.items():
            if base is not None and kind != "standard" and b == batch and backend.startswith("ort"):
                log(f"  pair: {kind} {backend} decode batch {batch}")
                out[f"standard/{kind} decode tokens/s, batch {batch} ({backend})"] = paired_ratio(fn, base, warmup, repeats)
    return out
