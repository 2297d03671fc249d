"""Triton Python-backend model over an exported msar ONNX graph, run in ONNX Runtime.

`msar-export serve` copies this file into the model repository as
`<model>/1/model.py`, and beside it `ort_runner.py`, the one ONNX Runtime runner
(msar_export/runners/ort_runner.py), which opens the session and runs the graph.
Both need numpy and onnxruntime only (no msar_export import), so a repository
runs on any Triton whose Python environment has those two packages.

Two kinds, picked by the config parameter `msar_model`:

- `logits`: input_ids [b, T] int64 -> logits [b, T, vocab] (prefill graph, or the
  decode graph with an empty cache).
- `generate`: input_ids [b, T] int64 + max_new_tokens [b, 1] int32 -> tokens
  [b, max_new_tokens] int64, greedy, on the decode graph (KV + conv-state cache).

Dynamic batching hands `execute` several requests of different lengths
(`allow_ragged_batch`).  Their rows are sorted by length and grouped when they
are within `merge_tokens` of each other (padding costs compute; a run saved pays
for about that many tokens).  logits: one right-padded run per group (causal:
padding after a token never changes its logits).  generate: each group is
prefilled left-padded with an attention mask, then *all* rows decode together,
their caches left-padded to the longest prompt and the padded keys masked out;
the one-token decode steps are where batching pays most.  A bad request gets its
own error response; the others in the batch are served.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

try:  # msar_export.serving.repository.triton_model: tests, reuse outside Triton
    from ...runners.ort_runner import THREADS, OrtGraph
except ImportError:  # Triton's stub (it imports "<version>.model"): ort_runner.py lies beside this file
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from ort_runner import THREADS, OrtGraph

try:  # only inside Triton's Python backend stub
    import triton_python_backend_utils as pb_utils
except ImportError:  # imported for tests / reuse outside Triton
    pb_utils = None


class RequestError(ValueError):
    """The request is malformed: answered with an error response, never raised to Triton."""


class MsarOnnx:
    """One ONNX Runtime session over a prefill or decode graph (no Triton here)."""

    def __init__(self, path: str, threads: int | None = None):
        # Several stub processes share few cores: CPU only, no busy-waiting threads.
        threads = THREADS["serving"] if threads is None else max(1, int(threads))
        self.graph = OrtGraph(path, providers=["cpu"], threads=threads, spinning=False, label=path)
        self.session = self.graph.session
        meta = self.session.get_modelmeta().custom_metadata_map
        if "msar.config" not in meta:
            raise ValueError(f"{path}: no msar.config metadata; export it with `msar-export export`")
        self.cfg = json.loads(meta["msar.config"])
        self.vocab_size = int(self.cfg["vocab_size"])
        self.max_seq_len = int(self.cfg["max_seq_len"])
        self.is_decode = self.graph.is_decode
        self.cache_specs = self.graph.cache_specs
        if any(dt is None for _, _, dt in self.cache_specs):
            raise ValueError(f"{path}: cache dtype cannot be fed from numpy; serve a float32 or float16 export")
        self.empty_cache, self.step = self.graph.empty_cache, self.graph.step

    # -- validation -----------------------------------------------------------
    def check_ids(self, ids: np.ndarray, new_tokens: int = 0) -> None:
        if ids.ndim != 2:
            raise RequestError(f"input_ids must be 2-D [batch, seq], got shape {list(ids.shape)}")
        if ids.shape[0] == 0 or ids.shape[1] == 0:
            raise RequestError(f"input_ids is empty (shape {list(ids.shape)}); give at least one token per row")
        if ids.dtype not in (np.int64, np.int32):
            raise RequestError(f"input_ids must be INT64 token ids, got {ids.dtype}")
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= self.vocab_size:
            bad = hi if hi >= self.vocab_size else lo
            raise RequestError(f"token id {bad} is outside the vocabulary [0, {self.vocab_size})")
        T = ids.shape[1]
        if T + new_tokens > self.max_seq_len:
            what = f"sequence length {T}" + (f" + {new_tokens} new tokens" if new_tokens else "")
            raise RequestError(f"{what} exceeds max_seq_len={self.max_seq_len}")

    # -- graph runs -------------------------------------------------------------
    def logits(self, rows: list[np.ndarray]) -> np.ndarray:
        """Right-padded batch of 1-D rows -> logits [n, maxT, vocab]."""
        T = max(len(r) for r in rows)
        ids = np.zeros((len(rows), T), np.int64)
        for i, r in enumerate(rows):
            ids[i, :len(r)] = r
        return self.graph.logits(ids)

    def prefill(self, rows: list[np.ndarray]):
        """Left-padded prefill of 1-D rows -> (last-position logits [n, vocab] float32, mask [n, T], cache)."""
        T = max(len(r) for r in rows)
        B = len(rows)
        ids = np.zeros((B, T), np.int64)
        mask = np.zeros((B, T), np.int64)
        for i, r in enumerate(rows):
            ids[i, T - len(r):] = r
            mask[i, T - len(r):] = 1
        positions = np.clip(np.cumsum(mask, axis=1) - 1, 0, None)
        logits, cache = self.step(ids, mask, positions, self.empty_cache(B))
        return logits[:, -1].astype(np.float32), mask, cache

    def cache_axes(self) -> dict[str, tuple[int, int | None]]:
        """{cache input: (batch axis, past axis or None)} from the graph's symbolic dims."""
        axes = {}
        for name, shape, _ in self.cache_specs:
            b = list(shape).index("batch")
            past = next((k for k, d in enumerate(shape) if k != b and not isinstance(d, int)), None)
            axes[name] = (b, past)
        return axes

    def generate(self, groups: list[list[np.ndarray]], steps: list[list[int]]) -> list[list[np.ndarray]]:
        """Greedy decoding, the loop of msar_export.runtime.OrtDecoder.generate, for several
        prefill groups at once: each group is prefilled on its own (rows of about the same
        length, left-padded), then all rows decode together as one batch whose caches are
        left-padded to the longest prompt (padded keys are masked out).  Rows leave the batch
        when they have their `steps` tokens.  Returns the new tokens per group and row."""
        axes = self.cache_axes()
        firsts, masks, caches, want, where = [], [], [], [], []
        for g, rows in enumerate(groups):
            last, mask, cache = self.prefill(rows)
            firsts.append(last.argmax(-1))
            masks.append(mask)
            caches.append(cache)
            for j in range(len(rows)):
                want.append(steps[g][j])
                where.append((g, j))
        P = max(m.shape[1] for m in masks)

        def left_pad(a, axis, n):
            if n == 0:
                return a
            pad = [(0, 0)] * a.ndim
            pad[axis] = (n, 0)
            return np.pad(a, pad)

        mask = np.concatenate([left_pad(m, 1, P - m.shape[1]) for m in masks])
        cache = {}
        for name, (b, past) in axes.items():
            parts = [c[name] if past is None else left_pad(c[name], past, P - m.shape[1])
                     for c, m in zip(caches, masks)]
            cache[name] = np.concatenate(parts, axis=b)
        nxt = np.concatenate(firsts).astype(np.int64)
        positions = mask.sum(axis=1, keepdims=True) - 1           # of the last prompt token
        want = np.asarray(want)
        tokens = [[nxt[i]] for i in range(len(want))]
        active = np.arange(len(want))
        for s in range(1, int(want.max())):
            keep = want[active] > s
            if not keep.all():                                   # rows done: drop them from the batch
                active, nxt, mask, positions = active[keep], nxt[keep], mask[keep], positions[keep]
                cache = {n: np.compress(keep, v, axis=axes[n][0]) for n, v in cache.items()}
            mask = np.concatenate([mask, np.ones((len(active), 1), np.int64)], axis=1)
            positions = positions + 1
            logits, cache = self.step(nxt[:, None], mask, positions, cache)
            nxt = logits[:, -1].astype(np.float32).argmax(-1).astype(np.int64)
            for k, i in enumerate(active):
                tokens[i].append(nxt[k])
        out = [[None] * len(rows) for rows in groups]
        for i, (g, j) in enumerate(where):
            out[g][j] = np.asarray(tokens[i][:want[i]], np.int64)
        return out


