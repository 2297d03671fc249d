"""Reading and writing whole ONNX files (weights included) for the interop commands."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import OnnxModelError
from ..fileio import check_output_file, check_outputs, os_errors_as_output_errors, scratch_dir_beside
from ..graph_file import ExportedGraph, inputs_of  # noqa: F401  (inputs_of: re-exported for interop.cli)

TWO_GB = 2**31


def check_rewrite_outputs(source, target, *more_inputs) -> None:
    """The output set of a rewrite (TARGET and TARGET.data), checked before any work."""
    check_outputs([target, str(target) + ".data"], [*inputs_of(source), *more_inputs])


def load_whole(path, check_functions: bool = True) -> tuple[object, bool]:
    """(ModelProto with its weights, whether they were external): each external
    file is checked to lie inside the model's folder before it is read.
    check_functions=False: a file whose msar functions another tool broke (for repair)."""
    import onnx

    path = Path(path)
    graph = ExportedGraph.open(path, weights=True, check_functions=check_functions)  # checks every external-data location first
    model, external = graph.proto, graph.uses_external_data
    if external:
        try:
            onnx.load_external_data_for_model(model, str(path.parent))
        except (OSError, ValueError) as e:
            raise OnnxModelError(f"{path}: cannot read its external data ({e})") from None
    check_initializer_sizes(model, path)
    return model, external


def check_initializer_sizes(model, path) -> None:
    """Every initializer holds as many elements as its dims declare (a tensor with dims and no
    data made onnx's reference evaluator fail deep inside numpy): OnnxModelError, one line."""
    import math

    from onnx import TensorProto, helper

    for t in model.graph.initializer:
        if t.data_type in (TensorProto.STRING, TensorProto.UNDEFINED):
            continue
        want = math.prod(t.dims)
        if t.raw_data:
            have = len(t.raw_data) / helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
        else:
            per = 2 if t.data_type in (TensorProto.COMPLEX64, TensorProto.COMPLEX128) else 1
            have = len(getattr(t, helper.tensor_dtype_to_field(t.data_type))) / per
        if have != want:
            raise OnnxModelError(f"{path}: initializer {t.name!r} declares dims {list(t.dims)} ({want} elements) "
                                 f"but holds {have:g}; the file is damaged")


def save_whole(model, target, external: bool = False) -> Path:
    """Write `model` to `target` atomically; weights go to `target.name + '.data'`
    beside it when asked or when the file would pass protobuf's 2 GB limit."""
    import onnx

    target = check_output_file(target)
    external = external or model.ByteSize() >= TWO_GB
    with scratch_dir_beside(target) as tmp, os_errors_as_output_errors(target):
        staged = tmp / target.name
        data_name = target.name + ".data"
        onnx.save_model(model, str(staged), save_as_external_data=external, all_tensors_to_one_file=True,
                        location=data_name, size_threshold=1024)
        if external:
            check_output_file(target.parent / data_name)
            os.replace(tmp / data_name, target.parent / data_name)
        check_output_file(target)
        os.replace(staged, target)
    return target
