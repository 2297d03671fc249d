"""The native ONNX Runtime kernels (plugins/msarOrtOps) against the float64 references and the
function bodies, one node at a time, at sizes the kernels were not tuned at: d not a multiple of
the vector width or of the channel chunk, 1 token, fewer tokens than the longest kernel, one
source and 97, batch 2, a conv bank with more rows than sources, float32 and float16."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
import torch
from ort_ops_fixtures import ort_ops_library  # noqa: F401  (fixture)

from msar_export import kernels as K
from msar_export.bench.mixer import (conv_state_model, depth_retrieval_model, fused_mixer_model, source_views_model,
                                    stream_gate_model)
from msar_export.runners.ort_runner import open_session
from msar_export.verdict import rel_err

# Bounds against float64 (relative, as verdict.rel_err): float32 arithmetic inside in both cases;
# float16 storage rounds the inputs and the output (u = 4.9e-4).
BOUND = {"float32": 2e-6, "float16": 2e-3}
DTYPES = {"float32": (ir.DataType.FLOAT, np.float32), "float16": (ir.DataType.FLOAT16, np.float16)}


def session(model: ir.Model, ort_ops, threads: int = 2):
    s = open_session(ir.serde.serialize_model(model).SerializeToString(), providers=["cpu"], threads=threads,
                     ort_ops=ort_ops)
    assert s.msar_native == (ort_ops != "function")
    return s


def mixer_inputs(n, kernels, B, T, d, seed, conv_rows=None):
    g = torch.Generator().manual_seed(seed)
    m, Kt = len(kernels), sum(kernels[1:])
    return dict(query=torch.randn(m, d, generator=g), gate_weight=torch.randn(m, m * d, generator=g) / d**0.5,
                gate_bias=torch.randn(m, generator=g), gate_scale=torch.tensor(1.0 + torch.rand((), generator=g).item()),
                conv_weight=0.5 * torch.randn(conv_rows or n, Kt, d, generator=g),
                sources=[torch.randn(B, T, d, generator=g) for _ in range(n)])


def run_mixer(inp, kernels, precision, ort_ops, eps=1e-6):
    n, d = len(inp["sources"]), inp["sources"][0].shape[-1]
    irtype, nptype = DTYPES[precision]
    model = fused_mixer_model(n, d, eps=eps, kernels=kernels, dtype=irtype, conv_rows=inp["conv_weight"].shape[0])
    feeds = {k: inp[k].numpy().astype(nptype) for k in ("query", "gate_weight", "gate_bias", "gate_scale", "conv_weight")}
    feeds.update({f"x{i}": x.numpy().astype(nptype) for i, x in enumerate(inp["sources"])})
    return session(model, ort_ops).run(["h"], feeds)[0]


def stored(inp, precision):
    """The inputs as the graph holds them (float16 rounds them): the reference sees the same numbers."""
    t = getattr(torch, precision)
    return {k: ([x.to(t).double() for x in v] if k == "sources" else v.to(t).double()) for k, v in inp.items()}


MIXER_CASES = [  # (n, kernels, B, T, d)
    (3, [1, 4, 8, 12], 2, 37, 37),    # d not a multiple of 8 or 16; tiles that do not divide T
    (1, [1, 4, 8, 12], 1, 5, 64),     # one source (all weights 1), fewer tokens than the longest kernel
    (4, [1, 3, 5], 2, 1, 40),         # one token
    (97, [1, 4, 8, 12], 1, 9, 24),    # 97 sources
    (5, [1], 1, 70, 130),             # identity stream only; more than one channel chunk
    (6, [1, 2, 3, 4, 5, 6, 7, 8], 1, 40, 16),  # eight streams; tokens past one tile of 32
    (7, [1, 4, 8, 12], 2, 100, 128),  # float32 rows read in place (whole chunks, tiles inside the sequence)
    (3, [1, 17, 5], 1, 75, 64),       # a kernel longer than the unrolled sizes (the run-time loop), in place
]


@pytest.mark.parametrize("precision", ["float32", "float16"])
@pytest.mark.parametrize("case", MIXER_CASES, ids=lambda c: "n{}-k{}-B{}T{}d{}".format(c[0], len(c[1]), *c[2:]))
def test_fused_mixer_matches_float64(ort_ops_library, case, precision):
    check_fused_mixer(ort_ops_library, *case, precision)


def check_fused_mixer(ort_ops_library, n, kernels, B, T, d, precision):
    inp = mixer_inputs(n, kernels, B, T, d, seed=n + T, conv_rows=n + 2)
    ref = K.reference_fused_mixer64(**stored(inp, precision), stream_kernels=kernels, eps=1e-6).numpy()
    native = run_mixer(inp, kernels, precision, ort_ops_library)
    function = run_mixer(inp, kernels, precision, "function")
    assert native.dtype == np.dtype(precision) and native.shape == (B, T, d)
    assert rel_err(native, ref) <= BOUND[precision], rel_err(native, ref)
    assert rel_err(function, ref) <= BOUND[precision]  # the same bar holds for the portable path


def test_fused_mixer_negative_control(ort_ops_library):
    """2% on one source's taps (what `check` must catch in a model) is far outside the bound."""
    kernels = [1, 4, 8, 12]
    inp = mixer_inputs(5, kernels, 2, 20, 48, seed=7)
    ref = K.reference_fused_mixer64(**stored(inp, "float32"), stream_kernels=kernels, eps=1e-6).numpy()
    inp["conv_weight"][2] *= 1.02
    err = rel_err(run_mixer(inp, kernels, "float32", ort_ops_library), ref)
    assert err > 50 * BOUND["float32"], err


