"""Export without holding the weights: the graph is traced from a model whose parameters
are fake (FakeTensorMode: shapes and dtypes, no storage), and every initializer that
stands for a checkpoint tensor becomes an `onnx_ir.LazyTensor` whose loader reads that
one tensor from its memory-mapped safetensors file and converts it to the export dtype
there.  `save.py` writes the initializers one at a time and drops each once written, so
the export holds one weight (plus what the optimiser folds, all small) at any time,
whatever the checkpoint's size.

The values are the ones `load_checkpoint(dtype=...)` gives (the same `Tensor.to`, the
same finiteness checks), so the file is byte-identical to the export of the loaded model.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import onnx_ir as ir
import torch

from ..checkpoint import checked_values
from ..weights import WeightFiles

# torch.onnx names a parameter by its path in the traced module: PrefillGraph/DecodeGraph
# hold the model as `.model`.
PARAM_PREFIX = "model."
CONV_BANK = "conv_bank"  # graphs.py: the FusedMixer conv bank, derived from the conv weights


def fake_model(cfg, dtype: torch.dtype):
    """An MSARLM of `cfg` in `dtype` whose parameters hold no memory."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from ..model import MSARLM

    with FakeTensorMode(allow_non_fake_inputs=True):
        model = MSARLM(cfg)
        # Module.to() cannot swap a fake parameter in place: each is replaced instead.
        for module in model.modules():
            for name, p in list(module._parameters.items()):
                if p is not None and p.dtype != dtype:
                    module._parameters[name] = torch.nn.Parameter(p.detach().to(dtype), requires_grad=p.requires_grad)
    return model.eval()


def _ir_tensor(t: torch.Tensor, name: str) -> ir.Tensor:
    """`t` as onnx_ir stores it (numpy has no bfloat16: its bits, viewed as ml_dtypes')."""
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        arr = t.view(torch.uint16).numpy().view(ir.DataType.BFLOAT16.numpy())
        return ir.Tensor(arr, dtype=ir.DataType.BFLOAT16, name=name)
    return ir.Tensor(np.asarray(t.numpy()), name=name)


class LazyWeights:
    """Loaders for the initializers of a graph traced from `fake_model(cfg, dtype)`."""

    def __init__(self, files: WeightFiles, cfg, dtype: torch.dtype):
        self.files, self.cfg, self.dtype = files, cfg, dtype
        self.loads = 0  # how many tensors were read (tests: each weight once, while saving)

    def read(self, name: str) -> torch.Tensor:
        self.loads += 1
        return checked_values(name, self.files.read(name), self.dtype)

    def source_convs(self, i: int) -> list:
        return [SimpleNamespace(weight=self.read(f"sources.{i}.conv.{r}.weight"))
                for r in range(1, len(self.cfg.conv_kernels) + 1)]

    def conv_bank(self) -> torch.Tensor:
        from .custom_paths import pack_conv_rows

        return pack_conv_rows((self.source_convs(i) for i in range(self.cfg.n_sublayers + 1)), self.cfg.d_model,
                              self.dtype)

    def conv_taps(self, i: int) -> torch.Tensor:
        from .custom_paths import pack_conv_rows

        return pack_conv_rows([self.source_convs(i)], self.cfg.d_model, self.dtype)[0]

    def mixer_queries(self, i: int) -> torch.Tensor:
        from .custom_paths import later_queries

        return later_queries(lambda j: self.read(f"mixers.{j}.query"), i, self.cfg.n_sublayers)

    def loader(self, value_name: str, tensor_name: str):
        from .custom_paths import CONV_TAPS, MIXER_QUERIES

        if value_name == CONV_BANK:
            return lambda: _ir_tensor(self.conv_bank(), tensor_name)
        for prefix, make in ((CONV_TAPS, self.conv_taps), (MIXER_QUERIES, self.mixer_queries)):
            if value_name.startswith(prefix) and value_name[len(prefix):].isdigit():
                i = int(value_name[len(prefix):])
                return lambda: _ir_tensor(make(i), tensor_name)
        if value_name.startswith(PARAM_PREFIX) and value_name[len(PARAM_PREFIX):] in self.files.entries:
            key = value_name[len(PARAM_PREFIX):]
            return lambda: _ir_tensor(self.read(key), tensor_name)
        raise RuntimeError(f"initializer {value_name!r} of a weightless trace is neither a checkpoint tensor "
                           "nor one derived from them (conv bank, taps, queries): the exporter does not know "
                           "where its values come from")

    def attach(self, model: ir.Model) -> int:
        """Replace every fake initializer of `model` (straight from torch.onnx) by a LazyTensor.
        Real ones (constants lifted by the trace) stay.  Returns how many were replaced."""
        from torch._subclasses.fake_tensor import FakeTensor

        n = 0
        for value in model.graph.initializers.values():
            tensor = value.const_value
            if not isinstance(getattr(tensor, "raw", None), FakeTensor):
                continue
            value.const_value = ir.LazyTensor(self.loader(value.name, tensor.name), dtype=tensor.dtype,
                                              shape=tensor.shape, name=tensor.name)
            n += 1
        return n


__all__ = ["fake_model", "LazyWeights"]
