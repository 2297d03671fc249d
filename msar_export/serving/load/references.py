"""What the load test checks each served answer against.

Logits: with the checkpoint the served files came from (`--checkpoint`), the
eager model in float64, judged by msar_export.verdict against the eager model's
own error at the served precision, the way `check` and export validation judge.
Without it, a batch-1 ONNX Runtime run of the very file the server loaded, within
verdict.SAME_GRAPH (the two differ only in summation order).  Generated tokens:
greedy decoding of the same decode graph in ONNX Runtime, exactly.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np

from ...errors import InputError
from ...verdict import SAME_GRAPH, judge, rel_err, within
from ..triton.client import ServingClient

class References:
    """Batch-1 ONNX Runtime runs of the served files (or the files given), and the
    float64 eager reference when a checkpoint is given."""

    def __init__(self, client: ServingClient, models: tuple[str, ...], prefill: str | None, decode: str | None,
                 checkpoint: str | None = None, rtol: float | None = None):
        from ...runners.ort_runner import THREADS
        from ...runtime import OrtDecoder, OrtModel

        self.models = models
        self.logits_model = self.decoder = self.decoder_for_logits = None
        self.sources = {}
        if "logits" in models:
            params = client.parameters("logits")
            path = prefill or params.get("reference_onnx")
            if not path or not Path(path).is_file():
                raise InputError(f"no local copy of the logits model's graph ({path}); pass --onnx")
            if params.get("graph") == "decode" and not prefill:
                self.decoder_for_logits = OrtDecoder(path, threads=THREADS["reference"])
            else:
                self.logits_model = OrtModel(path, threads=THREADS["reference"])
            self.sources["logits"] = str(path)
        if "generate" in models:
            path = decode or client.parameters("generate").get("reference_onnx")
            if not path or not Path(path).is_file():
                raise InputError(f"no local copy of the generate model's decode graph ({path}); pass --decode-onnx")
            self.decoder = OrtDecoder(path, threads=THREADS["reference"])
            self.sources["generate"] = str(path)
        self.precision = self._served_precision()
        self.eager = EagerFloat64(checkpoint, self.cfg(), self.precision) if checkpoint and "logits" in models else None
        if self.eager is not None:
            self.sources["logits_judged_against"] = f"eager float64 of {checkpoint} (msar_export.verdict)"
            self.rtol = None
        else:
            self.rtol = SAME_GRAPH[self.precision] if rtol is None else rtol
            if "logits" in models:
                self.sources["logits_judged_against"] = f"the same graph at batch 1, within {self.rtol:.0e}"

    def cfg(self):
        m = self.logits_model or self.decoder or self.decoder_for_logits
        return m.cfg

    def _served_precision(self) -> str:
        m = self.logits_model or self.decoder_for_logits or self.decoder
        return m.graph.precision or "float32"  # the opened graph's msar.dtype

    def compute(self, item) -> None:
        """Fill the item's references."""
        import torch

        if item.model == "logits":
            if self.eager is not None:
                item.eager, item.ref64 = self.eager.logits(item.ids)
            if self.logits_model is not None:
                item.ref = self.logits_model.logits(item.ids)
            else:
                dec = self.decoder_for_logits
                T = item.ids.shape[1]
                item.ref = dec.step(item.ids, np.ones_like(item.ids), np.arange(T, dtype=np.int64)[None],
                                    dec.empty_cache(1))[0]
            return
        out = self.decoder.generate(torch.from_numpy(item.ids), max_new_tokens=item.new_tokens)
        item.ref = out[:, item.ids.shape[1]:].numpy()

    def problem(self, item, out: np.ndarray) -> str | None:
        """Why a served answer is wrong, or None."""
        if out.shape != item.ref.shape:
            return f"shape {list(out.shape)} != reference {list(item.ref.shape)}"
        if item.model != "logits":
            return None if np.array_equal(out, item.ref) else f"tokens {out[0].tolist()} != reference {item.ref[0].tolist()}"
        if self.eager is not None:
            v = judge(out, item.eager, item.ref64, self.precision)
            return None if v.passed else f"logits: {v.describe('served')}"
        err = rel_err(out, item.ref)
        return None if within(err, self.rtol) else f"logits rel err {err:.2e} against the same graph > {self.rtol:.0e}"


class EagerFloat64:
    """The checkpoint's eager model: float64 logits, and logits at the served precision."""

    def __init__(self, checkpoint: str, served_cfg, precision: str):
        import torch

        from ...checkpoint import load_checkpoint

        self.model = load_checkpoint(checkpoint, dtype=torch.float32)
        if self.model.cfg != served_cfg:
            raise InputError(f"--checkpoint {checkpoint}: its config is not the served model's "
                             f"({_config_difference(self.model.cfg, served_cfg)})")
        # A separate copy at a lower precision: rounding the weights in place would make
        # every later float64 reference one of rounded weights.
        self.model_p = None if precision == "float32" else copy.deepcopy(self.model).to(getattr(torch, precision))

    def logits(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        import torch

        from ...model.precision import float64_one_sublayer_at_a_time

        x = torch.from_numpy(ids)
        with torch.no_grad():
            with float64_one_sublayer_at_a_time(self.model):
                ref64 = self.model(x).numpy()
            eager = (self.model_p or self.model)(x).float().numpy()
        return eager, ref64


def _config_difference(a, b) -> str:
    da, db = vars(a), vars(b)
    diff = [f"{k} {da[k]!r} vs {db.get(k)!r}" for k in da if da[k] != db.get(k)]
    return ", ".join(diff[:3]) or "differs"
