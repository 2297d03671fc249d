"""Issue 22, sections 3-5: numbers that pass each bound alone but not together, a verdict
that called NaN a pass, and numeric options that overflowed into tracebacks."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import make_checkpoint
from hostile_helpers import one_line_exit_2, run_cli


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("numbers") / "ckpt", seed=3, n_blocks=1)[0]


# -- 4: a non-finite error or bound is a FAIL everywhere -----------------------------------------

def test_a_non_finite_error_or_bound_never_passes():
    from msar_export.verdict import Verdict, judge, rel_err, within

    nan = np.full((2, 3), np.nan)
    ref = np.ones((2, 3))
    # Before: eager at the precision was NaN -> bound inf -> inf <= inf was a PASS.
    assert not judge(nan, nan, ref, "float32").passed
    assert not Verdict(float("inf"), float("inf"), "float32").passed
    assert not Verdict(0.0, float("nan"), "float32").passed
    assert rel_err(ref, nan) == float("inf")  # a NaN reference judges nothing close
    for error, limit in ((np.inf, np.inf), (np.nan, 1.0), (0.0, np.inf), (0.0, np.nan), (None, 1.0)):
        assert not within(error, limit), (error, limit)
    # Negative control: finite and inside still passes, at the bound exactly too.
    assert within(1e-6, 1e-5) and within(1e-5, 1e-5) and not within(2e-5, 1e-5)
    assert judge(ref * (1 + 1e-9), ref, ref, "float32").passed


def test_parity_layer_with_an_infinite_tolerance_fails():
    from msar_export.compare.parity import compare_backend
    from msar_export.compare.tolerances import fixed
    from polygraphy.comparator import IterationResult

    ref = [IterationResult(outputs={"logits": np.ones((1, 2, 4), np.float32)}, runner_name="ref")]
    got = [IterationResult(outputs={"logits": np.full((1, 2, 4), 1.5, np.float32)}, runner_name="fake")]
    assert compare_backend(ref, got, ["logits"], fixed(float("inf")), "onnxrt", "float32").status == "fail"
    # control: the same outputs under a finite, loose enough tolerance pass
    assert compare_backend(ref, got, ["logits"], fixed(0.6), "onnxrt", "float32").status == "pass"


def test_config_whose_rotary_frequencies_overflow_is_refused_at_load(ckpt, tmp_path):
    from msar_export.config import MSARConfig
    from msar_export.errors import ConfigError

    with pytest.raises(ConfigError, match="rope_theta"):
        MSARConfig(rope_theta=5e-324, d_model=128, n_heads=2, n_kv_heads=2)  # head_dim 64: theta^-(62/64) = inf
    MSARConfig(rope_theta=5e-324, d_model=128, n_heads=4, n_kv_heads=2)  # control: finite at head_dim 32
    bad = make_checkpoint(tmp_path / "theta", d_model=128, n_heads=2, n_kv_heads=2, n_blocks=1)[0]
    cfg = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**cfg, "rope_theta": 5e-324}))
    before = (bad / "config.json").read_bytes()
    # Before: exported, logits all NaN, and validation printed PASS.
    assert "rope_theta" in one_line_exit_2(run_cli("export", bad, "-o", tmp_path / "m.onnx"))
    assert (bad / "config.json").read_bytes() == before and not (tmp_path / "m.onnx").exists()
