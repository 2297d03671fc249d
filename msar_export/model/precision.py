"""The float64 reference run without a float64 copy of the whole model."""

from __future__ import annotations

import contextlib

import torch


@contextlib.contextmanager
def float64_one_sublayer_at_a_time(model):
    """Inside, `model` computes in float64 as `model.double()` would, but each
    sublayer's weights are float64 only while it runs; everything else (embedding,
    head, mixers, norms: a few per cent of a large model) is float64 throughout.
    Converting back is exact (float32 -> float64 -> float32 is the identity), so the
    model leaves as it came.  A float64 copy of a 318 M-parameter model is 2.5 GB
    beside its 1.3 GB of float32 weights; this costs one sublayer's."""
    dtype = model.dtype
    layers = list(model.layers.values())
    rest = [p for name, p in model.named_parameters() if not name.startswith("layers.")]

    def up(mod, args):  # a hook's return value would replace the inputs
        mod.to(torch.float64)

    def down(mod, args, out):
        mod.to(dtype)

    hooks = [h for layer in layers for h in (layer.register_forward_pre_hook(up), layer.register_forward_hook(down))]
    try:
        for p in rest:
            p.data = p.data.to(torch.float64)
        yield model
    finally:
        for h in hooks:
            h.remove()
        for p in rest:
            p.data = p.data.to(dtype)
        for layer in layers:
            layer.to(dtype)
