"""MSAR depth mixing (MSAR_SPEC.md 1.1-1.3): source expansion, per-stream
retrieval over depth, scalar stream fusion.  All of it runs in float32."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .layers import f32



class SourceExpansion(nn.Module):
    """Views of one source x_i: the identity plus one causal depthwise conv per
    stream r >= 1.  Weights `sources.{i}.conv.{r}.weight` in Conv1d layout
    [d, 1, k], so tap delta (0 = current token) is w[:, 0, k-1-delta]."""

    def __init__(self, d: int, conv_kernels: tuple[int, ...]):
        super().__init__()
        self.conv = nn.ModuleDict(
            {str(r): nn.Conv1d(d, d, k, groups=d, bias=False) for r, k in enumerate(conv_kernels, start=1)}
        )

    def forward(self, x: torch.Tensor, history: torch.Tensor | None = None, conv_op: bool = False) -> torch.Tensor:
        """x (B,T,d) -> views (B,T,m,d) float32.  `history` (B,H,d) holds the H
        positions before x (the convolution state); None means sequence start.

        conv_op: one depthwise Conv per stream (_merged_conv) instead of k
        shifted multiply-adds (the exporter's choice: 1 ONNX Conv instead of
        about 3k nodes per stream, and faster in ONNX Runtime; eager training
        keeps the shifted form, faster on CPU forward and backward)."""
        x = f32(x)
        if conv_op and self.conv:
            return torch.cat([x.unsqueeze(2), self._merged_conv(x, history)], dim=2)
        views = [x]
        for conv in self.conv.values():
            k = conv.kernel_size[0]
            if history is None:
                window = F.pad(x, (0, 0, k - 1, 0))  # zeros before the sequence start
            else:
                window = torch.cat([f32(history)[:, history.shape[1] - (k - 1) :], x], dim=1)
            views.append(causal_conv(window, f32(conv.weight)))
        return torch.stack(views, dim=2)  # (B, T, m, d)

    def _merged_conv(self, x: torch.Tensor, history: torch.Tensor | None) -> torch.Tensor:
        """Every conv stream of x (B, T, m-1, d) over one window with kmax-1 positions of history, each
        stream one depthwise 2-D Conv (height 1, taps right-aligned in a kmax-wide kernel, zeros in
        front). ONNX Runtime runs a depthwise Conv with one output per channel in 2-D form on its
        depthwise path; a 1-D Conv, or all streams in one Conv as its depth multiplier, becomes one
        small GEMM per channel: 3x slower for a batch-8 decode step (docs/ort_kernels.md)."""
        convs = list(self.conv.values())
        kmax, d = max(c.kernel_size[0] for c in convs), x.shape[-1]
        if history is None:
            window = F.pad(x, (0, 0, kmax - 1, 0))
        else:
            window = torch.cat([f32(history)[:, history.shape[1] - (kmax - 1):], x], dim=1)
        planes = window.transpose(1, 2).unsqueeze(2)  # (B, d, 1, T + kmax - 1)
        ys = [F.conv2d(planes, F.pad(f32(c.weight), (kmax - c.kernel_size[0], 0)).unsqueeze(2), groups=d) for c in convs]
        return torch.cat(ys, dim=2).permute(0, 3, 2, 1)  # (B, d, m-1, T) -> (B, T, m-1, d)


def causal_conv(window: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Depthwise conv over window (B, k-1+T, d) with Conv1d weight (d, 1, k) -> (B, T, d).

    Written as k shifted multiply-adds: output t reads window[t .. t+k-1], and
    window position t+j is token t-(k-1-j), so tap j = w[:, 0, j] multiplies
    delta = k-1-j (MSAR_SPEC 1.1).  Faster than grouped conv1d on CPU, forward
    and backward, and exports to plain Mul/Add."""
    k = weight.shape[-1]
    T = window.shape[1] - (k - 1)
    out = window[:, 0:T] * weight[:, 0, 0]
    for j in range(1, k):
        out = out + window[:, j : j + T] * weight[:, 0, j]
    return out


