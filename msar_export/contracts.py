"""The `msar` custom ops, written once.

The torch export path, the ONNX function bodies' attributes, the benchmark's
node, the kernels' ctypes arguments, the TensorRT plugins' generated headers
(contract_headers.py) and docs/custom_ops.md all follow these records; tests
check that the plugin READMEs and the exported nodes agree with them.
"""

from __future__ import annotations

from dataclasses import dataclass

DOMAIN = "msar"
# 2: SourceViews reads its row of the conv state in place (state, index, source in place of a built
# window) and zeroes padded tokens itself (mask); ConvState is new. Files of version 1 still load
# with a version-2 library: their SourceViews nodes find no kernel of their version and ONNX Runtime
# runs their function bodies.
DOMAIN_VERSION = 2
PLUGIN_VERSION = "1"
PLUGIN_NAMESPACE = ""


@dataclass(frozen=True)
class Port:
    name: str
    shape: str
    dtype: str
    doc: str
    variadic: bool = False


@dataclass(frozen=True)
class Attr:
    name: str
    type: str  # ONNX attribute type: INT, INTS, FLOAT, STRING
    default: object  # None: required
    doc: str
    config: str | None = None  # the MSARConfig field an export takes the value from; None: the default
    kernel: bool = True  # a kernel argument (False: only read by TensorRT's ONNX parser)
    count: str | None = None  # INTS: the kernel argument that holds the list's length

    def kernel_members(self) -> list[tuple[str, str]]:
        """(C type, member) pairs this attribute adds to its op's kernel arguments: an INTS is a host
        array and its length; the generated msarKernelAttrs.h and the ctypes binding both follow it."""
        if self.type == "INTS":
            return [("int32_t const*", self.name), ("int32_t", self.count)]
        return [({"INT": "int32_t", "FLOAT": "float"}[self.type], self.name)]

    def coerce(self, value):
        """`value` as the attribute type's Python value (what onnx-ir and ctypes are given)."""
        return {"INTS": lambda v: [int(x) for x in v], "INT": int, "FLOAT": float, "STRING": str}[self.type](value)


@dataclass(frozen=True)
class OpContract:
    name: str
    doc: str
    inputs: tuple[Port, ...]
    outputs: tuple[Port, ...]
    attributes: tuple[Attr, ...]
    # A TensorRT plugin implements it. False: its function body has one overload per file, which
    # TensorRT's parser imports as standard layers (engines/onnx_info.py keeps that body).
    plugin: bool = True
    since: int = 1  # the first domain version with this contract (the native kernel's start version)

    def overload(self, n_sources: int) -> str:
        """Function overload for a given number of sources: ONNX functions have a
        fixed input list, so each arity gets its own body under one op name."""
        return f"n{n_sources}"

    @property
    def n_fixed_inputs(self) -> int:
        return sum(not p.variadic for p in self.inputs)

    @property
    def kernel_attributes(self) -> tuple[Attr, ...]:
        return tuple(a for a in self.attributes if a.kernel)

    def attribute_values(self, cfg=None, **given) -> dict:
        """Every attribute's value, in contract order: `given` by name, else the model config's field
        (Attr.config), else the default; a required attribute with none of these is an error."""
        unknown = set(given) - {a.name for a in self.attributes}
        if unknown:
            raise TypeError(f"{self.name}: unknown attribute(s) {sorted(unknown)}")
        out = {}
        for a in self.attributes:
            if a.name in given:
                value = given[a.name]
            elif cfg is not None and a.config is not None:
                value = getattr(cfg, a.config)
            else:
                value = a.default
            if value is None:
                raise TypeError(f"{self.name}: attribute {a.name} is required")
            out[a.name] = a.coerce(value)
        return out


COMMON_ATTRS = (
    Attr("plugin_version", "STRING", PLUGIN_VERSION, "TensorRT plugin version the ONNX parser looks up", kernel=False),
    Attr("plugin_namespace", "STRING", PLUGIN_NAMESPACE, "TensorRT plugin namespace the ONNX parser looks up",
         kernel=False),
)

STREAM_KERNELS = Attr("stream_kernels", "INTS", None, "kernel size per stream, first is 1 (identity)",
                      config="stream_kernels", count="n_streams")
EPS = Attr("eps", "FLOAT", 1e-6, "mixer_eps of the parameter-free key RMSNorm", config="mixer_eps")
GATE_PORTS = (  # the scalar stream gate's parameters (MSAR_SPEC 1.3): FusedMixer and StreamGate
    Port("gate_weight", "[m, m*d]", "T", "fusion projection W_l in nn.Linear layout"),
    Port("gate_bias", "[m]", "T", "fusion bias b_l"),
    Port("gate_scale", "[]", "T", "fusion scalar a_l"),
)

