"""Sublayers of an msar_lm block: RMSNorm, rotary GQA attention, SwiGLU MLP."""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from ..config import MSARConfig


def f32(x: torch.Tensor) -> torch.Tensor:
    """x in the compute precision: float32, or float64 when the model runs in
    float64 (the reference every backend is judged against).  A no-op for
    float32 tensors, so the traced graph has no Cast node for it either."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def rms_normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    """Parameter-free RMSNorm in float32: x / sqrt(mean(x^2) + eps)."""
    x = f32(x)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (rms_normalize(x, self.eps) * f32(self.weight)).to(x.dtype)


def rotary_split(max_positions: int) -> int:
    """K of the two rotary tables: position p = (p // K) * K + p % K, K = ceil(sqrt(max_positions))."""
    return max(1, math.isqrt(max(int(max_positions) - 1, 0)) + 1)


@functools.lru_cache(maxsize=8)
def _rotary_tables_np(max_positions: int, head_dim: int, theta: float, np_dtype: str):
    k = rotary_split(max_positions)
    inv_freq = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)

    def table(positions):
        angles = positions[:, None] * inv_freq
        t = np.concatenate([np.cos(angles), np.sin(angles)], axis=-1).astype(np_dtype)
        t.flags.writeable = False
        return t

    coarse = table(np.arange(-(-int(max_positions) // k), dtype=np.float64) * k)
    return coarse, table(np.arange(k, dtype=np.float64))


_EAGER_TABLES: dict = {}


def rotary_table(max_positions: int, head_dim: int, theta: float, dtype: torch.dtype, device):
    """(coarse, fine): cos | sin of the angles of positions k*K and of 0..K-1, K about
    sqrt(max_positions), computed in float64 and rounded to `dtype`; inside torch.export
    they are constants.  `rotary_cos_sin` combines them by the angle-addition formulas.

    Two tables of about sqrt(max_seq_len) rows, not one row per position: a
    [max_seq_len, head_dim] float64 table built on every forward and embedded in the
    graph made a 19 KB checkpoint with max_seq_len 2**24 export a 537 MB ONNX file at
    2.9 GB peak (issue 22).  Still tables gathered by position, not angles computed
    from a Cast of the int64 positions: ONNX fp16 converters turn every float tensor
    into float16, and float16 angles are about 0.25 rad off at position 500, while
    float16 tables are within 5e-4 of every cos and sin (products of two: ~1e-3).  It
    also keeps int->float Cast nodes out of the graph, which those converters mistype.

    Eagerly the tensors are made once per (shape, dtype, device): decoding asks for
    them at every token.  Under a trace they are made fresh and never cached, since a
    tensor made there is a fake one."""
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"rotary table in {dtype}: the rotary angles are computed in float32 or float64")
    # Rounded in numpy: traced, a float64 constant would stay float64 behind a Cast.
    tables = _rotary_tables_np(int(max_positions), int(head_dim), float(theta), str(dtype).removeprefix("torch."))
    if torch.compiler.is_compiling() or torch.compiler.is_exporting():
        return tuple(torch.tensor(t, device=device) for t in tables)
    key = (int(max_positions), int(head_dim), float(theta), dtype, str(device))
    if key not in _EAGER_TABLES:
        _EAGER_TABLES[key] = tuple(torch.tensor(t, device=device) for t in tables)
    return _EAGER_TABLES[key]


def rotary_cos_sin(position_ids: torch.Tensor, tables) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape (B, 1, T, head_dim) for the rotate-half convention, in the tables' dtype:
    cos(a + b) = cos a cos b - sin a sin b, sin(a + b) = sin a cos b + cos a sin b, with a the
    angle of (p // K) * K and b that of p % K (integer ops: no int->float Cast in the graph)."""
    coarse, fine = tables
    k = fine.shape[0]
    ch, sh = F.embedding(position_ids // k, coarse)[:, None].chunk(2, dim=-1)  # (B, 1, T, hd/2) each
    cl, sl = F.embedding(position_ids % k, fine)[:, None].chunk(2, dim=-1)
    cos, sin = ch * cl - sh * sl, sh * cl + ch * sl
    return torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class AttentionSublayer(nn.Module):
    """f_l(h) = Attn_l(RMSNorm_l(h)) for odd l: causal GQA with rotary embeddings and a KV cache."""

    def __init__(self, cfg: MSARConfig):
        super().__init__()
        d, H, Hkv, hd = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.H, self.Hkv, self.hd = H, Hkv, hd
        self.norm = RMSNorm(d, cfg.norm_eps)
        self.wq = nn.Linear(d, H * hd, bias=False)
        self.wk = nn.Linear(d, Hkv * hd, bias=False)
        self.wv = nn.Linear(d, Hkv * hd, bias=False)
        self.wo = nn.Linear(H * hd, d, bias=False)

    def forward(self, h, cos, sin, bias, past_k=None, past_v=None):
        """h (B,T,d); bias (B,1,T,S) additive float32 mask; returns out, (k, v) of length S."""
        x = self.norm(h)
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, self.H, self.hd).transpose(1, 2)  # (B, H, T, hd)
        k = self.wk(x).view(B, T, self.Hkv, self.hd).transpose(1, 2)  # (B, Hkv, T, hd)
        v = self.wv(x).view(B, T, self.Hkv, self.hd).transpose(1, 2)
        q = apply_rotary(f32(q), cos, sin)
        k = apply_rotary(f32(k), cos, sin).to(x.dtype)
        if past_k is not None:
            k = torch.cat([past_k, k], dim=2)  # (B, Hkv, S, hd)
            v = torch.cat([past_v, v], dim=2)
        G = self.H // self.Hkv
        qg = q.view(B, self.Hkv, G, T, self.hd)  # query heads grouped by their kv head
        scores = qg @ f32(k)[:, :, None].transpose(-1, -2) * self.hd**-0.5  # (B, Hkv, G, T, S)
        probs = torch.softmax(scores + bias[:, :, None], dim=-1)
        out = (probs @ f32(v)[:, :, None]).reshape(B, self.H, T, self.hd)
        out = out.transpose(1, 2).reshape(B, T, self.H * self.hd).to(x.dtype)
        return self.wo(out), (k, v)


class MLPSublayer(nn.Module):
    """f_l(h) = MLP_l(RMSNorm_l(h)) for even l: w_down(silu(w_gate(x)) * w_up(x))."""

    def __init__(self, cfg: MSARConfig):
        super().__init__()
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.w_gate = nn.Linear(cfg.d_model, cfg.mlp_hidden, bias=False)
        self.w_up = nn.Linear(cfg.d_model, cfg.mlp_hidden, bias=False)
        self.w_down = nn.Linear(cfg.mlp_hidden, cfg.d_model, bias=False)

    def forward(self, h):
        x = self.norm(h)
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))
