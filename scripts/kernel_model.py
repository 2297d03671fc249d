"""The roofline model of docs/kernels.md as code, so that every timed row of
scripts/gpu_check.py carries the model's estimate next to the measurement and
docs/kernels.md's rows can be regenerated from the same numbers
(`python scripts/kernel_model.py`). ESTIMATES, not measurements: the
per-element costs come from `ptxas -v` / SASS counts, the bandwidths from the
vendor (L2 assumed, NVIDIA publishes none).

time = max(instructions / issue rate, L2 bytes / L2 bandwidth, HBM bytes / HBM bandwidth),
the issue rate scaled by the warps a launch keeps on each SM (fusedMixerPlan.h's cost model), the
bandwidths by the fraction of SMs it occupies.
"""

from __future__ import annotations

import math

H200 = dict(hbm=4.8e12, l2=7e12, issue=33.5e12, sms=132, clock=1.98e9, l2_to_sm=127e9, smem_optin=227 * 1024)
# The plan's cost model (plugins/msarFusedMixerPlugin/fusedMixerPlan.h, modelMixerClocks; a test checks these are
# its constants): SASS instructions per element-token of each kernel, and an SM at full issue from 16 resident warps
# on (8 warps, the tile kernel's one ~130 KB block per SM, get about half: issue 23, item 7).
TILE_INSTR = 320  # tile kernel, bf16, 2 tokens x 4 channels per thread
WARP_INSTR = 550  # warp kernel, bf16, 4 tokens x 1 channel per lane, both passes
WARPS_FULL_ISSUE = 16
WARP_RESIDENT = {2: 16, 4: 12, 8: 12}  # warp kernel: 128 / 168 / 168 registers per lane
WARP_TOKENS = {2: 8, 4: 4, 8: 1}
TILE_WINDOW_L2 = 26  # source window bytes per element-token from L2
WARP_L2 = 47  # warp kernel: taps 24, gate weights 8, window 15 bytes per element-token
RETRIEVAL_INSTR = 8  # per view element, both passes (DepthRetrieval, 16-byte loads)
RETRIEVAL_PASS1_INSTR = 4.4  # per view element, pass 1 alone (each decode slice repeats it)
MAX_SPLITS = 16  # fusedMixerPlan.h kMaxSplits
SPLIT_BUDGET = 32 << 20  # fusedMixerPlan.h kSplitBudgetBytes
DECODE_THREADS_CHUNKS = 32  # depthRetrievalKernel.cu: at least 32 chunks per slice


def prefill_bytes(n: int, B: int, T: int, d: int, elt: int) -> int:
    """n inputs of [B, T, d] read once, one written."""
    return (n + 1) * B * T * d * elt


def decode_bytes(n: int, B: int, m: int, d: int, elt: int) -> int:
    return prefill_bytes(n, B, 1, m * d, elt)


def copy_row_bytes(nbytes: int) -> int:
    """A device-to-device copy reads and writes every byte."""
    return 2 * nbytes


def _occupied(blocks: int, sms: int) -> float:
    return min(1.0, blocks / sms) if blocks > 0 else 1.0


def _bucket(m: int) -> int:
    return 2 if m <= 2 else 4 if m <= 4 else 8