def test_fused_mixer_eps_and_padding_rows(ort_ops_library):
    """eps is read from the node (a large eps changes the scores), and rows of the conv bank past
    the node's sources are never read (NaN there changes nothing)."""
    kernels = [1, 3, 5]
    inp = mixer_inputs(3, kernels, 1, 11, 20, seed=1, conv_rows=6)
    inp["conv_weight"][3:] = float("nan")
    for eps in (1e-6, 0.5):
        ref = K.reference_fused_mixer64(**stored(inp, "float32"), stream_kernels=kernels, eps=eps).numpy()
        assert rel_err(run_mixer(inp, kernels, "float32", ort_ops_library, eps=eps), ref) <= BOUND["float32"]
    small = K.reference_fused_mixer64(**stored(inp, "float32"), stream_kernels=kernels, eps=1e-6).numpy()
    assert rel_err(run_mixer(inp, kernels, "float32", ort_ops_library, eps=0.5), small) > 1e-3


# (n, m, B, T, d); d 64: float32 rows read in place (whole vectors), as in a batch-8 decode step;
# d 128: the same over the size the kernel splits across threads
RETRIEVAL_CASES = [(1, 1, 2, 3, 37), (97, 4, 1, 2, 40), (9, 4, 3, 1, 8), (4, 2, 1, 33, 100), (17, 4, 8, 1, 64),
                   (17, 4, 8, 1, 128)]


@pytest.mark.parametrize("precision", ["float32", "float16"])
@pytest.mark.parametrize("case", RETRIEVAL_CASES, ids=lambda c: "n{}-m{}-B{}T{}d{}".format(*c))
def test_depth_retrieval_matches_float64(ort_ops_library, case, precision):
    check_depth_retrieval(ort_ops_library, *case, precision)


