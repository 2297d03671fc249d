"""The validation reference streamed from the checkpoint: the model's forward pass run on a
skeleton whose parameters hold no memory (`meta`), each unit's weights read from the
memory-mapped checkpoint just before it runs and dropped right after.

Units: the embedding, each sublayer, each source expansion, the final norm, the head.
The mixers' parameters (queries and gates of every mixer, O(L m^2 d), under 1% of a
large model) stay loaded for the whole pass: every source's projections read all later
mixers' at once (`MSARLM.later_mixer_weights`).  What is kept between units is the
activations at the validation input's size (3 x 19): for msar the views of every
source, (L+1) x 3 x 19 x m x d.

The values are those of `validate.reference_logits` on the loaded model, bit for bit:
each tensor is read as `load_checkpoint(dtype=float32)` reads it (checked finite) and
converted with the same `Tensor.to`, and the forward pass is the model's own
(`MSARLM.run`), unchanged.  Unlike the whole-model reference, the peak does not grow
with the checkpoint: baseline + the mixers + the activations + the largest unit in the
run's dtype (float64 for the reference) + that unit's largest tensor as stored.
"""

from __future__ import annotations

import torch

from ..checkpoint import checked_values
from ..memory import trim_heap
from ..verdict import NUMPY_DTYPES
from ..weights import WeightFiles
from .validate import Reference, validation_ids


class StreamedWeights:
    """Reads the checkpoint's tensors for a skeleton in `dtype`, as `load_checkpoint(dtype=float32)`
    and then `Tensor.to(dtype)` would give them."""

    def __init__(self, files: WeightFiles, dtype: torch.dtype):
        self.files, self.dtype = files, dtype

    def tensor(self, name: str) -> torch.Tensor:
        t = checked_values(name, self.files.read(name), torch.float32)
        if self.dtype.itemsize < t.dtype.itemsize:  # float16 can overflow: the export's own one-line error
            return checked_values(name, t, self.dtype)
        return t.to(self.dtype)

    def load(self, module: torch.nn.Module, prefix: str) -> None:
        # assign: the read tensors become the parameters (a copy into the meta ones cannot be made)
        module.load_state_dict({k: self.tensor(prefix + k) for k in module.state_dict()}, assign=True)

    def stream(self, module: torch.nn.Module, prefix: str) -> None:
        """`module`'s weights loaded when it is called and dropped (back to meta) when it returns."""
        module.register_forward_pre_hook(lambda mod, args: self.load(mod, prefix))

        def drop(mod, args, out):
            mod.to("meta")
            trim_heap()  # the unit's buffers, below glibc's mmap threshold, back to the system

        module.register_forward_hook(drop)


def skeleton(cfg, dtype: torch.dtype):
    """An MSARLM of `cfg` in `dtype` whose parameters hold no memory."""
    from ..model import MSARLM

    with torch.device("meta"):
        return MSARLM(cfg).to(dtype).eval()


def streamed_logits(files: WeightFiles, cfg, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The model's logits on `ids` computed in `dtype` (float64: the reference), one unit's
    weights in memory at a time besides the mixers'."""
    model = skeleton(cfg, dtype)
    weights = StreamedWeights(files, dtype)
    if cfg.residual != "standard":
        weights.load(model.mixers, "mixers.")
    weights.stream(model.embed, "embed.")
    weights.stream(model.final_norm, "final_norm.")
    for l, layer in model.layers.items():
        weights.stream(layer, f"layers.{l}.")
    for i, source in getattr(model, "sources", {}).items():
        weights.stream(source, f"sources.{i}.")
    head = "embed.weight" if cfg.tie_embeddings else "lm_head.weight"
    model.head_weight = lambda: weights.tensor(head)  # used once, by the last F.linear, then dropped
    with torch.no_grad():
        logits = model(ids)
    del model, weights  # no reference cycle: freed here, no garbage collection needed
    trim_heap()
    return logits


def streamed_reference(files: WeightFiles, cfg, dtype: str, batch: int = 3, seq: int | None = None) -> Reference | None:
    """`validate.reference_logits`' result for the checkpoint behind `files`, without loading
    it: the float64 pass, then the pass at the export dtype, each streamed.  None for
    a dtype ORT does not run (bfloat16: verdict.NUMPY_DTYPES)."""
    if dtype not in NUMPY_DTYPES:
        return None
    ids = validation_ids(cfg, batch, seq)
    ref64 = streamed_logits(files, cfg, ids, torch.float64).numpy()
    eager = streamed_logits(files, cfg, ids, getattr(torch, dtype)).float().numpy()
    return Reference(ids.numpy(), ref64, eager)


__all__ = ["StreamedWeights", "skeleton", "streamed_logits", "streamed_reference"]
