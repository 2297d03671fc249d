"""The model's own mixing code (msar_export.model.mixing, float32 inside like
the kernels) applied to the ops' inputs."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .reference64 import split_conv_weight


def eager_fused_mixer(query, gate_weight, gate_bias, gate_scale, conv_weight, sources, stream_kernels, eps):
    """The model's own mixer code (float32 inside) on the op's inputs -> h float32."""
    from ..model.layers import rms_normalize
    from ..model.mixing import causal_conv, depth_retrieval, stream_fusion

    views = []
    for i, x in enumerate(sources):
        xf = x.float()
        streams = [xf]
        for w in split_conv_weight(conv_weight, i, stream_kernels):
            k = w.shape[-1]
            streams.append(causal_conv(F.pad(xf, (0, 0, k - 1, 0)), w.float()))
        views.append(torch.stack(streams, dim=2))
    keys = [rms_normalize(v, eps) for v in views]
    z = depth_retrieval(query, torch.stack(views), torch.stack(keys))
    return stream_fusion(z, gate_weight, gate_bias, gate_scale)


def eager_depth_retrieval(query, views, eps):
    from ..model.layers import rms_normalize
    from ..model.mixing import depth_retrieval

    V = torch.stack([v.float() for v in views])
    return depth_retrieval(query, V, rms_normalize(V, eps))
