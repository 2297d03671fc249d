"""Crafted ONNX bundles: an external-data location may not reach outside the model's
folder, whether the file is exported, checked, built or put in a Triton repository,
and nothing outside what the user named is read or written.  Each case isolates
one path rule on a tiny graph (hostile_helpers.tiny_model)."""

from __future__ import annotations

import json
import os

import numpy as np
import onnx
import pytest

from hostile_helpers import REPO, W, one_line_exit_2, run_main, run_tiny, tiny_model, tree  # noqa: F401


def test_traversal_location_overwrites_nothing_outside(tmp_path):
    """The reported attack: a model five folders deep whose data `location` climbs back out,
    with a payload next to it; before the fix `victim.txt` was overwritten and exit was 0."""
    victim = tmp_path / "victim.txt"
    victim.write_text("victim")
    loc = "../../../../../victim.txt"
    # read from p/victim.txt (the payload, beside the model's folders); the copy's target,
    # repo-tmp/tiny/1/<loc>, is tmp_path/victim.txt
    model = tiny_model(tmp_path / "p" / "a" / "b" / "c" / "d" / "e", loc)
    assert (tmp_path / "p" / "victim.txt").read_bytes() == W.tobytes()
    before = tree(tmp_path)
    repo = tmp_path / "a" / "b" / "repo"
    line = one_line_exit_2(run_main("triton-repo", model, "-o", repo, "--name", "tiny", "--no-validate"))
    assert "climbs out" in line
    assert tree(tmp_path) == before and victim.read_text() == "victim"


@pytest.mark.parametrize("case", ["dotdot", "symlink_out", "symlinked_dir_out", "absolute", "hardlink", "missing"])
def test_external_data_outside_the_model_folder_is_refused(tmp_path, case):
    secret = tmp_path / "secret" / "canary.txt"
    secret.parent.mkdir()
    secret.write_bytes(W.tobytes())  # right size: only the path rule can refuse it
    folder = tmp_path / "model"
    if case == "dotdot":
        model, want = tiny_model(folder, "../secret/canary.txt"), "climbs out"
    elif case == "symlink_out":
        folder.mkdir()
        (folder / "w.data").symlink_to(secret)
        model, want = tiny_model(folder, "w.data"), "leads outside"
    elif case == "symlinked_dir_out":
        folder.mkdir()
        (folder / "sub").symlink_to(secret.parent, target_is_directory=True)
        model, want = tiny_model(folder, "sub/canary.txt"), "leads outside"
    elif case == "absolute":
        model, want = tiny_model(folder, str(secret)), "absolute path"
    elif case == "hardlink":
        folder.mkdir()
        os.link(secret, folder / "w.data")
        model, want = tiny_model(folder, "w.data"), "hard links"
    else:
        folder.mkdir()
        model, want = tiny_model(folder, "w.data", payload=tmp_path / "elsewhere.bin"), "is missing"
    before = tree(tmp_path)
    line = one_line_exit_2(run_main("triton-repo", model, "-o", tmp_path / "repo", "--no-validate"))
    assert want in line, line
    assert tree(tmp_path) == before  # no repository, no copy of the canary, nothing linked


def test_repository_carries_a_copy_of_the_data_and_the_original_stays_usable(tmp_path):
    model = tiny_model(tmp_path / "model", "weights/w.data")
    r = run_main("triton-repo", model, "-o", tmp_path / "repo", "--name", "tiny", "--no-validate")
    assert r.returncode == 0, r.stderr.decode()
    copied = tmp_path / "repo" / "tiny" / "1" / "weights" / "w.data"
    original = tmp_path / "model" / "weights" / "w.data"
    assert copied.is_file() and not copied.is_symlink()
    assert os.stat(original).st_nlink == 1 and not os.path.samefile(copied, original)  # copied, never linked
    manifest = json.loads((tmp_path / "repo" / "manifest.json").read_text())
    assert "tiny/1/weights/w.data" in manifest["files"]
    np.testing.assert_array_equal(run_tiny(tmp_path / "repo" / "tiny" / "1" / "model.onnx"), np.tile(W, (2, 1)))
    # the original still loads in the onnx library (which refuses hard-linked data) and in ORT
    onnx.load(str(model), load_external_data=True)
    np.testing.assert_array_equal(run_tiny(model), np.tile(W, (2, 1)))


def test_manifest_entries_cannot_point_outside_the_repository(tmp_path):
    from msar_export.serving.repository.writer import verify_repo

    (tmp_path / "outside.txt").write_text("x")
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "manifest.json").write_text(json.dumps({"files": {"../outside.txt": "0" * 64}}))
    problems = verify_repo(repo)
    assert len(problems) == 1 and "climbs out" in problems[0]


def test_triton_repo_refuses_a_graph_that_cannot_run(tmp_path):
    model = tiny_model(tmp_path / "model", "w.data")
    proto = onnx.load(str(model), load_external_data=False)
    proto.graph.node[0].op_type = "NoSuchOp"
    model.write_bytes(proto.SerializeToString())
    line = one_line_exit_2(run_main("triton-repo", model, "-o", tmp_path / "repo", "--no-validate"))
    assert "ONNX Runtime cannot load" in line and not (tmp_path / "repo").exists()


# -- 4: output paths ---------------------------------------------------------------------------
