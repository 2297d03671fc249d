"""Triton `config.pbtxt`: I/O read from the ONNX graph, rendered as protobuf text,
and validated by parsing it with Triton's own ModelConfig schema.

The schema is Triton's `model_config.proto`, bundled as a serialized
descriptor (pbtxt_check.py), so validation needs neither tritonclient (which
refuses the main venv's protobuf 7) nor the serving venv.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import MsarError, OnnxModelError
from ...graph_file import ExportedGraph

# onnx.TensorProto.DataType -> Triton data type
ONNX_TO_TRITON = {
    1: "TYPE_FP32", 2: "TYPE_UINT8", 3: "TYPE_INT8", 4: "TYPE_UINT16", 5: "TYPE_INT16", 6: "TYPE_INT32",
    7: "TYPE_INT64", 8: "TYPE_STRING", 9: "TYPE_BOOL", 10: "TYPE_FP16", 11: "TYPE_FP64", 12: "TYPE_UINT32",
    13: "TYPE_UINT64", 16: "TYPE_BF16",
}


class ConfigInvalid(MsarError):
    """A generated config.pbtxt does not parse with Triton's ModelConfig schema."""


class Enum(str):
    """A protobuf enum value: rendered bare (KIND_CPU), not quoted."""


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str                      # Triton TYPE_*
    shape: tuple                    # full shape; int, or str for a symbolic / unknown dim


@dataclass(frozen=True)
class GraphIO:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    metadata: dict
    files: dict = field(default_factory=dict)  # {location: real path} of the checked external-data files
    kind: str = "prefill"  # ExportedGraph.kind
    graph: ExportedGraph | None = None  # the file as opened (its .config: msar.config, checked)

    def batch_symbol(self):
        """The symbol every input and output has as its first dim, or None: only then can
        Triton batch requests (the decode graph's conv state has batch second)."""
        firsts = {t.shape[0] if t.shape else None for t in self.inputs + self.outputs}
        if len(firsts) == 1:
            sym = next(iter(firsts))
            if isinstance(sym, str):
                return sym
        return None


def read_onnx_io(graph: ExportedGraph | str | os.PathLike) -> GraphIO:
    """Inputs / outputs (names, Triton types, dims) of an opened ExportedGraph (or a path, opened
    here without its weights): its external-data files checked (they stay inside the model's
    folder) and listed."""
    if not isinstance(graph, ExportedGraph):
        graph = ExportedGraph.open(graph)
    path = graph.path

    def spec(t) -> TensorSpec:
        if t.elem_type is None:
            raise OnnxModelError(f"{path}: graph I/O '{t.name}' is not a tensor; Triton cannot serve it")
        if t.elem_type not in ONNX_TO_TRITON:
            raise OnnxModelError(f"{path}: graph I/O '{t.name}' has ONNX element type {t.elem_type}, "
                                 "which Triton has no data type for")
        return TensorSpec(t.name, ONNX_TO_TRITON[t.elem_type], tuple("?" if d is None else d for d in t.dims))

    ins = tuple(spec(t) for t in graph.inputs)
    outs = tuple(spec(t) for t in graph.outputs)
    return GraphIO(ins, outs, graph.metadata, graph.external_files, graph.kind, graph)


def triton_dims(spec: TensorSpec, batched: bool) -> list[int]:
    dims = list(spec.shape[1:] if batched else spec.shape)
    return [d if isinstance(d, int) else -1 for d in dims]


# -- protobuf text format -----------------------------------------------------

def _scalar(v) -> str:
    if isinstance(v, Enum):
        return str(v)
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    return json.dumps(str(v))  # a double-quoted string with C-style escapes: valid text format


def render(msg: dict, indent: int = 0) -> str:
    """Render a nested dict as protobuf text format (lists of dicts -> `key [ {..}, {..} ]`)."""
    pad = "  " * indent
    lines = []
    for key, val in msg.items():
        if val is None:
            continue
        if isinstance(val, dict):
            lines.append(f"{pad}{key} {{\n{render(val, indent + 1)}{pad}}}")
        elif isinstance(val, (list, tuple)):
            if not val:
                continue
            if all(isinstance(x, dict) for x in val):
                items = [f"{pad}  {{\n{render(x, indent + 2)}{pad}  }}" for x in val]
                lines.append(f"{pad}{key} [\n" + ",\n".join(items) + f"\n{pad}]")
            else:
                lines.append(f"{pad}{key}: [ " + ", ".join(_scalar(x) for x in val) + " ]")
        else:
            lines.append(f"{pad}{key}: {_scalar(val)}")
    return "".join(line + "\n" for line in lines)


def io_entry(spec: TensorSpec, batched: bool, **extra) -> dict:
    return {"name": spec.name, "data_type": Enum(spec.dtype), "dims": triton_dims(spec, batched) or None, **extra}


def parameters(params: dict[str, str]) -> list[dict]:
    return [{"key": k, "value": {"string_value": str(v)}} for k, v in params.items()]


# -- validation with Triton's ModelConfig schema ------------------------------

from .pbtxt_check import check_config, parse_model_config  # noqa: E402,F401  (re-exported; standalone script too)


def validate_files(paths: list[Path]) -> dict[str, str | None]:
    """{path: None | problem} for each config.pbtxt (Triton's schema is bundled: no tritonclient needed)."""
    return {str(p): check_config(Path(p).read_text(), Path(p).parent.name) for p in paths}


def validate_repository(repo: str | os.PathLike) -> list[Path]:
    """Validate every */config.pbtxt under `repo`; raise ConfigInvalid naming the first bad one."""
    paths = sorted(Path(repo).glob("*/config.pbtxt"))
    if not paths:
        raise ConfigInvalid(f"{repo}: no */config.pbtxt to validate")
    for path, problem in validate_files(paths).items():
        if problem:
            raise ConfigInvalid(f"{Path(path).parent.name}/config.pbtxt: {problem}")
    return paths
