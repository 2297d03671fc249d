"""Seeded token batches for a parity check."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from ..errors import InputError
from ..graph_spec import INPUT_IDS

# Batch sizes and lengths unlike the export's tracing inputs (2, 5): a graph that
# specialised a dynamic dimension fails here instead of passing by luck.
DEFAULT_BATCHES = (1, 2, 3)
DEFAULT_LENGTHS = (None, 37, 64)  # None: kmax + 5, one full conv window plus a few tokens
# Every backend holds float32 logits [B, T, vocab] and hidden states for each shape:
# 2**27 logits is 512 MiB per copy, far above what a parity check needs.
MAX_BATCH, MAX_LOGITS = 256, 1 << 27


def default_shapes(cfg) -> list[tuple[int, int]]:
    """(1, kmax+5), (2, 37), (3, 64), clipped to max_seq_len (duplicates dropped)."""
    shapes = []
    for b, t in zip(DEFAULT_BATCHES, DEFAULT_LENGTHS):
        t = cfg.kmax + 5 if t is None else t
        shape = (b, min(t, cfg.max_seq_len))
        if shape not in shapes:
            shapes.append(shape)
    return shapes


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """'1x17,2x37' -> [(1, 17), (2, 37)]."""
    if not text.strip():
        raise InputError("--shapes is empty; give e.g. 1x17,2x37,3x64")
    shapes = []
    for part in text.split(","):
        part = part.strip().lower()
        try:
            b, t = (int(x) for x in part.split("x"))
        except ValueError:
            raise InputError(f"--shapes: {part!r} is not BATCHxSEQ (e.g. 2x37)") from None
        shapes.append((b, t))
    if not shapes:
        raise InputError("--shapes is empty; give e.g. 1x17,2x37,3x64")
    return shapes


def check_shapes(shapes, cfg) -> list[tuple[int, int]]:
    shapes = [tuple(int(x) for x in s) for s in shapes]
    if not shapes:
        raise InputError("no input shapes given; give at least one BATCHxSEQ")
    for b, t in shapes:
        if b < 1 or t < 1:
            raise InputError(f"input shape {b}x{t}: batch and sequence must be at least 1")
        if b > MAX_BATCH or b * t * cfg.vocab_size > MAX_LOGITS:
            raise InputError(f"input shape {b}x{t}: too large for a parity check (at most {MAX_BATCH} rows and "
                             f"{MAX_LOGITS:,} logits per batch, i.e. {MAX_LOGITS // cfg.vocab_size:,} tokens at "
                             f"vocab {cfg.vocab_size})")
        if t > cfg.max_seq_len:
            raise InputError(f"input shape {b}x{t}: sequence length exceeds the checkpoint's max_seq_len={cfg.max_seq_len}")
    need = cfg.kmax + 1
    if max(t for _, t in shapes) < need:
        raise InputError(
            f"input shapes {['%dx%d' % s for s in shapes]} are all shorter than {need} tokens; at least one must "
            f"cover the largest conv window (kmax={cfg.kmax}) plus one token"
        )
    return shapes


def token_batches(cfg, shapes, seed: int = 0) -> list[OrderedDict]:
    """One feed dict {input_ids: int64 [B, T]} per shape, drawn uniformly from the
    vocabulary; the last batch also holds token 0 and token vocab-1 (the table's edges)."""
    rng = np.random.default_rng(seed)
    feeds = []
    for b, t in shapes:
        ids = rng.integers(0, cfg.vocab_size, size=(b, t), dtype=np.int64)
        feeds.append(OrderedDict([(INPUT_IDS, ids)]))
    last = feeds[-1][INPUT_IDS]
    last.flat[0] = 0
    last.flat[-1] = cfg.vocab_size - 1
    return feeds


def decode_batches(model, shapes, cache_dtype, seed: int = 0) -> list[OrderedDict]:
    """Feeds for the decode graph: each batch's first half is run eagerly to make
    a past (KV cache and conv state); the graph and the eager runner then both
    process the second half on top of that past."""
    import torch

    from ..graph_spec import GraphSpec

    spec = GraphSpec(model.cfg, decode=True)
    feeds = []
    for feed in token_batches(model.cfg, shapes, seed):
        ids = torch.as_tensor(feed[INPUT_IDS])
        B, T = ids.shape
        p = T // 2
        with torch.no_grad():
            cache = model.empty_cache(B) if p == 0 else model.run(ids[:, :p])[1]
        past = [x for kv in zip(cache.keys, cache.values) for x in kv] + ([cache.conv] if cache.conv is not None else [])
        past = {p.name: x.float().numpy().astype(cache_dtype) for p, x in zip(spec.cache_inputs, past, strict=True)}
        feeds.append(OrderedDict(spec.feeds(ids[:, p:].numpy(), np.ones((B, T), np.int64),
                                            np.broadcast_to(np.arange(p, T), (B, T - p)).copy(), past)))
    return feeds
