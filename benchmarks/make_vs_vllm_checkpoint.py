"""A larger checkpoint of the course architecture, random weights, for ``bench_vs_vllm.py``.

    .venv/bin/python benchmarks/make_vs_vllm_checkpoint.py      # -> data/hf/servelab-large/ (~10 s)

The course models are small enough that a decode step is mostly per-step
overhead (Python, dispatch, scheduling). This one is the same Llama shape
(grouped-query attention, RoPE, SwiGLU, tied embeddings, the course's 4,096-id
tokenizer) at about 100M parameters and a 2,048-token context, so the matrix
products and attention weigh more than the overhead. Its weights are random
(``init_weights(seed=0)``, stored in bf16 as the course models are): speed
does not depend on what the weights know, and greedy tokens still agree
between engines. The folder is a Hugging Face one (:mod:`servelab.hf_export`:
tokenizer files included), under ``data/hf/`` which git ignores; rerunning
rewrites the same files.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "data" / "hf" / "servelab-large"
MAIN = ROOT / "data" / "models" / "servelab-main"
SHAPE = dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=16, num_attention_heads=12,
             num_key_value_heads=4, head_dim=64, max_position_embeddings=2048)


def build(out: Path = OUT, seed: int = 0) -> Path:
    import torch

    from servelab import hf_export
    from servelab.checkpoint import load_config, save_pretrained
    from servelab.model import LlamaModel

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((MAIN / "config.json").read_text())
    cfg.update(SHAPE)
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    torch.manual_seed(seed)
    model = LlamaModel(load_config(out)).init_weights(seed=seed).to(torch.bfloat16)
    save_pretrained(model, out)
    (out / "config.json").write_text(json.dumps(json.loads((out / "config.json").read_text()), indent=2) + "\n")
    hf_export.export_tokenizer(out, model_max_length=SHAPE["max_position_embeddings"])
    (out / "generation_config.json").write_text(json.dumps(hf_export.generation_config(cfg), indent=2) + "\n")
    return out


def parameters(folder: Path = OUT) -> int:
    from servelab import arith
    from servelab.checkpoint import load_config
    return arith.count_params(load_config(folder)).total


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=OUT)
    a = p.parse_args(argv)
    folder = build(a.out)
    print(f"{folder}: {parameters(folder):,} parameters")
    return 0


if __name__ == "__main__":
    sys.exit(main())
