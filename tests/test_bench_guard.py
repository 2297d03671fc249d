"""The guard against the next slowdown of MSAR in ONNX Runtime: msar/standard prefill time on a
small model, measured here side by side, must stay within GUARD_MARGIN of the ratio the committed
benchmark recorded (benchmarks/results.json, written by `msar-export bench`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from msar_export.bench.guard import GUARD_MARGIN, guard_ratios, regressions

# Alone, after the parallel workers (scripts/test.sh): a ratio measured beside other tests is noise.
pytestmark = pytest.mark.serial

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results.json"


def test_msar_over_standard_in_ort_has_not_regressed():
    recorded = json.loads(RESULTS.read_text())["guard"]
    measured = guard_ratios(threads=recorded["threads"])
    assert [k for k in recorded if k.startswith("msar/standard")], "the committed benchmark has no guard ratios"
    assert "msar/standard (function)" in measured
    bad = regressions(measured, recorded)
    assert not bad, f"MSAR got dearer in ONNX Runtime: {bad}; measured {measured}, recorded {recorded}"


def test_the_guard_catches_a_regression():
    """Negative control of the comparison itself: 1.3x the recorded ratio fails, 1.1x passes."""
    recorded = {"msar/standard (native)": 1.2, "msar/standard (function)": 3.0, "threads": 2}
    assert regressions({"msar/standard (native)": 1.2 * 1.3, "msar/standard (function)": 3.0}, recorded)
    assert not regressions({"msar/standard (native)": 1.2 * 1.1, "msar/standard (function)": 3.0 * 1.1}, recorded)
    assert 1.3 > GUARD_MARGIN > 1.1
