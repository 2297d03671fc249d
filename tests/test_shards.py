"""Sharded checkpoints (Hugging Face layout: model-0000K-of-0000N.safetensors + index):
they load exactly like one model.safetensors, save above a size, and a hostile index
is refused with one line before any tensor value is read, the user's files untouched.

The sharded fixtures are written here with safetensors' own `save_file` and `json`,
not with the code under test."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import make_checkpoint
from hostile_helpers import one_line_exit_2, run_cli, run_main, tree


def shard_by_hand(src: Path, dst: Path, n: int = 3, index_edit=None) -> Path:
    """`src` (one model.safetensors) rewritten as `n` shards + index at `dst`."""
    dst.mkdir(parents=True)
    shutil.copy(src / "config.json", dst / "config.json")
    tensors = load_file(str(src / "model.safetensors"))
    names = list(tensors)
    groups = [names[k::n] for k in range(n)]
    weight_map = {}
    for k, group in enumerate(groups, start=1):
        file = f"model-{k:05d}-of-{n:05d}.safetensors"
        save_file({name: tensors[name] for name in group}, str(dst / file))
        weight_map.update({name: file for name in group})
    index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in tensors.values())},
             "weight_map": weight_map}
    if index_edit:
        index_edit(index)
    (dst / "model.safetensors.index.json").write_text(json.dumps(index))
    return dst


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("single") / "ckpt", seed=5)[0]


@pytest.fixture
def sharded(single, tmp_path):
    return shard_by_hand(single, tmp_path / "sharded")


def _state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_sharded_loads_exactly_as_the_single_file(single, sharded, tmp_path):
    from msar_export.checkpoint import load_checkpoint

    a, b = _state(load_checkpoint(single)), _state(load_checkpoint(sharded))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # Negative control: one changed value in one shard is seen.
    other = shard_by_hand(single, tmp_path / "changed")
    shard = other / "model-00002-of-00003.safetensors"
    t = load_file(str(shard))
    first = sorted(t)[0]
    t[first] = t[first] + 1.0
    save_file(t, str(shard))
    c = _state(load_checkpoint(other))
    assert not torch.equal(a[first], c[first])


def test_save_shards_above_the_size_and_round_trips(single, tmp_path):
    from msar_export.checkpoint import load_checkpoint, save_checkpoint

    model = load_checkpoint(single)
    state = _state(model)
    total = sum(t.numel() * t.element_size() for t in state.values())
    limit = total // 4
    out = save_checkpoint(model, tmp_path / "out", max_shard_size=limit)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted(p.name for p in out.glob("*.safetensors"))
    n = len(files)
    assert n >= 4 and files == [f"model-{k:05d}-of-{n:05d}.safetensors" for k in range(1, n + 1)]
    assert index["metadata"]["total_size"] == total
    union = {}
    for f in files:  # read with safetensors alone: what any Hugging Face tool sees
        part = load_file(str(out / f))
        assert sum(t.numel() * t.element_size() for t in part.values()) <= limit or len(part) == 1
        assert all(index["weight_map"][name] == f for name in part)
        assert not union.keys() & part.keys()
        union.update(part)
    assert union.keys() == state.keys() and all(torch.equal(union[k], state[k]) for k in state)
    again = _state(load_checkpoint(out))
    assert all(torch.equal(again[k], state[k]) for k in state)
    # Below the size (the default, 5 GB): one model.safetensors and no index, as before.
    one = save_checkpoint(model, tmp_path / "one")
    assert sorted(p.name for p in one.iterdir()) == ["config.json", "model.safetensors"]
    # Re-saving a sharded checkpoint smaller leaves no stale shard behind (the folder is swapped whole).
    save_checkpoint(model, out)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]


def _move(index, name, to):
    index["weight_map"][name] = to


def _first(index):
    return sorted(index["weight_map"])[0]


# name -> (how to spoil a sharded checkpoint, words the one-line refusal must hold)
HOSTILE = {
    "absolute_shard": (lambda d: _edit(d, lambda i: _move(i, _first(i), str(d / "model-00001-of-00003.safetensors"))),
                       "absolute path"),
    "dotdot_shard": (lambda d: _edit(d, lambda i: _move(i, _first(i), "../outside.safetensors")), "climbs out"),
    "symlink_out": (lambda d: _link_out(d), "leads outside"),
    "missing_shard": (lambda d: (d / "model-00003-of-00003.safetensors").unlink(), "is missing"),
    "wrong_shard": (lambda d: _edit(d, lambda i: _move(i, _first(i), _other_shard(i, _first(i)))),
                    "index puts it in|does not hold it"),
    "tensor_in_two_shards": (lambda d: _duplicate(d), "exactly the one shard"),
    "unreferenced_shard": (lambda d: shutil.copy(d / "model-00001-of-00003.safetensors",
                                                 d / "model-00004-of-00004.safetensors"), "not named by"),
    "unlisted_tensor": (lambda d: _edit(d, lambda i: i["weight_map"].pop(_first(i))), "does not list it"),
    "total_size_lies": (lambda d: _edit(d, lambda i: i["metadata"].update(total_size=12)), "total_size"),
    "not_json": (lambda d: (d / "model.safetensors.index.json").write_text("{weight_map"), "not valid JSON"),
    "no_weight_map": (lambda d: (d / "model.safetensors.index.json").write_text('{"metadata": {}}'), "weight_map"),
    "duplicate_key": (lambda d: (d / "model.safetensors.index.json").write_text(
        '{"weight_map": {"a": "x.safetensors", "a": "y.safetensors"}}'), "duplicate key"),
    "location_not_a_string": (lambda d: _edit(d, lambda i: _move(i, _first(i), 7)), "not a shard file name"),
    "both_layouts": (lambda d: shutil.copy(d / "model-00001-of-00003.safetensors", d / "model.safetensors"),
                     "ambiguous"),
    "truncated_shard": (lambda d: _truncate(d / "model-00002-of-00003.safetensors"), "truncated or corrupt"),
    "shape_lies": (lambda d: _reshape_one(d), "config and weights disagree"),
    "index_too_big": (lambda d: _big_index(d), "byte limit"),
}


def _edit(d: Path, fn) -> None:
    p = d / "model.safetensors.index.json"
    index = json.loads(p.read_text())
    fn(index)
    p.write_text(json.dumps(index))


def _other_shard(index, name):
    return next(f for f in sorted(set(index["weight_map"].values())) if f != index["weight_map"][name])


def _link_out(d: Path) -> None:
    target = d / "model-00001-of-00003.safetensors"
    outside = d.parent / "elsewhere.safetensors"
    shutil.move(target, outside)  # a valid file: only the containment rule refuses it
    target.symlink_to(outside)


def _duplicate(d: Path) -> None:
    index = json.loads((d / "model.safetensors.index.json").read_text())
    name = _first(index)
    home = index["weight_map"][name]
    other = d / _other_shard(index, name)
    t = load_file(str(other))
    t[name] = load_file(str(d / home))[name]
    save_file(t, str(other))


def _truncate(p: Path) -> None:
    data = p.read_bytes()
    p.write_bytes(data[: len(data) - 8])


def _reshape_one(d: Path) -> None:
    p = d / "model-00002-of-00003.safetensors"
    t = load_file(str(p))
    name = sorted(t)[0]
    t[name] = t[name].reshape(-1)[:-1].contiguous() if t[name].numel() > 1 else torch.zeros(2)
    save_file(t, str(p))
    _edit(d, lambda i: i["metadata"].pop("total_size"))  # total_size is optional: the config check must catch it


def _big_index(d: Path) -> None:
    with open(d / "model.safetensors.index.json", "w") as f:
        f.write('{"weight_map": {}, "pad": "')
        f.truncate(65 << 20)


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_index_is_refused_in_one_line(single, tmp_path, case):
    from msar_export.checkpoint import load_checkpoint
    from msar_export.errors import CheckpointError

    d = shard_by_hand(single, tmp_path / "ckpt")
    assert load_checkpoint(d) is not None  # negative control: the unspoiled copy loads
    spoil, words = HOSTILE[case]
    spoil(d)
    with pytest.raises(CheckpointError, match=words) as info:
        load_checkpoint(d)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("case", ["dotdot_shard", "tensor_in_two_shards", "unreferenced_shard", "truncated_shard"])
def test_cli_refuses_a_hostile_index_and_leaves_the_files_as_they_were(single, tmp_path, case):
    d = shard_by_hand(single, tmp_path / "ckpt")
    HOSTILE[case][0](d)
    before = tree(tmp_path)
    line = one_line_exit_2(run_main("export", d, "-o", tmp_path / "out.onnx", "--no-validate"))
    assert HOSTILE[case][1] in line
    assert tree(tmp_path) == before  # no output, no temp litter, the checkpoint untouched


def test_a_shard_that_is_a_fifo_is_refused_unread(single, tmp_path):
    from msar_export.checkpoint import load_checkpoint
    from msar_export.errors import CheckpointError

    d = shard_by_hand(single, tmp_path / "ckpt")
    p = d / "model-00002-of-00003.safetensors"
    p.unlink()
    os.mkfifo(p)  # opening it for reading would block forever
    with pytest.raises(CheckpointError, match="not a regular file"):
        load_checkpoint(d)


@pytest.mark.slow
def test_sharded_checkpoint_exports_the_same_file(single, tmp_path):
    """The same weights, sharded or not, export to the same bytes (the folder's name is
    recorded in the file, so both are called `ckpt`)."""
    a = tmp_path / "a" / "ckpt"
    shutil.copytree(single, a)
    b = shard_by_hand(single, tmp_path / "b" / "ckpt")
    for src in (a, b):
        r = run_cli("export", src, "-o", src.parent / "m.onnx", "--no-validate")
        assert r.returncode == 0, r.stderr.decode()[-2000:]
    assert (a.parent / "m.onnx").read_bytes() == (b.parent / "m.onnx").read_bytes()


def test_a_single_file_checkpoint_ignores_other_safetensors_files(single, tmp_path):
    """One model.safetensors is the whole of the weights (as before shards existed); only the
    sharded layout refuses a *.safetensors its index does not name (unreferenced_shard)."""
    from msar_export.checkpoint import load_checkpoint

    d = tmp_path / "ckpt"
    shutil.copytree(single, d)
    save_file({"step": torch.zeros(1)}, str(d / "optimizer.safetensors"))
    a, b = _state(load_checkpoint(single)), _state(load_checkpoint(d))
    assert all(torch.equal(a[k], b[k]) for k in a)
