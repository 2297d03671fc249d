"""The small random msar checkpoint most modules test on, with its prefill and decode graphs
(each exported once per session: an export costs 7-20 s of CPU), and the fault injection
that edits a checkpoint's weights."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import make_checkpoint
from msar_export.checkpoint import load_checkpoint
from msar_export.export import ExportOptions, export_model


@pytest.fixture(scope="session")
def faithful(tmp_path_factory):
    """A small random msar checkpoint (kernels [1,3,5], 2 blocks) and its fp32 prefill graph."""
    root = tmp_path_factory.mktemp("compare")
    ckpt, cfg = make_checkpoint(root / "ckpt", seed=5)
    onnx_path = root / "model.onnx"
    export_model(load_checkpoint(ckpt), onnx_path, ExportOptions(), validate=False)
    return ckpt, onnx_path, cfg


@pytest.fixture(scope="session")
def faithful_decode(faithful, tmp_path_factory):
    """The decode graph of `faithful`'s checkpoint: (checkpoint, decode.onnx, config dict)."""
    ckpt, _, cfg = faithful
    path = tmp_path_factory.mktemp("decode") / "decode.onnx"
    export_model(load_checkpoint(ckpt), path, ExportOptions(decode=True), validate=False)
    return ckpt, path, cfg


def lazy_exports(ckpt: Path, root: Path, options: dict, made: dict | None = None):
    """get(kind) -> `ckpt` exported with options[kind] to root/KIND.onnx on first use (without
    validation); `made` holds paths exported already (kind -> path)."""
    from msar_export.export import export_checkpoint

    made = dict(made or {})

    def get(kind):
        if kind not in made:
            made[kind] = root / f"{kind}.onnx"
            export_checkpoint(ckpt, made[kind], options[kind], validate=False)
        return made[kind]

    return get


def faulted(src: Path, dst: Path, edit) -> Path:
    """Copy checkpoint `src` to `dst` with `edit(tensors)` applied (the same config)."""
    dst.mkdir(parents=True)
    shutil.copy(src / "config.json", dst / "config.json")
    tensors = load_file(str(src / "model.safetensors"))
    with torch.no_grad():
        edit(tensors)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(dst / "model.safetensors"))
    return dst


def scale_tap(i, r, tap, factor=1.02):
    def edit(t):
        t[f"sources.{i}.conv.{r}.weight"][:, 0, tap] *= factor
    return edit


def check_both_passes_then_fails_on_two_percent_taps(ckpt: Path, onnx_path: Path, tmp_path: Path, capsys) -> None:
    """`check --ort-ops both` on `onnx_path`: exit 0 with both ONNX Runtime rows PASS against `ckpt`,
    exit 1 with both FAIL against a copy whose tap changed by 2% (the caller sets MSAR_ORT_OPS)."""
    from msar_export.cli import main

    assert main(["check", str(ckpt), "--onnx", str(onnx_path), "--ort-ops", "both", "--no-trt"]) == 0
    out = capsys.readouterr().out
    assert "onnxrt-native: PASS" in out and "onnxrt-function: PASS" in out
    bad = faulted(ckpt, tmp_path / "bad", scale_tap(2, 1, 1))
    assert main(["check", str(bad), "--onnx", str(onnx_path), "--ort-ops", "both", "--no-trt"]) == 1
    out = capsys.readouterr().out
    assert "onnxrt-native: FAIL" in out and "onnxrt-function: FAIL" in out
