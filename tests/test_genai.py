"""`msar-export genai`: ONNX Runtime GenAI (onnxruntime-genai 0.18) generates from our
folder exactly what our eager model generates, greedy, 64 new tokens."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import make_checkpoint, trained_checkpoint

og = pytest.importorskip("onnxruntime_genai", reason="onnxruntime-genai is not installed (scripts/setup_env.sh)")

from msar_export.checkpoint import load_checkpoint  # noqa: E402
from msar_export.interop.genai import write_genai_folder  # noqa: E402
from msar_export.model.generate import generate  # noqa: E402

N = 64
TEXT = [b"def hello(x):\n    return ", b"import os"]


def eager_tokens(ckpt, rows: list[list[int]], eos: int | None) -> list[list[int]]:
    """Our eager greedy tokens for rows of one length (GenAI's batch: see genai_tokens)."""
    model = load_checkpoint(ckpt).eval()
    ids = torch.tensor(rows)
    with torch.no_grad():
        out = generate(model, ids, torch.ones_like(ids), max_new_tokens=N, eos_token_id=eos)
    return out[:, ids.shape[1]:].tolist()


def genai_tokens(folder, rows: list[list[int]], **search) -> list[list[int]]:
    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(rows[0]) + N, batch_size=len(rows), **{"do_sample": False, **search})
    gen = og.Generator(model, params)
    gen.append_tokens(np.array(rows, dtype=np.int32))
    while not gen.is_done():
        gen.generate_next_token()
    return [[int(t) for t in gen.get_sequence(i)][len(rows[0]):] for i in range(len(rows))]


def padded(rows: list[list[int]], pad: int) -> list[list[int]]:
    """GenAI 0.18 feeds a batch's left padding as tokens (attention mask all ones,
    positions counting the pads), so a padded row is compared with eager on the same row."""
    T = max(map(len, rows))
    return [[pad] * (T - len(r)) + r for r in rows]


def until_eos(tokens: list[int], eos: int) -> list[int]:
    """GenAI stops a batch-1 run at the end token (eager repeats it to the length asked)."""
    return tokens[: tokens.index(eos) + 1] if eos in tokens else tokens


@pytest.fixture(scope="module")
def random_case(tmp_path_factory):
    """A random odd-size checkpoint, its prompts, an end token eager never emits for them
    (so all 64 tokens are compared) and its GenAI folder."""
    root = tmp_path_factory.mktemp("genai")
    ckpt, cfg = make_checkpoint(root / "ckpt", seed=7, query_scale=0.5)
    V = cfg["vocab_size"]
    rows = [[b % V for b in t] for t in TEXT]
    seen = {t for r in rows for t in r}
    for r in padded(rows, 0) + rows[:1]:
        seen |= set(eager_tokens(ckpt, [r], None)[0])
    eos = min(set(range(V)) - seen)
    folder = root / "genai"
    write_genai_folder(ckpt, folder, validate=False, eos_token_id=eos)
    return ckpt, rows, eos, folder


def test_greedy_tokens_equal_eager_batch_1(random_case):
    ckpt, rows, eos, folder = random_case
    want = eager_tokens(ckpt, rows[:1], eos)[0]
    assert genai_tokens(folder, rows[:1]) == [until_eos(want, eos)] and len(want) == N


def test_greedy_tokens_equal_eager_batch_of_different_lengths(random_case):
    ckpt, rows, eos, folder = random_case
    batch = padded(rows, eos)
    assert genai_tokens(folder, batch) == eager_tokens(ckpt, batch, eos)


def test_sampling_with_a_seed_runs_and_repeats(random_case):
    _, rows, _, folder = random_case
    runs = [genai_tokens(folder, rows[:1], do_sample=True, top_k=5, temperature=0.9, random_seed=3) for _ in range(2)]
    assert runs[0] == runs[1] and all(0 <= t < 61 for t in runs[0][0])


def test_rewind_is_refused_as_documented(random_case):
    """docs/interop.md says GenAI cannot rewind these folders; the day it can, this fails."""
    _, rows, _, folder = random_case
    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(rows[0]) + 4, do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(np.array(rows[:1], dtype=np.int32))
    gen.generate_next_token()
    with pytest.raises(Exception, match="RewindTo is currently not supported"):
        gen.rewind_to(0)


