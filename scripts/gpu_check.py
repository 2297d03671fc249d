"""GPU check of the msar kernels without TensorRT (driven by scripts/gpu_check.sh).

Runs the kernel library (C ABI, ctypes) on torch CUDA tensors at every launch
path (tile kernel, split sources, warp kernel, scalar loads, decode retrieval)
and judges each output against the float64 reference with the project's one
verdict (msar_export/verdict.py: error <= 4 x the eager mixer's own error at
that precision + a floor). Then times the prefill paths and decode retrieval
(scripts/gpu_timing.py). Prints a table and writes JSON.

    python scripts/gpu_check.py --lib build/gpu_check/cmake/libmsar_kernels.so --out results.json
    python scripts/gpu_check.py --lib LIB --sanitize     # tiny cases of every path (under compute-sanitizer)
    python scripts/gpu_check.py --lib LIB --profile      # each kernel once at a real shape (under ncu)

`--emulation LIB` runs the correctness checks on the CPU with the emulation
build (plugins/tests/cudaHostEmulation.h) at tiny shapes and no timing: a
smoke test of this script on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

from msar_export import verdict
from msar_export.kernels import (KernelLibrary, eager_depth_retrieval, eager_fused_mixer,
                                       random_fused_mixer_inputs, reference_depth_retrieval64,
                                       reference_fused_mixer64, rel_err)

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
MAIN = [1, 4, 8, 12]
EIGHT = [1, 2, 3, 4, 5, 6, 7, 8]

# (n, stream_kernels, B, T, d, path): full comparison at every dtype.
CORRECTNESS = [
    (1, [1], 2, 33, 64, "tile, one source"),
    (3, [1, 3, 5], 3, 29, 40, "tile"),
    (5, MAIN, 2, 77, 256, "tile"),
    (9, [1, 2, 3, 4, 5, 6], 1, 45, 128, "tile, 8-stream bucket"),
    (4, MAIN, 2, 9, 33, "tile, scalar loads (odd d)"),
    (25, MAIN, 1, 512, 2048, "tile"),
    (97, MAIN, 1, 1, 4096, "split, one token"),
    (97, MAIN, 1, 16, 4096, "split"),
    (3, MAIN, 4, 3, 1024, "kernel longer than T"),
    (3, MAIN, 1, 64, 8192, "tile, d 8192"),
    (2, EIGHT, 1, 8, 8192, "warp kernel (8 streams, d 8192)"),
    (256, MAIN, 1, 4, 256, "256 sources"),
]
# DecodeRetrieval: (n, B, T, m, d)
RETRIEVAL = [(97, 1, 1, 4, 4096), (97, 64, 1, 4, 4096), (13, 1, 1, 4, 1024), (3, 2, 5, 3, 40), (25, 4, 512, 1, 1024),
             (2, 1, 1, 4, 8192)]
# Prefill timing, fused vs cached views: (n, stream_kernels, B, T, d). T = 16 splits sources, 1,024 is the plain
# tile kernel (the B = 1 headline), 1,056 and 1,057 straddle the old tile/warp crossover (8 tokens per SM on 132
# SMs); then the token sweep to 65,536 at n = 25, d = 2048.
PREFILL = [(97, MAIN, 1, T, 4096) for T in (16, 1024, 1056, 1057)]
PREFILL += [(25, MAIN, 1, T, 2048) for T in (256, 1024, 4096, 16384, 65536)]
# Decode retrieval (n, B, m, d) in the views dtype a bfloat16 model's decode export stores: the model's
# (docs/kernels.md, decode views' storage dtype), as the prefill rows' bfloat16.
DECODE = [(97, B, 4, 4096) for B in (1, 4, 16, 64)]
DECODE_DTYPE = torch.bfloat16
TIME_BUDGET_S = 150  # stop starting timed cases after this: gpu_check.sh keeps ~4 minutes for sanitizers and ncu
# --dry-run: the same timing code on the CPU at shapes the emulation runs in seconds.
DRY_PREFILL = [(3, MAIN, 1, 2, 32), (3, MAIN, 2, 3, 32)]
DRY_DECODE = [(3, 1, 4, 32), (3, 2, 4, 32)]

EMULATION_CORRECTNESS = [(1, [1], 1, 9, 32, "tile"), (3, [1, 3, 5], 2, 11, 40, "tile"), (4, MAIN, 1, 13, 64, "tile"),
                         (9, MAIN, 1, 1, 32, "split")]
EMULATION_RETRIEVAL = [(3, 2, 1, 4, 40), (9, 1, 1, 4, 256)]
SANITIZE = [(3, MAIN, 2, 9, 64, "tile"), (4, MAIN, 1, 5, 33, "scalar"), (9, MAIN, 1, 2, 64, "split"),
            (2, EIGHT, 1, 2, 8192, "warp")]
SANITIZE_RETRIEVAL = [(9, 1, 1, 4, 256), (3, 2, 3, 2, 41)]


def judged(got, eager, ref, dtype_name: str) -> dict:
    v = verdict.judge(got.double().cpu().numpy(), eager.double().cpu().numpy(), ref.double().cpu().numpy(), dtype_name)
    return dict(err=v.error, eager_err=v.eager_error, bound=v.bound, ok=v.passed)


def check_fused_case(lib, n, ks, B, T, d, path, dtype_name, device) -> dict:
    dt = DTYPES[dtype_name]
    inp = random_fused_mixer_inputs(n, B, T, d, ks, dtype=dt, device=device, seed=n * 1000 + d)
    got = lib.fused_mixer(**inp)
    if got.is_cuda:
        torch.cuda.synchronize()
    res = judged(got, eager_fused_mixer(**inp).to(dt), reference_fused_mixer64(**inp), dtype_name)
    return dict(op="FusedMixer", path=path, n=n, stream_kernels=ks, B=B, T=T, d=d, dtype=dtype_name, **res)


def check_retrieval_case(lib, n, B, T, m, d, dtype_name, device) -> dict:
    dt = DTYPES[dtype_name]
    g = torch.Generator().manual_seed(n * 100 + d)
    q = (2.0 / d**0.5 * torch.randn(m, d, generator=g)).to(dt)
    views = [torch.randn(B, T, m, d, generator=g).to(dt) for _ in range(n)]
    got = lib.depth_retrieval(q.to(device), [v.to(device) for v in views], 1e-6)
    res = judged(got, eager_depth_retrieval(q, views, 1e-6).to(dt), reference_depth_retrieval64(q, views, 1e-6),
                 dtype_name)
    return dict(op="DepthRetrieval", n=n, B=B, T=T, m=m, d=d, dtype=dtype_name, **res)


def fmt_row(r: dict) -> str:
    if r["op"] == "prefill paths":
        cached = f"cached views {r['cached_ms']:8.3f} ms -> {r['faster']}" if "cached_ms" in r else "cached: too big"
        return (f"time {r['op']:<16} {r['dtype']:<8} n={r['n']:>3} B={r['B']:>3} T={r['T']:>5} d={r['d']:>5}  "
                f"fused {r['fused_ms']:8.3f} ms ({r['fused_gbs']:7.1f} GB/s, {100 * r['fused_copy_fraction']:4.1f}% of "
                f"copy, {r['fused_vs_model']:5.2f}x model)  {cached}  [{r['timer']}]")
    if r["op"] == "decode retrieval":
        return (f"time {r['op']:<16} {r['dtype']:<8} n={r['n']:>3} B={r['B']:>3} m={r['m']} d={r['d']:>5}  "
                f"{1e3 * r['retrieval_ms']:8.1f} us ({r['retrieval_gbs']:7.1f} GB/s, "
                f"{100 * r['retrieval_copy_fraction']:4.1f}% of copy, {r['retrieval_vs_model']:5.2f}x model)  [{r['timer']}]")
    shape = f"n={r['n']:>3} B={r['B']:>3} T={r['T']:>5} d={r['d']:>5}"
    shape += f" m={r['m']}" if "m" in r else f" k={r['stream_kernels']} [{r['path']}]"
    return (f"{'ok  ' if r['ok'] else 'FAIL'} {r['op']:<14} {r['dtype']:<8} {shape:<70} "
            f"err {r['err']:.2e} (eager {r['eager_err']:.2e}, bound {r['bound']:.2e})")


def run_correctness(lib, device, fused, retrieval, dtypes, results):
    for case in fused:
        for dt in dtypes:
            results.append(check_fused_case(lib, *case, dt, device))
            print(fmt_row(results[-1]), flush=True)
    for case in retrieval:
        for dt in dtypes:
            results.append(check_retrieval_case(lib, *case, dt, device))
            print(fmt_row(results[-1]), flush=True)


def run_profile(lib, device):
    """Each kernel once at a real shape, nothing else on the GPU in between (ncu -k picks them)."""
    dt = torch.bfloat16
    for n, ks, B, T, d in [(25, MAIN, 4, 1024, 2048), (97, MAIN, 1, 16, 4096), (2, EIGHT, 1, 64, 8192)]:
        inp = random_fused_mixer_inputs(n, B, T, d, ks, dtype=dt, device=device, seed=1)
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_push(f"FusedMixer n={n} B={B} T={T} d={d} m={len(ks)}")
        lib.fused_mixer(**inp)
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
    q = torch.randn(4, 4096, device=device, dtype=dt) * 0.03
    views = [torch.randn(1, 1, 4, 4096, device=device, dtype=dt) for _ in range(97)]
    lib.depth_retrieval(q, views, 1e-6)
    torch.cuda.synchronize()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", help="CUDA build of the kernels (libmsar_kernels.so)")
    ap.add_argument("--emulation", help="CPU emulation build instead (tiny shapes, no timing)")
    ap.add_argument("--out", default="build/gpu_check/results.json")
    ap.add_argument("--quick", action="store_true", help="correctness only, no timing")
    ap.add_argument("--sanitize", action="store_true", help="tiny cases of every path, float32 and bfloat16")
    ap.add_argument("--profile", action="store_true", help="each kernel once at a real shape, no checks")
    ap.add_argument("--dry-run", action="store_true", help="with --emulation: the timing and report code too, on the "
                    "CPU at tiny shapes (host timers: proves the code, measures nothing)")
    a = ap.parse_args(argv)
    if not (a.lib or a.emulation):
        ap.error("give --lib or --emulation")
    if a.dry_run and not a.emulation:
        ap.error("--dry-run runs on the emulation build: give --emulation")

    results = []
    t_start = time.perf_counter()
    if a.emulation:
        lib, device = KernelLibrary(a.emulation), "cpu"
        env = {"device": "cpu emulation", "torch": torch.__version__}
        run_correctness(lib, device, EMULATION_CORRECTNESS, EMULATION_RETRIEVAL, DTYPES, results)
        if a.dry_run:
            run_timing(lib, device, env, results, t_start, dry_run=True)
    else:
        if not torch.cuda.is_available():
            print("skipped: no CUDA device")
            return 0
        lib, device = KernelLibrary(a.lib), torch.device("cuda")
        if a.profile:
            run_profile(lib, device)
            return 0
        props = torch.cuda.get_device_properties(device)
        env = {"device": props.name, "capability": f"{props.major}.{props.minor}", "memory_gb": props.total_memory / 1e9,
               "sm_count": props.multi_processor_count, "torch": torch.__version__, "torch_cuda": torch.version.cuda,
               "python": platform.python_version()}
        print(f"# {props.name} (sm_{props.major}{props.minor}, {props.multi_processor_count} SMs), "
              f"torch {torch.__version__}, CUDA {torch.version.cuda}")
        print("# correctness: msar_export.verdict against float64 (bound = 4 x eager's own error + floor)")
        if a.sanitize:
            run_correctness(lib, device, SANITIZE, SANITIZE_RETRIEVAL, ("float32", "bfloat16"), results)
        else:
            run_correctness(lib, device, CORRECTNESS, RETRIEVAL, DTYPES, results)
        if not (a.quick or a.sanitize):
            run_timing(lib, device, env, results, t_start)

    failed = [r for r in results if not r.get("ok", True)]
    summary = dict(environment=env, results=results, failed=len(failed), seconds=time.perf_counter() - t_start)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2) + "\n")
    checked = [r for r in results if "ok" in r]
    print(f"# {len(checked) - len(failed)}/{len(checked)} checks passed in {summary['seconds']:.0f} s; results: {out}")
    return 1 if failed else 0


def run_timing(lib, device, env, results, t_start, dry_run: bool = False):
    from gpu_timing import copy_bandwidth_gbs, time_decode, time_prefill_paths

    prefill, decode = (DRY_PREFILL, DRY_DECODE) if dry_run else (PREFILL, DECODE)
    copy_gbs, timer = copy_bandwidth_gbs(device, nbytes=(1 << 20) if dry_run else (2 << 30))
    env["copy_gbs"], env["timer"] = copy_gbs, timer
    results.append(dict(op="copy bandwidth", gbs=copy_gbs, timer=timer))
    print(f"# timing: {timer}, per call; device-to-device copy {copy_gbs:.0f} GB/s (the measured HBM ceiling); "
          "fused bytes = sources read once + output written; cached = views read once + z written; "
          "'x model' = time / scripts/kernel_model.py's estimate")
    jobs = [(time_prefill_paths, (*c, torch.bfloat16)) for c in prefill]
    jobs += [(time_prefill_paths, (*c, torch.float32)) for c in prefill[:1]]
    jobs += [(time_decode, (n, B, m, d, DECODE_DTYPE)) for n, B, m, d in decode]
    for fn, args in jobs:
        if time.perf_counter() - t_start > TIME_BUDGET_S:
            print(f"# time budget ({TIME_BUDGET_S} s) used up: skipping {fn.__name__}{args}")
            env.setdefault("skipped_for_time", []).append([fn.__name__, *map(str, args)])
            continue
        results.append(fn(lib, *args, device, copy_gbs))
        print(fmt_row(results[-1]), flush=True)


if __name__ == "__main__":
    sys.exit(main())
