"""One Polygraphy runner per backend, all behind `polygraphy.backend.base.BaseRunner`.

- `eager`:  `TorchRunner`, our own PyTorch runner over `MSARLM.forward_with_hidden`
  (Polygraphy's `PytRunner` forces CUDA and returns a tuple, so it is not used).
- `ort_runner`: the one ONNX Runtime runner (`OrtRunner`, and `OrtGraph` with the
  prefill `logits()` and decode `step()` that runtime, serving, bench and export
  validation use); every session option is decided there.  `onnxrt` hands it the
  graph as opened once (`graph_file.ExportedGraph`), `hidden.{l}` marked as outputs.
- `trt`:    Polygraphy's `TrtRunner`, from a serialised engine or built from the
  ONNX graph with the same outputs marked; TensorRT is imported lazily.

Every runner takes `input_ids` [batch, seq] int64 and returns a dict of numpy
arrays named `logits`, `hidden.1` .. `hidden.{L+1}` (see `output_names`).
"""

from .common import output_names

__all__ = ["output_names"]