def test_a_dropped_conv_state_is_caught(random_case, tmp_path):
    """Negative control: the folder's model with its convolution state zeroed on every step
    must no longer match eager (the state really travels through GenAI)."""
    import onnx
    from onnx import helper

    ckpt, rows, eos, folder = random_case
    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    model = onnx.load(broken / "model.onnx")
    reshape = next(n for n in model.graph.node if n.name == "genai.in0")
    model.graph.node.insert(0, helper.make_node("Mul", [reshape.input[0], "zero"], ["zeroed"]))
    model.graph.initializer.append(helper.make_tensor("zero", onnx.TensorProto.FLOAT, [], [0.0]))
    reshape.input[0] = "zeroed"
    onnx.save(model, broken / "model.onnx")
    want = eager_tokens(ckpt, rows[:1], eos)[0]
    assert genai_tokens(broken, rows[:1]) != [until_eos(want, eos)]


def test_cli_refuses_a_foreign_folder_and_bad_eos(random_case, tmp_path):
    ckpt, *_ = random_case
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    cli = [sys.executable, "-m", "msar_export.cli", "genai", str(ckpt)]
    for args, says in ((["-o", str(foreign)], "was not written by `msar-export genai`"),
                       (["-o", str(tmp_path / "new"), "--eos-token-id", "61", "--no-validate"], "outside the vocabulary")):
        r = subprocess.run([*cli, *args], capture_output=True, text=True, timeout=600)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and says in lines[0] and "Traceback" not in r.stderr, r.stderr
    assert (foreign / "notes.txt").read_text() == "keep me" and not (tmp_path / "new").exists()


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_trained_checkpoint_greedy_and_byte_tokenizer(tmp_path, dtype):
    """The committed default checkpoint through the CLI: GenAI's tokenizer maps bytes exactly,
    and its greedy tokens equal eager's (float16: eager in float16 too)."""
    ckpt = trained_checkpoint("msar")
    folder = tmp_path / "genai"
    r = subprocess.run([sys.executable, "-m", "msar_export.cli", "genai", str(ckpt), "-o", str(folder), "--dtype", dtype],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr
    assert json.loads((folder / "genai_config.json").read_text())["model"]["eos_token_id"] == [0]
    tok = og.Tokenizer(og.Model(str(folder)))
    text = "def f(x):\n\treturn x  # é €\n"
    assert list(tok.encode(text)) == list(text.encode()) and tok.decode(list(text.encode())) == text
    rows = [list(b"def "), list(b"import collections\n")]
    model = load_checkpoint(ckpt).eval().to(getattr(torch, dtype))
    for batch in (rows[:1], padded(rows, 0)):
        ids = torch.tensor(batch)
        with torch.no_grad():
            want = generate(model, ids, torch.ones_like(ids), max_new_tokens=N, eos_token_id=0)[:, ids.shape[1]:].tolist()
        if len(batch) == 1:
            want = [until_eos(want[0], 0)]
        assert genai_tokens(folder, batch) == want


@pytest.mark.slow
def test_a_graph_without_conv_state_uses_the_plain_decoder_type(tmp_path):
    """attnres (one identity stream) has no convolution state: GenAI's "llama" type, same tokens."""
    got, want = one_identity_stream_folder(tmp_path, "attnres")
    assert got == want


@pytest.mark.slow
def test_msar_without_conv_streams_drops_its_empty_conv_state(tmp_path):
    """msar with stream_kernels [1] exports a conv state of no positions ([L+1, batch, 0, d]), which
    GenAI's conv cache cannot hold (its Reshape needs a 0 dimension: the folder did not load): the
    folder's graph drops it and runs as "llama", with the eager model's tokens."""
    import onnx

    got, want = one_identity_stream_folder(tmp_path, "msar")
    graph = onnx.load(tmp_path / "genai" / "model.onnx", load_external_data=False).graph
    assert "past_conv_state" not in {v.name for v in graph.input} and not any(n.op_type == "ConvState" for n in graph.node)
    assert got == want


def one_identity_stream_folder(tmp_path, residual: str):
    """A stream_kernels [1] checkpoint's GenAI folder (asserted to be the "llama" type): GenAI's greedy
    tokens for the first prompt, and the eager model's."""
    ckpt, cfg = make_checkpoint(tmp_path / "ckpt", seed=7, residual=residual, stream_kernels=[1])
    rows = [[b % cfg["vocab_size"] for b in t] for t in TEXT]
    want = eager_tokens(ckpt, rows[:1], None)[0]
    eos = min(set(range(cfg["vocab_size"])) - set(want) - set(rows[0]))
    write_genai_folder(ckpt, tmp_path / "genai", validate=False, eos_token_id=eos)
    assert json.loads((tmp_path / "genai" / "genai_config.json").read_text())["model"]["type"] == "llama"
    return genai_tokens(tmp_path / "genai", rows[:1]), [want]
