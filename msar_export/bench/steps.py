"""The runs the bench times (and bench/processes.py, bench/width.py, scripts/decode_pair.py): each
returns a function that runs `steps` greedy decode steps from the state after `prompt`, or one
prefill (ort_prefill_run)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch


def eager_decode_steps(model, prompt: torch.Tensor, steps: int):
    import torch  # here, not above: a prefill-only process (bench/processes.py) need not load it

    with torch.inference_mode():
        logits, cache = model.run(prompt)
        tok = logits[:, -1:].argmax(-1)

    def run():
        c, t = cache, tok
        with torch.inference_mode():
            for _ in range(steps):
                lg, c = model.run(t, cache=c)
                t = lg[:, -1:].argmax(-1)

    return run


def ort_decode_steps(decoder, prompt: torch.Tensor, steps: int):
    B, T = prompt.shape
    logits, cache = decoder.step(prompt.numpy(), np.ones((B, T), np.int64), np.broadcast_to(np.arange(T), (B, T)),
                                 decoder.empty_cache(B))
    tok = logits[:, -1:].argmax(-1)

    def run():
        c, t = cache, tok
        for s in range(steps):
            lg, c = decoder.step(t, np.ones((B, T + s + 1), np.int64), np.full((B, 1), T + s), c)
            t = lg[:, -1:].argmax(-1)

    return run


DECODE_PROMPT, DECODE_STEPS = 64, 16  # the one-process and width-sweep decode runs (bench/processes.py, width.py)


def ort_prefill_run(path, ids: np.ndarray, threads: int):
    """A function that runs one prefill of `ids` through the graph at `path` in ONNX Runtime."""
    from ..runners.ort_runner import OrtGraph

    graph = OrtGraph(path, threads=threads)
    return lambda: graph.logits(ids)


def ort_decode_run(path, batch: int, vocab: int, threads: int):
    """A function that runs DECODE_STEPS steps of the decode graph at `path` after a seeded
    DECODE_PROMPT-token prompt of `batch` rows."""
    import torch

    from ..runtime import OrtDecoder

    prompt = torch.randint(0, vocab, (batch, DECODE_PROMPT), generator=torch.Generator().manual_seed(1))
    return ort_decode_steps(OrtDecoder(path, threads=threads), prompt, DECODE_STEPS)
