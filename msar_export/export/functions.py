"""ONNX function bodies (standard ops only) for the `msar` custom ops, so stock
ONNX Runtime runs a file that holds `msar::*` nodes unchanged.

Bodies are generated per number of sources (the op is variadic, an ONNX
function's input list is not) and registered as overloads `n{count}` of one
function name.  Everything runs in float32 and is cast back to the input type.
"""

from __future__ import annotations

import onnx_ir as ir
from onnx_ir.tape import Tape

from .contracts import COMMON_ATTRS, DEPTH_RETRIEVAL, DOMAIN, FUSED_MIXER, OpContract

FLOAT = ir.DataType.FLOAT


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


def _retrieve(b: _Body, query, views, eps):
    """views: list of float32 (B,T,m,d) -> z (B,T,m,d): the contract's retrieval.

    Per source: s = (q . v) / rms(v); the softmax over depth runs on the small
    (n,B,T,m) score tensor; z is a running sum, so no view is copied into a
    stacked tensor (that copy is quadratic in depth and dominated ORT's time)."""
    scores = []
    for v in views:
        ms = b.ReduceMean(b.Mul(v, v), b.ints([-1]), keepdims=0)  # (B, T, m)
        qv = b.ReduceSum(b.Mul(v, query), b.ints([-1]), keepdims=0)
        scores.append(b.Unsqueeze(b.Div(qv, b.Sqrt(b.Add(ms, eps))), b.ints([0])))
    alpha = b.Softmax(b.Concat(*scores, axis=0), axis=0)  # (n, B, T, m): each stream over depth
    z = None
    for i, v in enumerate(views):
        term = b.Mul(b.Unsqueeze(b.Gather(alpha, b.int_(i), axis=0), b.ints([-1])), v)
        z = term if z is None else b.Add(z, term)
    return z


def _causal_conv(b: _Body, xt, taps, offset: int, k: int, d: int):
    """xt (B,d,T) float32, taps (d,K) -> stream view (B,T,d): a depthwise Conv
    over the k taps taps[:, offset:offset+k] (Conv1d order), left-padded by k-1."""
    w = b.Unsqueeze(b.Slice(taps, b.ints([offset]), b.ints([offset + k]), b.ints([1])), b.ints([1]))  # (d, 1, k)
    y = b.Conv(xt, w, group=d, kernel_shape=[k], pads=[k - 1, 0])  # zeros before the sequence start
    return b.Transpose(y, perm=[0, 2, 1])


def _inputs(names):
    return [ir.Value(name=n) for n in names]


def _function(contract: OpContract, n: int, inputs, outputs, b: _Body, attrs, opset: int) -> ir.Function:
    graph = ir.Graph(inputs, outputs, nodes=b.tape.nodes, opset_imports={"": opset}, name=contract.name)
    return ir.Function(DOMAIN, contract.name, contract.overload(n), graph=graph, attributes=attrs)


def _common_attrs(eps: float):
    attrs = [ir.Attr("eps", ir.AttributeType.FLOAT, float(eps))]
    attrs += [ir.Attr(a.name, ir.AttributeType.STRING, a.default) for a in COMMON_ATTRS]
    return attrs


def depth_retrieval_function(n: int, eps: float, opset: int) -> ir.Function:
    ins = _inputs(["query"] + [f"views_{i}" for i in range(n)])
    b = _Body()
    query = b.Cast(ins[0], to=FLOAT)
    z = _retrieve(b, query, [b.Cast(v, to=FLOAT) for v in ins[1:]], b.ref_float("eps"))
    out = b.CastLike(z, ins[1])
    out.name = "z"
    return _function(DEPTH_RETRIEVAL, n, ins, [out], b, _common_attrs(eps), opset)


def fused_mixer_function(n: int, stream_kernels: list[int], eps: float, d: int, opset: int) -> ir.Function:
    """Body for `n` sources of width `d` (Conv's `group` is static); kernels and
    width are fixed for a model, so one overload per source count suffices."""
    ins = _inputs(["query", "gate_weight", "gate_bias", "gate_scale", "conv_weight"] + [f"sources_{i}" for i in range(n)])
    query_in, gw_in, gb_in, gs_in, conv_in, *sources = ins
    b = _Body()
    conv = b.Cast(conv_in, to=FLOAT)
    views = []
    for i, x in enumerate(sources):
        xf = b.Cast(x, to=FLOAT)
        taps = b.Gather(conv, b.int_(i), axis=0)  # (d, K): source i's taps
        xt = b.Transpose(xf, perm=[0, 2, 1])  # (B, d, T), channels first for Conv
        streams, offset = [xf], 0
        for k in stream_kernels[1:]:
            streams.append(_causal_conv(b, xt, taps, offset, k, d))
            offset += k
        views.append(b.Concat(*[b.Unsqueeze(s, b.ints([2])) for s in streams], axis=2))  # (B, T, m, d)
    z = _retrieve(b, b.Cast(query_in, to=FLOAT), views, b.ref_float("eps"))
    flat = b.Reshape(z, b.ints([0, 0, -1]))  # streams in order [z0, z1, ...]
    logits = b.MatMul(flat, b.Transpose(b.Cast(gw_in, to=FLOAT), perm=[1, 0]))  # (B, T, m)
    gates = b.Sigmoid(b.Add(b.Mul(logits, b.Cast(gs_in, to=FLOAT)), b.Cast(gb_in, to=FLOAT)))
    h = b.ReduceSum(b.Mul(b.Unsqueeze(gates, b.ints([-1])), z), b.ints([2]), keepdims=0)
    out = b.CastLike(h, sources[0])
    out.name = "h"
    attrs = _common_attrs(eps) + [ir.Attr("stream_kernels", ir.AttributeType.INTS, list(stream_kernels))]
    return _function(FUSED_MIXER, n, ins, [out], b, attrs, opset)
