"""`msar-export genai CKPT -o DIR`: a folder ONNX Runtime GenAI (`og.Model(DIR)`) loads.

ORT GenAI 0.18 knows a causal-convolution state beside the KV cache only for its
"lfm2" model type: one state tensor per "conv" layer, named by
`decoder.inputs.past_conv_names` / `outputs.present_conv_names` (a literal name
is taken as it is), rank 3 [batch, H, L], every dim but batch a number; GenAI
only allocates it, zeroes it and passes it from one step to the next.  Our decode
graph keeps the convolution state of every source in one tensor, layers first
([L+1, batch, kmax-1, d]: GraphSpec), so the folder's model.onnx is that graph
with a Reshape and a Transpose on the way in and out ([batch, (L+1)*d, kmax-1]),
and the config declares the n_blocks attention layers and one "conv" layer after
them.  Nothing else in the graph changes: the KV cache, attention mask and
positions are what GenAI feeds any decoder.

The tokenizer is Hugging Face's tokenizer.json, which ORT GenAI reads: for our
byte-level checkpoints a byte-level BPE with no merges, token i = byte i, so text
round-trips exactly.  A checkpoint's own tokenizer files, when it has them, are
copied instead.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ..errors import InputError
from ..graph_spec import (ATTENTION_MASK, INPUT_IDS, LOGITS, META_GRAPH, PAST_CONV, PAST_KEY, PAST_VALUE,
                          POSITION_IDS, PRESENT_CONV, PRESENT_KEY, PRESENT_VALUE)

MODEL_FILE = "model.onnx"
MARKER = "msar_export.json"  # what the folder was made from; also: a folder this command may replace
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
GENAI_GRAPH = "genai-decode"  # msar.graph of the folder's model: not a decode graph our runners feed
LAYER_FIRST = "{}.layer_first"
# A byte-level LM has no end-of-text token, and GenAI needs one in the vocabulary: byte 0
# (NUL), which text does not hold.
BYTE_EOS = 0


def drop_empty_conv_state(model) -> None:
    """In place: a decode graph whose conv state keeps no position (stream_kernels [1]: [L+1, batch,
    0, d]) loses that input, its ConvState node and the output, so GenAI runs it as a plain decoder
    (its conv cache cannot be zero-wide: the Reshape genai_conv_state adds would need a 0 dimension).
    The state holds nothing, so nothing is lost; anything else reading it is refused."""
    graph = model.graph
    makers = [n for n in graph.node if PRESENT_CONV in n.output]
    if len(makers) != 1 or list(makers[0].input[:1]) != [PAST_CONV]:
        raise InputError("the decode graph's zero-length conv state is not made by one node from past_conv_state")
    graph.node.remove(makers[0])
    if any(PAST_CONV in n.input for n in graph.node):
        raise InputError("the decode graph reads its zero-length conv state beyond ConvState")
    for values in (graph.input, graph.output):
        kept = [v for v in values if v.name not in (PAST_CONV, PRESENT_CONV)]
        del values[:]
        values.extend(kept)


def genai_conv_state(model, cfg) -> None:
    """In place: the decode graph's conv state, input and output, becomes what GenAI's conv
    cache allocates: rank 3 [batch, H, L] with H = (L+1)*d channels and L = kmax-1 positions
    (ours: [L+1, batch, kmax-1, d]), every dim but batch a number."""
    from onnx import TensorProto, helper

    graph = model.graph
    n, k, d = cfg.n_sublayers + 1, max(cfg.stream_kernels) - 1, cfg.d_model
    inner_in, inner_out = LAYER_FIRST.format(PAST_CONV), LAYER_FIRST.format(PRESENT_CONV)
    for node in graph.node:
        node.input[:] = [inner_in if i == PAST_CONV else i for i in node.input]
        node.output[:] = [inner_out if o == PRESENT_CONV else o for o in node.output]
    for value in (*graph.input, *graph.output):
        if value.name in (PAST_CONV, PRESENT_CONV):
            elem = value.type.tensor_type.elem_type
            value.CopyFrom(helper.make_tensor_value_info(value.name, elem, ["batch", n * d, k]))
    graph.initializer.extend(helper.make_tensor(name, TensorProto.INT64, [len(v)], v)
                             for name, v in (("genai.by_source", [0, n, d, k]), ("genai.by_channel", [0, n * d, k])))
    # in: [B, n*d, k] -> [B, n, d, k] -> [n, B, k, d];  out: the reverse
    graph.node.insert(0, helper.make_node("Reshape", [PAST_CONV, "genai.by_source"], ["genai.conv_in"], name="genai.in0"))
    graph.node.insert(1, helper.make_node("Transpose", ["genai.conv_in"], [inner_in], perm=[1, 0, 3, 2], name="genai.in1"))
    graph.node.append(helper.make_node("Transpose", [inner_out], ["genai.conv_out"], perm=[1, 0, 3, 2], name="genai.out0"))
    graph.node.append(helper.make_node("Reshape", ["genai.conv_out", "genai.by_channel"], [PRESENT_CONV], name="genai.out1"))
    for p in model.metadata_props:
        if p.key == META_GRAPH:
            p.value = GENAI_GRAPH


def genai_config(cfg, library: str | None, eos: int, conv: bool = True) -> dict:
    """genai_config.json: type "lfm2" with one "conv" layer after the attention layers, or,
    for a graph without a convolution state, GenAI's plain decoder type "llama"."""
    session = {"log_id": "msar-export", "provider_options": []}
    if library:
        session["custom_ops_library"] = library
    n_attn = cfg.n_blocks
    decoder = {
        "session_options": session,
        "filename": MODEL_FILE,
        "head_size": cfg.head_dim,
        "hidden_size": cfg.d_model,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "num_hidden_layers": n_attn,
        "inputs": {"input_ids": INPUT_IDS, "attention_mask": ATTENTION_MASK, "position_ids": POSITION_IDS,
                   "past_key_names": PAST_KEY.format("%d"), "past_value_names": PAST_VALUE.format("%d")},
        "outputs": {"logits": LOGITS, "present_key_names": PRESENT_KEY.format("%d"),
                    "present_value_names": PRESENT_VALUE.format("%d")},
    }
    if conv:
        decoder.update(num_hidden_layers=n_attn + 1, layer_types=["full_attention"] * n_attn + ["conv"])
        decoder["inputs"]["past_conv_names"] = PAST_CONV
        decoder["outputs"]["present_conv_names"] = PRESENT_CONV
    return {
        "model": {
            "type": "lfm2" if conv else "llama",
            "vocab_size": cfg.vocab_size,
            "context_length": cfg.max_seq_len,
            # GenAI needs an end token inside the vocabulary, and pads rows that ended with the
            # pad token: the same id makes a batch row read as eager's (which repeats EOS).
            "bos_token_id": eos,
            "eos_token_id": [eos],
            "pad_token_id": eos,
            "decoder": decoder,
        },
        "search": {"do_sample": False, "max_length": cfg.max_seq_len, "min_length": 0, "num_beams": 1,
                   "num_return_sequences": 1, "past_present_share_buffer": False, "repetition_penalty": 1.0,
                   "temperature": 1.0, "top_k": 1, "top_p": 1.0, "early_stopping": True, "length_penalty": 1.0},
    }


