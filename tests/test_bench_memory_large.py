"""`bench --export-memory`'s larger-than-memory row (issue 26), at a size that runs here:
a random checkpoint written shard by shard without a model, exported weightless, the
disk planned before anything is written, and everything it made removed."""

from __future__ import annotations

import json

import pytest
import torch

from msar_export.bench import memory
from msar_export.bench.memory import LARGE_VARIANTS, memory_config, run_export_memory
from msar_export.bench.models import random_checkpoint


def test_random_checkpoint_is_sharded_and_loads(tmp_path):
    from msar_export.checkpoint import load_checkpoint

    cfg = memory_config(1, 128, 256)
    ckpt = random_checkpoint(cfg, tmp_path / "ckpt", max_shard_size=64 * 1024)
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())
    shards = sorted(p.name for p in ckpt.glob("*.safetensors"))
    assert len(shards) >= 3 and sorted(set(index["weight_map"].values())) == shards
    model = load_checkpoint(ckpt)  # every header and value checked by the loader
    assert index["metadata"]["total_size"] == sum(p.numel() * 4 for p in model.parameters())
    w = model.layers["1"].wq.weight
    assert 0.01 < float(w.detach().std()) < 0.03 and torch.equal(model.final_norm.weight, torch.ones(128))
    # Negative control: another seed gives other weights.
    other = load_checkpoint(random_checkpoint(cfg, tmp_path / "other", seed=1, max_shard_size=64 * 1024))
    assert not torch.equal(other.layers["1"].wq.weight, w)


def test_a_run_the_disk_cannot_hold_is_refused_before_writing(tmp_path, monkeypatch):
    from msar_export.errors import InputError

    cfg = memory_config(32, 4096, 32000)
    assert memory.checkpoint_bytes(cfg) > 20 * 2**30  # the planned ~26 GB row
    monkeypatch.setattr(memory.shutil, "disk_usage", lambda p: type("U", (), {"free": 30 * 2**30})())
    with pytest.raises(InputError, match="needs 4[0-9].[0-9] GiB free") as info:
        run_export_memory(cfg, LARGE_VARIANTS, tmp_path)
    assert "\n" not in str(info.value) and list(tmp_path.iterdir()) == []
    # Control: the small row fits the same disk.
    assert memory.plan_disk(memory_config(1, 128, 256), tmp_path) < 30 * 2**30


@pytest.mark.slow
def test_the_large_row_dry_run_exports_sharded_and_removes_what_it_made(tmp_path):
    seen = []

    def log(line):
        seen.append((line, sorted(p.name for p in tmp_path.rglob("*") if p.suffix == ".safetensors")))

    cfg = memory_config(1, 128, 256)
    res = run_export_memory(cfg, LARGE_VARIANTS, tmp_path, log=log, max_shard_size=64 * 1024)
    assert res["settings"]["shards"] >= 3
    (row,) = res["rows"]
    assert row["returncode"] == 0, row
    assert row["file_mib"] > 0 and row["peak_export_mib"] > 0
    assert row["export_bound_mib"] == pytest.approx(row["baseline_mib"] + 1024 + 256 * 128 * 4 / 2**20, abs=0.1)
    # While it ran, the shards were there (the control); afterwards nothing is left.
    assert len(seen[0][1]) >= 3, seen
    assert list(tmp_path.iterdir()) == []
