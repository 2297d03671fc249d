"""The msar_lm decoder (MSAR_SPEC.md section 1) with incremental decoding."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..config import MSARConfig
from .layers import AttentionSublayer, MLPSublayer, RMSNorm, f32, rotary_cos_sin, rotary_table
from .mixing import DepthMixer, SourceExpansion, mix_from_projections, source_projections


@dataclass
class DecodeCache:
    """KV cache per attention sublayer and, for msar, the convolution state:
    the last kmax-1 positions of every source, (L+1, B, kmax-1, d)."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    conv: torch.Tensor | None

    @property
    def past_len(self) -> int:
        return self.keys[0].shape[2]


def attention_bias(attention_mask: torch.Tensor | None, T: int, past: int, device) -> torch.Tensor:
    """Additive float32 mask (B|1, 1, T, past+T): causal, and padded keys hidden."""
    q_pos = torch.arange(T, device=device)[:, None] + past
    k_pos = torch.arange(past + T, device=device)[None, :]
    allowed = (k_pos <= q_pos)[None, None]
    if attention_mask is not None:
        allowed = allowed & attention_mask[:, None, None, :].bool()
    # finfo.min, not -inf: a fully padded query row must give finite (ignored) output.
    return torch.where(allowed, 0.0, torch.finfo(torch.float32).min)


class DepthPath:
    """How sources become mixer inputs.  `add_source(i, x)` is called once per
    source in order, `mix(l)` returns h_l (float32).  The eager paths live here;
    the export paths (custom ONNX ops) subclass this in `msar_export.export`."""

    def __init__(self, model: "MSARLM", history: torch.Tensor | None, source_mask: torch.Tensor | None):
        self.model = model
        self.history = history  # (L+1, B, kmax-1, d) or None at sequence start
        self.source_mask = source_mask  # (B, T): zero out padded positions before the convs
        self.conv_states: list[torch.Tensor] = []

    def add_source(self, i: int, x: torch.Tensor) -> None:
        raise NotImplementedError

    def mix(self, l: int) -> torch.Tensor:
        raise NotImplementedError

    def masked(self, x: torch.Tensor) -> torch.Tensor:
        # Where, not a multiply by the mask cast to float: no int->float Cast
        # for fp16 converters to mistype (see rotary_table).
        return x if self.source_mask is None else torch.where(self.source_mask[..., None].bool(), x, 0.0)

    def window(self, i: int, x: torch.Tensor) -> torch.Tensor:
        """Source i's kmax-1 positions of history (zeros at a sequence start), then x (after masking).
        The zeros are a Pad, not a Concat with a zero tensor: float16 converters retype Pad's input."""
        keep = self.model.cfg.kmax - 1
        if self.history is None:
            return F.pad(x, (0, 0, keep, 0))
        return torch.cat([self.history[i].to(x.dtype), x], dim=1)

    def record_conv_state(self, window: torch.Tensor) -> None:
        """Keep the window's last kmax-1 positions (DepthPath.window) for the next step."""
        self.conv_states.append(window[:, window.shape[1] - (self.model.cfg.kmax - 1) :])

    def conv_state(self) -> torch.Tensor | None:
        """The next convolution state (L+1, B, kmax-1, d), None for a model without one."""
        return torch.stack(self.conv_states) if self.conv_states else None


class ResidualSumPath(DepthPath):
    """`standard`: h_l = sum_{i<l} x_i, kept as a running sum."""

    def add_source(self, i, x):
        self.total = f32(x) if i == 0 else self.total + f32(x)

    def mix(self, l):
        return self.total


class EagerDepthPath(DepthPath):
    """`attnres` / `msar`: expand each source once into its views, then each
    mixer retrieves over the views of all earlier sources.

    What a source contributes to every later mixer (its scores against their
    queries, its share of their gate logits) is computed once, when the source
    appears, in one matmul; a mixer then reads each earlier view only once."""

    conv_op = False  # SourceExpansion's conv form (the export paths set True)

    def __init__(self, model, history, source_mask):
        super().__init__(model, history, source_mask)
        self.views: list[torch.Tensor] = []
        self.scores: list[torch.Tensor] = []  # source i: (L+1-i, B, T, m) for mixers i+1..L+1
        self.parts: list[torch.Tensor | None] = []  # source i: (L+1-i, B, T, m, m) gate-logit parts

    def expand(self, i, x):
        """Source i -> its views (B, T, m, d) float32, recording the conv state."""
        m = self.model
        if m.cfg.residual == "attnres":
            return f32(x).unsqueeze(2)  # one identity stream
        x = self.masked(x)
        hist = self.history[i] if self.history is not None else None
        self.record_conv_state(self.window(i, x))
        return m.sources[str(i)](x, hist, conv_op=self.conv_op)

    def add_source(self, i, x):
        views = self.expand(i, x)
        self.views.append(views)
        queries, gates = self.model.later_mixer_weights(i + 1)
        scores, parts = source_projections(views, queries, gates, self.model.cfg.mixer_eps)
        self.scores.append(scores)
        self.parts.append(parts)

    def mix(self, l):
        pick = [l - 1 - i for i in range(l)]  # mixer l's row in each earlier source's projections
        scores = torch.stack([s[k] for s, k in zip(self.scores, pick)])  # (l, B, T, m)
        mixer = self.model.mixers[str(l)]
        if not mixer.gated:
            return mix_from_projections(scores, None, self.views, None, None)
        parts = torch.stack([p[k] for p, k in zip(self.parts, pick)])  # (l, B, T, m, m)
        return mix_from_projections(scores, parts, self.views, mixer.gate.bias, mixer.gate_scale)