def tile_plan(elt: int, m: int, d: int, optin: int = H200["smem_optin"]):
    """fusedMixerPlan.h planTile's tokens per block, threads and shared memory (aligned pointers), or None."""
    mb = _bucket(m)
    for ts in (4, 2, 1):
        v = min(16 // elt, max(1, 32 // (mb * ts)))
        vec = v if d % v == 0 else 1
        threads = min(256, math.ceil(math.ceil(d / vec) / 32) * 32)
        smem = 4 * (ts * m * d + threads + 5 * mb * ts + MAX_SPLITS * mb * ts)
        if mb * ts <= 16 and smem <= optin:
            return ts, threads, smem
    return None


def issue_fraction(resident_warps: float, launched_warps: float, sms: int) -> float:
    return min(1.0, min(resident_warps, launched_warps / sms) / WARPS_FULL_ISSUE)


def fused_us(n: int, B: int, T: int, d: int, m: int, elt: int, K: int = 24, hw=H200, kernel: str | None = None) -> float:
    """FusedMixer as the plan runs it: the tile or the warp kernel, whichever the plan's issue model rates faster
    (fusedMixerPlan.h), then max(issue, L2, HBM) for that kernel; K taps per channel. A throughput model: the idle
    SMs of a last partial wave are not counted. kernel="tile" or "warp": that kernel's cost whatever the plan picks."""
    mb = _bucket(m)
    plan = tile_plan(elt, m, d, hw["smem_optin"])
    costs = []
    if plan and kernel != "warp":
        ts, threads, smem = plan
        tiles = B * math.ceil(T / ts)
        slot = 4 * (ts * m * d + 2 * mb * ts)
        slots = min(256 * 4 * (4 * m * d + 2 * 8 * 4), SPLIT_BUDGET) // slot
        splits = min(MAX_SPLITS, n // 2, math.ceil(2 * hw["sms"] / tiles), slots // tiles) if tiles < 2 * hw["sms"] else 1
        blocks = tiles * max(1, splits)
        warps = threads // 32
        resident = max(1, min(hw["smem_optin"] // smem, 2048 // threads)) * warps
        E = n * tiles * ts * d
        issue = E * TILE_INSTR / (hw["issue"] * issue_fraction(resident, blocks * warps, hw["sms"]))
        l2 = E * (K * elt / ts * 2 + TILE_WINDOW_L2)
        occ = _occupied(blocks, hw["sms"])
        costs.append((issue, max(issue, l2 / hw["l2"] / occ, prefill_bytes(n, B, T, d, elt) / hw["hbm"] / occ)))
    if kernel == "tile":
        return 1e6 * costs[0][1]
    ts = WARP_TOKENS[mb]
    warps = B * math.ceil(T / ts)
    E = n * warps * ts * d
    issue = E * WARP_INSTR / (hw["issue"] * issue_fraction(WARP_RESIDENT[mb], warps, hw["sms"]))
    occ = _occupied(warps, hw["sms"])
    costs.append((issue, max(issue, E * WARP_L2 / hw["l2"] / occ, 2 * prefill_bytes(n, B, T, d, elt) / hw["hbm"] / occ)))
    return 1e6 * min(costs)[1]


def retrieval_us(n: int, B: int, T: int, d: int, m: int, elt: int, hw=H200) -> float:
    """DepthRetrieval over cached views at prefill sizes (rows plenty, one slice): two passes over the views."""
    elems = n * B * T * m * d
    t = max(elems * RETRIEVAL_INSTR / hw["issue"], (2 * elems + B * T * m * d) * elt / hw["hbm"])
    return 1e6 * t


def decode_us(n: int, B: int, d: int, m: int, elt: int, hw=H200) -> float:
    """DepthRetrieval at decode: rows = B*m, each split into channel slices whose blocks all walk the whole row
    in pass 1; bound by one block's issue or L2-to-SM time, the aggregate L2 traffic, or HBM."""
    rows = B * m
    chunks = d // (16 // elt)
    target = 2 * hw["sms"]
    slices = min(math.ceil(target / rows), max(1, chunks // DECODE_THREADS_CHUNKS)) if rows < target else 1
    blocks = rows * slices
    row_bytes = n * d * elt
    per_block = max(n * d * RETRIEVAL_PASS1_INSTR / (128 * hw["clock"]), row_bytes / hw["l2_to_sm"])
    t = max(per_block * math.ceil(blocks / hw["sms"]), blocks * row_bytes / hw["l2"],
            decode_bytes(n, B, m, d, elt) / hw["hbm"])
    return 1e6 * t


def estimate_us(kind: str, n: int, B: int, T: int, d: int, m: int, elt: int, K: int = 24) -> float:
    if kind == "fused":
        return fused_us(n, B, T, d, m, elt, K)
    if kind == "retrieval":
        return retrieval_us(n, B, T, d, m, elt)
    if kind == "decode":
        return decode_us(n, B, d, m, elt)
    raise ValueError(kind)


def doc_rows() -> list[str]:
    """docs/kernels.md's estimated rows (H200), n = 97, d = 4096, m = 4 unless noted."""
    out = []
    for T in (16, 1024, 1056, 1057):
        out.append(f"prefill B=1 T={T} bf16: fused ~{fused_us(97, 1, T, 4096, 4, 2):,.0f} us "
                   f"(warp kernel ~{fused_us(97, 1, T, 4096, 4, 2, kernel='warp'):,.0f} us), "
                   f"cached views ~{retrieval_us(97, 1, T, 4096, 4, 2):,.0f} us")
    out.append(f"prefill B*T=65536 n=25 d=2048 bf16: fused ~{fused_us(25, 1, 65536, 2048, 4, 2) / 1e3:,.1f} ms, "
               f"cached views ~{retrieval_us(25, 1, 65536, 2048, 4, 2) / 1e3:,.1f} ms")
    for B in (1, 4, 16, 64):
        out.append(f"decode B={B}: float32 views ~{decode_us(97, B, 4096, 4, 4):,.1f} us, "
                   f"bf16 views ~{decode_us(97, B, 4096, 4, 2):,.1f} us")
    return out


if __name__ == "__main__":
    print("\n".join(doc_rows()))
