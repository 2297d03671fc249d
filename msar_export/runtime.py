"""ONNX Runtime sessions over exported graphs, with `generate()` on the decode graph.

Execution providers: whatever is installed, CUDA first when `onnxruntime-gpu`
is present, CPU otherwise."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from .config import MSARConfig
from .errors import OnnxModelError, first_line
from .graph_spec import LOGITS, META_CONFIG, GraphSpec

ORT_DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(bfloat16)": None}


def default_providers() -> list[str]:
    import onnxruntime as ort

    available = ort.get_available_providers()
    preferred = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return [p for p in preferred if p in available] or available


def open_session(path: str | os.PathLike, providers: list[str] | None = None, threads: int | None = None,
                 optimization: str = "all", low_memory: bool = False):
    """low_memory: no pre-packed copy of each MatMul weight (ORT's CPU default: a second
    copy of most weights), so weights in external data are used straight from the mapped file,
    and no constant folding, which kept folded copies beside the weights (a transposed
    tied embedding; with float16 weights, float32 Casts of them): 1863 -> 1450 MiB for a
    318 M-parameter float32 file, 2348 -> ~1900 MiB for its float16 export, logits
    bit-identical in both (measured 2026-12-01; the tests compare them)."""
    import onnxruntime as ort

    from .onnx_file import inspect_onnx

    path = Path(path)
    inspect_onnx(path, weights=False)  # a clear error for an unusable file; ORT reads the weights
    opts = ort.SessionOptions()
    if low_memory:
        opts.add_session_config_entry("session.disable_prepacking", "1")
    if threads:
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
    opts.graph_optimization_level = {
        "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL, "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED, "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[optimization]
    opts.log_severity_level = 3
    try:
        return ort.InferenceSession(str(path), opts, providers=providers or default_providers(),
                                    disabled_optimizers=["ConstantFolding"] if low_memory else None)
    except Exception as e:  # ORT raises its own Fail/InvalidGraph/... types for unreadable files
        raise OnnxModelError(f"{path}: ONNX Runtime cannot load this file ({first_line(e)[:300]})") from None


def config_of(session, path) -> MSARConfig:
    meta = session.get_modelmeta().custom_metadata_map
    if META_CONFIG not in meta:
        raise OnnxModelError(f"{path}: no {META_CONFIG} metadata; export it with `msar-export export`")
    return MSARConfig.from_json(meta[META_CONFIG])


class OrtModel:
    """The prefill graph: input_ids -> logits."""

    def __init__(self, path, providers=None, threads: int | None = None, optimization: str = "all",
                 low_memory: bool = False):
        self.path = Path(path)
        self.session = open_session(path, providers, threads, optimization, low_memory)
        self.cfg = config_of(self.session, path)

    def logits(self, input_ids) -> np.ndarray:
        import torch  # not at module level: export validation runs ORT in a process without torch

        from .model.generate import check_token_batch

        ids = torch.as_tensor(input_ids)
        check_token_batch(ids, None, self.cfg.vocab_size, self.cfg.max_seq_len)
        return self.session.run(["logits"], {"input_ids": ids.long().numpy()})[0]


class OrtDecoder:
    """The decode graph: prefill with an empty cache, then one token per step."""

    def __init__(self, path, providers=None, threads: int | None = None, optimization: str = "all",
                 low_memory: bool = False):
        self.path = Path(path)
        self.session = open_session(path, providers, threads, optimization, low_memory)
        self.cfg = config_of(self.session, path)
        names = [i.name for i in self.session.get_inputs()]
        self.spec = GraphSpec(self.cfg, decode=True)
        first_cache = self.spec.cache_inputs[0].name
        if first_cache not in names:
            raise OnnxModelError(f"{path}: not a decode graph (no {first_cache} input); export it with --decode")
        self.input_names = names
        self.output_names = [o.name for o in self.session.get_outputs()]
        kv_type = self.session.get_inputs()[names.index(first_cache)].type
        if ORT_DTYPES.get(kv_type) is None:
            raise OnnxModelError(f"{path}: cache dtype {kv_type} cannot be fed from numpy; use a float32 or float16 export")
        self.cache_dtype = ORT_DTYPES[kv_type]

    def empty_cache(self, batch: int) -> dict[str, np.ndarray]:
        return self.spec.empty_cache(batch, self.cache_dtype)

    def step(self, input_ids: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray,
             cache: dict[str, np.ndarray]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        feeds = {"input_ids": input_ids.astype(np.int64), "attention_mask": attention_mask.astype(np.int64),
                 "position_ids": position_ids.astype(np.int64), **cache}
        outs = dict(zip(self.output_names, self.session.run(self.output_names, feeds)))
        return outs[LOGITS], self.spec.next_cache(outs)

    def generate(self, input_ids, attention_mask=None, max_new_tokens: int = 32, do_sample: bool = False,
                 temperature: float = 1.0, top_k: int | None = None, seed: int | None = None,
                 eos_token_id: int | None = None) -> torch.Tensor:
        """Same contract as `msar_export.generate` (left-padded batches)."""
        import torch

        from .model.generate import check_token_batch, decode_loop

        ids = torch.as_tensor(input_ids)
        mask = None if attention_mask is None else torch.as_tensor(attention_mask)
        check_token_batch(ids, mask, self.cfg.vocab_size, self.cfg.max_seq_len, max_new_tokens)

        def step(ids, mask, positions, cache):
            return self.step(ids.numpy(), mask.numpy(), positions.numpy(), cache)

        return decode_loop(step, ids, mask, self.empty_cache(ids.shape[0]), max_new_tokens, do_sample, temperature,
                           top_k, seed, eos_token_id)


__all__ = ["OrtModel", "OrtDecoder", "open_session", "default_providers"]