SOURCES = Port("sources", "[B, T, d]", "T", "x_0 .. x_{n-1}, n >= 1 (variadic)", variadic=True)
MIXER_OUTPUT = Port("h", "[B, T, d]", "T", "the mixer output h_l")

FUSED_MIXER = OpContract(
    name="FusedMixer",
    doc=(
        "Mixer l of an msar model from the raw sources: causal depthwise conv views "
        "computed on the fly, per-stream RMS-normalised softmax retrieval over depth, "
        "sigmoid scalar gate per stream, sum of gated streams. Float32 inside."
    ),
    inputs=(
        Port("query", "[m, d]", "T", "pseudo-query per stream (a key-norm weight, if any, folded in)"),
        *GATE_PORTS,
        Port("conv_weight", "[N, K, d]", "T",
             "taps of every source in the layout the kernels read, channels last, N >= n: "
             "conv_weight[i, o_r + j, c] is tap j of stream r (r = 1..m-1) for channel c of source i, "
             "o_r = sum(stream_kernels[1:r]), in Conv1d order (tap j multiplies token t-(k_r-1-j)); "
             "K = sum(stream_kernels[1:])"),
        SOURCES,
    ),
    outputs=(MIXER_OUTPUT,),
    attributes=(
        STREAM_KERNELS,
        EPS,
    ) + COMMON_ATTRS,
)

DEPTH_RETRIEVAL = OpContract(
    name="DepthRetrieval",
    doc=(
        "Per-stream depth retrieval over already-expanded views: each stream scores "
        "every source view against its own pseudo-query (q . RMSNorm(v)), takes a "
        "softmax over sources, and returns the weighted sum. Float32 inside."
    ),
    inputs=(
        Port("query", "[m, d]", "T", "pseudo-query per stream"),
        Port("views", "[B, T, m, d]", "T", "v_0 .. v_{n-1}: the m views of each source, n >= 1 (variadic)",
             variadic=True),
    ),
    outputs=(Port("z", "[B, T, m, d]", "T", "retrieved stream vectors z^(0..m-1)"),),
    attributes=(EPS,) + COMMON_ATTRS,
)

SOURCE_VIEWS = OpContract(
    name="SourceViews",
    doc=(
        "The m views of one source (MSAR_SPEC 1.1): the source itself and one causal depthwise "
        "convolution per stream r >= 1, over the window [state[index]; source] (kmax-1+T positions), "
        "read where it lies: no window tensor is built. Padded tokens (mask 0) count as zeros, in the "
        "views and in the window. Float32 inside, rounded once to T."
    ),
    inputs=(
        Port("conv_weight", "[K, d]", "T",
             "this source's taps, one row of FusedMixer's conv_weight: conv_weight[o_r + j, c] is tap j "
             "of stream r for channel c (Conv1d order: tap j multiplies token t-(k_r-1-j))"),
        Port("state", "[S, B, kmax-1, d]", "T",
             "kmax-1 positions before each of S sources' tokens: past_conv_state when decoding, zeros "
             "at a sequence start (S = 1)"),
        Port("index", "[]", "int64", "the row of state that precedes this source's tokens"),
        Port("source", "[B, T, d]", "T", "x_i, the source's T tokens"),
        Port("mask", "[B, T]", "int64", "nonzero: a real token; zero: padding, read as a zero row"),
    ),
    outputs=(Port("views", "[B, T, m, d]", "T",
                  "views[:, :, 0] = the source's tokens, views[:, :, r] = stream r's convolution"),),
    attributes=(STREAM_KERNELS,),
    plugin=False,
    since=2,
)

STREAM_GATE = OpContract(
    name="StreamGate",
    doc=(
        "Mixer l's scalar stream fusion (MSAR_SPEC 1.3) over its retrieved streams: "
        "g = sigmoid(a_l * (flat(z) W_l^T) + b_l), one scalar per stream, and h = sum_r g^(r) z^(r). "
        "Float32 inside."
    ),
    inputs=(
        *GATE_PORTS,
        Port("z", "[B, T, m, d]", "T", "retrieved stream vectors z^(0..m-1) (DepthRetrieval's output)"),
    ),
    outputs=(MIXER_OUTPUT,),
    attributes=(),
    plugin=False,
)