def depth_retrieval(query: torch.Tensor, views: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """Per-stream softmax retrieval over depth.

    query (m,d); views (n,B,T,m,d) = x_i^(r) for sources i < l; keys = RMSNorm(views)
    (parameter-free, computed once per source since every later mixer reuses it)
    -> z (B,T,m,d).  s_i^(r) = q^(r) . keys_i^(r); alpha = softmax over i;
    z^(r) = sum_i alpha_i^(r) x_i^(r)."""
    scores = (keys * f32(query)).sum(-1)  # (n, B, T, m)
    alpha = torch.softmax(scores, dim=0)  # each stream normalises over depth on its own
    return (alpha.unsqueeze(-1) * views).sum(0)


def source_projections(views: torch.Tensor, queries: torch.Tensor, gate_weights: torch.Tensor | None, eps: float):
    """Everything later mixers need from one source's views, in one matmul.

    views (B,T,m,d); queries (Q,m,d) and gate_weights (Q,m,m*d) of the Q later
    mixers.  Returns scores (Q,B,T,m) = q^(r) . RMSNorm(x^(r)), written as
    (q . x) / rms(x), and gate parts (Q,B,T,m,m) with [.., r', r] = x^(r) . W[r', r-th d-block]:
    the fusion logits are linear in z = sum_i alpha_i x_i, so they are the
    alpha-weighted sum of these parts and z itself is never materialised."""
    B, T, m, d = views.shape
    Q = queries.shape[0]
    rinv = torch.rsqrt((views * views).mean(-1) + eps)  # (B, T, m)
    cols = [f32(queries).permute(1, 2, 0)]  # (m, d, Q)
    if gate_weights is not None:
        cols.append(f32(gate_weights).reshape(Q, m, m, d).permute(2, 3, 0, 1).reshape(m, d, Q * m))
    proj = torch.matmul(views.permute(2, 0, 1, 3).reshape(m, B * T, d), torch.cat(cols, dim=-1))  # (m, BT, Q(1+m))
    scores = proj[..., :Q].permute(2, 1, 0).reshape(Q, B, T, m) * rinv
    if gate_weights is None:
        return scores, None
    parts = proj[..., Q:].reshape(m, B, T, Q, m).permute(3, 1, 2, 4, 0)  # (Q, B, T, m', m)
    return scores, parts


def mix_from_projections(scores: torch.Tensor, parts: torch.Tensor | None, views: list[torch.Tensor],
                         gate_bias: torch.Tensor | None, gate_scale: torch.Tensor | None) -> torch.Tensor:
    """h_l from the l earlier sources: scores (l,B,T,m), parts (l,B,T,m,m) or None (no gate).

    alpha = softmax over depth; gate logits = sum_i sum_r alpha_i^(r) parts_i[., r];
    h = sum_i sum_r (g^(r) alpha_i^(r)) x_i^(r): each earlier view is read once."""
    alpha = torch.softmax(scores, dim=0)  # (l, B, T, m)
    coef = alpha
    if parts is not None:
        logits = (alpha.unsqueeze(-2) * parts).sum(dim=(0, -1))  # (B, T, m)
        g = torch.sigmoid(f32(gate_scale) * logits + f32(gate_bias))
        coef = alpha * g
    h = None
    for i, v in enumerate(views):
        term = torch.matmul(coef[i].unsqueeze(-2), v).squeeze(-2)  # (B, T, d)
        h = term if h is None else h + term
    return h


def stream_fusion(z: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """g = sigmoid(a * (flat(Z) W) + b), one scalar per stream; h = sum_r g^(r) z^(r).

    z (B,T,m,d) float32; weight (m, m*d) in nn.Linear layout -> h (B,T,d)."""
    flat = z.flatten(-2)  # streams in order [z^(0), ..., z^(m-1)]
    g = torch.sigmoid(f32(scale) * F.linear(flat, f32(weight)) + f32(bias))  # (B, T, m)
    return (g.unsqueeze(-1) * z).sum(dim=-2)


class DepthMixer(nn.Module):
    """Mixer l's parameters and its stream fusion; the retrieval over the
    views of x_0..x_{l-1} is `depth_retrieval` (done by the model's depth path).

    `attnres` is one identity stream without a gate; `msar` fuses m streams."""

    def __init__(self, d: int, n_streams: int, gated: bool):
        super().__init__()
        self.query = nn.Parameter(torch.zeros(n_streams, d))
        self.gated = gated
        if gated:
            self.gate = nn.Linear(n_streams * d, n_streams)
            self.gate_scale = nn.Parameter(torch.ones(()))

    def fuse(self, z: torch.Tensor) -> torch.Tensor:
        """z (B,T,m,d) retrieved streams, float32 -> h (B,T,d) float32."""
        if not self.gated:
            return z[:, :, 0]
        return stream_fusion(z, self.gate.weight, self.gate.bias, self.gate_scale)
