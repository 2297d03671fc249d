"""The ORT term of the export-memory formula (bench/bounds.py, README "Export memory"): what
ONNX Runtime holds while validating, term by term, and a row over it is flagged."""

from __future__ import annotations

import pytest

from msar_export.bench.bounds import (ORT_GRAPH_MIB, ORT_IMAGE_MIB, heap_kept_bytes, largest_tensor_bytes,
                                      ort_activations_mib, ort_bound_mib, row_bounds, within)
from msar_export.bench.memory import memory_config

CFG = memory_config(24, 1024, 32000)  # the README table's 318 M model: 48 sublayers, 4 streams
PARAMS = 318141685


def test_the_readmes_worked_figures_for_the_318m_rows():
    # README: image 96 + 0.75 x 48 = 132, references 12 B x 57 x 32,000 = 20.9, file 1215.3, the
    # tensors under 1 MiB 8.6; decomposed run 4 B x 57 x (4 x 49 x 4 x 1024 + 32,000 + 3 x 2816)
    # = 183.4 > the load's 125
    assert heap_kept_bytes(CFG) / 2**20 == pytest.approx(8.6, abs=0.05)
    assert ort_bound_mib(1215.3, CFG, False, False, False, decomposed=True) == pytest.approx(1560.1, abs=0.1)
    # fused run 4 B x 57 x (8 x 49 x 1024 + 32,000 + 3 x 2816) = 96.1 < the embedding in flight, 125
    assert ort_activations_mib(CFG, False) == pytest.approx(96.1, abs=0.1)
    assert ort_bound_mib(1215.2, CFG, False, False, False, decomposed=False) == pytest.approx(1501.7, abs=0.1)


def test_the_heap_keeps_the_parsed_copies_of_the_tensors_under_the_mmap_threshold():
    # at d 512 the k and v projections (512 x 256 floats, 0.5 MiB) are under 1 MiB, at d 1024 not
    narrow = memory_config(24, 512, 32000)
    kv = 2 * narrow.n_blocks * 512 * 256 * 4  # 24 MiB
    assert heap_kept_bytes(narrow) > kv > 2 * heap_kept_bytes(CFG)
    assert heap_kept_bytes(narrow) / 2**20 == pytest.approx(28.3, abs=0.05)


def test_inline_weights_count_one_tensor_in_flight_external_data_none():
    tiny = memory_config(2, 256, 50000)  # its embedding (49 MiB) far above its activations
    inline = ort_bound_mib(10.0, tiny, False, False, False, False)
    external = ort_bound_mib(10.0, tiny, False, False, True, False)
    in_flight, run = largest_tensor_bytes(tiny) / 2**20, ort_activations_mib(tiny, False)
    assert in_flight > run  # the load, not the run, sets the inline peak: max(in flight, run)
    assert inline - external == pytest.approx(in_flight - run + heap_kept_bytes(tiny) / 2**20)
    # the anonymous part of an external-data run leaves the mapped file out, inline keeps it
    assert external - ort_bound_mib(10.0, tiny, False, True, True, False) == pytest.approx(10.0)
    assert ort_bound_mib(10.0, tiny, False, True, False, False) == inline


def test_float16_adds_a_float32_copy_of_the_weights():
    from msar_export.bench.bounds import checkpoint_bytes

    f16 = ort_bound_mib(609.0, CFG, True, False, False, False)
    assert f16 - ort_bound_mib(609.0, CFG, False, False, False, False) == pytest.approx(checkpoint_bytes(CFG) / 2**20)
    assert checkpoint_bytes(CFG) == 4 * PARAMS


def test_activations_follow_the_graph_the_tokens_and_the_depth():
    shallow, deep = memory_config(8, 1024, 32000), CFG
    for cfg in (shallow, deep):
        per_token = {k: ort_activations_mib(cfg, k) for k in (False, True)}
        sources = (cfg.n_sublayers + 1) * cfg.d_model
        rest = cfg.vocab_size + 3 * cfg.mlp_hidden
        # decomposed: 4 (L+1) m d per token (views, stack, cast, one product); fused (m+4)(L+1) d
        assert per_token[True] / per_token[False] == pytest.approx((16 * sources + rest) / (8 * sources + rest))
    assert ort_activations_mib(deep, True) > 2.5 * ort_activations_mib(shallow, True) > 0
    assert ORT_IMAGE_MIB + ORT_GRAPH_MIB * deep.n_sublayers > ORT_IMAGE_MIB + ORT_GRAPH_MIB * shallow.n_sublayers


def _row(variant: str, peak: float, file_mib: float = 1215.3) -> dict:
    return {"variant": variant, "parameters": PARAMS, "baseline_mib": 219.2, "file_mib": file_mib,
            "external_data": "--external-data" in variant, "peak_mib": peak, "tree_peak_anon_mib": peak - 40,
            "returncode": 0}


def test_a_row_over_its_graphs_bound_is_flagged():
    # the decomposed row measured 2026-12-02 (1492.6 MiB) is within; 1600 is not
    for peak, ok in ((1492.6, True), (1600.0, False)):
        row = _row("decomposed", peak)
        row.update(row_bounds(row, CFG))
        assert within(row) is ok
    # the same peak is within for a decomposed graph and over for a fused one: the graph's term decides
    fused_bound = row_bounds(_row("default", 0), CFG)["bound_mib"]
    row = _row("decomposed", fused_bound + 30)
    assert within({**row, **row_bounds(row, CFG)})
    row = _row("default", fused_bound + 30)
    assert not within({**row, **row_bounds(row, CFG)})
