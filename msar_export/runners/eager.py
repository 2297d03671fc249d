"""The PyTorch reference runner: `MSARLM.forward_with_hidden` behind Polygraphy's runner contract."""

from __future__ import annotations

import time
from collections import OrderedDict

import numpy as np
from polygraphy.backend.base import BaseRunner
from polygraphy.common import TensorMetadata

from ..graph_spec import INPUT_IDS, LOGITS, hidden_name


class TorchRunner(BaseRunner):
    """Runs an MSARLM eagerly on CPU (or `device`) and returns logits and every mixer output.

    Outputs are float32 numpy arrays whatever the model's dtype (numpy has no
    bfloat16): `logits` [B, T, vocab] and `hidden.{l}` [B, T, d] for l = 1..L+1.
    """

    def __init__(self, model, name: str | None = None, device: str = "cpu", decode_cache_dtype=None):
        """model: an MSARLM or a callable returning one (called on activation).

        decode_cache_dtype: set (np.float32 / np.float16) to take the decode
        graph's inputs (MSAR_SPEC section 3) and run the same cached step."""
        super().__init__(name=name, prefix="torch-runner")
        self._model = model
        self.device = device
        self.decode_cache_dtype = decode_cache_dtype

    def activate_impl(self):
        import torch

        model = self._model if isinstance(self._model, torch.nn.Module) else self._model()
        self.model = model.to(self.device).eval()

    def get_input_metadata_impl(self):
        meta = TensorMetadata().add(INPUT_IDS, dtype=np.int64, shape=("batch", "seq"))
        if self.decode_cache_dtype is None:
            return meta
        from ..graph_spec import GraphSpec

        for port in GraphSpec(self.model.cfg, decode=True).inputs[1:]:
            meta.add(port.name, dtype=self.decode_cache_dtype if port.kind == "cache" else np.int64, shape=port.axes)
        return meta

    def _cache(self, feed_dict):
        """The past from the feed, in the model's dtype (None for the prefill graph)."""
        import torch

        from ..model import DecodeCache

        if self.decode_cache_dtype is None:
            return None, None, None
        cfg, dt = self.model.cfg, self.model.dtype

        def t(name):
            return torch.as_tensor(np.asarray(feed_dict[name])).to(self.device)

        from ..graph_spec import ATTENTION_MASK, PAST_CONV, PAST_KEY, PAST_VALUE, POSITION_IDS

        keys = [t(PAST_KEY.format(k)).to(dt) for k in range(cfg.n_blocks)]
        values = [t(PAST_VALUE.format(k)).to(dt) for k in range(cfg.n_blocks)]
        conv = t(PAST_CONV).to(dt) if cfg.residual == "msar" else None
        return DecodeCache(keys, values, conv), t(ATTENTION_MASK), t(POSITION_IDS)

    def infer_impl(self, feed_dict):
        import torch

        from ..model.generate import check_token_batch

        ids = torch.as_tensor(np.asarray(feed_dict[INPUT_IDS]))
        cfg = self.model.cfg
        check_token_batch(ids, None, cfg.vocab_size, cfg.max_seq_len)
        start = time.perf_counter()
        cache, mask, positions = self._cache(feed_dict)
        with torch.no_grad():
            hidden = []
            logits, _ = self.model.run(ids.to(self.device), mask, positions, cache, hidden=hidden)
        self.inference_time = time.perf_counter() - start
        out = OrderedDict()
        # float64 stays float64 (the reference every backend is judged against); others become float32.
        out_dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
        out[LOGITS] = logits.to(out_dtype).cpu().numpy()
        for l, h in enumerate(hidden, start=1):
            out[hidden_name(l)] = h.to(out_dtype).cpu().numpy()
        return out

    def deactivate_impl(self):
        del self.model