def byte_tokenizer(vocab_size: int) -> dict:
    """tokenizer.json for a byte-level model: byte b <-> token b (GPT-2's byte-to-unicode
    alphabet, so every byte has a printable symbol), no merges, no normalisation.  A
    vocabulary under 256 holds bytes 0..vocab-1 only; ids from 256 up are special tokens
    <|msar:ID|> (a model with a larger vocabulary ships its own tokenizer.json)."""
    symbols = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    mapping, extra = {}, 0
    for b in range(256):
        if b in symbols:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + extra)
            extra += 1
    vocab = {mapping[b]: b for b in range(min(vocab_size, 256))}
    added = [{"id": i, "content": f"<|msar:{i}|>", "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i in range(256, vocab_size)]
    vocab.update({t["content"]: t["id"] for t in added})
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "vocab": vocab, "merges": []},
    }


def tokenizer_config() -> dict:
    return {"tokenizer_class": "GPT2Tokenizer", "add_bos_token": False, "add_prefix_space": False,
            "model_max_length": 1 << 30, "clean_up_tokenization_spaces": False}


def write_tokenizer(checkpoint: Path, folder: Path, vocab_size: int) -> str:
    """The checkpoint's own tokenizer files when it has tokenizer.json, else the byte tokenizer."""
    if (checkpoint / "tokenizer.json").is_file():
        for name in TOKENIZER_FILES:
            if (checkpoint / name).is_file():
                shutil.copyfile(checkpoint / name, folder / name)
        return "the checkpoint's tokenizer.json"
    (folder / "tokenizer.json").write_text(json.dumps(byte_tokenizer(vocab_size), ensure_ascii=False))
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config()))
    return "byte-level (token i = byte i)"


