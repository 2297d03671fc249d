"""ONNX function bodies (standard ops only) for the `msar` custom ops, so stock
ONNX Runtime runs a file that holds `msar::*` nodes unchanged.

Bodies are generated per number of sources (the op is variadic, an ONNX
function's input list is not) and registered as overloads `n{count}` of one
function name (SourceViews, StreamGate and SourceScores, not variadic: one overload, `n0`;
ConvState, variadic but one node per decode graph: one overload).  Everything runs in float32
and is cast back to the input type.

A body has the same nodes whatever the number of sources n: the n variadic
inputs enter one Concat and everything after it works on the stacked tensor.
Bodies with one group of nodes per source made the functions of an
L-sublayer model O(L^2) nodes in all (31k at 16 blocks), paid for again by
the checker, shape inference and ONNX Runtime's inliner; stacked, they are
O(L) nodes (only the Concat inputs stay O(L^2)).
"""

from __future__ import annotations

import onnx_ir as ir
from onnx_ir.tape import Tape

from ..contracts import (CONV_STATE, DEPTH_RETRIEVAL, DOMAIN, FUSED_MIXER, SCORED_MIXER, SOURCE_SCORES, SOURCE_VIEWS,
                         STREAM_GATE, OpContract)

FLOAT = ir.DataType.FLOAT
_IR_TYPES = {"INTS": ir.AttributeType.INTS, "INT": ir.AttributeType.INT, "FLOAT": ir.AttributeType.FLOAT,
             "STRING": ir.AttributeType.STRING}


def ir_attributes(contract: OpContract, values: dict) -> list[ir.Attr]:
    """`values` (OpContract.attribute_values) as onnx-ir attributes, typed and ordered by the contract:
    a node's attributes and its function's defaults alike."""
    return [ir.Attr(a.name, _IR_TYPES[a.type], values[a.name]) for a in contract.attributes]


class _Body:
    """A thin helper over onnx-ir's Tape for writing a function body."""

    def __init__(self):
        self.tape = Tape()

    def __getattr__(self, op_type):  # body.Mul(a, b, axis=0) -> Value
        def emit(*inputs, **attrs):
            return self.tape.op(op_type, list(inputs), attributes=attrs or None)

        return emit

    def ints(self, values):
        return self.tape.op("Constant", [], attributes={"value_ints": list(values)})

    def int_(self, value):
        return self.tape.op("Constant", [], attributes={"value_int": int(value)})

    def ref_float(self, attr_name):
        """A float32 scalar taken from the calling node's attribute `attr_name`."""
        return self.tape.op("Constant", [], attributes={"value_float": ir.RefAttr("value_float", attr_name, ir.AttributeType.FLOAT)})


def _inputs(names):
    return [ir.Value(name=n) for n in names]


def _function(contract: OpContract, n: int, inputs, outputs, b: _Body, values: dict, opset: int) -> ir.Function:
    graph = ir.Graph(inputs, outputs, nodes=b.tape.nodes, opset_imports={"": opset}, name=contract.name)
    return ir.Function(DOMAIN, contract.name, contract.overload(n), graph=graph,
                       attributes=ir_attributes(contract, values))


def depth_retrieval_function(n: int, values: dict, opset: int) -> ir.Function:
    """views_i (B,T,m,d) stacked to (B,T,n,m,d); per stream s = (q . v) / rms(v),
    softmax over the n sources, z = sum_i alpha_i v_i."""
    ins = _inputs(["query"] + [f"views_{i}" for i in range(n)])
    b = _Body()
    query = b.Cast(ins[0], to=FLOAT)  # (m, d)
    stacked = b.Concat(*ins[1:], axis=2)  # (B, T, n*m, d)
    shape = b.Shape(ins[1])  # B, T, m, d
    five = b.Concat(b.Slice(shape, b.ints([0]), b.ints([2])), b.ints([n]), b.Slice(shape, b.ints([2]), b.ints([4])), axis=0)
    V = b.Cast(b.Reshape(stacked, five), to=FLOAT)  # (B, T, n, m, d)
    qv = b.ReduceSum(b.Mul(V, query), b.ints([-1]), keepdims=0)  # (B, T, n, m)
    ms = b.ReduceMean(b.Mul(V, V), b.ints([-1]), keepdims=0)
    alpha = b.Softmax(b.Div(qv, b.Sqrt(b.Add(ms, b.ref_float("eps")))), axis=2)  # each stream over depth
    z = b.ReduceSum(b.Mul(b.Unsqueeze(alpha, b.ints([-1])), V), b.ints([2]), keepdims=0)  # (B, T, m, d)
    out = b.CastLike(z, ins[1])
    out.name = "z"
    return _function(DEPTH_RETRIEVAL, n, ins, [out], b, values, opset)