def plan_groups(lengths: list[int], max_rows: int, merge_tokens: int) -> list[list[int]]:
    """Row indices grouped for padded runs, longest first: a row joins the current group
    when it is at most `merge_tokens` shorter than the group's longest row.  One run costs
    about (fixed overhead) + (per-token cost) x rows x longest; merging a row of length l
    into a group of longest L saves the overhead and costs L - l padded tokens, so it pays
    while L - l stays under the overhead expressed in tokens (about 8 for the demo model on
    a CPU core).  merge_tokens=0 batches equal lengths only."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups: list[list[int]] = []
    for i in order:
        if groups and len(groups[-1]) < max_rows and lengths[groups[-1][0]] - lengths[i] <= merge_tokens:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


class Served:
    """The request logic of one model kind, independent of Triton's types."""

    def __init__(self, kind: str, model: MsarOnnx, max_rows: int, merge_tokens: int, max_new_tokens_limit: int):
        if kind not in ("logits", "generate"):
            raise ValueError(f"msar_model must be 'logits' or 'generate', got {kind!r}")
        if kind == "generate" and not model.is_decode:
            raise ValueError("the generate model needs a decode graph (export with --decode)")
        self.kind, self.model = kind, model
        self.max_rows, self.merge_tokens, self.limit = max_rows, merge_tokens, max_new_tokens_limit

    def parse(self, ids: np.ndarray, new_tokens) -> int:
        """Validate one request; return its number of new tokens (0 for logits)."""
        n = 0
        if self.kind == "generate":
            if new_tokens is None:
                raise RequestError("missing input 'max_new_tokens' (INT32, shape [batch, 1])")
            nt = np.asarray(new_tokens).reshape(-1)
            if nt.size == 0 or not np.all(nt == nt[0]):
                raise RequestError("max_new_tokens must hold one value (the same for every row of the request)")
            n = int(nt[0])
            if not 1 <= n <= self.limit:
                raise RequestError(f"max_new_tokens must be in [1, {self.limit}], got {n}")
        self.model.check_ids(ids, n)
        return n

    def run(self, batch: list[tuple[np.ndarray, int]]) -> list[np.ndarray]:
        """Valid requests (ids [b, T], n) -> one output array per request."""
        rows, owner = [], []
        for r, (ids, n) in enumerate(batch):
            for row in ids.astype(np.int64):
                rows.append((row, n))
                owner.append(r)
        results: list = [None] * len(rows)
        groups = plan_groups([len(r) for r, _ in rows], self.max_rows, self.merge_tokens)
        if self.kind == "logits":
            for group in groups:
                out = self.model.logits([rows[i][0] for i in group])
                for j, i in enumerate(group):
                    results[i] = out[j, :len(rows[i][0])]
        else:
            outs = self.model.generate([[rows[i][0] for i in g] for g in groups],
                                       [[rows[i][1] for i in g] for g in groups])
            for g, out in zip(groups, outs):
                for j, i in enumerate(g):
                    results[i] = out[j]
        per_request: list[list] = [[] for _ in batch]
        for i, r in enumerate(owner):
            per_request[r].append(results[i])
        return [np.stack(x) for x in per_request]


