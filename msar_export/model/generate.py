"""Greedy and sampled generation with the KV + convolution-state cache."""

from __future__ import annotations

import math

import torch

from ..errors import InputError


def check_token_batch(input_ids, attention_mask, vocab_size: int, max_seq_len: int, max_new_tokens: int = 0) -> None:
    """Raise InputError for anything a model cannot be asked to run on."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise InputError(f"max_new_tokens must be a non-negative integer, got {max_new_tokens!r}")
    if input_ids.dim() != 2:
        raise InputError(f"input_ids must be 2-D [batch, seq], got shape {list(input_ids.shape)}")
    B, T = input_ids.shape
    if B == 0 or T == 0:
        raise InputError(f"input_ids is empty (shape {list(input_ids.shape)}); give at least one token per row")
    if input_ids.dtype not in (torch.int64, torch.int32):
        raise InputError(f"input_ids must be int64 token ids, got {input_ids.dtype}")
    lo, hi = int(input_ids.min()), int(input_ids.max())
    if lo < 0 or hi >= vocab_size:
        raise InputError(f"token id {hi if hi >= vocab_size else lo} is outside the vocabulary [0, {vocab_size})")
    if T + max_new_tokens > max_seq_len:
        raise InputError(f"prompt length {T} + {max_new_tokens} new tokens exceeds max_seq_len={max_seq_len}")
    if attention_mask is not None:
        if tuple(attention_mask.shape) != (B, T):
            raise InputError(f"attention_mask shape {list(attention_mask.shape)} does not match input_ids {[B, T]}")
        am = attention_mask.to(torch.int64)
        if not bool(((am == 0) | (am == 1)).all()):
            raise InputError("attention_mask must hold only 0 and 1")
        if not bool((am[:, -1] == 1).all()):
            raise InputError("attention_mask must be left-padded: the last position of every row must be a real token")
        if not bool((am[:, 1:] >= am[:, :-1]).all()):
            raise InputError("attention_mask must be left-padded: zeros only before the first real token")


def positions_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Left padding: real tokens are numbered 0, 1, ... from their first position."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def check_sampling(do_sample: bool, temperature: float, top_k: int | None) -> None:
    """Sampling settings that would divide by zero, make NaN probabilities or an empty top-k
    (refused with or without sampling: a setting that is ignored silently is a surprise)."""
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature > 0):
        raise InputError(f"temperature must be a positive finite number, got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise InputError(f"top_k must be a positive integer (or unset), got {top_k!r}")


def pick_next(logits: torch.Tensor, do_sample: bool, temperature: float, top_k: int | None, generator) -> torch.Tensor:
    """logits (B, vocab) -> next token ids (B,)."""
    if not do_sample:
        return logits.argmax(-1)
    logits = logits.float() / max(temperature, 1e-6)
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(torch.softmax(logits, -1), 1, generator=generator)[:, 0]


def decode_loop(step, input_ids, attention_mask, cache, max_new_tokens: int, do_sample: bool, temperature: float,
                top_k: int | None, seed: int | None, eos_token_id: int | None = None) -> torch.Tensor:
    """Prefill then one token per step, for any backend.

    step(ids, mask, positions, cache) -> (logits (B,T,vocab), cache) runs the
    model on new tokens (torch int64 tensors) after `cache`; input_ids must be
    validated already.  Rows that emitted `eos_token_id` keep emitting it."""
    check_sampling(do_sample, temperature, top_k)
    input_ids = input_ids.long()
    B = input_ids.shape[0]
    mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask.long()
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    positions = positions_from_mask(mask)
    logits, cache = step(input_ids, mask, positions, cache)
    out = [input_ids]
    done = torch.zeros(B, dtype=torch.bool)
    for i in range(max_new_tokens):
        nxt = pick_next(torch.as_tensor(logits[:, -1]).float(), do_sample, temperature, top_k, gen)
        if eos_token_id is not None:
            nxt = torch.where(done, torch.full_like(nxt, eos_token_id), nxt)
            done |= nxt == eos_token_id
        out.append(nxt[:, None])
        if i == max_new_tokens - 1:
            break
        mask = torch.cat([mask, torch.ones(B, 1, dtype=mask.dtype)], dim=1)
        positions = positions[:, -1:] + 1
        logits, cache = step(nxt[:, None], mask, positions, cache)
    return torch.cat(out, dim=1)


def generate_decoder(decoder, input_ids, attention_mask=None, max_new_tokens: int = 32, do_sample: bool = False,
                     temperature: float = 1.0, top_k: int | None = None, seed: int | None = None,
                     eos_token_id: int | None = None) -> torch.Tensor:
    """`generate` over an exported decode graph's runner (runtime.OrtDecoder,
    runners.trt.TrtDecoder): `decoder` gives `cfg`, `empty_cache(batch)` and
    `step(ids, mask, positions, cache)` on numpy arrays."""
    ids = torch.as_tensor(input_ids)
    mask = None if attention_mask is None else torch.as_tensor(attention_mask)
    check_token_batch(ids, mask, decoder.cfg.vocab_size, decoder.cfg.max_seq_len, max_new_tokens)

    def step(ids, mask, positions, cache):
        return decoder.step(ids.numpy(), mask.numpy(), positions.numpy(), cache)

    return decode_loop(step, ids, mask, decoder.empty_cache(ids.shape[0]), max_new_tokens, do_sample, temperature,
                       top_k, seed, eos_token_id)


@torch.no_grad()
def generate(model, input_ids, attention_mask=None, max_new_tokens: int = 32, do_sample: bool = False,
             temperature: float = 1.0, top_k: int | None = None, seed: int | None = None,
             eos_token_id: int | None = None) -> torch.Tensor:
    """Prefill the (left-padded) prompt, then decode one token at a time.

    Returns (B, T + max_new_tokens) token ids; rows that emitted `eos_token_id`
    keep emitting it."""
    cfg = model.cfg
    check_token_batch(input_ids, attention_mask, cfg.vocab_size, cfg.max_seq_len, max_new_tokens)
    return decode_loop(model.run, input_ids, attention_mask, None, max_new_tokens, do_sample, temperature, top_k,
                       seed, eos_token_id)
