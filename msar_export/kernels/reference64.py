"""Independent float64 implementations of MSAR_SPEC 1.1-1.3, what the kernels' outputs are measured against."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def split_conv_weight(conv_weight: torch.Tensor, i: int, stream_kernels) -> list[torch.Tensor]:
    """Row i of conv_weight [N, K, d] -> Conv1d weights [d, 1, k] for streams 1..m-1."""
    out, off = [], 0
    for k in stream_kernels[1:]:
        out.append(conv_weight[i, off:off + k, :].t().unsqueeze(1))
        off += k
    return out


def reference_fused_mixer64(query, gate_weight, gate_bias, gate_scale, conv_weight, sources, stream_kernels, eps):
    """MSAR_SPEC 1.1-1.3 written out in float64 -> h float64."""
    T = sources[0].shape[1]
    views = []
    for i, x in enumerate(sources):
        x = x.double()
        streams = [x]
        for w in split_conv_weight(conv_weight.double(), i, stream_kernels):
            k = w.shape[-1]
            xp = F.pad(x, (0, 0, k - 1, 0))  # zeros before the sequence start
            streams.append(sum(xp[:, j:j + T] * w[:, 0, j] for j in range(k)))  # tap j: token t-(k-1-j)
        views.append(torch.stack(streams, dim=2))
    V = torch.stack(views)  # (n, B, T, m, d)
    keys = V / torch.sqrt((V * V).mean(-1, keepdim=True) + eps)
    alpha = torch.softmax((keys * query.double()).sum(-1), dim=0)  # (n, B, T, m)
    z = (alpha.unsqueeze(-1) * V).sum(0)  # (B, T, m, d)
    return reference_stream_gate64(gate_weight, gate_bias, gate_scale, z)


def reference_stream_gate64(gate_weight, gate_bias, gate_scale, z):
    """MSAR_SPEC 1.3 in float64: z (B, T, m, d) -> h (B, T, d)."""
    z = z.double()
    logits = z.flatten(-2) @ gate_weight.double().T  # (B, T, m)
    g = torch.sigmoid(gate_scale.double() * logits + gate_bias.double())
    return (g.unsqueeze(-1) * z).sum(-2)


def reference_depth_retrieval64(query, views, eps):
    V = torch.stack([v.double() for v in views])
    keys = V / torch.sqrt((V * V).mean(-1, keepdim=True) + eps)
    alpha = torch.softmax((keys * query.double()).sum(-1), dim=0)
    return (alpha.unsqueeze(-1) * V).sum(0)


def _zero_padded64(source, mask):
    """source (B, T, d) in float64 with padded tokens (mask (B, T) zero, or no mask: none) as zero rows."""
    x = source.double()
    return x if mask is None else torch.where(torch.as_tensor(mask)[..., None] != 0, x, 0.0)


def reference_source_views64(conv_weight, state, index, source, stream_kernels, mask=None):
    """SourceViews in float64: source (B, T, d), padded tokens (mask zero) as zeros, after state[index]
    (state: S, B, kmax-1, d), taps conv_weight (K, d) -> views (B, T, m, d)."""
    window, conv_weight = torch.cat([state[index].double(), _zero_padded64(source, mask)], dim=1), conv_weight.double()
    kmax = max(stream_kernels)
    T = window.shape[1] - (kmax - 1)
    streams, off = [window[:, kmax - 1:]], 0
    for k in stream_kernels[1:]:
        x = window[:, kmax - k:]  # the last k-1 positions of history, then the tokens
        streams.append(sum(x[:, j:j + T] * conv_weight[off + j] for j in range(k)))  # tap j: token t-(k-1-j)
        off += k
    return torch.stack(streams, dim=2)


def reference_conv_state64(past, sources, mask=None):
    """ConvState in float64: per source, the last kmax-1 positions of [past[i]; sources[i]] (padded
    tokens, mask zero, as zero rows), row by row."""
    keep = past.shape[2]
    out = torch.empty(past.shape, dtype=torch.float64)
    for i, x in enumerate(sources):
        rows = list(past[i].double().unbind(1)) + list(_zero_padded64(x, mask).unbind(1))  # (B, d) per position
        for r in range(keep):
            out[i, :, r] = rows[len(rows) - keep + r]
    return out


def _views64(x, conv_weight_row, stream_kernels):
    """(B, T, d) source, (K, d) taps -> (B, T, m, d) float64 views, zeros before the sequence start."""
    x, w = x.double(), conv_weight_row.double()
    T = x.shape[1]
    streams, off = [x], 0
    for k in stream_kernels[1:]:
        xp = F.pad(x, (0, 0, k - 1, 0))
        streams.append(sum(xp[:, j:j + T] * w[off + j] for j in range(k)))  # tap j: token t-(k-1-j)
        off += k
    return torch.stack(streams, dim=2)


def reference_source_scores64(conv_weight, queries, source, stream_kernels, eps):
    """SourceScores in float64: taps (K, d), queries (P, m, d), source (B, T, d) -> scores (P, B, T, m)."""
    V = _views64(source, conv_weight, stream_kernels)  # (B, T, m, d)
    keys = V / torch.sqrt((V * V).mean(-1, keepdim=True) + eps)
    return torch.einsum("btrd,prd->pbtr", keys, queries.double())


def reference_scored_mixer64(gate_weight, gate_bias, gate_scale, conv_weight, scores, sources, stream_kernels):
    """ScoredMixer in float64: scores (n, B, T, m), sources n x (B, T, d) -> h (B, T, d)."""
    V = torch.stack([_views64(x, conv_weight[i], stream_kernels) for i, x in enumerate(sources)])  # (n, B, T, m, d)
    alpha = torch.softmax(scores.double(), dim=0)
    z = (alpha.unsqueeze(-1) * V).sum(0)
    return reference_stream_gate64(gate_weight, gate_bias, gate_scale, z)
