"""Bad input: one line, exit 2, no traceback, nothing written, no code executed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from conftest import ODD, make_checkpoint, random_tensors, write_checkpoint
from msar_export import load_checkpoint
from msar_export.config import MSARConfig
from msar_export.errors import CheckpointError, ConfigError, InputError, MsarError, OnnxModelError


def cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "msar_export.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


def cli_for(case: str, *native: str):
    """A child process for the cases whose bytes a native parser reads (a crash there would take
    the test session with it), the CLI's main in this process for the others."""
    from hostile_helpers import run_main

    return cli if case in native else lambda *args: run_main(*args, text=True)


def assert_one_line_exit_2(r):
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    return lines[0]


def _cfg(**over):
    return {**MSARConfig().to_dict(), **ODD, **over}


def _bad(tmp_path: Path, name: str) -> Path:
    """A broken checkpoint directory named `name`."""
    path, cfg = make_checkpoint(tmp_path / name, seed=1)
    st_file = path / "model.safetensors"
    tensors = random_tensors(MSARConfig.from_dict(cfg), 1)
    if name == "missing_tensor":
        del tensors["layers.2.w_up.weight"]
        save_file(tensors, str(st_file))
    elif name == "extra_tensor":
        tensors["layers.9.extra"] = torch.zeros(3)
        save_file(tensors, str(st_file))
    elif name == "wrong_shape":
        tensors["mixers.2.query"] = torch.zeros(2, cfg["d_model"])
        save_file(tensors, str(st_file))
    elif name == "non_finite":
        tensors["sources.1.conv.2.weight"][0, 0, 0] = float("nan")
        save_file(tensors, str(st_file))
    elif name == "int_dtype":
        tensors["final_norm.weight"] = torch.ones(cfg["d_model"], dtype=torch.int32)
        save_file(tensors, str(st_file))
    elif name == "truncated_safetensors":
        data = st_file.read_bytes()
        st_file.write_bytes(data[: len(data) // 2])
    elif name == "corrupt_safetensors":
        st_file.write_bytes(b"\xff" * 64)
    elif name == "heads_not_dividing":
        (path / "config.json").write_text(json.dumps(_cfg(n_heads=3)))
    elif name == "config_contradicts_tensors":
        (path / "config.json").write_text(json.dumps(_cfg(mlp_hidden=80)))
    elif name == "future_format":
        (path / "config.json").write_text(json.dumps(_cfg(format_version=2)))
    elif name == "malformed_json":
        (path / "config.json").write_text("{ not json")
    elif name == "kernels_not_starting_with_1":
        (path / "config.json").write_text(json.dumps(_cfg(stream_kernels=[4, 8])))
    elif name == "unknown_residual":
        (path / "config.json").write_text(json.dumps(_cfg(residual="dense")))
    elif name == "pickle_only":
        st_file.unlink()
        torch.save(tensors, path / "model.pt")
    else:
        raise AssertionError(name)
    return path


BAD = {
    "missing_tensor": (CheckpointError, "missing 1 tensor"),
    "extra_tensor": (CheckpointError, "unexpected tensor"),
    "wrong_shape": (CheckpointError, "mixers.2.query"),
    "non_finite": (CheckpointError, "NaN or Inf"),
    "int_dtype": (CheckpointError, "dtype"),
    "truncated_safetensors": (CheckpointError, "truncated or corrupt"),
    "corrupt_safetensors": (CheckpointError, "truncated or corrupt"),
    "heads_not_dividing": (ConfigError, "does not divide"),
    "config_contradicts_tensors": (CheckpointError, "config and weights disagree"),
    "future_format": (ConfigError, "format_version 2 is not supported"),
    "malformed_json": (ConfigError, "not valid JSON"),
    "kernels_not_starting_with_1": (ConfigError, "must start with 1"),
    "unknown_residual": (ConfigError, "residual must be one of"),
    "pickle_only": (CheckpointError, "pickle"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_loader_refuses_with_a_specific_error(tmp_path, name):
    err, text = BAD[name]
    with pytest.raises(err, match=text) as info:
        load_checkpoint(_bad(tmp_path, name))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("name", ["missing_tensor", "non_finite", "truncated_safetensors", "future_format", "pickle_only"])
def test_cli_refuses_bad_checkpoint_in_one_line_and_writes_nothing(tmp_path, name):
    path = _bad(tmp_path, name)
    out = tmp_path / "out.onnx"
    line = assert_one_line_exit_2(cli_for(name, "truncated_safetensors")("export", path, "-o", out))
    assert BAD[name][1] in line
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]


def test_pickle_payload_never_runs_even_when_trusted(tmp_path):
    path, cfg = make_checkpoint(tmp_path / "c", seed=1)
    (path / "model.safetensors").unlink()
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    import pickle

    with open(path / "model.pt", "wb") as f:
        pickle.dump({"embed.weight": Payload()}, f)
    with pytest.raises(CheckpointError, match="pickle"):
        load_checkpoint(path)
    with pytest.raises(CheckpointError, match="weights_only"):
        load_checkpoint(path, trust_pickle=True)
    assert not marker.exists()


def test_trusted_pickle_of_plain_tensors_loads(tmp_path):
    path, cfg = make_checkpoint(tmp_path / "c", seed=1)
    tensors = random_tensors(MSARConfig.from_dict(cfg), 1)
    (path / "model.safetensors").unlink()
    torch.save(tensors, path / "model.pt")
    model = load_checkpoint(path, trust_pickle=True)
    assert torch.equal(model.embed.weight, tensors["embed.weight"])


@pytest.fixture(scope="module")
def standard_onnx(tmp_path_factory):
    """One export for the cases that break a real file (the same bytes each case exported before)."""
    from msar_export.export import ExportOptions, export_checkpoint

    root = tmp_path_factory.mktemp("bad_onnx")
    ckpt, _ = make_checkpoint(root / "c", seed=1, residual="standard", n_blocks=1)
    export_checkpoint(ckpt, root / "m.onnx", ExportOptions(), validate=False)
    return root / "m.onnx"


@pytest.mark.parametrize("what", ["not_onnx", "truncated", "missing", "missing_external_data"])
def test_bad_onnx_files_get_specific_errors(tmp_path, what, request):
    from msar_export.runtime import OrtModel

    path = tmp_path / "m.onnx"
    if what == "not_onnx":
        path.write_text("hello")
        match = "not an ONNX model"
    elif what == "missing":
        match = "no such file"
    else:
        path.write_bytes(request.getfixturevalue("standard_onnx").read_bytes())
        if what == "truncated":
            data = path.read_bytes()
            path.write_bytes(data[: len(data) // 3])
            match = "truncated"
        else:
            import onnx

            m = onnx.load(str(path))
            onnx.save_model(m, str(path), save_as_external_data=True, location="m.onnx.data", size_threshold=0)
            (tmp_path / "m.onnx.data").unlink()
            match = "external data file 'm.onnx.data' is missing"
    with pytest.raises(OnnxModelError, match=match):
        OrtModel(path)
    line = assert_one_line_exit_2(cli_for(what, "truncated")("generate", "--onnx", path))
    assert match in line


@pytest.mark.parametrize("ids,mask,match", [
    ([[1, 2, 300]], None, "outside the vocabulary"),
    ([[-1, 2]], None, "outside the vocabulary"),
    ([[1] * 130], None, "exceeds max_seq_len"),
    (torch.zeros(0, 4, dtype=torch.long), None, "empty"),
    ([[1, 2, 3]], [[1, 1]], "does not match"),
    ([[1, 2, 3]], [[1, 0, 1]], "left-padded"),
    ([[1, 2, 3]], [[1, 1, 0]], "left-padded"),
    ([[1, 2, 3]], [[1, 2, 1]], "only 0 and 1"),
])
def test_generation_inputs_are_validated(tmp_path, ids, mask, match):
    from msar_export import generate

    path, _ = make_checkpoint(tmp_path / "c", seed=1, vocab_size=256)
    model = load_checkpoint(path)
    ids = torch.as_tensor(ids)
    with pytest.raises(InputError, match=match):
        generate(model, ids, None if mask is None else torch.as_tensor(mask), max_new_tokens=4)


def test_usage_errors_are_one_line(tmp_path):
    assert "required" in assert_one_line_exit_2(cli("export"))
    assert "invalid choice" in assert_one_line_exit_2(cli("export", tmp_path, "-o", tmp_path / "x", "--dtype", "int8"))
    assert "no such checkpoint" in assert_one_line_exit_2(cli("generate", tmp_path / "nope"))


# -- property-based: broken configs and tensor sets ---------------------------------------

_config_mutations = st.sampled_from([
    ("d_model", st.integers(-5, 0)), ("n_heads", st.integers(-2, 0)), ("n_kv_heads", st.sampled_from([0, 2, 3, 4])),
    ("vocab_size", st.sampled_from([0, -1, 1.5, "256", None])), ("norm_eps", st.sampled_from([0, -1e-5, float("inf"), "x"])),
    ("stream_kernels", st.sampled_from([[], [0], [2, 4], [1, -3], [1, 2.5], "1,4", [True, 4]])),
    ("residual", st.text(max_size=8).filter(lambda s: s not in ("msar", "standard", "attnres"))),
    ("tie_embeddings", st.sampled_from([0, 1, "yes", None])), ("format_version", st.sampled_from([0, 2, "1", None])),
    ("model_type", st.sampled_from(["llama", "", None])), ("n_blocks", st.sampled_from([0, -1, 2.0])),
])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_broken_configs_are_refused_and_nothing_is_written(tmp_path_factory, data):
    key, values = data.draw(_config_mutations)
    value = data.draw(values)
    cfg = _cfg(**{key: value})
    if data.draw(st.booleans()):
        cfg.pop(data.draw(st.sampled_from(sorted(cfg))))
    if data.draw(st.booleans()):
        cfg["surprise"] = 1
    root = tmp_path_factory.mktemp("prop")
    good_cfg = MSARConfig.from_dict(_cfg())
    write_checkpoint(root / "c", cfg, random_tensors(good_cfg, 0))
    out = root / "out.onnx"
    with pytest.raises((ConfigError, CheckpointError)):
        load_checkpoint(root / "c")
    assert not out.exists()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_broken_tensor_sets_are_refused(tmp_path_factory, data):
    cfg = MSARConfig.from_dict(_cfg())
    tensors = random_tensors(cfg, 0)
    name = data.draw(st.sampled_from(sorted(tensors)))
    action = data.draw(st.sampled_from(["drop", "reshape", "nan", "inf", "rename", "int"]))
    t = tensors[name]
    if action == "drop":
        del tensors[name]
    elif action == "reshape":
        tensors[name] = torch.zeros(*t.shape, 2) if t.dim() else torch.zeros(2)
    elif action in ("nan", "inf"):
        t = t.clone().reshape(-1)
        t[data.draw(st.integers(0, t.numel() - 1))] = float(action)
        tensors[name] = t.reshape(tensors[name].shape)
    elif action == "rename":
        tensors[name + "_x"] = tensors.pop(name)
    else:
        tensors[name] = t.to(torch.int64)
    root = tmp_path_factory.mktemp("propt")
    write_checkpoint(root / "c", cfg.to_dict(), tensors)
    with pytest.raises(CheckpointError):
        load_checkpoint(root / "c")


def test_every_user_error_is_an_msar_error():
    for cls in (CheckpointError, ConfigError, InputError, OnnxModelError):
        assert issubclass(cls, MsarError)


# -- interrupted runs ----------------------------------------------------------------------

@pytest.mark.slow  # a SIGKILL mid-export; atomic writes are also checked by test_hostile's litter test
def test_killed_export_leaves_the_old_file_or_a_whole_new_one(tmp_path):
    import onnx

    ckpt, _ = make_checkpoint(tmp_path / "c", seed=1, n_blocks=1)
    out = tmp_path / "m.onnx"
    out.write_bytes(b"old model")
    for delay in (0.5, 2.0, 4.0, 6.0, 8.0):
        p = subprocess.Popen([sys.executable, "-m", "msar_export.cli", "export", str(ckpt), "-o", str(out),
                              "--no-validate"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        p.send_signal(signal.SIGKILL)
        p.wait()
        data = out.read_bytes()
        if data != b"old model":
            onnx.checker.check_model(onnx.load_from_string(data), full_check=True)  # complete, not half
            return
    # every kill landed before the rename: the old file must still be whole
    assert out.read_bytes() == b"old model"
