"""The roofline model of docs/kernels.md as code, so that every timed row of
scripts/gpu_check.py carries the model's estimate next to the measurement and
docs/kernels.md's rows can be regenerated from the same numbers
(`python scripts/kernel_model.py`). ESTIMATES, not measurements: the
per-element costs come from `ptxas -v` / SASS counts, the bandwidths from the
vendor (L2 assumed, NVIDIA publishes none).

time = max(instructions / issue rate, L2 bytes / L2 bandwidth, HBM bytes / HBM bandwidth),
each divided by the fraction of SMs a launch occupies.
"""

from __future__ import annotations

import math

H200 = dict(hbm=4.8e12, l2=7e12, issue=33.5e12, sms=132, clock=1.98e9, l2_to_sm=127e9)
TILE_THREADS_ISSUE = 0.5  # one ~130 KB block (8 warps) per SM: about half the issue rate (issue 23, item 7)
TILE_INSTR = 320  # SASS instructions per element-token, tile kernel, bf16, 2 tokens x 4 channels per thread
TILE_WINDOW_L2 = 26  # source window bytes per element-token from L2
RETRIEVAL_INSTR = 8  # per view element, both passes (DepthRetrieval, 16-byte loads)
RETRIEVAL_PASS1_INSTR = 4.4  # per view element, pass 1 alone (each decode slice repeats it)
MAX_SPLITS = 16  # fusedMixerPlan.h kMaxSplits
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


def fused_us(n: int, B: int, T: int, d: int, m: int, elt: int, K: int = 24, hw=H200) -> float:
    """FusedMixer, the tile kernel's cost; K taps per channel. NB: fusedMixerPlan.h still switches to the warp kernel
    above 8 tokens per SM (issue 23 defect 6, open): rows past that (T = 1,057 at B = 1) are the tile kernel's
    estimate, not what runs today."""
    ts = 2 if elt == 2 else 1  # tokens per block the plan picks for the 4-stream bucket (fusedMixerPlan.h)
    E = n * B * T * d
    l2 = E * (K * elt / ts * 2 + TILE_WINDOW_L2)
    tiles = B * math.ceil(T / ts)
    splits = min(MAX_SPLITS, max(1, n // 2), math.ceil(2 * hw["sms"] / tiles)) if tiles < 2 * hw["sms"] else 1
    occ = _occupied(tiles * splits, hw["sms"])
    t = max(E * TILE_INSTR / (hw["issue"] * TILE_THREADS_ISSUE), l2 / hw["l2"], prefill_bytes(n, B, T, d, elt) / hw["hbm"])
    return 1e6 * t / occ


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
        out.append(f"prefill B=1 T={T} bf16: fused ~{fused_us(97, 1, T, 4096, 4, 2):,.0f} us, "
                   f"cached views ~{retrieval_us(97, 1, T, 4096, 4, 2):,.0f} us")
    out.append(f"prefill B*T=65536 n=25 d=2048 bf16: fused ~{fused_us(25, 1, 65536, 2048, 4, 2) / 1e3:,.1f} ms, "
               f"cached views ~{retrieval_us(25, 1, 65536, 2048, 4, 2) / 1e3:,.1f} ms")
    for B in (1, 4, 16, 64):
        out.append(f"decode B={B}: float32 views ~{decode_us(97, B, 4096, 4, 4):,.1f} us, "
                   f"bf16 views ~{decode_us(97, B, 4096, 4, 2):,.1f} us")
    return out


if __name__ == "__main__":
    print("\n".join(doc_rows()))
