"""An exported .onnx file, opened once: `ExportedGraph.open(path)`.

One parse - by default the weightless skeleton reader (onnx_wire), which reads
the file field by field and leaves large in-file weights where they lie - gives
everything the stages ask of a file: the `msar.*` metadata and the config in it,
the graph kind and its GraphSpec, the precision, the msar custom-op counts, the
opsets and model-local functions, and the external-data files, each checked to
stay inside the model's folder (a crafted file cannot make us read elsewhere).
Build, compare, serving, bench and the ONNX Runtime runner all start here; no
other module parses an exported file.  Torch-free.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from .contracts import DOMAIN
from .errors import ConfigError, OnnxModelError
from .graph_spec import ATTENTION_MASK, META_CONFIG, META_DECOMPOSED, META_DTYPE, META_GRAPH, GraphSpec
from .onnx_wire import LEAVE_OUT_ABOVE, load_without_weights
from .untrusted import contained



@dataclass(frozen=True)
class GraphTensor:
    """A graph input or output as the file declares it."""

    name: str
    elem_type: int | None  # onnx.TensorProto.DataType (1 FLOAT, 7 INT64, ...); None: not a tensor
    dims: tuple  # per axis: int (fixed), str (named dynamic), None (unnamed dynamic)

    @classmethod
    def of(cls, v) -> "GraphTensor":
        if not v.type.HasField("tensor_type"):
            return cls(v.name, None, ())
        tt = v.type.tensor_type
        dims = tuple(int(d.dim_value) if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim)
        return cls(v.name, tt.elem_type, dims)


def _parse(path: Path, weights: bool):
    """The ModelProto at `path` (external data never loaded); weights=False: large in-file
    weights left out too (onnx_wire).  The one place an exported file is parsed."""
    import onnx

    return onnx.load(str(path), load_external_data=False) if weights else load_without_weights(path)


def _external_entries(model):
    """(tensor name, {key: value}) for every initializer stored outside the file."""
    import onnx

    for init in model.graph.initializer:
        if init.data_location == onnx.TensorProto.EXTERNAL:
            yield init.name, {e.key: e.value for e in init.external_data}


def inputs_of(path) -> list[Path]:
    """The model file and every external-data file it names: what no command's output may
    overwrite (fileio.check_outputs).  An unreadable file gives just itself: whoever reads
    it next says why, in one line."""
    path = Path(path)
    try:
        return [path, *external_data_files(_parse(path, weights=False), path, skip=path.name).values()]
    except Exception:
        return [path]


def external_data_files(model, path: str | os.PathLike, skip: str | None = None) -> dict[str, Path]:
    """{location as written in the model: real path} of each external-data file, checked:
    relative, inside the model's folder after symlinks, a regular file with one link,
    and long enough for every tensor stored in it.  skip: a location not to check or
    list (the skeleton's references to the model file itself)."""
    path = Path(path)
    files: dict[str, Path] = {}
    need: dict[str, int] = {}
    for name, entry in _external_entries(model):
        loc = entry.get("location", "")
        if skip is not None and loc == skip:
            continue
        if loc not in files:
            files[loc] = contained(path.parent, loc, f"{path}: external data file", OnnxModelError)
        try:
            offset, length = int(entry.get("offset", 0)), int(entry.get("length", 0))
        except ValueError:
            raise OnnxModelError(f"{path}: external data of '{name}' has a non-integer offset or length") from None
        if offset < 0 or length < 0:
            raise OnnxModelError(f"{path}: external data of '{name}' has a negative offset or length")
        need[loc] = max(need.get(loc, 0), offset + length)
    for loc, real in files.items():
        if real.stat().st_size < need[loc]:
            raise OnnxModelError(f"{path}: external data file {loc!r} is truncated")
    return files


def _check_path(path: Path, label: str) -> None:
    if not path.exists():
        raise OnnxModelError(f"{label}{path}: no such file")
    if path.is_dir():
        raise OnnxModelError(f"{label}{path}: is a directory, expected an .onnx file")
    if not path.is_file():
        raise OnnxModelError(f"{label}{path}: not a regular file, expected an .onnx file")
    if path.stat().st_size == 0:
        raise OnnxModelError(f"{label}{path}: file is empty")


def all_nodes(graph):
    """The nodes of `graph` and of every subgraph in their attributes."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.HasField("g"):
                yield from all_nodes(attr.g)
            for g in attr.graphs:
                yield from all_nodes(g)


@dataclass
class ExportedGraph:
    path: Path
    proto: object  # onnx.ModelProto: without external data; weights=False: without large in-file weights
    label: str = ""  # how errors name the file's option, e.g. "--onnx "
    external_files: dict[str, Path] = field(default_factory=dict)  # {location: checked real path}

    @classmethod
    def open(cls, path: str | os.PathLike, weights: bool = False, label: str = "",
             check_functions: bool = True) -> "ExportedGraph":
        """Parse `path` once, or raise OnnxModelError with one line naming what is wrong.
        check_functions=False: open a file whose msar function bodies another tool broke
        (only `msar-export onnx repair` does, to mend it)."""
        from google.protobuf.message import DecodeError

        path = Path(path)
        _check_path(path, label)
        try:
            proto = _parse(path, weights)
        except (DecodeError, ValueError, RuntimeError, EOFError) as e:
            raise OnnxModelError(f"{label}{path}: not an ONNX model or truncated "
                                 f"(protobuf parse failed: {str(e)[:120]})") from None
        # Protobuf parses many non-ONNX byte strings into an empty message.
        if not proto.graph.node or not proto.graph.output:
            raise OnnxModelError(f"{label}{path}: not an ONNX model or truncated (no graph nodes or outputs)")
        files = external_data_files(proto, path, skip=None if weights else path.name)
        graph = cls(path, proto, label, files)
        if check_functions:
            graph.check_functions()
        return graph

    @classmethod
    def from_proto(cls, proto, path: str | os.PathLike = "the model") -> "ExportedGraph":
        """A model already in memory (loaded with its weights, or built), read the same way."""
        return cls(Path(path), proto)

    # -- what the file says about itself ---------------------------------------------
    @property
    def metadata(self) -> dict[str, str]:
        return {p.key: p.value for p in self.proto.metadata_props}

    @cached_property
    def config(self):
        """The MSARConfig in msar.config (parsed once per opened file), or OnnxModelError (not exported
        by msar-export, or unreadable)."""
        from .config import MSARConfig

        meta = self.metadata
        if META_CONFIG not in meta:
            raise OnnxModelError(f"{self.label}{self.path}: no {META_CONFIG} metadata, so it was not exported by "
                                 "msar-export; export it with `msar-export export`")
        try:
            return MSARConfig.from_json(meta[META_CONFIG], "msar.config metadata")
        except ConfigError as e:
            raise OnnxModelError(f"{self.label}{self.path}: unreadable msar.config metadata ({e})") from None

    @property
    def max_seq_len(self) -> int:
        """The longest sequence the graph was exported for: msar.config's, checked with the rest of
        the config; MSARConfig's default for a file without msar.config (not exported by msar-export)."""
        from .config import MSARConfig

        return self.config.max_seq_len if META_CONFIG in self.metadata else MSARConfig().max_seq_len

    @property
    def kind(self) -> str:
        """"prefill" | "decode": msar.graph, else whether the graph takes an attention mask."""
        return self.metadata.get(META_GRAPH) or ("decode" if ATTENTION_MASK in self.input_names else "prefill")

    @property
    def decode(self) -> bool:
        return self.kind == "decode"

    @property
    def spec(self) -> GraphSpec:
        return GraphSpec(self.config, decode=self.decode)

    @property
    def precision(self) -> str | None:
        """msar.dtype: the precision the graph computes in (None when absent)."""
        return self.metadata.get(META_DTYPE)

    @property
    def decomposed(self) -> bool:
        return self.metadata.get(META_DECOMPOSED) == "true"

    # -- the graph ---------------------------------------------------------------------
    @property
    def initializers(self) -> dict:
        return {t.name: t for t in self.proto.graph.initializer}

    @cached_property
    def inputs(self) -> tuple[GraphTensor, ...]:
        """The graph inputs a caller feeds (initializers left out): the one reader of a graph's I/O."""
        inits = {t.name for t in self.proto.graph.initializer}
        return tuple(GraphTensor.of(v) for v in self.proto.graph.input if v.name not in inits)

    @property
    def input_names(self) -> list[str]:
        return [v.name for v in self.inputs]

    @cached_property
    def outputs(self) -> tuple[GraphTensor, ...]:
        return tuple(GraphTensor.of(v) for v in self.proto.graph.output)

    @property
    def files(self) -> list[Path]:
        """The model file and its checked external-data files: what no output may overwrite."""
        return [self.path, *self.external_files.values()]

    @property
    def custom_ops(self) -> dict[str, int]:
        """{op_type: count} of the msar custom nodes in the main graph."""
        counts: dict[str, int] = {}
        for node in self.proto.graph.node:
            if node.domain == DOMAIN:
                counts[node.op_type] = counts.get(node.op_type, 0) + 1
        return counts

    @property
    def opsets(self) -> dict[str, int]:
        return {o.domain: o.version for o in self.proto.opset_import}

    @property
    def functions(self) -> list[tuple[str, str, str]]:
        """(domain, name, overload) of each model-local function."""
        return [(f.domain, f.name, getattr(f, "overload", "")) for f in self.proto.functions]

    def check_functions(self) -> None:
        """Every msar node must find the function body of its own arity, under its own overload,
        once: what msar-export writes.  Tools that key functions by name alone break that
        (onnxslim keeps one body for every node, onnx-graphsurgeon blanks the overloads into
        duplicates), and ONNX Runtime then fails deep inside a body, or on the duplicates, with
        nothing that names the cause.  OnnxModelError: one line, the cause and the repair."""
        bodies: dict[tuple[str, str], int] = {}
        duplicated = set()
        for f in self.proto.functions:
            if f.domain == DOMAIN:
                key = (f.name, getattr(f, "overload", ""))
                if key in bodies:
                    duplicated.add(key)
                bodies[key] = len(f.input)
        nodes = [n for n in all_nodes(self.proto.graph) if n.domain == DOMAIN]
        bad = [n for n in nodes if bodies.get((n.op_type, n.overload)) != len(n.input)]
        if not bad and not duplicated:
            return
        what = (f"{len(duplicated)} msar functions share one name and overload (overloads blanked)" if duplicated
                else f"{len(bad)} of {len(nodes)} msar nodes find no function body of their arity under their overload")
        fixed = self.path.with_name(self.path.stem + ".repaired.onnx")
        held = ", ".join(sorted(f"{name}/{overload or '(none)'}" for name, overload in bodies)[:4]) or "none"
        raise OnnxModelError(
            f"{self.label}{self.path}: {what} (function overloads held: {held}): a tool that rewrites functions "
            f"by name (onnxslim, onnx-graphsurgeon, polygraphy surgeon) broke the msar ops; fix it with "
            f"`msar-export onnx repair {self.path} -o {fixed}` (add --functions-from ORIGINAL.onnx to take the "
            "bodies from the file msar-export wrote rather than rebuild them from msar.config)")

    @property
    def uses_external_data(self) -> bool:
        """Whether the weights live (also) in files beside the model (> 2 GB exports)."""
        return bool(self.external_files)

    def model_bytes(self, extra_outputs=(), drop_functions=frozenset()) -> bytes:
        """The parsed model serialised again, with `extra_outputs` marked as graph outputs, the
        model-local functions named in `drop_functions` ((domain, name) pairs) left out, and small tensors kept in
        external files read in (ONNX Runtime's shape inference reads constants only from the
        model itself when it gets bytes); the parsed model itself is left as it was.  Large
        weights keep their references (to the model file itself, for a skeleton): load the
        bytes with the model's folder as the external-data folder."""
        import onnx

        proto, graph = self.proto, self.proto.graph
        n_out, kept_functions = len(graph.output), list(proto.functions)
        have = {o.name for o in graph.output}
        graph.output.extend(onnx.ValueInfoProto(name=n) for n in extra_outputs if n not in have)
        if drop_functions:
            del proto.functions[:]
            proto.functions.extend(f for f in kept_functions if (f.domain, f.name) not in drop_functions)
        inlined = self._inline_small_external()
        try:
            return proto.SerializeToString()
        finally:
            del graph.output[n_out:]
            del proto.functions[:]
            proto.functions.extend(kept_functions)
            for t, entries in inlined:
                t.ClearField("raw_data")
                t.data_location = onnx.TensorProto.EXTERNAL
                t.external_data.extend(entries)

    def _inline_small_external(self, limit: int = LEAVE_OUT_ABOVE) -> list:
        """Read each external tensor of at most `limit` bytes from its (checked) file into the
        model; return [(tensor, its external-data entries)] to undo it."""
        import onnx

        done = []
        for t in self.proto.graph.initializer:
            if t.data_location != onnx.TensorProto.EXTERNAL:
                continue
            entry = {e.key: e.value for e in t.external_data}
            real = self.external_files.get(entry.get("location", ""))
            length = int(entry.get("length", -1) or -1)
            if real is None or not 0 <= length <= limit:
                continue
            with open(real, "rb") as f:
                f.seek(int(entry.get("offset", 0)))
                data = f.read(length)
            entries = [onnx.StringStringEntryProto(key=e.key, value=e.value) for e in t.external_data]
            del t.external_data[:]
            t.data_location = onnx.TensorProto.DEFAULT
            t.raw_data = data
            done.append((t, entries))
        return done
