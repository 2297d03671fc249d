"""Random op inputs and the error metric the kernel checks share."""

from __future__ import annotations

import torch

from .. import verdict


def random_fused_mixer_inputs(n: int, B: int, T: int, d: int, stream_kernels, dtype=torch.float32, device="cpu",
                              seed: int = 0, extra_rows: int = 1) -> dict:
    """Inputs with every parameter non-trivial; scores of order one (query ~ 2/sqrt(d))."""
    g = torch.Generator().manual_seed(seed)
    m, K = len(stream_kernels), sum(stream_kernels[1:])

    def rnd(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=g)).to(dtype=dtype, device=device).contiguous()

    return dict(
        query=rnd(m, d, scale=2.0 / d**0.5),
        gate_weight=rnd(m, m * d, scale=1.0 / (m * d) ** 0.5),
        gate_bias=rnd(m, scale=0.5),
        gate_scale=(1.0 + torch.rand((), generator=g)).to(dtype=dtype, device=device),
        # drawn [N, d, K] and laid out [N, K, d]: the same taps per (source, channel) as before issue 23
        conv_weight=rnd(n + extra_rows, d, K, scale=0.5).transpose(1, 2).contiguous(),
        sources=[rnd(B, T, d) for _ in range(n)],
        stream_kernels=list(stream_kernels),
        eps=1e-6,
    )


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    """The project's one metric (msar_export.verdict.rel_err) on torch tensors of any dtype."""
    return verdict.rel_err(got.detach().double().cpu().numpy(), ref.detach().double().cpu().numpy())
