"""Train small byte-level msar_lm models on Python's standard-library sources.

Every machine with Python has that text, so the default checkpoint is
reproducible anywhere: fixed seed, fixed file list, fixed thread count.
The three residual kinds are trained from the same seed and data order so
their eval losses compare like for like."""

from __future__ import annotations

import json
import math
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .log import silent
from .checkpoint import save_checkpoint
from .config import MSARConfig
from .fileio import atomic_path, atomic_write_text
from .model import MSARLM

DEFAULT_CONFIG = MSARConfig(
    vocab_size=256, d_model=128, n_blocks=4, n_heads=4, n_kv_heads=2, mlp_hidden=352,
    max_seq_len=512, residual="msar", stream_kernels=(1, 4, 8, 12), tie_embeddings=True,
)


@dataclass
class TrainSettings:
    steps: int = 300  # the committed checkpoints/default were trained so
    batch: int = 16
    seq: int = 128
    lr: float = 3e-3
    mixer_lr_mult: float = 5.0  # pseudo-queries start at zero; a larger step lets depth softmaxes sharpen
    weight_decay: float = 0.05
    warmup: int = 30
    eval_every: int = 50
    eval_batches: int = 8
    seed: int = 1234
    threads: int = 2
    corpus_bytes: int = 3_000_000


def stdlib_corpus(max_bytes: int) -> torch.Tensor:
    """Bytes of the standard library's .py files, in sorted path order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    chunks, total = [], 0
    for p in sorted(root.glob("*.py")):
        data = p.read_bytes()
        chunks.append(data)
        total += len(data)
        if total >= max_bytes:
            break
    return torch.frombuffer(bytearray(b"".join(chunks)[:max_bytes]), dtype=torch.uint8).long()


def init_weights(model: MSARLM, generator: torch.Generator) -> None:
    """GPT-style init; pseudo-queries zero (uniform depth average at step 0), gates open."""
    for name, p in model.named_parameters():
        if name.endswith(".query"):
            torch.nn.init.zeros_(p)
        elif name.endswith("gate_scale"):
            torch.nn.init.ones_(p)
        elif name.endswith("gate.bias"):
            torch.nn.init.zeros_(p)
        elif name.endswith("norm.weight"):
            torch.nn.init.ones_(p)
        elif ".conv." in name:
            # Start each conv view near the identity (current-token tap = 1) plus noise.
            with torch.no_grad():
                p.normal_(0.0, 0.1, generator=generator)
                p[:, 0, -1] += 1.0
        else:
            with torch.no_grad():
                p.normal_(0.0, 0.02, generator=generator)


def batches(data: torch.Tensor, batch: int, seq: int, generator: torch.Generator):
    while True:
        starts = torch.randint(0, len(data) - seq - 1, (batch,), generator=generator)
        idx = starts[:, None] + torch.arange(seq + 1)
        chunk = data[idx]
        yield chunk[:, :-1], chunk[:, 1:]


def lr_at(step: int, s: TrainSettings) -> float:
    if step < s.warmup:
        return s.lr * (step + 1) / s.warmup
    progress = (step - s.warmup) / max(1, s.steps - s.warmup)
    return s.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


@torch.no_grad()
def evaluate(model: MSARLM, data: torch.Tensor, s: TrainSettings) -> float:
    gen = torch.Generator().manual_seed(s.seed + 1)
    it = batches(data, s.batch, s.seq, gen)
    losses = []
    for _ in range(s.eval_batches):
        x, y = next(it)
        logits = model(x)
        losses.append(torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten()).item())
    return sum(losses) / len(losses)


def train_one(cfg: MSARConfig, s: TrainSettings, progress=None) -> tuple[MSARLM, dict]:
    torch.set_num_threads(s.threads)
    data = stdlib_corpus(s.corpus_bytes)
    split = int(len(data) * 0.95)
    train_data, val_data = data[:split], data[split:]
    torch.manual_seed(s.seed)
    model = MSARLM(cfg)
    init_weights(model, torch.Generator().manual_seed(s.seed))
    mixer_params = [p for n, p in model.named_parameters() if n.startswith(("mixers.", "sources."))]
    other = [p for n, p in model.named_parameters() if not n.startswith(("mixers.", "sources."))]
    groups = [{"params": other, "lr_mult": 1.0}]
    if mixer_params:
        groups.append({"params": mixer_params, "lr_mult": s.mixer_lr_mult, "weight_decay": 0.0})
    opt = torch.optim.AdamW(groups, lr=s.lr, weight_decay=s.weight_decay, betas=(0.9, 0.95))
    it = batches(train_data, s.batch, s.seq, torch.Generator().manual_seed(s.seed))
    history = {"step": [], "train_loss": [], "eval_step": [], "eval_loss": []}
    t0 = time.perf_counter()
    model.train()
    for step in range(s.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, s) * g["lr_mult"]
        x, y = next(it)
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        history["step"].append(step)
        history["train_loss"].append(loss.item())
        if (step + 1) % s.eval_every == 0 or step == s.steps - 1:
            model.eval()
            history["eval_step"].append(step + 1)
            history["eval_loss"].append(evaluate(model, val_data, s))
            model.train()
        if progress is not None:
            progress(step + 1, loss.item())
    model.eval()
    history["seconds"] = time.perf_counter() - t0
    history["final_eval_loss"] = history["eval_loss"][-1]
    return model, history


def plot_losses(histories: dict[str, dict], out_png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for kind, h in histories.items():
        ax.plot(h["step"], h["train_loss"], alpha=0.35, lw=0.8)
        ax.plot(h["eval_step"], h["eval_loss"], marker="o", ms=3, label=f"{kind} (eval {h['final_eval_loss']:.3f})",
                color=ax.lines[-1].get_color())
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/byte)")
    ax.set_title("byte-level LM on Python stdlib sources")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    with atomic_path(out_png) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)


def train_all(out_dir: Path, kinds=("msar", "standard", "attnres"), cfg: MSARConfig = DEFAULT_CONFIG,
              settings: TrainSettings | None = None, progress=None) -> dict:
    """Train each residual kind identically; write checkpoints, losses JSON and PNG; one line per
    kind to `progress`."""
    from rich.console import Console
    from rich.progress import Progress

    s = settings or TrainSettings()
    progress = progress or silent
    out_dir = Path(out_dir)
    histories = {}
    with Progress(transient=True, console=Console(stderr=True)) as prog:  # a bar on a terminal only
        for kind in kinds:
            task = prog.add_task(f"train {kind}", total=s.steps)
            model, hist = train_one(cfg.replace(residual=kind), s,
                                    lambda n, loss: prog.update(task, completed=n, description=f"train {kind} loss {loss:.3f}"))
            save_checkpoint(model, out_dir / kind, extra_files={"train_history.json": json.dumps(hist) + "\n"})
            histories[kind] = hist
            progress(f"{kind}: eval loss {hist['final_eval_loss']:.4f} after {s.steps} steps in {hist['seconds']:.0f}s -> {out_dir / kind}")
    summary = {"settings": vars(s), "eval_loss": {k: h["final_eval_loss"] for k, h in histories.items()},
               "seconds": {k: round(h["seconds"], 1) for k, h in histories.items()}}
    atomic_write_text(out_dir / "eval_losses.json", json.dumps(summary, indent=2) + "\n")
    plot_losses(histories, out_dir / "loss_curve.png")
    return summary