CONV_STATE = OpContract(
    name="ConvState",
    doc=(
        "The decode graph's next convolution state: per source i, the last kmax-1 positions of "
        "[past[i]; x_i], one node for every source at the end of a step (MSAR_SPEC 1.1's causal "
        "windows carried across calls), padded tokens (mask 0) as zero rows. Copies only."
    ),
    inputs=(
        Port("past", "[N, B, kmax-1, d]", "T", "past_conv_state: kmax-1 positions of every source"),
        Port("mask", "[B, T]", "int64", "nonzero: a real token; zero: padding, kept as a zero row"),
        Port("sources", "[B, T, d]", "T", "x_0 .. x_{N-1}, N (variadic)", variadic=True),
    ),
    outputs=(Port("present", "[N, B, kmax-1, d]", "T", "present_conv_state"),),
    attributes=(),
    plugin=False,
    since=2,
)

SOURCE_SCORES = OpContract(
    name="SourceScores",
    doc=(
        "Source i's retrieval scores for every later mixer (MSAR_SPEC 1.2), made once per source "
        "(`--mixer-op scored`): its m views (MSAR_SPEC 1.1, zeros before the sequence start), each "
        "RMS-normalised, dotted with the pseudo-query of each of the P mixers that read the source. "
        "Float32 inside and out (the spec's scores are float32 whatever the storage type)."
    ),
    inputs=(
        Port("conv_weight", "[K, d]", "T", "this source's taps, as SourceViews' conv_weight"),
        Port("queries", "[P, m, d]", "T",
             "queries[p] = the pseudo-queries of mixer i+1+p (the mixers after source i, in order)"),
        Port("source", "[B, T, d]", "T", "x_i"),
    ),
    outputs=(Port("scores", "[P, B, T, m]", "float32",
                  "scores[p, b, t, r] = q_{i+1+p}^(r) . RMSNorm(x_i^(r))[b, t]"),),
    attributes=(STREAM_KERNELS, EPS),
    plugin=False,
)

SCORED_MIXER = OpContract(
    name="ScoredMixer",
    doc=(
        "Mixer l from the raw sources and their scores (SourceScores): per stream the softmax over "
        "the sources of the given scores, the causal depthwise conv views recomputed on the fly, "
        "their weighted sum, the sigmoid scalar gate per stream and the sum of gated streams. "
        "FusedMixer without its scoring pass (`--mixer-op scored`). Float32 inside."
    ),
    inputs=(
        *GATE_PORTS,
        Port("conv_weight", "[N, K, d]", "T", "taps of every source, N >= n, as FusedMixer's conv_weight"),
        Port("scores", "[n, B, T, m]", "float32",
             "scores[i] = s_{i,l}: row l-1-i of source i's SourceScores output"),
        SOURCES,
    ),
    outputs=(MIXER_OUTPUT,),
    attributes=(STREAM_KERNELS,),
    plugin=False,
)

CONTRACTS = {c.name: c for c in (FUSED_MIXER, DEPTH_RETRIEVAL, SOURCE_VIEWS, STREAM_GATE, SOURCE_SCORES,
                                 SCORED_MIXER, CONV_STATE)}
PLUGIN_CONTRACTS = {name: c for name, c in CONTRACTS.items() if c.plugin}


def render_markdown() -> str:
    """docs/custom_ops.md body: one section per op."""
    out = [f"# `{DOMAIN}` custom ops (domain version {DOMAIN_VERSION})", "",
           "Generated from `msar_export/contracts.py`; `T` is float32, float16 or bfloat16.", ""]
    for c in CONTRACTS.values():
        since = [] if c.since == 1 else [f"Since domain version {c.since}.", ""]
        out += [f"## `{DOMAIN}::{c.name}`", "", c.doc, "", *since, "| input | shape | dtype | meaning |",
                "| --- | --- | --- | --- |"]
        out += [f"| `{p.name}`{' (variadic)' if p.variadic else ''} | `{p.shape}` | {p.dtype} | {p.doc} |" for p in c.inputs]
        out += ["", "| output | shape | dtype | meaning |", "| --- | --- | --- | --- |"]
        out += [f"| `{p.name}` | `{p.shape}` | {p.dtype} | {p.doc} |" for p in c.outputs]
        out += ["", "| attribute | type | default | meaning |", "| --- | --- | --- | --- |"]
        out += [f"| `{a.name}` | {a.type} | {a.default!r} | {a.doc} |" for a in c.attributes]
        out += [""]
    return "\n".join(out)
