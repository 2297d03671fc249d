"""GPU check of the msar kernels without TensorRT (driven by scripts/gpu_check.sh).

Runs the kernel library (C ABI, ctypes) on torch CUDA tensors and compares it
with a float64 reference and the eager mixer (msar_export.model.mixing), in
float32 / float16 / bfloat16, then times it with CUDA events against a
device-to-device copy (the bandwidth ceiling). Prints a table and writes JSON.

    python scripts/gpu_check.py --lib build/gpu_check/libmsar_kernels.so --out build/gpu_check/results.json

`--emulation LIB` runs the same checks on the CPU with the emulation build
(plugins/tests/cudaHostEmulation.h) at tiny shapes and no timing: a smoke test
of this script on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from msar_export.build.kernels import (KernelLibrary, eager_depth_retrieval, eager_fused_mixer,
                                       random_fused_mixer_inputs, reference_depth_retrieval64,
                                       reference_fused_mixer64, rel_err)

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# Error budget vs the float64 reference (max abs error / max abs reference); a
# kernel also passes within 2x the eager mixer's own error in that dtype.
TOLERANCE = {"float32": 1e-4, "float16": 2e-3, "bfloat16": 1.6e-2}
MAIN_KERNELS = [1, 4, 8, 12]

# (sources n, stream_kernels, B, T, d): full comparison at every dtype.
CORRECTNESS = [
    (1, [1], 2, 33, 64),
    (2, [1, 2], 2, 17, 96),
    (3, [1, 3, 5], 3, 29, 40),
    (5, MAIN_KERNELS, 2, 77, 256),
    (9, [1, 2, 3, 4, 5, 6], 1, 45, 128),
    (25, MAIN_KERNELS, 1, 64, 2048),
]
# (n, stream_kernels, B, T, d): timed, checked on sampled token windows.
PERFORMANCE = [
    (2, MAIN_KERNELS, 16, 4096, 64),
    (2, MAIN_KERNELS, 16, 4096, 2048),
    (13, MAIN_KERNELS, 4, 4096, 1024),
    (25, MAIN_KERNELS, 16, 4096, 2048),
    (25, MAIN_KERNELS, 16, 4096, 64),
]
# DepthRetrieval: (n, B, T, m, d)
RETRIEVAL = [(25, 64, 1, 4, 2048), (13, 1, 1, 4, 1024), (3, 2, 5, 3, 40), (25, 4, 4096, 1, 1024)]

TIME_BUDGET_S = 210  # stop starting timed cases after this (the whole check stays under 5 minutes)

EMULATION_CORRECTNESS = [(1, [1], 1, 9, 32), (3, [1, 3, 5], 2, 11, 40), (4, MAIN_KERNELS, 1, 13, 64)]
EMULATION_RETRIEVAL = [(3, 2, 1, 4, 40)]


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


def check_fused_case(lib, n, ks, B, T, d, dtype_name, device) -> dict:
    dt = DTYPES[dtype_name]
    inp = random_fused_mixer_inputs(n, B, T, d, ks, dtype=dt, device=device, seed=n * 1000 + d)
    got = lib.fused_mixer(**inp)
    if got.is_cuda:
        torch.cuda.synchronize()
    ref = reference_fused_mixer64(**inp)
    eager = eager_fused_mixer(**inp).to(dt)
    err, eager_err = rel_err(got, ref), rel_err(eager, ref)
    ok = bool(torch.isfinite(got.float()).all()) and err <= max(TOLERANCE[dtype_name], 2 * eager_err)
    return dict(op="FusedMixer", n=n, stream_kernels=ks, B=B, T=T, d=d, dtype=dtype_name, err=err,
                eager_err=eager_err, ok=ok)


def check_retrieval_case(lib, n, B, T, m, d, dtype_name, device) -> dict:
    dt = DTYPES[dtype_name]
    g = torch.Generator().manual_seed(n * 100 + d)
    q = (2.0 / d**0.5 * torch.randn(m, d, generator=g)).to(dt).to(device)
    views = [torch.randn(B, T, m, d, generator=g).to(dt).to(device) for _ in range(n)]
    got = lib.depth_retrieval(q, views, 1e-6)
    if got.is_cuda:
        torch.cuda.synchronize()
    ref = reference_depth_retrieval64(q, views, 1e-6)
    eager = eager_depth_retrieval(q, views, 1e-6).to(dt)
    err, eager_err = rel_err(got, ref), rel_err(eager, ref)
    ok = bool(torch.isfinite(got.float()).all()) and err <= max(TOLERANCE[dtype_name], 2 * eager_err)
    out = dict(op="DepthRetrieval", n=n, B=B, T=T, m=m, d=d, dtype=dtype_name, err=err, eager_err=eager_err, ok=ok)
    if got.is_cuda:
        ms = cuda_time_ms(lambda: lib.depth_retrieval(q, views, 1e-6, out=got))
        nbytes = (n + 1) * B * T * m * d * got.element_size()
        out.update(ms=ms, gbs=nbytes / (ms * 1e-3) / 1e9)
    return out


def sampled_error(lib_out, inp, windows: list[tuple[int, int]], span: int = 64) -> float:
    """Compare the kernel output on token windows [t0, t0+span) of batch b with the
    float64 reference run on the window plus its kmax-1 history tokens."""
    kmax = max(inp["stream_kernels"])
    worst = 0.0
    for b, t0 in windows:
        lo = max(0, t0 - (kmax - 1))
        sub = dict(inp, sources=[s[b:b + 1, lo:t0 + span].contiguous() for s in inp["sources"]])
        ref = reference_fused_mixer64(**sub)[:, t0 - lo:]
        worst = max(worst, rel_err(lib_out[b:b + 1, t0:t0 + span], ref))
    return worst


def perf_case(lib, n, ks, B, T, d, dtype_name, device, copy_gbs: float) -> dict:
    dt = DTYPES[dtype_name]
    inp = random_fused_mixer_inputs(n, 1, 1, d, ks, dtype=dt, device=device, seed=7)
    inp["sources"] = [torch.randn(B, T, d, device=device, dtype=dt) for _ in range(n)]
    out = torch.empty_like(inp["sources"][0])
    ws = torch.empty(max(lib.fused_mixer_workspace(n, d, ks), 1), dtype=torch.uint8, device=device)
    ms = cuda_time_ms(lambda: lib.fused_mixer(**inp, out=out, workspace=ws))
    windows = [(0, 0), (B // 2, T // 2), (B - 1, T - 64)]
    err = sampled_error(out, inp, windows)
    elt = out.element_size()
    nbytes = (n + 1) * B * T * d * elt  # sources read once + output written: the fused op's minimum traffic
    res = dict(op="FusedMixer", n=n, stream_kernels=ks, B=B, T=T, d=d, dtype=dtype_name, ms=ms,
               gbs=nbytes / (ms * 1e-3) / 1e9, err=err, ok=bool(torch.isfinite(out.float()).all())
               and err <= TOLERANCE[dtype_name] * 2)
    res["copy_fraction"] = res["gbs"] / copy_gbs
    # The eager mixer (views materialised in float32) where it fits comfortably.
    m = len(ks)
    eager_bytes = 3 * n * B * T * m * d * 4
    if eager_bytes < 0.25 * torch.cuda.get_device_properties(device).total_memory:
        with torch.no_grad():
            res["eager_ms"] = cuda_time_ms(lambda: eager_fused_mixer(**inp), warmup=1, reps=3)
    del inp, out, ws
    torch.cuda.empty_cache()
    return res


def fmt_row(r: dict) -> str:
    shape = f"n={r['n']:>2} B={r['B']:>3} T={r['T']:>5} d={r['d']:>4}"
    shape += f" m={r['m']}" if "m" in r else f" k={r['stream_kernels']}"
    timing = ""
    if "ms" in r:
        timing = f"  {r['ms']:8.3f} ms  {r['gbs']:7.1f} GB/s"
        if "copy_fraction" in r:
            timing += f" ({100 * r['copy_fraction']:4.1f}% of copy)"
        if "eager_ms" in r:
            timing += f"  eager {r['eager_ms']:8.2f} ms"
    eager = f" eager {r['eager_err']:.2e}" if "eager_err" in r else ""
    return f"{'ok  ' if r['ok'] else 'FAIL'} {r['op']:<14} {r['dtype']:<8} {shape:<52} err {r['err']:.2e}{eager}{timing}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", help="CUDA build of the kernels (libmsar_kernels.so)")
    ap.add_argument("--emulation", help="CPU emulation build instead (tiny shapes, no timing)")
    ap.add_argument("--out", default="build/gpu_check/results.json")
    ap.add_argument("--quick", action="store_true", help="skip the large timed shapes")
    a = ap.parse_args(argv)
    if not (a.lib or a.emulation):
        ap.error("give --lib or --emulation")

    results = []
    t_start = time.perf_counter()
    if a.emulation:
        lib, device = KernelLibrary(a.emulation), "cpu"
        env = {"device": "cpu emulation", "torch": torch.__version__}
        for case in EMULATION_CORRECTNESS:
            for dt in DTYPES:
                results.append(check_fused_case(lib, *case, dt, device))
                print(fmt_row(results[-1]), flush=True)
        for case in EMULATION_RETRIEVAL:
            results.append(check_retrieval_case(lib, *case, "float32", device))
            print(fmt_row(results[-1]), flush=True)
    else:
        if not torch.cuda.is_available():
            print("skipped: no CUDA device")
            return 0
        lib, device = KernelLibrary(a.lib), torch.device("cuda")
        props = torch.cuda.get_device_properties(device)
        env = {"device": props.name, "capability": f"{props.major}.{props.minor}", "memory_gb": props.total_memory / 1e9,
               "torch": torch.__version__, "torch_cuda": torch.version.cuda, "python": platform.python_version()}
        print(f"# {props.name} (sm_{props.major}{props.minor}), torch {torch.__version__}, CUDA {torch.version.cuda}")
        print("# correctness: error = max|got - ref| / max|ref| vs a float64 reference; eager = the model's mixer")
        for case in CORRECTNESS:
            for dt in DTYPES:
                results.append(check_fused_case(lib, *case, dt, device))
                print(fmt_row(results[-1]), flush=True)
        for case in RETRIEVAL:
            for dt in DTYPES:
                results.append(check_retrieval_case(lib, *case, dt, device))
                print(fmt_row(results[-1]), flush=True)
        if not a.quick:
            copy_gbs = copy_bandwidth_gbs(device)
            env["copy_gbs"] = copy_gbs
            print(f"# timing: CUDA events, median; bandwidth ceiling (device-to-device copy) {copy_gbs:.0f} GB/s; "
                  "GB/s counts sources read once + output written")
            for case in PERFORMANCE:
                for dt in ("bfloat16", "float16", "float32"):
                    if time.perf_counter() - t_start > TIME_BUDGET_S:
                        print(f"# time budget ({TIME_BUDGET_S} s) used up: skipping {dt} {case}")
                        env.setdefault("skipped_for_time", []).append([dt, *map(str, case)])
                        continue
                    results.append(perf_case(lib, *case, dt, device, copy_gbs))
                    print(fmt_row(results[-1]), flush=True)

    failed = [r for r in results if not r["ok"]]
    summary = dict(environment=env, results=results, failed=len(failed), seconds=time.perf_counter() - t_start)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"# {len(results) - len(failed)}/{len(results)} passed in {summary['seconds']:.0f} s; results: {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
