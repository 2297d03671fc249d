"""An independent float64 implementation of msar_lm, written from MSAR_SPEC.md
in numpy.  It reads the checkpoint's tensors by name and shares no code with
`msar_export`, so agreement with it means the package computes the spec."""

from __future__ import annotations

import numpy as np


def _rmsnorm(x, w, eps):
    y = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    return y if w is None else y * w


def _rope(x, pos, theta):
    # x (B, H, T, hd); rotate-half with inv_freq_j = theta^(-2j/hd)
    hd = x.shape[-1]
    inv = theta ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    ang = pos[:, None, :, None].astype(np.float64) * inv  # (B,1,T,hd/2)
    ang = np.concatenate([ang, ang], -1)
    x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
    return x * np.cos(ang) + np.concatenate([-x2, x1], -1) * np.sin(ang)


def _causal_conv(x, w):
    # x (B,T,d); w (d,1,k): y_t = sum_delta w[:,0,k-1-delta] * x_{t-delta}, zeros before t=0
    B, T, d = x.shape
    k = w.shape[-1]
    y = np.zeros_like(x)
    for delta in range(min(k, T)):  # taps reaching before t = 0 see zeros
        c = w[:, 0, k - 1 - delta]
        y[:, delta:] += c * x[:, : T - delta]
    return y


def reference_logits(cfg: dict, tensors: dict, input_ids: np.ndarray, return_hidden: bool = False):
    """Full-sequence logits (B,T,V) in float64; optionally every mixer output h_l."""
    P = {k: np.asarray(v, dtype=np.float64) for k, v in tensors.items()}
    d, H, Hkv = cfg["d_model"], cfg["n_heads"], cfg["n_kv_heads"]
    hd = d // H
    L = 2 * cfg["n_blocks"]
    kind = cfg["residual"]
    kernels = cfg["stream_kernels"]
    B, T = input_ids.shape
    pos = np.broadcast_to(np.arange(T), (B, T))
    causal = np.tril(np.ones((T, T), dtype=bool))

    def attention(l, h):
        x = _rmsnorm(h, P[f"layers.{l}.norm.weight"], cfg["norm_eps"])
        q = (x @ P[f"layers.{l}.wq.weight"].T).reshape(B, T, H, hd).transpose(0, 2, 1, 3)
        k = (x @ P[f"layers.{l}.wk.weight"].T).reshape(B, T, Hkv, hd).transpose(0, 2, 1, 3)
        v = (x @ P[f"layers.{l}.wv.weight"].T).reshape(B, T, Hkv, hd).transpose(0, 2, 1, 3)
        q, k = _rope(q, pos, cfg["rope_theta"]), _rope(k, pos, cfg["rope_theta"])
        rep = H // Hkv
        k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)  # head h uses kv head h // rep
        s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd)
        s = np.where(causal, s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        o = (p @ v).transpose(0, 2, 1, 3).reshape(B, T, H * hd)
        return o @ P[f"layers.{l}.wo.weight"].T

    def mlp(l, h):
        x = _rmsnorm(h, P[f"layers.{l}.norm.weight"], cfg["norm_eps"])
        g = x @ P[f"layers.{l}.w_gate.weight"].T
        return ((g / (1 + np.exp(-g))) * (x @ P[f"layers.{l}.w_up.weight"].T)) @ P[f"layers.{l}.w_down.weight"].T

    def views_of(i, x):
        if kind == "attnres":
            return [x]
        return [x] + [_causal_conv(x, P[f"sources.{i}.conv.{r}.weight"]) for r in range(1, len(kernels))]

    sources, views, hidden = [], [], []
    x = P["embed.weight"][input_ids]
    for l in range(1, L + 2):
        sources.append(x)
        if kind != "standard":
            views.append(views_of(l - 1, x))
        if kind == "standard":
            h = np.sum(sources, axis=0)
        else:
            m = len(views[0])
            z = []
            for r in range(m):
                q = P[f"mixers.{l}.query"][r]
                vals = np.stack([v[r] for v in views])  # (l, B, T, d)
                s = (_rmsnorm(vals, None, cfg["mixer_eps"]) * q).sum(-1)
                a = np.exp(s - s.max(0))
                a /= a.sum(0)
                z.append((a[..., None] * vals).sum(0))
            if kind == "attnres":
                h = z[0]
            else:
                flat = np.concatenate(z, -1)
                g = P[f"mixers.{l}.gate_scale"] * (flat @ P[f"mixers.{l}.gate.weight"].T) + P[f"mixers.{l}.gate.bias"]
                g = 1 / (1 + np.exp(-g))
                h = sum(g[..., r : r + 1] * z[r] for r in range(m))
        hidden.append(h)
        if l <= L:
            x = attention(l, h) if l % 2 == 1 else mlp(l, h)
    head = P["embed.weight"] if cfg["tie_embeddings"] else P["lm_head.weight"]
    logits = _rmsnorm(h, P["final_norm.weight"], cfg["norm_eps"]) @ head.T
    return (logits, hidden) if return_hidden else logits
