"""A course checkpoint as a Hugging Face model folder, so ``transformers`` and vLLM can read it.

``vllm serve DIR`` needs what ``transformers.AutoTokenizer.from_pretrained(DIR)``
needs: a ``tokenizer.json`` (the fast tokenizer) and a ``tokenizer_config.json``
(its class, special tokens and the chat template). The course checkpoints hold
only ``config.json`` and ``model.safetensors``; :func:`export_model_folder`
writes a folder with both, next to the same weights (linked, not copied), so two
servers read one checkpoint:

    python -m servelab.hf_export data/models/servelab-main   # -> data/hf/servelab-main/

* ``tokenizer.json``: :meth:`servelab.bpe.Tokenizer.to_huggingface` of the
  course tokenizer (byte-level BPE, GPT-4 pre-split, ``ignore_merges``); it
  gives the ids :mod:`servelab.bpe` gives (``tests/test_hf_export.py``).
* ``tokenizer_config.json``: ``PreTrainedTokenizerFast``, ``<|endoftext|>`` as
  end token, and :data:`CHAT_TEMPLATE`, the Jinja form of
  :func:`servelab.bpe.render_chat` (each turn ``<|role|>\\n{content}<|end|>\\n``,
  a prompt ends with ``<|assistant|>\\n``).
* ``generation_config.json``: the end token, so vLLM stops where servelab does.

One difference stays: Hugging Face always reads special-token *text* as the
special token, so a chat message that contains the text ``<|end|>`` becomes the
end-of-turn token under ``transformers``/vLLM. ``servelab.server`` encodes
message content as plain text, so there a user cannot forge a turn.

No torch here: the export is JSON and a file link.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path

from servelab import bpe

__all__ = ["CHAT_TEMPLATE", "DEFAULT_OUT", "tokenizer_config", "generation_config", "export_tokenizer",
           "export_model_folder", "main"]

ROOT = Path(__file__).resolve().parents[2]
#: Where exported folders go (ignored by git: ``data/hf/.gitignore``).
DEFAULT_OUT = ROOT / "data" / "hf"

#: :func:`servelab.bpe.render_chat` as a Jinja chat template (``transformers``,
#: vLLM). Unknown roles raise, as ``render_chat`` does.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] not in ['system', 'user', 'assistant'] -%}"
    "{{ raise_exception(\"role must be 'system', 'user' or 'assistant'\") }}"
    "{%- endif -%}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|assistant|>\n' }}{%- endif -%}"
)


def tokenizer_config(tok: bpe.Tokenizer, model_max_length: int) -> dict:
    """``tokenizer_config.json`` for ``tok``: a fast tokenizer with the course chat template."""
    specials = tok.special_tokens
    eos = "<|endoftext|>"
    if eos not in specials:
        raise ValueError(f"the tokenizer has no {eos} token; it has {sorted(specials)}")
    added = {str(tid): {"content": text, "lstrip": False, "normalized": False, "rstrip": False,
                        "single_word": False, "special": True}
             for text, tid in sorted(specials.items(), key=lambda kv: kv[1])}
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "bos_token": eos, "eos_token": eos, "pad_token": eos, "unk_token": None,
        "add_bos_token": False, "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(model_max_length),
        "chat_template": CHAT_TEMPLATE,
    }


def generation_config(config: dict) -> dict:
    """``generation_config.json``: the checkpoint's begin and end tokens, nothing else (so no
    sampling defaults are imposed on vLLM)."""
    return {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"],
            "_from_model_config": True}


def export_tokenizer(out_dir: str | Path, tok: bpe.Tokenizer | None = None, *,
                     model_max_length: int = 1024) -> Path:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` for ``tok`` (default: the
    course tokenizer) into ``out_dir``; returns ``out_dir``."""
    tok = tok or bpe.load_course_tokenizer()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _write_json(out / "tokenizer.json", tok.to_huggingface(), indent=1)
    _write_json(out / "tokenizer_config.json", tokenizer_config(tok, model_max_length), indent=2)
    return out


def export_model_folder(model_dir: str | Path, out_dir: str | Path | None = None, *,
                        tok: bpe.Tokenizer | None = None, link: bool = True) -> Path:
    """A Hugging Face folder for the checkpoint in ``model_dir``: its ``config.json``, its
    weights (a symbolic link with ``link``, else a copy), the tokenizer files and
    ``generation_config.json``. ``out_dir`` defaults to ``data/hf/<folder name>``.
    Rewriting an existing export is safe (same files)."""
    src = Path(model_dir).resolve()
    cfg_path = src / "config.json"
    if not cfg_path.exists():
        raise FileNotFoundError(f"{src} has no config.json: not a checkpoint folder")
    weights = sorted(src.glob("*.safetensors"))
    if not weights:
        raise FileNotFoundError(f"{src} has no *.safetensors weights")
    out = Path(out_dir) if out_dir is not None else DEFAULT_OUT / src.name
    if out.resolve() == src:
        raise ValueError("export into a folder of its own, not the checkpoint's (it would shadow "
                         "the course tokenizer servelab loads by default)")
    out.mkdir(parents=True, exist_ok=True)
    config = json.loads(cfg_path.read_text())
    _write_json(out / "config.json", config, indent=2)
    for w in weights:
        dst = out / w.name
        if dst.is_symlink() or dst.exists():
            dst.unlink()
        if link:
            os.symlink(os.path.relpath(w, out.resolve()), dst)
        else:
            shutil.copyfile(w, dst)
    if tok is None:  # the tokenizer servelab.LLM would use (servelab.engine.llm.load_tokenizer)
        own = [src / n for n in ("tokenizer.json", "servelab-bpe.json", "tokenizer.servelab.json")]
        tok = next((bpe.Tokenizer.load(f) for f in own if f.exists()), None) or bpe.load_course_tokenizer()
    export_tokenizer(out, tok, model_max_length=config.get("max_position_embeddings", 1024))
    _write_json(out / "generation_config.json", generation_config(config), indent=2)
    return out


def _write_json(path: Path, data: dict, indent: int) -> None:
    path.write_text(json.dumps(data, ensure_ascii=False, indent=indent) + "\n", encoding="utf-8")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m servelab.hf_export", description=__doc__.split("\n\n")[0])
    p.add_argument("model", nargs="+", help="checkpoint folder(s) (config.json + *.safetensors)")
    p.add_argument("--out", default=None, help="output folder (one model only; default data/hf/<name>)")
    p.add_argument("--copy", action="store_true", help="copy the weights instead of linking them")
    a = p.parse_args(argv)
    if a.out and len(a.model) > 1:
        p.error("--out takes one model")
    for m in a.model:
        print(export_model_folder(m, a.out, link=not a.copy))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
