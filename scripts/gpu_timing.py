"""Timing half of scripts/gpu_check.py: CUDA-event timings of the kernels and
of the two prefill paths MSAR_SPEC section 4 says to measure before trusting
either, with the bytes each must move (docs/kernels.md has the model):

- fused: FusedMixer over the raw sources (reads n*B*T*d, writes B*T*d);
- cached views: DepthRetrieval over n cached expanded views (reads n*B*T*m*d,
  writes B*T*m*d) then the scalar gate fusion in torch.
"""

from __future__ import annotations

import statistics
import time

import torch

from msar_export.kernels import random_fused_mixer_inputs
from msar_export.model.mixing import stream_fusion


def cuda_time_ms(fn, warmup: int = 3, reps: int = 10, budget_s: float = 2.0) -> float:
    """Median of per-call CUDA-event times."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times, t0 = [], time.perf_counter()
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
        if time.perf_counter() - t0 > budget_s and len(times) >= 3:
            break
    return statistics.median(times)


def copy_bandwidth_gbs(device, nbytes: int = 2 << 30) -> float:
    """Device-to-device copy: bytes read + written per second (the ceiling a streaming kernel can reach)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = cuda_time_ms(lambda: dst.copy_(src))
    del src, dst
    return 2 * nbytes / (ms * 1e-3) / 1e9


def time_prefill_paths(lib, n, ks, B, T, d, dtype, device, copy_gbs: float) -> dict:
    """FusedMixer (taps prepared once, as the plugin does) against cached-view DepthRetrieval + gate fusion."""
    m = len(ks)
    inp = random_fused_mixer_inputs(n, 1, 1, d, ks, dtype=dtype, device=device, seed=7)
    inp["sources"] = [torch.randn(B, T, d, device=device, dtype=dtype) for _ in range(n)]
    taps = lib.prepare_taps(inp["conv_weight"], n, ks)
    ws = torch.empty(max(lib.fused_mixer_workspace(n, d, ks), 1), dtype=torch.uint8, device=device)
    out = torch.empty_like(inp["sources"][0])
    fused_ms = cuda_time_ms(lambda: lib.fused_mixer(**inp, out=out, workspace=ws, prepared_taps=taps))
    elt = out.element_size()
    fused_bytes = (n + 1) * B * T * d * elt
    res = dict(op="prefill paths", n=n, stream_kernels=ks, B=B, T=T, d=d, dtype=str(dtype).split(".")[-1],
               fused_ms=fused_ms, fused_gbs=fused_bytes / (fused_ms * 1e-3) / 1e9)
    res["fused_copy_fraction"] = res["fused_gbs"] / copy_gbs
    del inp["sources"], out
    cached_bytes = (n + 1) * B * T * m * d * elt
    if cached_bytes < 0.5 * torch.cuda.get_device_properties(device).total_memory:
        views = [torch.randn(B, T, m, d, device=device, dtype=dtype) for _ in range(n)]
        z = torch.empty_like(views[0])

        def cached():
            lib.depth_retrieval(inp["query"], views, inp["eps"], out=z)
            return stream_fusion(z, inp["gate_weight"], inp["gate_bias"], inp["gate_scale"])

        res["retrieval_ms"] = cuda_time_ms(lambda: lib.depth_retrieval(inp["query"], views, inp["eps"], out=z))
        res["cached_ms"] = cuda_time_ms(cached)
        res["retrieval_copy_fraction"] = cached_bytes / (res["retrieval_ms"] * 1e-3) / 1e9 / copy_gbs
        res["faster"] = "fused" if fused_ms < res["cached_ms"] else "cached views"
        del views, z
    torch.cuda.empty_cache()
    return res


def time_decode(lib, n, B, m, d, dtype, device, copy_gbs: float) -> dict:
    """DepthRetrieval for one decoded token per sequence: n views of [B, 1, m, d]."""
    q = torch.randn(m, d, device=device, dtype=dtype) * (2.0 / d**0.5)
    views = [torch.randn(B, 1, m, d, device=device, dtype=dtype) for _ in range(n)]
    out = torch.empty_like(views[0])
    ms = cuda_time_ms(lambda: lib.depth_retrieval(q, views, 1e-6, out=out), warmup=5, reps=50)
    nbytes = (n + 1) * B * m * d * out.element_size()
    gbs = nbytes / (ms * 1e-3) / 1e9
    return dict(op="decode retrieval", n=n, B=B, m=m, d=d, dtype=str(dtype).split(".")[-1], ms=ms, us=1e3 * ms,
                gbs=gbs, copy_fraction=gbs / copy_gbs)
