"""How far a model's own float64 logits move when its weights move by float32's rounding.

A float32 backend rounds at every op, so its error against the float64 eager model can be no
smaller than what the model does with perturbations of that size.  `perturbation_spread`
measures that directly: the float64 model's logits with every weight multiplied by
(1 + scale * N(0, 1)), scale 1e-7 (float32's unit roundoff is 6e-8), against its own
unperturbed logits, over several draws.  Where the spread is as large as a backend's error,
the model's conditioning sets that error, not the backend (docs/ort_kernels.md,
"Function bodies: speed and precision": random checkpoints with sharp pseudo-queries at
depth move by 1e-2 - 3e-1; trained ones by 1e-7 - 1e-6).
"""

from __future__ import annotations

import torch

from ..verdict import rel_err

SCALE = 1e-7  # about float32's unit roundoff (2**-24 = 6e-8) times a few ops' worth


def perturbation_spread(model, input_ids: torch.Tensor, draws: int = 8, scale: float = SCALE,
                        seed: int = 5) -> list[float]:
    """rel_err of the float64 `model`'s logits with its weights perturbed, one per draw, against
    its own logits.  The weights are restored afterwards."""
    if model.dtype != torch.float64:
        raise ValueError(f"the model must be float64 (the reference), got {model.dtype}")
    params = dict(model.named_parameters())
    saved = {n: p.detach().clone() for n, p in params.items()}
    spread = []
    try:
        with torch.inference_mode():
            ref = model(input_ids).numpy()
            for k in range(draws):
                g = torch.Generator().manual_seed(seed + k)
                for n, p in params.items():
                    noise = torch.randn(p.shape, generator=g, dtype=torch.float64)
                    p.copy_(saved[n] * (1 + scale * noise))
                spread.append(rel_err(model(input_ids).numpy(), ref))
    finally:
        with torch.no_grad():
            for n, p in params.items():
                p.copy_(saved[n])
    return spread


__all__ = ["perturbation_spread", "SCALE"]