def fused_mixer_function(n: int, values: dict, d: int, opset: int) -> ir.Function:
    """Body for `n` sources of width `d` (Conv's `group` is static); kernels and
    width are fixed for a model, so one overload per source count suffices.

    The sources stack to X (B, T, n*d); each conv stream is one depthwise Conv
    over all n sources at once (channels first: group n*d, taps conv_weight[:n]),
    transposed back, so every view V_r is (B, T, n, d) with channels last: the
    scores are one MatMul against q^(r), the norms a reduction over the
    contiguous last axis, the softmax runs over the last axis of (B, T, 1, n),
    and z^(r) = alpha @ V_r is one batched MatMul.  (Channels-first views made
    every reduction strided and the softmax transpose: 1.7x slower in ORT.)
    The gate logits are flat(Z) @ W^T and h = g @ Z, Z = (B, T, m, d)."""
    ins = _inputs(["query", "gate_weight", "gate_bias", "gate_scale", "conv_weight"] + [f"sources_{i}" for i in range(n)])
    query_in, gw_in, gb_in, gs_in, conv_in, *sources = ins
    b = _Body()
    query = b.Cast(query_in, to=FLOAT)  # (m, d)
    eps_v = b.ref_float("eps")
    views = _stacked_views(b, sources, conv_in, n, d, values["stream_kernels"])
    zs = []
    for r, V in enumerate(views):
        q = b.Reshape(b.Slice(query, b.ints([r]), b.ints([r + 1]), b.ints([0])), b.ints([d, 1]))  # (d, 1)
        qv = b.MatMul(V, q)  # (B, T, n, 1)
        ms = b.ReduceMean(b.Mul(V, V), b.ints([3]), keepdims=1)  # (B, T, n, 1)
        scores = b.Transpose(b.Div(qv, b.Sqrt(b.Add(ms, eps_v))), perm=[0, 1, 3, 2])  # (B, T, 1, n)
        zs.append(b.MatMul(b.Softmax(scores, axis=3), V))  # softmax over the n sources; z^(r): (B, T, 1, d)
    out = b.CastLike(_gated_sum(b, zs, gw_in, gb_in, gs_in, d), sources[0])
    out.name = "h"
    return _function(FUSED_MIXER, n, ins, [out], b, values, opset)


def _stacked_views(b: _Body, sources, conv_in, n: int, d: int, stream_kernels) -> list:
    """The views of n sources, one (B, T, n, d) float32 tensor per stream (FusedMixer, ScoredMixer)."""
    X = b.Cast(b.Concat(*sources, axis=2), to=FLOAT)  # (B, T, n*d)
    by_source = b.ints([0, 0, n, d])  # (B, T, n*d) -> (B, T, n, d)
    views = [b.Reshape(X, by_source)]
    if len(stream_kernels) > 1:  # stream_kernels [1]: the identity view alone, no taps to read
        # conv_weight is [N, K, d] (the kernels' layout); Conv wants each channel's taps together
        first_n = b.Slice(conv_in, b.ints([0]), b.ints([n]), b.ints([0]))
        conv = b.Cast(b.Transpose(first_n, perm=[0, 2, 1]), to=FLOAT)  # (n, d, K)
        Xt = b.Transpose(X, perm=[0, 2, 1])  # (B, n*d, T), channels first for Conv
    offset = 0
    for k in stream_kernels[1:]:
        w = b.Reshape(b.Slice(conv, b.ints([offset]), b.ints([offset + k]), b.ints([2])), b.ints([n * d, 1, k]))
        Y = b.Conv(Xt, w, group=n * d, kernel_shape=[k], pads=[k - 1, 0])  # zeros before t = 0
        views.append(b.Reshape(b.Transpose(Y, perm=[0, 2, 1]), by_source))
        offset += k
    return views


