"""Timing half of scripts/gpu_check.py: device times of the kernels and of the
two prefill paths MSAR_SPEC section 4 says to measure before trusting either,
with the bytes each must move and the roofline model's estimate
(scripts/kernel_model.py, docs/kernels.md):

- fused: FusedMixer over the raw sources (reads n*B*T*d, writes B*T*d);
- cached views: DepthRetrieval over n cached expanded views (reads n*B*T*m*d,
  writes B*T*m*d) then the scalar gate fusion in torch.

On a GPU every call is recorded `CALLS` times into one CUDA graph and the graph
replayed between two events, so no host time (Python, ctypes: 160-380 us per
call, more than most kernels here) is in a row. `--dry-run` runs the same code
on the CPU (emulation build, CPU torch) with host timers: it proves the code
path, its times mean nothing and rows say so (timer = "host, dry run").
"""

from __future__ import annotations

import statistics
import time

import torch
from kernel_model import copy_row_bytes, decode_bytes, estimate_us, prefill_bytes

from msar_export.kernels import random_fused_mixer_inputs
from msar_export.model.mixing import stream_fusion

CALLS = 10  # calls per captured graph: one replay's launch cost spread over them


def _device_time_ms(fn, reps: int = 5) -> tuple[float, str]:
    """Median per-call time of `fn` from CUDA-graph replays (no host time in the window)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up outside capture (first calls set kernel attributes)
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / CALLS)
    return statistics.median(times), "cuda graph replay"


def _host_time_ms(fn, reps: int = 2) -> tuple[float, str]:
    """Dry run: wall time of `fn` on the CPU; exercises the code, measures nothing about a GPU."""
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times), "host, dry run"


def time_ms(fn, device) -> tuple[float, str]:
    return _device_time_ms(fn) if torch.device(device).type == "cuda" else _host_time_ms(fn)


def copy_bandwidth_gbs(device, nbytes: int = 2 << 30) -> tuple[float, str]:
    """Device-to-device copy: bytes read + written per second (the ceiling a streaming kernel can reach)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms, timer = time_ms(lambda: dst.copy_(src), device)
    del src, dst
    return copy_row_bytes(nbytes) / (ms * 1e-3) / 1e9, timer


def cached_gate(z: torch.Tensor, inp: dict) -> torch.Tensor:
    """The gate fusion after cached-view retrieval. stream_fusion takes z in float32 (it casts the weights
    to float32): a 16-bit z from the kernel is widened first, as the eager mixer computes it."""
    return stream_fusion(z.float(), inp["gate_weight"], inp["gate_bias"], inp["gate_scale"])


def _rated(res: dict, prefix: str, nbytes: int, ms: float, copy_gbs: float, model_us: float) -> dict:
    """Bytes moved, achieved GB/s, fraction of the measured copy bandwidth, ratio to the model's estimate."""
    gbs = nbytes / (ms * 1e-3) / 1e9
    res.update({f"{prefix}_ms": ms, f"{prefix}_bytes": nbytes, f"{prefix}_gbs": gbs,
                f"{prefix}_copy_fraction": gbs / copy_gbs, f"{prefix}_model_us": model_us,
                f"{prefix}_vs_model": 1e3 * ms / model_us})
    return res


def time_prefill_paths(lib, n, ks, B, T, d, dtype, device, copy_gbs: float) -> dict:
    """FusedMixer (conv bank read as exported) against cached-view DepthRetrieval + gate fusion."""
    m = len(ks)
    inp = random_fused_mixer_inputs(n, 1, 1, d, ks, dtype=dtype, device=device, seed=7)
    inp["sources"] = [torch.randn(B, T, d, device=device, dtype=dtype) for _ in range(n)]
    ws = torch.empty(max(lib.fused_mixer_workspace(n, d, ks), 1), dtype=torch.uint8, device=device)
    out = torch.empty_like(inp["sources"][0])
    elt = out.element_size()
    fused_ms, timer = time_ms(lambda: lib.fused_mixer(**inp, out=out, workspace=ws), device)
    res = dict(op="prefill paths", n=n, stream_kernels=ks, B=B, T=T, d=d, dtype=str(dtype).split(".")[-1], timer=timer)
    _rated(res, "fused", prefill_bytes(n, B, T, d, elt), fused_ms, copy_gbs, estimate_us("fused", n, B, T, d, m, elt, sum(ks[1:])))
    del inp["sources"], out
    cached_bytes = prefill_bytes(n, B, T, m * d, elt)
    room = torch.cuda.get_device_properties(device).total_memory if torch.device(device).type == "cuda" else 1 << 30
    if cached_bytes < 0.5 * room:
        views = [torch.randn(B, T, m, d, device=device, dtype=dtype) for _ in range(n)]
        z = torch.empty_like(views[0])
        retrieval_ms, _ = time_ms(lambda: lib.depth_retrieval(inp["query"], views, inp["eps"], out=z), device)
        _rated(res, "retrieval", cached_bytes, retrieval_ms, copy_gbs,
               estimate_us("retrieval", n, B, T, d, m, elt))

        def cached():
            lib.depth_retrieval(inp["query"], views, inp["eps"], out=z)
            return cached_gate(z, inp)

        res["cached_ms"], _ = time_ms(cached, device)
        res["faster"] = "fused" if fused_ms < res["cached_ms"] else "cached views"
        del views, z
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
    return res


def time_decode(lib, n, B, m, d, dtype, device, copy_gbs: float) -> dict:
    """DepthRetrieval for one decoded token per sequence: n views of [B, 1, m, d] in the export's views dtype."""
    q = torch.randn(m, d, device=device, dtype=dtype) * (2.0 / d**0.5)
    views = [torch.randn(B, 1, m, d, device=device, dtype=dtype) for _ in range(n)]
    out = torch.empty_like(views[0])
    ms, timer = time_ms(lambda: lib.depth_retrieval(q, views, 1e-6, out=out), device)
    elt = out.element_size()
    res = dict(op="decode retrieval", n=n, B=B, m=m, d=d, dtype=str(dtype).split(".")[-1], timer=timer)
    return _rated(res, "retrieval", decode_bytes(n, B, m, d, elt), ms, copy_gbs,
                  estimate_us("decode", n, B, 1, d, m, elt))