def check_depth_retrieval(ort_ops_library, n, m, B, T, d, precision):
    g = torch.Generator().manual_seed(n * 7 + d)
    query = torch.randn(m, d, generator=g)
    views = [torch.randn(B, T, m, d, generator=g) * (1 + i % 3) for i in range(n)]
    _, nptype = DTYPES[precision]
    t = getattr(torch, precision)
    ref = K.reference_depth_retrieval64(query.to(t), [v.to(t) for v in views], 1e-6).numpy()
    model = depth_retrieval_model(n, m, d, dtype=DTYPES[precision][0])
    feeds = {"query": query.numpy().astype(nptype), **{f"x{i}": v.numpy().astype(nptype) for i, v in enumerate(views)}}
    native = session(model, ort_ops_library).run(["z"], feeds)[0]
    assert rel_err(native, ref) <= BOUND[precision], rel_err(native, ref)
    # negative control: every view 2% larger leaves the scores (RMS-normalised) and scales z by 1.02
    scaled = K.reference_depth_retrieval64(query.to(t), [v.to(t) * 1.02 for v in views], 1e-6).numpy()
    assert rel_err(native, scaled) > 5 * BOUND[precision]


VIEWS_CASES = [  # (kernels, B, T, d)
    ([1, 4, 8, 12], 1, 1, 40),      # a decode step: one token after kmax-1 rows of state
    ([1, 4, 8, 12], 2, 37, 37),     # d not a multiple of the vector width; a tile that does not divide T
    ([1, 3, 5], 3, 70, 130),        # three tiles of tokens, d past one vector row
    ([1, 2, 3, 4, 5, 6, 7, 8], 1, 5, 16),  # eight streams, fewer tokens than the longest kernel
    ([1, 17, 5], 1, 9, 24),         # a kernel longer than the rest
    ([1, 4, 8, 12], 8, 1, 64),      # a batch-8 decode step, float32 rows read in place (whole vectors)
]


