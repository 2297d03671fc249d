"""Depth paths that emit `msar` custom nodes while torch.onnx traces the model.

`torch.onnx.ops.symbolic` records one node with the given domain, inputs and
attributes; it only means something inside an export (eagerly it returns a
placeholder), so these paths are used by the exporter alone."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..model.layers import f32
from ..model.lm import DepthPath, EagerDepthPath
from ..contracts import (CONV_STATE, DEPTH_RETRIEVAL, DOMAIN, DOMAIN_VERSION, FUSED_MIXER, SCORED_MIXER, SOURCE_SCORES,
                         SOURCE_VIEWS, STREAM_GATE)

CONV_TAPS = "conv_taps_"  # graphs.py: source i's SourceViews taps are the buffer conv_taps_{i}
MIXER_QUERIES = "mixer_queries_"  # graphs.py: the queries of the mixers after source i (SourceScores)


def pack_conv_rows(convs_per_source, d: int, dtype: torch.dtype) -> torch.Tensor:
    """(N, K, d), the FusedMixer contract's conv_weight: row i = source i's depthwise Conv1d taps for
    streams 1..m-1 back to back along K (Conv1d order), channels last. Channels last because it is what
    the kernels read (a warp's tap loads walk d): the bank is an initializer in that layout, so nothing
    is transposed or allocated at run time (issue 23 defect 3). Without conv streams (stream_kernels
    [1]) K is 0: an empty (N, 0, d) bank of `dtype`, which the contract's shapes still describe."""
    rows = []
    for convs in convs_per_source:
        taps = [c.weight[:, 0, :] for c in convs]
        rows.append((torch.cat(taps, dim=1) if taps else torch.zeros(d, 0, dtype=dtype)).t())
    return torch.stack(rows)


def conv_taps_name(i: int) -> str:
    return f"{CONV_TAPS}{i}"


def mixer_queries_name(i: int) -> str:
    return f"{MIXER_QUERIES}{i}"


def later_queries(query_of, i: int, n_sublayers: int) -> torch.Tensor:
    """(P, m, d), P = L+1-i: the pseudo-queries of mixers i+1..L+1, the mixers that read source i
    (SourceScores' queries). query_of(j) gives mixer j's (m, d) query."""
    return torch.stack([query_of(j) for j in range(i + 1, n_sublayers + 2)])


def pack_conv_weights(model) -> torch.Tensor:
    """(L+1, K, d): the conv bank of every source of `model` (pack_conv_rows)."""
    return pack_conv_rows((model.sources[str(i)].conv.values() for i in range(model.cfg.n_sublayers + 1)),
                          model.cfg.d_model, model.dtype)


def source_views_op(conv_taps: torch.Tensor, state: torch.Tensor, index: int, x: torch.Tensor, mask: torch.Tensor,
                    cfg) -> torch.Tensor:
    """Source x (B, T, d) after row `index` of state (S, B, kmax-1, d), padded tokens (mask (B, T) int64
    zero) as zero rows -> (B, T, m, d) views in x's dtype (one SourceViews node)."""
    B, T, d = x.shape
    return torch.onnx.ops.symbolic(
        f"{DOMAIN}::{SOURCE_VIEWS.name}", [conv_taps, state, torch.tensor(index, dtype=torch.int64), x, mask],
        SOURCE_VIEWS.attribute_values(cfg), dtype=x.dtype, shape=(B, T, len(cfg.stream_kernels), d),
        version=DOMAIN_VERSION,
    )


def conv_state_op(past: torch.Tensor, mask: torch.Tensor, sources: list[torch.Tensor]) -> torch.Tensor:
    """past (N, B, kmax-1, d), the padding mask (B, T) and the N sources -> present (N, B, kmax-1, d)
    (one ConvState node)."""
    return torch.onnx.ops.symbolic(
        f"{DOMAIN}::{CONV_STATE.name}", [past, mask, *(x.to(past.dtype) for x in sources)], {}, dtype=past.dtype,
        shape=past.shape, version=DOMAIN_VERSION,
    )


def depth_retrieval_op(query: torch.Tensor, views: list[torch.Tensor], cfg) -> torch.Tensor:
    # One type for every input (the op's type variable T, and the plugin's rule): the query is
    # cast to the views' type.
    query = query.to(views[0].dtype)
    return torch.onnx.ops.symbolic(
        f"{DOMAIN}::{DEPTH_RETRIEVAL.name}", [query, *views], DEPTH_RETRIEVAL.attribute_values(cfg),
        dtype=views[0].dtype, shape=views[0].shape, version=DOMAIN_VERSION,
    )


def stream_gate_op(mixer, z: torch.Tensor) -> torch.Tensor:
    """(B, T, m, d) retrieved streams -> h (B, T, d) in z's dtype (one StreamGate node); the gate's
    parameters are cast to z's type (the op's one type variable)."""
    B, T, m, d = z.shape
    params = [mixer.gate.weight, mixer.gate.bias, mixer.gate_scale]
    return torch.onnx.ops.symbolic(
        f"{DOMAIN}::{STREAM_GATE.name}", [p.to(z.dtype) for p in params] + [z], {},
        dtype=z.dtype, shape=(B, T, d), version=DOMAIN_VERSION,
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


def source_scores_op(conv_taps: torch.Tensor, queries: torch.Tensor, x: torch.Tensor, cfg) -> torch.Tensor:
    """Source x (B, T, d) -> its scores (P, B, T, m) float32 for the P mixers of `queries` (one
    SourceScores node); taps, queries and x share the model's dtype (the op's type variable)."""
    B, T, _ = x.shape
    shape = (queries.shape[0], B, T, len(cfg.stream_kernels))
    return torch.onnx.ops.symbolic(
        f"{DOMAIN}::{SOURCE_SCORES.name}", [conv_taps, queries, x], SOURCE_SCORES.attribute_values(cfg),
        dtype=torch.float32, shape=shape, version=DOMAIN_VERSION,
    )


class ScoredMixerPath(DepthPath):
    """msar prefill, `--mixer-op scored`: each source's scores against every later mixer's query
    are made once, when it appears (one SourceScores node), and every mixer is one ScoredMixer
    node over the raw sources and its row of each earlier source's scores: FusedMixer's work
    less its scoring pass, which recomputed every earlier source's views for each mixer."""

    def __init__(self, model, history, source_mask, conv_bank: torch.Tensor, conv_taps: list, queries: list):
        super().__init__(model, history, source_mask)
        self.conv_bank, self.conv_taps, self.queries = conv_bank, conv_taps, queries  # graphs.py's buffers
        self.sources: list[torch.Tensor] = []
        self.scores: list[torch.Tensor] = []  # source i: (L+1-i, B, T, m), row p for mixer i+1+p

    def add_source(self, i, x):
        self.sources.append(x)
        self.scores.append(source_scores_op(self.conv_taps[i], self.queries[i], x, self.model.cfg))

    def mix(self, l):
        mixer, cfg = self.model.mixers[str(l)], self.model.cfg
        x0 = self.sources[0]
        scores = torch.cat([s[l - 1 - i : l - i] for i, s in enumerate(self.scores)], dim=0)  # (l, B, T, m)
        gate = [p.to(x0.dtype) for p in (mixer.gate.weight, mixer.gate.bias, mixer.gate_scale)]
        return torch.onnx.ops.symbolic(
            f"{DOMAIN}::{SCORED_MIXER.name}", [*gate, self.conv_bank, scores, *self.sources],
            SCORED_MIXER.attribute_values(cfg), dtype=x0.dtype, shape=x0.shape, version=DOMAIN_VERSION,
        )


class RetrievalOpPath(EagerDepthPath):
    """attnres (prefill and decode), msar decode and msar `--mixer-op retrieval`: each source
    is expanded once (msar: one SourceViews node over its window, from the conv state when
    decoding), each mixer is a DepthRetrieval node, and msar's scalar gate fusion one
    StreamGate node.  Every view is in the model's dtype (docs/kernels.md, view dtype)."""

    conv_op = True

    def __init__(self, model, history, source_mask, conv_taps=None):
        super().__init__(model, history, source_mask)
        self.conv_taps = conv_taps  # [K, d] per source (graphs.py), None: no conv streams
        self.msar = model.cfg.residual == "msar"
        self.sources: list[torch.Tensor] = []  # unmasked: ConvState masks them itself
        self.zeros = None  # the history at a sequence start
        self.mask = None  # (B, T) int64: the ops zero padded tokens themselves (no Where per source)

    def padding_mask(self, x):
        if self.mask is None:  # a prefill graph has no attention_mask: every token is real
            self.mask = (self.source_mask.to(torch.int64) if self.source_mask is not None
                         else torch.ones_like(x[..., 0], dtype=torch.int64))
        return self.mask

    def expand(self, i, x):
        if not self.msar:
            return super().expand(i, x)
        self.sources.append(x)
        mask = self.padding_mask(x)
        if self.conv_taps is None:  # stream_kernels [1]: the one view is the source itself, no SourceViews
            return self.masked(x).unsqueeze(2)
        if self.history is not None:  # the node reads its row of the state where it lies (no Gather, no Split)
            return source_views_op(self.conv_taps[i], self.history.to(x.dtype), i, x, mask, self.model.cfg)
        if self.zeros is None:  # a sequence start: one (1, B, kmax-1, d) zero state, shared. A Pad of an
            # empty slice, not zeros of a computed shape: float16 converters retype Pad's input (DepthPath.window)
            self.zeros = F.pad(x[:, :0], (0, 0, self.model.cfg.kmax - 1, 0)).unsqueeze(0)
        return source_views_op(self.conv_taps[i], self.zeros, 0, x, mask, self.model.cfg)

    def conv_state(self):
        # One ConvState node at the end of a step, where a Concat (the window) and a Slice (its tail)
        # per source, and a stack of the tails, cost a decode step more than its views (docs/ort_kernels.md).
        # stream_kernels [1] too: its state keeps kmax-1 = 0 positions (MSAR_SPEC 3), and the node's
        # (N, B, 0, d) output is the graph's present_conv_state all the same.
        if not self.msar:
            return super().conv_state()
        if self.history is None:
            return None  # a prefill graph: no state output
        return conv_state_op(self.history, self.mask, self.sources)

    def add_source(self, i, x):
        # No keys: the op normalises them itself. Views in the model's dtype, as SourceViews makes msar's
        # (docs/kernels.md, decode views' storage dtype): attnres's identity view is the source itself, so
        # this loses no bit and halves DepthRetrieval's bytes; a float32 model's views are float32 already
        # (no Cast, the graph unchanged).
        self.views.append(self.expand(i, x).to(self.model.dtype))

    def mix(self, l):
        mixer, cfg = self.model.mixers[str(l)], self.model.cfg
        z = depth_retrieval_op(mixer.query, self.views, cfg)
        return f32(stream_gate_op(mixer, z)) if mixer.gated else mixer.fuse(f32(z))
