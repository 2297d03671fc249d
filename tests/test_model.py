"""The reference model against the independent float64 implementation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import load_cfg, load_tensors, make_checkpoint, trained_checkpoint
from msar_export import generate, load_checkpoint
from msar_export.model.mixing import SourceExpansion, depth_retrieval
from msar_export.model.layers import rms_normalize
from msar_export.verdict import rel_err
from reference64 import reference_logits

TOL_FP32 = 1e-5


@pytest.mark.parametrize(
    "overrides",
    [
        dict(residual="msar"),
        dict(residual="msar", stream_kernels=[1, 4, 8, 12], tie_embeddings=False, n_kv_heads=5),
        dict(residual="msar", stream_kernels=[1, 2]),
        dict(residual="attnres"),
        dict(residual="standard", tie_embeddings=False),
    ],
    ids=["msar-odd", "msar-1-4-8-12-untied-mha", "msar-1-2", "attnres", "standard"],
)
def test_random_checkpoint_matches_float64_reference(tmp_path, overrides):
    path, cfg = make_checkpoint(tmp_path / "c", seed=11, **overrides)
    model = load_checkpoint(path)
    ids = torch.randint(0, cfg["vocab_size"], (3, 19), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = model(ids).numpy()
    ref = reference_logits(cfg, load_tensors(path), ids.numpy())
    assert rel_err(got, ref) <= TOL_FP32


@pytest.mark.parametrize("kind", ["msar", "standard", "attnres"])
def test_trained_checkpoint_matches_float64_reference(kind):
    path = trained_checkpoint(kind)
    cfg = load_cfg(path)
    model = load_checkpoint(path)
    ids = torch.randint(0, 256, (2, 37), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got = model(ids).numpy()
    assert rel_err(got, reference_logits(cfg, load_tensors(path), ids.numpy())) <= TOL_FP32


def test_reference_comparison_catches_a_wrong_model(tmp_path):
    """Negative control: one conv tap off by 2% must exceed the tolerance."""
    path, cfg = make_checkpoint(tmp_path / "c", seed=5)
    model = load_checkpoint(path)
    with torch.no_grad():
        model.sources["1"].conv["2"].weight[:, 0, -1] *= 1.02
        ids = torch.randint(0, cfg["vocab_size"], (2, 16), generator=torch.Generator().manual_seed(0))
        got = model(ids).numpy()
    assert rel_err(got, reference_logits(cfg, load_tensors(path), ids.numpy())) > 10 * TOL_FP32


@pytest.mark.parametrize("kind", ["msar", "attnres", "standard"])
def test_causality(tmp_path, kind):
    path, cfg = make_checkpoint(tmp_path / "c", seed=2, residual=kind)
    model = load_checkpoint(path)
    ids = torch.randint(0, cfg["vocab_size"], (2, 20), generator=torch.Generator().manual_seed(0))
    changed = ids.clone()
    changed[:, 12:] = (changed[:, 12:] + 7) % cfg["vocab_size"]
    with torch.no_grad():
        a, b = model(ids), model(changed)
    assert torch.equal(a[:, :12], b[:, :12])
    assert not torch.allclose(a[:, 12:], b[:, 12:])


def test_tap_orientation():
    """c_delta = w[:, 0, k-1-delta]: a one-hot weight at index j delays by k-1-j."""
    d, k, T = 3, 5, 9
    exp = SourceExpansion(d, (k,))
    x = torch.randn(1, T, d)
    for j in range(k):
        with torch.no_grad():
            exp.conv["1"].weight.zero_()
            exp.conv["1"].weight[:, 0, j] = 1.0
        y = exp(x)[:, :, 1]
        delta = k - 1 - j
        expected = torch.zeros_like(x)
        expected[:, delta:] = x[:, : T - delta]
        assert torch.equal(y, expected), f"tap {j} should delay by {delta}"


def test_each_stream_normalises_on_its_own():
    """Scaling one stream's query changes only that stream's retrieval."""
    n, m, d = 4, 3, 8
    views = torch.randn(n, 2, 5, m, d)
    keys = rms_normalize(views, 1e-6)
    q = torch.randn(m, d)
    z = depth_retrieval(q, views, keys)
    q2 = q.clone()
    q2[1] *= 3
    z2 = depth_retrieval(q2, views, keys)
    assert torch.allclose(z[:, :, [0, 2]], z2[:, :, [0, 2]])
    assert not torch.allclose(z[:, :, 1], z2[:, :, 1])
    # and each stream's weights sum to one: retrieving a constant gives the constant
    const = torch.ones_like(views) * torch.arange(1.0, m + 1)[:, None]
    zc = depth_retrieval(q, const, rms_normalize(const, 1e-6))
    assert torch.allclose(zc, const[0], atol=1e-6)


@pytest.mark.parametrize("gated", [True, False])
def test_per_source_projections_equal_retrieval_then_fusion(gated):
    """The model's fast path (scores and gate-logit parts of a source against
    all later mixers at once, z never formed) computes exactly
    depth_retrieval + stream_fusion, the equations as written."""
    from msar_export.model.mixing import mix_from_projections, source_projections, stream_fusion

    n, m, d = 5, 3 if gated else 1, 16
    g = torch.Generator().manual_seed(0)
    views = [torch.randn(2, 7, m, d, generator=g) * (i + 1) for i in range(n)]
    q, W = torch.randn(m, d, generator=g), torch.randn(m, m * d, generator=g) / d
    b, a = torch.randn(m, generator=g), torch.tensor(1.7)
    z = depth_retrieval(q, torch.stack(views), rms_normalize(torch.stack(views), 1e-6))
    ref = stream_fusion(z, W, b, a) if gated else z[:, :, 0]
    proj = [source_projections(v, q[None], W[None] if gated else None, 1e-6) for v in views]
    scores = torch.stack([s[0] for s, _ in proj])
    parts = torch.stack([p[0] for _, p in proj]) if gated else None
    got = mix_from_projections(scores, parts, views, b if gated else None, a if gated else None)
    assert torch.allclose(got, ref, atol=1e-5, rtol=1e-5)


def test_zero_query_is_uniform_depth_average():
    views = torch.randn(5, 2, 3, 2, 6)
    z = depth_retrieval(torch.zeros(2, 6), views, rms_normalize(views, 1e-6))
    assert torch.allclose(z, views.mean(0), atol=1e-6)


@pytest.mark.parametrize("kind", ["msar", "attnres"])
def test_mixer_one_sees_only_the_embedding(tmp_path, kind):
    """h_1 depends only on x_0: the softmax over one source is 1, not 0."""
    path, cfg = make_checkpoint(tmp_path / "c", seed=4, residual=kind)
    model = load_checkpoint(path)
    ids = torch.randint(0, cfg["vocab_size"], (1, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        path_obj = model.depth_path()
        x0 = model.embed(ids)
        path_obj.add_source(0, x0)
        h1 = path_obj.mix(1)
    _, hidden = reference_logits(cfg, load_tensors(path), ids.numpy(), return_hidden=True)
    assert rel_err(h1.numpy(), hidden[0]) <= TOL_FP32
    if kind == "attnres":
        assert torch.allclose(h1, x0, atol=1e-6)


@pytest.mark.parametrize("kind", ["msar", "attnres", "standard"])
def test_prefill_then_decode_equals_full_sequence(tmp_path, kind):
    path, cfg = make_checkpoint(tmp_path / "c", seed=6, residual=kind, stream_kernels=[1, 4, 8, 12])
    model = load_checkpoint(path)
    ids = torch.randint(0, cfg["vocab_size"], (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = model(ids)
        logits, cache = model.run(ids[:, :5])
        steps = [logits]
        for t in range(5, 24):
            logits, cache = model.run(ids[:, t : t + 1], cache=cache)
            steps.append(logits)
    assert rel_err(torch.cat(steps, 1).numpy(), full.numpy()) <= TOL_FP32
    if kind == "msar":
        assert cache.conv.shape == (2 * cfg["n_blocks"] + 1, 2, 11, cfg["d_model"])


def test_left_padded_batch_matches_unpadded_rows(tmp_path):
    path, cfg = make_checkpoint(tmp_path / "c", seed=8, stream_kernels=[1, 4, 8, 12])
    model = load_checkpoint(path)
    g = torch.Generator().manual_seed(0)
    a = torch.randint(0, cfg["vocab_size"], (1, 9), generator=g)
    b = torch.randint(0, cfg["vocab_size"], (1, 4), generator=g)
    batch = torch.cat([a, torch.cat([torch.zeros(1, 5, dtype=torch.long), b], 1)])
    mask = torch.tensor([[1] * 9, [0] * 5 + [1] * 4])
    out = generate(model, batch, mask, max_new_tokens=12)
    assert torch.equal(out[0], generate(model, a, max_new_tokens=12)[0])
    assert torch.equal(out[1, 5:], generate(model, b, max_new_tokens=12)[0])


def test_sampling_is_seeded(tmp_path):
    path, cfg = make_checkpoint(tmp_path / "c", seed=9)
    model = load_checkpoint(path)
    ids = torch.randint(0, cfg["vocab_size"], (2, 5), generator=torch.Generator().manual_seed(0))
    a = generate(model, ids, max_new_tokens=10, do_sample=True, top_k=10, seed=3)
    b = generate(model, ids, max_new_tokens=10, do_sample=True, top_k=10, seed=3)
    c = generate(model, ids, max_new_tokens=10, do_sample=True, top_k=10, seed=4)
    assert torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.parametrize("dtype,tol", [(torch.float16, 2e-2), (torch.bfloat16, 6e-2)])
def test_half_precision_runs_close_to_reference(tmp_path, dtype, tol):
    path, cfg = make_checkpoint(tmp_path / "c", seed=12, query_scale=0.5)
    model = load_checkpoint(path, dtype=dtype)
    ids = torch.randint(0, cfg["vocab_size"], (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = model(ids)
    assert got.dtype == dtype and torch.isfinite(got).all()
    assert rel_err(got.float().numpy(), reference_logits(cfg, load_tensors(path), ids.numpy())) <= tol
