"""Train the course's two tiny models on the course corpus, reproducibly, on a laptop CPU.

    python -m servelab.train --preset main     # ~6M parameters, the model the chapters run
    python -m servelab.train --preset draft    # ~1M parameters, the draft for speculative decoding

Each run tokenizes the corpus with the course tokenizer, trains a
:class:`servelab.model.LlamaModel` with AdamW (warm-up then cosine decay), logs
training and validation loss, and writes a Hugging Face-format folder
(``config.json`` + ``model.safetensors``) that :func:`servelab.model.load_pretrained`
and ``transformers`` both read, plus ``train_log.json`` / ``loss.csv`` /
``loss.png``. Matmuls run in bf16 autocast (AMX makes it several times faster
than fp32 on recent Xeons; elsewhere it is merely correct); weights and optimizer
state stay fp32 and are stored as bf16, the way public checkpoints ship.

Why so small: the models exist to make the serving ideas concrete (real logits,
real KV caches, a real draft/target pair), not to be good. Trained on ~3M
tokens of CPython source and docs, they produce recognisably Python-shaped text.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import time
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F

from servelab.machine import describe
from servelab.model import LlamaConfig, LlamaModel, load_pretrained, save_pretrained

REPO_ROOT = Path(__file__).resolve().parents[2]
MODELS_DIR = REPO_ROOT / "data" / "models"
EOT_TOKEN = "<|endoftext|>"


@dataclass(frozen=True)
class TrainPreset:
    """Everything that decides a run: the architecture and the optimisation recipe."""

    name: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    seq_len: int = 256
    batch_size: int = 8
    steps: int = 700
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 50
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    eval_every: int = 100
    eval_batches: int = 4
    seed: int = 0
    tie_word_embeddings: bool = True
    rope_theta: float = 10000.0

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.batch_size


PRESETS = {
    # d=256, 6 layers, GQA 8 query heads / 4 KV heads of 32 dims: ~5.8M parameters.
    "main": TrainPreset("servelab-main", hidden_size=256, intermediate_size=768, num_hidden_layers=6,
                        num_attention_heads=8, num_key_value_heads=4, steps=2000),
    # d=128, 4 layers, 4 query heads / 2 KV heads: ~1.2M parameters, same tokenizer.
    "draft": TrainPreset("servelab-draft", hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, lr=4e-3),
}


def model_config(preset: TrainPreset, tokenizer) -> LlamaConfig:
    eot = tokenizer.token_id(EOT_TOKEN)
    return LlamaConfig(
        vocab_size=tokenizer.n_vocab, hidden_size=preset.hidden_size,
        intermediate_size=preset.intermediate_size, num_hidden_layers=preset.num_hidden_layers,
        num_attention_heads=preset.num_attention_heads, num_key_value_heads=preset.num_key_value_heads,
        max_position_embeddings=preset.seq_len * 4, rms_norm_eps=1e-5, rope_theta=preset.rope_theta,
        tie_word_embeddings=preset.tie_word_embeddings, bos_token_id=eot, eos_token_id=eot,
    )


def tokenizer_sha256() -> str:
    """Fingerprint of the tokenizer file the model was trained with (ids must not drift)."""
    import hashlib

    from servelab.bpe import COURSE_TOKENIZER_PATH

    return hashlib.sha256(Path(COURSE_TOKENIZER_PATH).read_bytes()).hexdigest()


def encode_corpus(split: str) -> torch.Tensor:
    """The corpus split as one long tensor of token ids (documents joined by <|endoftext|>).

    Uses the Hugging Face ``tokenizers`` copy of the course tokenizer when it is
    installed (same ids, about 100x faster), the pure-Python one otherwise.
    """
    from servelab import corpus

    text = corpus.load_text(split)
    try:
        import tokenizers

        tok = tokenizers.Tokenizer.from_file(str(REPO_ROOT / "data" / "tokenizer" / "tokenizer.json"))
        ids = tok.encode(text).ids
    except ImportError:  # pragma: no cover - the slow, dependency-free path
        from servelab.bpe import load_course_tokenizer

        ids = load_course_tokenizer().encode(text, allowed_special="all")
    return torch.tensor(ids, dtype=torch.int32)


def random_batch(tokens: torch.Tensor, batch_size: int, seq_len: int, gen: torch.Generator):
    """Random windows of ``seq_len + 1`` tokens: inputs and the same shifted by one."""
    starts = torch.randint(0, len(tokens) - seq_len - 1, (batch_size,), generator=gen)
    rows = torch.stack([tokens[s:s + seq_len + 1] for s in starts.tolist()]).long()
    return rows[:, :-1], rows[:, 1:]


def lr_at(step: int, p: TrainPreset) -> float:
    """Linear warm-up, then cosine decay to ``min_lr_ratio * lr``."""
    if step < p.warmup_steps:
        return p.lr * (step + 1) / p.warmup_steps
    progress = (step - p.warmup_steps) / max(1, p.steps - p.warmup_steps)
    return p.lr * (p.min_lr_ratio + (1 - p.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def loss_on(model: LlamaModel, x: torch.Tensor, y: torch.Tensor, autocast: bool = True) -> torch.Tensor:
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logits = model(x)
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))


@torch.no_grad()
def evaluate(model: LlamaModel, tokens: torch.Tensor, seq_len: int, max_windows: int | None = None,
             batch_size: int = 16, autocast: bool = False) -> float:
    """Mean next-token loss (nats) over consecutive, non-overlapping windows of a split."""
    model.eval()
    n = (len(tokens) - 1) // seq_len
    if max_windows is not None:
        n = min(n, max_windows)
    total, count = 0.0, 0
    for start in range(0, n, batch_size):
        idx = range(start, min(n, start + batch_size))
        rows = torch.stack([tokens[i * seq_len:i * seq_len + seq_len + 1] for i in idx]).long()
        loss = loss_on(model, rows[:, :-1], rows[:, 1:], autocast=autocast)
        total += loss.item() * len(idx)
        count += len(idx)
    model.train()
    return total / count


def _plot(rows: list[dict], path: Path, title: str, final_val: float | None = None,
          probe_tokens: int | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([r["step"] for r in rows], [r["train_loss"] for r in rows], lw=1, label="train (batch)")
    ev = [r for r in rows if r.get("val_loss") is not None]
    probe = f"validation probe ({probe_tokens:,} tokens)" if probe_tokens else "validation probe"
    ax.plot([r["step"] for r in ev], [r["val_loss"] for r in ev], "o-", ms=3, label=probe)
    if final_val is not None:
        ax.plot([rows[-1]["step"]], [final_val], "*", ms=10, color="black", label="whole validation split (saved weights)")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def train(preset: TrainPreset, out: Path | None = None, threads: int = 1, log=None) -> dict:
    """Run one preset end to end and write the checkpoint folder; returns the summary."""
    log = log or (lambda msg: print(msg, flush=True))
    from servelab.bpe import load_course_tokenizer

    torch.set_num_threads(threads)
    torch.manual_seed(preset.seed)
    out = Path(out) if out is not None else MODELS_DIR / preset.name
    tokenizer = load_course_tokenizer()
    config = model_config(preset, tokenizer)
    t0 = time.perf_counter()
    train_tokens, val_tokens = encode_corpus("train"), encode_corpus("val")
    log(f"{preset.name}: {len(train_tokens):,} train tokens, {len(val_tokens):,} val tokens "
        f"({time.perf_counter() - t0:.1f} s to tokenize)")

    model = LlamaModel(config).init_weights(std=0.02, seed=preset.seed).train()
    n_params = model.num_parameters()
    log(f"{preset.name}: {n_params:,} parameters, {preset.steps} steps x {preset.tokens_per_step:,} tokens")
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": preset.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=preset.lr, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(preset.seed)
    rows: list[dict] = []
    start, cpu_start = time.perf_counter(), time.process_time()
    for step in range(preset.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, preset)
        x, y = random_batch(train_tokens, preset.batch_size, preset.seq_len, gen)
        loss = loss_on(model, x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), preset.grad_clip)
        opt.step()
        row = {"step": step + 1, "train_loss": round(loss.item(), 4), "lr": round(lr_at(step, preset), 6),
               "elapsed_s": round(time.perf_counter() - start, 1), "val_loss": None}
        if (step + 1) % preset.eval_every == 0 or step + 1 == preset.steps:
            # A quick probe on the first windows of the validation split (its first documents are
            # prose-heavy, so it reads high); the whole split is scored once at the end.
            row["val_loss"] = round(evaluate(model, val_tokens, preset.seq_len, preset.eval_batches * 16,
                                             autocast=True), 4)
            log(f"step {step + 1:5d}  train {row['train_loss']:.3f}  val {row['val_loss']:.3f}  "
                f"lr {row['lr']:.2e}  {row['elapsed_s']:.0f} s")
        rows.append(row)
    train_seconds = time.perf_counter() - start
    train_cpu_seconds = time.process_time() - cpu_start

    model.eval()
    save_pretrained(model.to(torch.bfloat16), out)
    # Score what was saved: the bf16 weights, loaded back in fp32, on the whole validation split.
    reloaded = load_pretrained(out, dtype=torch.float32)
    val_loss = evaluate(reloaded, val_tokens, preset.seq_len)
    summary = {
        "preset": asdict(preset), "parameters": n_params, "train_tokens_seen": preset.steps * preset.tokens_per_step,
        "corpus_train_tokens": len(train_tokens), "corpus_val_tokens": len(val_tokens),
        "final_val_loss": round(val_loss, 4), "final_val_perplexity": round(math.exp(val_loss), 2),
        "train_seconds": round(train_seconds, 1), "train_cpu_seconds": round(train_cpu_seconds, 1),
        "tokens_per_second": round(preset.steps * preset.tokens_per_step
                                                                             / train_seconds),
        "machine": describe(("torch",)), "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
        "command": f"python -m servelab.train --preset {preset.name.removeprefix('servelab-')}",
        "tokenizer_sha256": tokenizer_sha256(),
    }
    (out / "train_log.json").write_text(json.dumps({"summary": summary, "log": rows}, indent=1) + "\n")
    with open(out / "loss.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    _plot(rows, out / "loss.png", f"{preset.name}: {n_params / 1e6:.1f}M parameters", val_loss,
          preset.eval_batches * 16 * preset.seq_len)
    log(f"{preset.name}: validation loss {val_loss:.3f} nats/token (perplexity {math.exp(val_loss):.1f}), "
        f"{train_seconds / 60:.1f} min, saved to {out}")
    return summary


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), required=True)
    parser.add_argument("--out", type=Path, default=None, help="folder to write (default data/models/<name>)")
    parser.add_argument("--steps", type=int, default=None, help="override the preset's step count")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1 is steadiest on small shared VMs; see TOOLCHAIN notes)")
    args = parser.parse_args(argv)
    preset = PRESETS[args.preset]
    if args.steps is not None:
        preset = replace(preset, steps=args.steps, eval_every=min(preset.eval_every, args.steps))
    train(preset, args.out, threads=args.threads)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
