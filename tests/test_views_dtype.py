"""Issue 23 defect 7: the decision on the decode views' storage dtype (docs/kernels.md) rests on what
scripts/views_dtype.py measures: DepthRetrieval over views stored in bfloat16 against float64 over the
float32 views decode holds today, on the emulated CUDA kernel and in ONNX Runtime (native kernel and
function body). It must stay well inside the bar a bfloat16 model's backends are judged by
(verdict.bound, with eager's error = the output's own bfloat16 rounding); views with 2 mantissa bits
(float8_e5m2) must fail that bar (the comparison can fail)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from plugin_build import emulation

from msar_export import kernels as K

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import views_dtype  # noqa: E402

PROMPT = b"def main(argv):\n    return 0\n"


@pytest.fixture(scope="module")
def cases():
    ckpt = list(views_dtype.checkpoint_cases(views_dtype.REPO / "checkpoints/default/msar", PROMPT))
    return [ckpt[-1], next(views_dtype.random_cases())]  # the deepest mixer of the checkpoint; n = 97, d = 512


def test_bf16_views_within_a_quarter_of_the_bf16_bar(cases):
    try:
        from ort_ops_fixtures import native_library
        native_library()
        ort = True
    except pytest.skip.Exception:
        ort = False  # the emulation rows still decide; ORT's native kernel is not built here
    for row in views_dtype.measure(emulation(), cases, ort=ort):
        assert row["emulation float32"] < 1e-5, row  # today's float32 views: float32 arithmetic alone
        bf16 = [k for k in row if k.endswith("bfloat16")]
        assert len(bf16) == (3 if ort else 1), row
        for k in bf16:
            assert row["emulation float32"] < row[k] <= row["bf16_bound"] / 4, (k, row)


def test_two_mantissa_bits_fail_the_bar(cases):
    lib = emulation()
    for _, q, views in cases:
        ref = K.reference_depth_retrieval64(q, views, views_dtype.EPS)
        err = views_dtype.emulation_error(lib, q, views, ref, lambda v: v.to(torch.float8_e5m2).bfloat16())
        assert err > views_dtype.bf16_bar(ref)[1], err
