"""Timing and machine description for benchmarks: warm-up, repeats, median and spread."""

from __future__ import annotations

import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass


@dataclass
class Timing:
    median_s: float
    min_s: float
    max_s: float
    iqr_s: float
    repeats: int

    @classmethod
    def of(cls, samples: list[float]) -> Timing:
        """Median, extremes and interquartile range (statistics.quantiles) of samples in seconds."""
        ts = sorted(samples)
        q = statistics.quantiles(ts, n=4) if len(ts) >= 2 else [ts[0]] * 3
        return cls(statistics.median(ts), ts[0], ts[-1], q[2] - q[0], len(ts))

    def as_dict(self) -> dict:
        return {k: round(v, 6) if isinstance(v, float) else v for k, v in asdict(self).items()}


def time_fn(fn, warmup: int = 1, repeats: int = 5) -> Timing:
    return Timing.of(interleaved_samples({"fn": fn}, warmup, repeats)["fn"])


def interleaved_samples(fns: dict, warmup: int = 1, repeats: int = 5, clock=time.perf_counter) -> dict[str, list[float]]:
    """Every function's `repeats` times in seconds, taken round-robin after `warmup` calls each, so
    machine noise hits all alike (scripts/decode_pair.py takes pairwise ratios of the samples)."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t0 = clock()
            fn()
            samples[k].append(clock() - t0)
    return samples


def interleaved(fns: dict, warmup: int = 1, repeats: int = 5) -> dict[str, Timing]:
    """Time several functions round-robin, so machine noise hits all alike."""
    return {k: Timing.of(ts) for k, ts in interleaved_samples(fns, warmup, repeats).items()}


def machine_description(threads: int) -> dict:
    import numpy as np
    import onnxruntime
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    return {
        "cpu": cpu, "logical_cores": os.cpu_count(), "threads": threads, "python": platform.python_version(),
        "torch": torch.__version__, "onnxruntime": onnxruntime.__version__, "numpy": np.__version__,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
    }


def copy_bandwidth_gbs(nbytes: int = 256 * 1024**2) -> float:
    """Measured memcpy bandwidth (read + write counted once each), the bytes-moved ceiling."""
    import numpy as np

    a = np.ones(nbytes // 4, np.float32)
    b = np.empty_like(a)
    t = time_fn(lambda: np.copyto(b, a), warmup=1, repeats=5).median_s
    return 2 * nbytes / t / 1e9