class MSARLM(nn.Module):
    def __init__(self, cfg: MSARConfig):
        super().__init__()
        self.cfg = cfg
        d, L = cfg.d_model, cfg.n_sublayers
        self.embed = nn.Embedding(cfg.vocab_size, d)
        self.layers = nn.ModuleDict(
            {str(l): AttentionSublayer(cfg) if l % 2 == 1 else MLPSublayer(cfg) for l in range(1, L + 1)}
        )
        if cfg.residual != "standard":
            gated = cfg.residual == "msar"
            self.mixers = nn.ModuleDict(
                {str(j): DepthMixer(d, cfg.n_streams, gated) for j in range(1, L + 2)}
            )
        if cfg.residual == "msar":
            self.sources = nn.ModuleDict({str(i): SourceExpansion(d, cfg.conv_kernels) for i in range(L + 1)})
        self.final_norm = RMSNorm(d, cfg.norm_eps)
        if not cfg.tie_embeddings:
            self.lm_head = nn.Linear(d, cfg.vocab_size, bias=False)

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.weight.dtype

    def later_mixer_weights(self, first: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Queries (Q, m, d) and gate weights (Q, m, m*d) or None of mixers first..L+1."""
        mixers = [self.mixers[str(j)] for j in range(first, self.cfg.n_sublayers + 2)]
        queries = torch.stack([mx.query for mx in mixers])
        gates = torch.stack([mx.gate.weight for mx in mixers]) if mixers[0].gated else None
        return queries, gates

    def head_weight(self) -> torch.Tensor:
        return self.embed.weight if self.cfg.tie_embeddings else self.lm_head.weight

    def depth_path(self, history=None, source_mask=None, path_cls=None) -> DepthPath:
        if path_cls is None:
            path_cls = ResidualSumPath if self.cfg.residual == "standard" else EagerDepthPath
        return path_cls(self, history, source_mask)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids (B,T) int64 -> logits (B,T,vocab)."""
        logits, _ = self.run(input_ids)
        return logits

    def forward_with_hidden(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Logits and the mixer outputs h_1 .. h_{L+1} (the per-layer parity targets)."""
        hidden: list[torch.Tensor] = []
        logits, _ = self.run(input_ids, hidden=hidden)
        return logits, hidden

    def run(self, input_ids, attention_mask=None, position_ids=None, cache: DecodeCache | None = None, path_cls=None,
            hidden: list | None = None):
        """One pass over T new tokens after `cache` (None: sequence start).

        attention_mask (B, past+T) marks real tokens (left padding is 0);
        path_cls picks how sources reach the mixers (the exporter swaps in
        custom-op paths); `hidden`, if given, receives every mixer output h_l;
        returns logits (B,T,vocab) and the extended cache."""
        cfg = self.cfg
        B, T = input_ids.shape
        past = 0 if cache is None else cache.past_len
        if position_ids is None:
            position_ids = torch.arange(past, past + T, device=input_ids.device).expand(B, T)
        compute = torch.float64 if self.dtype == torch.float64 else torch.float32
        table = rotary_table(cfg.max_seq_len, cfg.head_dim, cfg.rope_theta, compute, input_ids.device)
        cos, sin = rotary_cos_sin(position_ids, table)
        bias = attention_bias(attention_mask, T, past, input_ids.device)
        source_mask = None if attention_mask is None else attention_mask[:, past:]
        path = self.depth_path(None if cache is None else cache.conv, source_mask, path_cls)

        x = self.embed(input_ids)  # source x_0
        keys, values = [], []
        for l in range(1, cfg.n_sublayers + 2):
            path.add_source(l - 1, x)
            h = path.mix(l).to(self.dtype)
            if hidden is not None:
                hidden.append(h)
            if l > cfg.n_sublayers:
                break
            layer = self.layers[str(l)]
            if l % 2 == 1:
                k = len(keys)
                past_kv = (None, None) if cache is None else (cache.keys[k], cache.values[k])
                x, (k_new, v_new) = layer(h, cos, sin, bias, *past_kv)
                keys.append(k_new)
                values.append(v_new)
            else:
                x = layer(h)
        logits = F.linear(self.final_norm(h), self.head_weight())
        return logits, DecodeCache(keys, values, path.conv_state())

    def empty_cache(self, batch: int) -> DecodeCache:
        cfg, dev, dt = self.cfg, self.embed.weight.device, self.dtype
        kv = [torch.zeros(batch, cfg.n_kv_heads, 0, cfg.head_dim, device=dev, dtype=dt) for _ in range(cfg.n_blocks)]
        conv = None
        if cfg.residual == "msar":
            conv = torch.zeros(cfg.n_sublayers + 1, batch, cfg.kmax - 1, cfg.d_model, device=dev, dtype=dt)
        return DecodeCache(kv, [t.clone() for t in kv], conv)