def _gated_sum(b: _Body, zs: list, gw_in, gb_in, gs_in, d: int):
    """MSAR_SPEC 1.3 over the retrieved streams zs (each (B, T, 1, d), float32) -> h (B, T, d) float32:
    the gate logits are flat(Z) @ W^T and h = g @ Z, Z = (B, T, m, d)."""
    m = len(zs)
    Z = zs[0] if m == 1 else b.Concat(*zs, axis=2)  # (B, T, m, d)
    flat = b.Reshape(Z, b.ints([0, 0, 1, m * d]))  # streams in order [z^(0), ..., z^(m-1)]
    logits = b.MatMul(flat, b.Transpose(b.Cast(gw_in, to=FLOAT), perm=[1, 0]))  # (B, T, 1, m)
    gates = b.Sigmoid(b.Add(b.Mul(logits, b.Cast(gs_in, to=FLOAT)), b.Cast(gb_in, to=FLOAT)))
    return b.Reshape(b.MatMul(gates, Z), b.ints([0, 0, d]))  # sum_r g^(r) z^(r): (B, T, d)


def scored_mixer_function(n: int, values: dict, d: int, opset: int) -> ir.Function:
    """Body for `n` sources: FusedMixer's (the same stacked views) with the softmax taken over the given
    scores (n, B, T, m), transposed once to (B, T, m, n) so that z^(r) = alpha^(r) @ V_r."""
    ins = _inputs(["gate_weight", "gate_bias", "gate_scale", "conv_weight", "scores"] + [f"sources_{i}" for i in range(n)])
    gw_in, gb_in, gs_in, conv_in, scores_in, *sources = ins
    b = _Body()
    alpha = b.Transpose(b.Softmax(b.Cast(scores_in, to=FLOAT), axis=0), perm=[1, 2, 3, 0])  # (B, T, m, n)
    views = _stacked_views(b, sources, conv_in, n, d, values["stream_kernels"])
    zs = [b.MatMul(b.Slice(alpha, b.ints([r]), b.ints([r + 1]), b.ints([2])), V) for r, V in enumerate(views)]
    out = b.CastLike(_gated_sum(b, zs, gw_in, gb_in, gs_in, d), sources[0])
    out.name = "h"
    return _function(SCORED_MIXER, n, ins, [out], b, values, opset)


def source_scores_function(values: dict, d: int, opset: int) -> ir.Function:
    """source (B, T, d) -> its views V (B, T, m, d) (one depthwise Conv per stream, channels first),
    keys = V / rms(V), scores = keys against every later mixer's queries (P, m, d) in one broadcast
    MatMul, (B, T, m, 1, d) @ (m, d, P), transposed to (P, B, T, m). One body per file."""
    ins = _inputs(["conv_weight", "queries", "source"])
    taps_in, queries_in, source_in = ins
    b = _Body()
    views = _stacked_views(b, [source_in], b.Unsqueeze(taps_in, b.ints([0])), 1, d, values["stream_kernels"])
    V = views[0] if len(views) == 1 else b.Concat(*views, axis=2)  # (B, T, m, d)
    keys = b.Div(V, b.Sqrt(b.Add(b.ReduceMean(b.Mul(V, V), b.ints([3]), keepdims=1), b.ref_float("eps"))))
    Q = b.Transpose(b.Cast(queries_in, to=FLOAT), perm=[1, 2, 0])  # (m, d, P)
    S = b.MatMul(b.Unsqueeze(keys, b.ints([3])), Q)  # (B, T, m, 1, P)
    out = b.Transpose(b.Squeeze(S, b.ints([3])), perm=[3, 0, 1, 2])  # (P, B, T, m) float32
    out.name = "scores"
    return _function(SOURCE_SCORES, 0, ins, [out], b, values, opset)


def _masked(b: _Body, x, mask):
    """x (B, T, d) with the rows of padded tokens (mask (B, T) zero) zeroed: a Where, so a padded NaN
    becomes zero too."""
    keep = b.Cast(b.Unsqueeze(mask, b.ints([2])), to=ir.DataType.BOOL)
    return b.Where(keep, x, b.CastLike(b.tape.op("Constant", [], attributes={"value_float": 0.0}), x))


