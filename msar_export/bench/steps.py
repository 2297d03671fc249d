"""Decode-step loops the bench times (and bench/processes.py, scripts/decode_pair.py): each returns
a function that runs `steps` greedy decode steps from the state after `prompt`."""

from __future__ import annotations

import numpy as np
import torch


def eager_decode_steps(model, prompt: torch.Tensor, steps: int):
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
