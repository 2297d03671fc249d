"""Depth paths that emit `msar` custom nodes while torch.onnx traces the model.

`torch.onnx.ops.symbolic` records one node with the given domain, inputs and
attributes; it only means something inside an export (eagerly it returns a
placeholder), so these paths are used by the exporter alone."""

from __future__ import annotations

import torch

from ..model.lm import DepthPath, EagerDepthPath
from .contracts import DEPTH_RETRIEVAL, DOMAIN, DOMAIN_VERSION, FUSED_MIXER


def pack_conv_rows(convs_per_source) -> torch.Tensor:
    """(N, K, d), the FusedMixer contract's conv_weight: row i = source i's depthwise Conv1d taps for
    streams 1..m-1 back to back along K (Conv1d order), channels last. Channels last because it is what
    the kernels read (a warp's tap loads walk d): the bank is an initializer in that layout, so nothing
    is transposed or allocated at run time (issue 23 defect 3)."""
    return torch.stack([torch.cat([c.weight[:, 0, :] for c in convs], dim=1).t() for convs in convs_per_source])


def pack_conv_weights(model) -> torch.Tensor:
    """(L+1, K, d): the conv bank of every source of `model` (pack_conv_rows)."""
    return pack_conv_rows(model.sources[str(i)].conv.values() for i in range(model.cfg.n_sublayers + 1))


def depth_retrieval_op(query: torch.Tensor, views: list[torch.Tensor], cfg) -> torch.Tensor:
    # One type for every input (the op's type variable T, and the plugin's rule):
    # the views are float32 whatever the export dtype (model/mixing.py), so the
    # query goes in as float32 too, as the eager mixer computes it.
    query = query.to(views[0].dtype)
    return torch.onnx.ops.symbolic(
        f"{DOMAIN}::{DEPTH_RETRIEVAL.name}", [query, *views], DEPTH_RETRIEVAL.attribute_values(cfg),
        dtype=views[0].dtype, shape=views[0].shape, version=DOMAIN_VERSION,
    )


class FusedMixerPath(DepthPath):
    """msar prefill: every mixer is one FusedMixer node over the raw sources."""

    def __init__(self, model, history, source_mask, conv_bank: torch.Tensor):
        super().__init__(model, history, source_mask)
        self.conv_bank = conv_bank
        self.sources: list[torch.Tensor] = []

    def add_source(self, i, x):
        self.sources.append(x)

    def mix(self, l):
        mixer, cfg = self.model.mixers[str(l)], self.model.cfg
        x0 = self.sources[0]
        return torch.onnx.ops.symbolic(
            f"{DOMAIN}::{FUSED_MIXER.name}",
            [mixer.query, mixer.gate.weight, mixer.gate.bias, mixer.gate_scale, self.conv_bank, *self.sources],
            FUSED_MIXER.attribute_values(cfg), dtype=x0.dtype, shape=x0.shape, version=DOMAIN_VERSION,
        )


class RetrievalOpPath(EagerDepthPath):
    """attnres (prefill and decode) and msar decode: views are expanded once per
    source with standard ops (from the conv state when decoding), each mixer is
    a DepthRetrieval node, and msar's scalar gate fusion stays standard ops."""

    conv_op = True

    def add_source(self, i, x):
        self.views.append(self.expand(i, x))  # no keys: the op normalises them itself

    def mix(self, l):
        mixer, cfg = self.model.mixers[str(l)], self.model.cfg
        return mixer.fuse(depth_retrieval_op(mixer.query, self.views, cfg))
