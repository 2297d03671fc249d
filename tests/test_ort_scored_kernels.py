"""The native SourceScores and ScoredMixer kernels (plugins/msarOrtOps, `--mixer-op scored`) against
the float64 references and their function bodies, one node at a time, at sizes the kernels were not
tuned at (d not a multiple of the vector width, 1 token, fewer tokens than the longest kernel, 1 and
97 sources, P past one block of queries, batch > 1, float32 and float16 storage)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ort_ops_fixtures import ort_ops_library  # noqa: F401  (fixture)
from test_ort_kernels import BOUND, DTYPES, MIXER_CASES, mixer_inputs, session, stored

from msar_export import kernels as K
from msar_export.bench.mixer import scored_mixer_model, source_scores_model
from msar_export.verdict import rel_err

# Scores are float32 whatever the storage: against float64 on the stored (rounded) inputs the only
# error is float32 arithmetic, so one bound holds for both storage types.
SCORES_BOUND = 5e-6

SCORES_CASES = [  # (kernels, B, T, d, P)
    ([1, 4, 8, 12], 2, 37, 37, 3),     # d not a multiple of the vector width; a tile that does not divide T
    ([1, 4, 8, 12], 1, 1, 40, 1),      # one token, one later mixer
    ([1, 3, 5], 3, 70, 130, 5),        # several tiles, d past one vector row, P past one block of 4
    ([1, 2, 3, 4, 5, 6, 7, 8], 1, 5, 16, 2),  # eight streams, fewer tokens than the longest kernel
    ([1, 17, 5], 1, 9, 24, 7),         # a kernel longer than the rest
    ([1, 4, 8, 12], 1, 33, 64, 17),    # whole vectors, the first source of an 8-block model (P = 17)
    ([1, 4, 8, 12], 2, 40, 64, 3),     # float32 whole chunks: a tile inside the sequence read in place, batch 2
    ([1], 2, 20, 16, 4),               # identity stream only
]


def scores_inputs(kernels, B, T, d, P, seed):
    g = torch.Generator().manual_seed(seed)
    return dict(conv_weight=0.5 * torch.randn(sum(kernels[1:]), d, generator=g),
                queries=torch.randn(P, len(kernels), d, generator=g), source=torch.randn(B, T, d, generator=g))


def run_scores(inp, kernels, precision, ort_ops, eps=1e-6):
    irtype, nptype = DTYPES[precision]
    model = source_scores_model(len(kernels), inp["source"].shape[-1], eps=eps, kernels=kernels, dtype=irtype)
    return session(model, ort_ops).run(["scores"], {k: v.numpy().astype(nptype) for k, v in inp.items()})[0]


def ref_scores(inp, kernels, precision, eps=1e-6):
    t = getattr(torch, precision)
    return K.reference_source_scores64(*(inp[k].to(t) for k in ("conv_weight", "queries", "source")), kernels, eps).numpy()


@pytest.mark.parametrize("precision", ["float32", "float16"])
@pytest.mark.parametrize("case", SCORES_CASES, ids=lambda c: "k{}-B{}T{}d{}P{}".format(len(c[0]), *c[1:]))
def test_source_scores_match_float64(ort_ops_library, case, precision):
    kernels, B, T, d, P = case
    inp = scores_inputs(kernels, B, T, d, P, seed=T + d + P)
    ref = ref_scores(inp, kernels, precision)
    native = run_scores(inp, kernels, precision, ort_ops_library)
    function = run_scores(inp, kernels, precision, "function")
    assert native.dtype == np.float32 and native.shape == (P, B, T, len(kernels))
    assert rel_err(native, ref) <= SCORES_BOUND, rel_err(native, ref)
    assert rel_err(function, ref) <= SCORES_BOUND, rel_err(function, ref)
    # negative control: the later mixers' queries in the wrong order
    if P > 1:
        swapped = dict(inp, queries=inp["queries"].roll(1, dims=0))
        assert rel_err(native, ref_scores(swapped, kernels, precision)) > 1e-2


def test_source_scores_taps_and_eps_reach_the_kernel(ort_ops_library):
    """2% on one tap of one stream moves the scores far past the bound (all taps of a stream 2% larger
    would not: RMSNorm undoes a scale), and eps is read from the node."""
    kernels = [1, 4, 8, 12]
    inp = scores_inputs(kernels, 1, 30, 48, 3, seed=3)
    native = run_scores(inp, kernels, "float32", ort_ops_library)
    off = dict(inp, conv_weight=inp["conv_weight"].clone())
    off["conv_weight"][6] *= 1.02  # stream 2's third tap
    assert rel_err(native, ref_scores(off, kernels, "float32")) > 50 * SCORES_BOUND
    big = run_scores(inp, kernels, "float32", ort_ops_library, eps=0.5)
    assert rel_err(big, ref_scores(inp, kernels, "float32", eps=0.5)) <= SCORES_BOUND
    assert rel_err(big, ref_scores(inp, kernels, "float32")) > 1e-3


def run_scored(inp, scores, kernels, precision, ort_ops):
    n, d = len(inp["sources"]), inp["sources"][0].shape[-1]
    irtype, nptype = DTYPES[precision]
    model = scored_mixer_model(n, d, kernels=kernels, dtype=irtype, conv_rows=inp["conv_weight"].shape[0])
    feeds = {k: inp[k].numpy().astype(nptype) for k in ("gate_weight", "gate_bias", "gate_scale", "conv_weight")}
    feeds["scores"] = scores.numpy().astype(np.float32)
    feeds.update({f"x{i}": x.numpy().astype(nptype) for i, x in enumerate(inp["sources"])})
    return session(model, ort_ops).run(["h"], feeds)[0]


def ref_scored(inp, scores, kernels, precision):
    s = stored(inp, precision)
    return K.reference_scored_mixer64(s["gate_weight"], s["gate_bias"], s["gate_scale"], s["conv_weight"], scores,
                                      s["sources"], kernels).numpy()


@pytest.mark.parametrize("precision", ["float32", "float16"])
@pytest.mark.parametrize("case", MIXER_CASES, ids=lambda c: "n{}-k{}-B{}T{}d{}".format(c[0], len(c[1]), *c[2:]))
def test_scored_mixer_matches_float64(ort_ops_library, case, precision):
    n, kernels, B, T, d = case
    inp = mixer_inputs(n, kernels, B, T, d, seed=n + T, conv_rows=n + 2)
    inp["conv_weight"][n:] = float("nan")  # rows past the node's sources are never read
    scores = 3 * torch.randn(n, B, T, len(kernels), generator=torch.Generator().manual_seed(d))
    ref = ref_scored(inp, scores, kernels, precision)
    native = run_scored(inp, scores, kernels, precision, ort_ops_library)
    assert native.dtype == np.dtype(precision) and native.shape == (B, T, d)
    assert rel_err(native, ref) <= BOUND[precision], rel_err(native, ref)
    inp["conv_weight"][n:] = 0.0  # the function body slices the bank, but NaN * 0 in a Conv is NaN
    function = run_scored(inp, scores, kernels, precision, "function")
    assert rel_err(function, ref) <= BOUND[precision], rel_err(function, ref)
    # negative control: one source's scores 0.5 higher shifts every stream's weights towards it
    if n > 1:
        off = scores.clone()
        off[n // 2] += 0.5
        assert rel_err(native, ref_scored(inp, off, kernels, precision)) > 5 * BOUND[precision]


def test_scores_then_scored_mixer_is_fused_mixer(ort_ops_library):
    """The contract's wiring: mixer l = n takes row n-1-i of source i's SourceScores (its queries the
    mixers after i), and the two ops together give FusedMixer's float64 reference."""
    kernels, n, B, T, d = [1, 4, 8, 12], 6, 2, 41, 72
    inp = mixer_inputs(n, kernels, B, T, d, seed=11)
    g = torch.Generator().manual_seed(5)
    later = [torch.randn(n - i, len(kernels), d, generator=g) for i in range(n)]  # mixers i+1 .. n
    for i in range(n):
        later[i][n - 1 - i] = inp["query"]  # mixer n's query
    rows = []
    for i, x in enumerate(inp["sources"]):
        s = run_scores(dict(conv_weight=inp["conv_weight"][i], queries=later[i], source=x), kernels, "float32",
                       ort_ops_library)
        rows.append(s[n - 1 - i])
    h = run_scored(inp, torch.from_numpy(np.stack(rows)), kernels, "float32", ort_ops_library)
    ref = K.reference_fused_mixer64(**stored(inp, "float32"), stream_kernels=kernels, eps=1e-6).numpy()
    assert rel_err(h, ref) <= BOUND["float32"], rel_err(h, ref)
    wrong = [torch.from_numpy(np.asarray(r)) for r in rows[::-1]]  # the rows of the wrong sources
    h_wrong = run_scored(inp, torch.stack(wrong), kernels, "float32", ort_ops_library)
    assert rel_err(h_wrong, ref) > 5 * BOUND["float32"]


def test_scored_bad_shapes_are_one_clear_error(ort_ops_library):
    kernels = [1, 3]
    inp = mixer_inputs(2, kernels, 1, 4, 16, seed=0)
    with pytest.raises(Exception, match=r"msar::ScoredMixer: scores must be \[n, B, T, m\] = \[2, 1, 4, 2\]"):
        run_scored(inp, torch.zeros(2, 1, 5, 2), kernels, "float32", ort_ops_library)
