"""The modules torch.onnx traces: the prefill graph and the decode graph, with
the input/output names of MSAR_SPEC.md section 3."""

from __future__ import annotations

import functools

import torch
import torch.nn as nn

from ..model.lm import DecodeCache
from .custom_paths import (FusedMixerPath, RetrievalOpPath, ScoredMixerPath, conv_taps_name, later_queries,
                           mixer_queries_name, pack_conv_rows, pack_conv_weights)


class _Graph(nn.Module):
    """mixer_op: how an msar prefill graph mixes (ExportOptions.mixer_op); other graphs ignore it."""

    def __init__(self, model, custom_ops: bool, mixer_op: str = "fused"):
        super().__init__()
        self.model = model
        self.custom_ops = custom_ops and model.cfg.residual != "standard"
        self.mixer_op = mixer_op
        if self.custom_ops and mixer_op in ("fused", "scored") and model.cfg.residual == "msar":
            # One initializer shared by every FusedMixer / ScoredMixer node; each reads its first n rows.
            self.register_buffer("conv_bank", pack_conv_weights(model).detach().clone())
        self.n_taps = 0
        if self.custom_ops and model.cfg.residual == "msar" and (model.cfg.conv_kernels or mixer_op == "scored"):
            # One [K, d] initializer per source for its SourceViews node (decode, --mixer-op retrieval) or its
            # SourceScores node (--mixer-op scored, which takes [0, d] when there are no conv streams).
            for i in range(model.cfg.n_sublayers + 1):
                rows = pack_conv_rows([model.sources[str(i)].conv.values()], model.cfg.d_model, model.dtype)[0]
                self.register_buffer(conv_taps_name(i), rows.detach().clone())
            self.n_taps = model.cfg.n_sublayers + 1
        if self.custom_ops and mixer_op == "scored" and model.cfg.residual == "msar":
            # Per source i, the queries of the mixers that read it (SourceScores), in the model's dtype.
            L = model.cfg.n_sublayers
            for i in range(L + 1):
                queries = later_queries(lambda j: model.mixers[str(j)].query, i, L)
                self.register_buffer(mixer_queries_name(i), queries.detach().clone())

    def path_cls(self, prefill: bool):
        if not self.custom_ops:
            return None
        msar_prefill = prefill and self.model.cfg.residual == "msar"
        if msar_prefill and self.mixer_op == "fused":
            return functools.partial(FusedMixerPath, conv_bank=self.conv_bank)
        taps = [getattr(self, conv_taps_name(i)) for i in range(self.n_taps)]
        if msar_prefill and self.mixer_op == "scored":
            queries = [getattr(self, mixer_queries_name(i)) for i in range(self.model.cfg.n_sublayers + 1)]
            return functools.partial(ScoredMixerPath, conv_bank=self.conv_bank, conv_taps=taps, queries=queries)
        if self.n_taps and self.model.cfg.conv_kernels:  # without conv streams a view is its source: no SourceViews
            return functools.partial(RetrievalOpPath, conv_taps=taps)
        return RetrievalOpPath


class PrefillGraph(_Graph):
    """input_ids (B, T) -> logits (B, T, V)."""

    def forward(self, input_ids):
        logits, _ = self.model.run(input_ids, path_cls=self.path_cls(prefill=True))
        return logits


class DecodeGraph(_Graph):
    """One graph for prefill (past length 0) and decode steps."""

    def forward(self, input_ids, attention_mask, position_ids, *past):
        cfg = self.model.cfg
        nb = cfg.n_blocks
        cache = DecodeCache(list(past[0 : 2 * nb : 2]), list(past[1 : 2 * nb : 2]),
                            past[2 * nb] if cfg.residual == "msar" else None)
        logits, new = self.model.run(input_ids, attention_mask, position_ids, cache, path_cls=self.path_cls(prefill=False))
        outs = [logits]
        for k, v in zip(new.keys, new.values):
            outs += [k, v]
        if cfg.residual == "msar":
            outs.append(new.conv)
        return tuple(outs)


def example_inputs(model, decode: bool, batch: int = 2, seq: int = 5, past: int = 3):
    """Tracing inputs; sizes > 1 and distinct so no dynamic dim gets specialised."""
    cfg = model.cfg
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=g)
    if not decode:
        return (ids,)
    cache = model.empty_cache(batch)
    dt = model.dtype
    keys = [torch.randn(batch, cfg.n_kv_heads, past, cfg.head_dim, generator=g).to(dt) for _ in cache.keys]
    vals = [torch.randn(batch, cfg.n_kv_heads, past, cfg.head_dim, generator=g).to(dt) for _ in cache.values]
    mask = torch.ones(batch, past + seq, dtype=torch.int64)
    pos = torch.arange(past, past + seq).expand(batch, seq).contiguous()
    args = [ids, mask, pos]
    for k, v in zip(keys, vals):
        args += [k, v]
    if cfg.residual == "msar":
        args.append(torch.randn(cache.conv.shape, generator=g).to(dt))
    return tuple(args)