def _error(message: str):
    try:
        return pb_utils.TritonError(message, pb_utils.TritonError.INVALID_ARG)
    except (AttributeError, TypeError):  # older stubs: no error codes
        return pb_utils.TritonError(message)


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        version_dir = os.path.join(args["model_repository"], args["model_version"])
        path = os.path.join(version_dir, params.get("onnx_file", "model.onnx"))
        model = MsarOnnx(path, threads=int(params.get("threads", THREADS["serving"])))
        how = "native msar kernels" if model.session.msar_native else "msar function bodies"
        print(f"msar-export: model {config.get('name')}: ONNX Runtime runs the {how}", flush=True)  # the server log
        max_rows = max(1, int(config.get("max_batch_size") or 1))
        self.served = Served(params.get("msar_model", "logits"), model, max_rows,
                             int(params.get("merge_tokens", "8")), int(params.get("max_new_tokens_limit", "256")))
        self.output_name = config["output"][0]["name"]
        self.output_dtype = pb_utils.triton_string_to_numpy(config["output"][0]["data_type"])

    def execute(self, requests):
        responses = [None] * len(requests)
        valid = []
        for k, request in enumerate(requests):
            try:
                t = pb_utils.get_input_tensor_by_name(request, "input_ids")
                if t is None:
                    raise RequestError("missing input 'input_ids' (INT64, shape [batch, seq])")
                ids = t.as_numpy()
                nt = pb_utils.get_input_tensor_by_name(request, "max_new_tokens")
                n = self.served.parse(ids, None if nt is None else nt.as_numpy())
                valid.append((k, ids, n))
            except RequestError as e:
                responses[k] = pb_utils.InferenceResponse(output_tensors=[], error=_error(str(e)))
        if valid:
            try:
                outs = self.served.run([(ids, n) for _, ids, n in valid])
                for (k, _, _), out in zip(valid, outs):
                    tensor = pb_utils.Tensor(self.output_name, np.ascontiguousarray(out.astype(self.output_dtype)))
                    responses[k] = pb_utils.InferenceResponse(output_tensors=[tensor])
            except Exception as e:  # an ONNX Runtime failure: fail these requests, keep serving
                msg = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
                for k, _, _ in valid:
                    responses[k] = pb_utils.InferenceResponse(
                        output_tensors=[], error=pb_utils.TritonError(f"inference failed: {msg}"))
        return responses

    def finalize(self):
        self.served = None


__all__ = ["MsarOnnx", "Served", "RequestError", "plan_groups", "TritonPythonModel"]