def padding_mask(B, T):
    """(B, T) int64: row 0 left-padded over its first third, the last row's last token padded (the ops
    take any pattern); nothing padded in a one-token batch of one. Values other than 1 are real tokens too."""
    mask = torch.full((B, T), 3 if B * T > 3 else 1, dtype=torch.int64)
    mask[0, : T // 3] = 0
    if B > 1:
        mask[-1, -1] = 0
    return mask


def run_views(taps, state, index, source, mask, kernels, precision, ort_ops):
    _, nptype = DTYPES[precision]
    model = source_views_model(source.shape[-1], kernels, dtype=DTYPES[precision][0])
    feeds = {"conv_weight": taps.numpy().astype(nptype), "state": state.numpy().astype(nptype),
             "index": np.array(index, np.int64), "source": source.numpy().astype(nptype), "mask": mask.numpy()}
    return session(model, ort_ops).run(["views"], feeds)[0]


@pytest.mark.parametrize("precision", ["float32", "float16"])
@pytest.mark.parametrize("case", VIEWS_CASES, ids=lambda c: "k{}-B{}T{}d{}".format(len(c[0]), *c[1:]))
def test_source_views_match_float64(ort_ops_library, case, precision):
    kernels, B, T, d = case
    g = torch.Generator().manual_seed(T + d)
    taps = 0.5 * torch.randn(sum(kernels[1:]), d, generator=g)
    state = torch.randn(3, B, max(kernels) - 1, d, generator=g)  # real values, not zeros; row 1 is this source's
    source = torch.randn(B, T, d, generator=g)
    mask = padding_mask(B, T)
    t = getattr(torch, precision)

    def ref(taps=taps, state=state, index=1, source=source, mask=mask):
        return K.reference_source_views64(taps.to(t), state.to(t), index, source.to(t), kernels, mask).numpy()

    native = run_views(taps, state, 1, source, mask, kernels, precision, ort_ops_library)
    function = run_views(taps, state, 1, source, mask, kernels, precision, "function")
    assert native.dtype == np.dtype(precision) and native.shape == (B, T, len(kernels), d)
    assert rel_err(native, ref()) <= BOUND[precision], rel_err(native, ref())
    assert rel_err(function, ref()) <= BOUND[precision], rel_err(function, ref())
    # negative controls: 2% on the taps, another row of the state, the window read one row late, the
    # padding not zeroed
    assert rel_err(native, ref(taps=taps * 1.02)) > 5 * BOUND[precision]
    assert rel_err(native, ref(index=2)) > 1e-3
    window = torch.cat([state[1], torch.where(mask[..., None] != 0, source, 0.0)], dim=1)
    late = torch.cat([window[:, :1], window[:, :-1]], dim=1)
    H = state.shape[2]
    assert rel_err(native, ref(state=late[None, :, :H], index=0, source=late[:, H:], mask=None)) > 1e-2
    if (mask == 0).any():
        assert rel_err(native, ref(mask=None)) > 1e-2


# (n, B, T, kmax-1, d): a decode step; a prompt longer than the state; fewer tokens than the state keeps;
# no conv streams; a batch-8 step whose float32 state is over the 1 MB the kernel splits across threads
CONV_STATE_CASES = [(17, 1, 1, 11, 64), (3, 2, 37, 11, 37), (4, 3, 2, 7, 16), (2, 1, 5, 0, 8), (17, 8, 1, 11, 200)]


@pytest.mark.parametrize("precision", ["float32", "float16"])
@pytest.mark.parametrize("case", CONV_STATE_CASES, ids=lambda c: "n{}B{}T{}H{}d{}".format(*c))
def test_conv_state_matches_float64(ort_ops_library, case, precision):
    n, B, T, H, d = case
    g = torch.Generator().manual_seed(n + T + H)
    t, nptype = getattr(torch, precision), DTYPES[precision][1]
    past = torch.randn(n, B, H, d, generator=g).to(t)
    sources = [torch.randn(B, T, d, generator=g).to(t) for _ in range(n)]
    mask = padding_mask(B, T)
    ref = K.reference_conv_state64(past, sources, mask).numpy()
    feeds = {"past": past.numpy().astype(nptype), "mask": mask.numpy()} | {
        f"x{i}": x.numpy().astype(nptype) for i, x in enumerate(sources)}
    model = conv_state_model(n, d, dtype=DTYPES[precision][0])
    native = session(model, ort_ops_library).run(["present"], feeds)[0]
    function = session(model, "function").run(["present"], feeds)[0]
    assert native.dtype == np.dtype(precision) and native.shape == (n, B, H, d)
    # copies: exact
    assert np.array_equal(native, ref.astype(nptype)) and np.array_equal(function, ref.astype(nptype))
    if H:  # negative controls: the state of the source before (a mixed-up source order); the padding kept
        rolled = K.reference_conv_state64(past.roll(1, 0), sources[-1:] + sources[:-1], mask).numpy()
        assert not np.array_equal(native, rolled.astype(nptype))
    if H and B > 1:  # the last row's last token is padded, and always among the kept positions
        assert not np.array_equal(native, K.reference_conv_state64(past, sources).numpy().astype(nptype))


# (B, T, m, d); d 64: a float32 weight read in place (whole vectors), as in a batch-8 decode step
GATE_CASES = [(1, 1, 4, 40), (2, 37, 4, 37), (1, 70, 8, 130), (3, 2, 1, 16), (8, 1, 4, 64)]


@pytest.mark.parametrize("precision", ["float32", "float16"])
@pytest.mark.parametrize("case", GATE_CASES, ids=lambda c: "B{}T{}m{}d{}".format(*c))
def test_stream_gate_matches_float64(ort_ops_library, case, precision):
    check_stream_gate(ort_ops_library, *case, precision)


# The kernels keep their scratch rows per thread, from call to call and session to session.  These
# calls run on the calling thread (B * T <= 4 keeps a call off the pool), one size falling while
# another grows: 8 streams of d 130 left a z buffer (m * d) long enough for 2 streams of d 300,
# whose gated-sum row was then written past its own shorter buffer.  Only a sanitizer sees such a
# write (tests/test_native_memory.py runs this module under AddressSanitizer).
GATE_WALK = [(1, 2, 8, 130), (1, 3, 2, 300), (1, 1, 1, 700)]
# The other kernels that keep per-thread scratch, likewise: one work item each (B = 1, one token
# tile; a retrieval under the size it keeps off the pool), sources, streams and width moving
# against each other.
MIXER_WALK = [(97, [1, 4, 8, 12], 1, 3, 24), (2, [1], 1, 30, 300), (9, [1, 2, 3, 4, 5, 6, 7, 8], 1, 5, 130),
              (1, [1, 17, 5], 1, 2, 700)]
RETRIEVAL_WALK = [(97, 4, 1, 1, 24), (2, 1, 1, 1, 700), (9, 8, 1, 1, 130)]


def test_stream_gate_shapes_in_turn_on_one_thread(ort_ops_library):
    for case in GATE_WALK:
        check_stream_gate(ort_ops_library, *case, "float32")


def test_fused_mixer_and_retrieval_shapes_in_turn_on_one_thread(ort_ops_library):
    for case in MIXER_WALK:
        check_fused_mixer(ort_ops_library, *case, "float32")
    for case in RETRIEVAL_WALK:
        check_depth_retrieval(ort_ops_library, *case, "float32")


def check_stream_gate(ort_ops_library, B, T, m, d, precision):
    g = torch.Generator().manual_seed(B + T + d)
    inp = dict(gate_weight=torch.randn(m, m * d, generator=g) / d**0.5, gate_bias=torch.randn(m, generator=g),
               gate_scale=torch.tensor(0.5 + torch.rand((), generator=g).item()), z=torch.randn(B, T, m, d, generator=g))
    t, nptype = getattr(torch, precision), DTYPES[precision][1]
    ref = K.reference_stream_gate64(**{k: v.to(t) for k, v in inp.items()}).numpy()
    feeds = {k: v.numpy().astype(nptype) for k, v in inp.items()}
    model = stream_gate_model(m, d, dtype=DTYPES[precision][0])
    native = session(model, ort_ops_library).run(["h"], feeds)[0]
    function = session(model, "function").run(["h"], feeds)[0]
    assert native.dtype == np.dtype(precision) and native.shape == (B, T, d)
    assert rel_err(native, ref) <= BOUND[precision], rel_err(native, ref)
    assert rel_err(function, ref) <= BOUND[precision], rel_err(function, ref)
    # negative control: the gate bias 0.2 higher opens every stream's gate further
    off = K.reference_stream_gate64(inp["gate_weight"].to(t), (inp["gate_bias"] + 0.2).to(t), inp["gate_scale"].to(t),
                                    inp["z"].to(t)).numpy()
    assert rel_err(native, off) > 5 * BOUND[precision], rel_err(native, off)


def test_bad_shapes_are_one_clear_error(ort_ops_library):
    """A node fed sources of different shapes fails with the op's own message, not a crash."""
    model = fused_mixer_model(2, 16, kernels=[1, 3])
    s = session(model, ort_ops_library)
    inp = mixer_inputs(2, [1, 3], 1, 4, 16, seed=0)
    feeds = {k: inp[k].numpy() for k in ("query", "gate_weight", "gate_bias", "gate_scale", "conv_weight")}
    feeds.update(x0=inp["sources"][0].numpy(), x1=np.zeros((1, 5, 16), np.float32))
    with pytest.raises(Exception, match="msar::FusedMixer: source 1 is"):
        s.run(["h"], feeds)
    views = session(source_views_model(16, [1, 3, 5]), ort_ops_library)
    feeds = {"conv_weight": np.zeros((8, 16), np.float32), "state": np.zeros((2, 1, 3, 16), np.float32),
             "index": np.array(0, np.int64), "source": np.zeros((1, 2, 16), np.float32),
             "mask": np.ones((1, 2), np.int64)}
    shape = r"state must be \[S, B, kmax-1 = 4, d\] with B, d = 1, 16, got \[2, 1, 3, 16\]"
    with pytest.raises(Exception, match=r"msar::SourceViews: " + shape):
        views.run(["views"], feeds)
    feeds.update(state=np.zeros((2, 1, 4, 16), np.float32), index=np.array(2, np.int64))
    with pytest.raises(Exception, match=r"msar::SourceViews: index 2 is outside the state's 2 rows"):
        views.run(["views"], feeds)
    feeds.update(index=np.array(1, np.int64), mask=np.ones((1, 3), np.int64))
    with pytest.raises(Exception, match=r"msar::SourceViews: mask must be \[B, T\] = \[1, 2\], got \[1, 3\]"):
        views.run(["views"], feeds)
    state = session(conv_state_model(2, 16), ort_ops_library)
    feeds = {"past": np.zeros((2, 1, 4, 16), np.float32), "mask": np.ones((1, 2), np.int64),
             "x0": np.zeros((1, 2, 16), np.float32), "x1": np.zeros((1, 3, 16), np.float32)}
    with pytest.raises(Exception, match=r"msar::ConvState: source 1 is \[1, 3, 16\], source 0 is \[1, 2, 16\]"):
        state.run(["present"], feeds)
    feeds.update(x1=np.zeros((1, 2, 16), np.float32), mask=np.ones((2, 2), np.int64))
    with pytest.raises(Exception, match=r"msar::ConvState: mask must be \[B, T\] = \[1, 2\], got \[2, 2\]"):
        state.run(["present"], feeds)


def test_a_changed_kernel_source_makes_the_installed_library_stale(tmp_path):
    """The stamp the fixture checks (ort_ops_fixtures.native_library) tells the sources apart: an
    identical copy of plugins/ elsewhere has the same digest, one changed byte in a kernel another."""
    import shutil

    from ort_ops_fixtures import REPO

    from msar_export.kernels.cmake import sources_digest

    copy = tmp_path / "plugins"
    shutil.copytree(REPO / "plugins", copy)
    assert sources_digest(copy) == sources_digest(REPO / "plugins")
    kernel = copy / "msarOrtOps" / "cpuFusedMixer.cpp"
    kernel.write_text(kernel.read_text().replace("kTile = 32", "kTile = 16"))
    assert sources_digest(copy) != sources_digest(REPO / "plugins")


def test_a_domain_version_1_file_runs_its_old_source_views_body(ort_ops_library):
    """A file exported before domain version 2 has SourceViews(conv_weight, window): with this library
    registered its node must find no version-2 kernel and run its own function body (here: the window's
    last T rows as the one view, kernels [1]), not fail on the new kernel's three inputs."""
    from onnx import TensorProto, helper

    body = helper.make_function(
        "msar", "SourceViews", ["conv_weight", "window"], ["views"],
        [helper.make_node("Constant", [], ["axes"], value_ints=[2]),
         helper.make_node("Unsqueeze", ["window", "axes"], ["views"])],
        opset_imports=[helper.make_opsetid("", 18)], attributes=["stream_kernels"])
    node = helper.make_node("SourceViews", ["conv_weight", "window"], ["views"], domain="msar", stream_kernels=[1])
    graph = helper.make_graph(
        [node], "v1", [helper.make_tensor_value_info("conv_weight", TensorProto.FLOAT, [0, 8]),
                       helper.make_tensor_value_info("window", TensorProto.FLOAT, [1, 3, 8])],
        [helper.make_tensor_value_info("views", TensorProto.FLOAT, [1, 3, 1, 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("msar", 1)],
                              functions=[body], ir_version=10)
    window = np.arange(24, dtype=np.float32).reshape(1, 3, 8)
    s = open_session(model.SerializeToString(), providers=["cpu"], threads=1, ort_ops=ort_ops_library)
    assert s.msar_native
    views = s.run(["views"], {"conv_weight": np.zeros((0, 8), np.float32), "window": window})[0]
    assert np.array_equal(views, window[:, :, None])
    # negative control: the same node declared version 2 meets the native kernel's schema, which refuses it
    model.opset_import[1].version = 2
    with pytest.raises(Exception, match="SourceViews"):
        s2 = open_session(model.SerializeToString(), providers=["cpu"], threads=1, ort_ops=ort_ops_library)
        s2.run(["views"], {"conv_weight": np.zeros((0, 8), np.float32), "window": window})