def write_genai_folder(checkpoint, folder, dtype: str = "float32", opset: int = 18, trust_pickle: bool = False,
                       validate: bool = True, eos_token_id: int | None = None) -> dict:
    """Export CKPT's decode graph into `folder` (new, or one this function wrote) with
    genai_config.json, the tokenizer and the native msar kernels when built.  Returns a summary."""
    from ..export import ExportOptions, export_checkpoint
    from ..fileio import scratch_dir_beside

    folder, checkpoint = Path(folder), Path(checkpoint)
    check_folder(folder)
    if eos_token_id is not None and checkpoint.is_dir():  # before the export, which takes a while
        from ..checkpoint import read_config

        check_eos(eos_token_id, read_config(checkpoint).vocab_size)
    with scratch_dir_beside(folder) as tmp:
        decode = tmp / "decode.onnx"
        report = export_checkpoint(checkpoint, decode, ExportOptions(decode=True, dtype=dtype, opset=opset),
                                   trust_pickle=trust_pickle, validate=validate)
        if report.validation is not None and not report.validation.passed:
            raise InputError(f"the decode graph failed validation ({'; '.join(report.validation.failures)}); "
                             "nothing written")
        staged = tmp / "genai"
        summary = assemble(decode, checkpoint, staged, eos_token_id)
        if folder.exists():
            shutil.rmtree(folder)
        staged.rename(folder)
    return summary


def assemble(decode, checkpoint: Path, staged: Path, eos_token_id: int | None = None) -> dict:
    """The folder's files in `staged` (new), from an exported decode graph of `checkpoint`."""
    import onnx

    from ..graph_file import ExportedGraph
    from ..runners.ort_runner import NATIVE_LIBRARY, native_library

    staged.mkdir()
    graph = ExportedGraph.open(decode, weights=True)
    cfg, model = graph.config, graph.proto
    if not graph.decode:
        raise InputError(f"{decode}: not a decode graph; export it with --decode")
    conv = PAST_CONV in graph.input_names  # standard / attnres residuals have none
    if conv and cfg.kmax == 1:  # stream_kernels [1]: a state of no positions, which GenAI cannot hold
        drop_empty_conv_state(model)
        conv = False
    if conv:
        genai_conv_state(model, cfg)
    onnx.save_model(model, str(staged / MODEL_FILE), save_as_external_data=model.ByteSize() >= 2**31,
                    location=MODEL_FILE + ".data")
    library = native_library()
    if library is not None:
        shutil.copyfile(library, staged / NATIVE_LIBRARY)
    eos = BYTE_EOS if eos_token_id is None else eos_token_id
    check_eos(eos, cfg.vocab_size)
    config = genai_config(cfg, NATIVE_LIBRARY if library is not None else None, eos, conv)
    (staged / "genai_config.json").write_text(json.dumps(config, indent=2) + "\n")
    tokenizer = write_tokenizer(checkpoint, staged, cfg.vocab_size)
    summary = {"checkpoint": checkpoint.name, "dtype": graph.precision, "tokenizer": tokenizer, "eos_token_id": eos,
               "native_kernels": library is not None}
    (staged / MARKER).write_text(json.dumps(summary, indent=2) + "\n")  # GenAI refuses unknown config keys
    return summary


def check_eos(eos: int, vocab_size: int) -> None:
    if not 0 <= eos < vocab_size:
        raise InputError(f"--eos-token-id {eos} is outside the vocabulary [0, {vocab_size})")


def check_folder(folder: Path) -> None:
    """DIR must be new, or a folder this command wrote (it holds MARKER)."""
    from ..errors import OutputError

    if not folder.exists():
        return
    if folder.is_symlink() or not folder.is_dir():
        raise OutputError(f"-o {folder}: exists and is not a folder")
    if not (folder / MARKER).is_file():
        raise OutputError(f"-o {folder}: exists and was not written by `msar-export genai`; give a new folder")