def source_views_function(values: dict, d: int, opset: int) -> ir.Function:
    """The window [state[index]; source] (B, kmax-1+T, d) channels first as (B, d, 1, kmax-1+T); stream r
    is one depthwise 2-D Conv (height 1: ONNX Runtime's depthwise path, model/mixing.py _merged_conv)
    over the last k_r-1+T positions; the identity is the last T; stacked (B, m, d, T) and transposed
    to (B, T, m, d). One body per file (width and kernels are the model's), so TensorRT's parser can
    import it as standard layers."""
    ins = _inputs(["conv_weight", "state", "index", "source", "mask"])
    taps_in, state_in, index_in, source_in, mask_in = ins
    b = _Body()
    kernels = values["stream_kernels"]
    kmax = max(kernels)
    if len(kernels) > 1:  # stream_kernels [1] has no taps (and graphs.py writes no SourceViews for it)
        taps = b.Transpose(b.Cast(taps_in, to=FLOAT), perm=[1, 0])  # (d, K)
    window = b.Concat(b.Gather(state_in, index_in, axis=0), _masked(b, source_in, mask_in), axis=1)
    planes = b.Unsqueeze(b.Transpose(b.Cast(window, to=FLOAT), perm=[0, 2, 1]), b.ints([2]))  # (B, d, 1, L)
    end = b.ints([2**62])

    def last(k):  # the window's last k-1+T positions
        return b.Slice(planes, b.ints([kmax - k]), end, b.ints([3]))

    ys, offset = [b.Unsqueeze(last(1), b.ints([1]))], 0  # (B, 1, d, 1, T)
    for k in kernels[1:]:
        w = b.Reshape(b.Slice(taps, b.ints([offset]), b.ints([offset + k]), b.ints([1])), b.ints([d, 1, 1, k]))
        ys.append(b.Unsqueeze(b.Conv(last(k), w, group=d, kernel_shape=[1, k]), b.ints([1])))
        offset += k
    stacked = b.Squeeze(b.Concat(*ys, axis=1), b.ints([3]))  # (B, m, d, T)
    out = b.CastLike(b.Transpose(stacked, perm=[0, 3, 1, 2]), source_in)
    out.name = "views"
    return _function(SOURCE_VIEWS, 0, ins, [out], b, values, opset)


def conv_state_function(n: int, opset: int) -> ir.Function:
    """present (N, B, kmax-1, d): the last kmax-1 positions of [past; stacked masked sources] along time,
    taken as a start index (length - (kmax-1)), which stays right when kmax-1 is 0."""
    ins = _inputs(["past", "mask"] + [f"sources_{i}" for i in range(n)])
    b = _Body()
    axis0 = b.ints([0])
    stacked = b.Concat(*[b.Unsqueeze(_masked(b, x, ins[1]), axis0) for x in ins[2:]], axis=0)  # (N, B, T, d)
    joined = b.Concat(ins[0], stacked, axis=2)  # (N, B, kmax-1+T, d)
    keep = b.Shape(ins[0], start=2, end=3)
    start = b.Sub(b.Shape(joined, start=2, end=3), keep)
    out = b.Slice(joined, start, b.ints([2**62]), b.ints([2]))
    out.name = "present"
    return _function(CONV_STATE, n, ins, [out], b, {}, opset)


def stream_gate_function(values: dict, d: int, m: int, opset: int) -> ir.Function:
    """Z (B, T, m, d): gate logits flat(Z) @ W^T, h = g @ Z (FusedMixer's body, from its z on)."""
    ins = _inputs(["gate_weight", "gate_bias", "gate_scale", "z"])
    gw_in, gb_in, gs_in, z_in = ins
    b = _Body()
    Z = b.Cast(z_in, to=FLOAT)
    flat = b.Reshape(Z, b.ints([0, 0, 1, m * d]))  # streams in order [z^(0), ..., z^(m-1)]
    logits = b.MatMul(flat, b.Transpose(b.Cast(gw_in, to=FLOAT), perm=[1, 0]))  # (B, T, 1, m)
    gates = b.Sigmoid(b.Add(b.Mul(logits, b.Cast(gs_in, to=FLOAT)), b.Cast(gb_in, to=FLOAT)))
    out = b.CastLike(b.Reshape(b.MatMul(gates, Z), b.ints([0, 0, d])), z_in)  # (B, T, d)
    out.name = "h"
    return _function(STREAM_GATE, 0, ins, [out], b, values, opset)


def function_body(contract: OpContract, n: int, cfg, opset: int) -> ir.Function:
    """The body of `contract`'s overload for n sources, its attribute defaults taken from the model config."""
    values = contract.attribute_values(cfg)
    if contract is FUSED_MIXER:
        return fused_mixer_function(n, values, cfg.d_model, opset)
    if contract is SOURCE_VIEWS:
        return source_views_function(values, cfg.d_model, opset)
    if contract is STREAM_GATE:
        return stream_gate_function(values, cfg.d_model, cfg.n_streams, opset)
    if contract is SOURCE_SCORES:
        return source_scores_function(values, cfg.d_model, opset)
    if contract is SCORED_MIXER:
        return scored_mixer_function(n, values, cfg.d_model, opset)
    if contract is CONV_STATE:
        return conv_state_function(n, opset)
    return depth_retrieval_function(n, values, opset)
