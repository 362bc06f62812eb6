"""Hugging Face ``tokenizer.json`` in and out, for :class:`servelab.bpe.Tokenizer`.

:func:`from_huggingface` reads a byte-level BPE ``tokenizer.json`` (GPT-2's
``ByteLevel`` split or a ``Split`` regex, byte-level vocab and merges);
:func:`to_huggingface` writes one that encodes like the course tokenizer
(``ignore_merges=True``, as tiktoken). :meth:`servelab.bpe.Tokenizer.from_huggingface`,
``to_huggingface`` and ``load`` call these; this module never imports the tokenizer
(:func:`from_huggingface` returns its constructor's arguments).
"""
from __future__ import annotations

from pathlib import Path

import regex

from servelab.bpe_blocks import GPT2_PATTERN, _read_json, bytes_to_unicode

__all__ = ["from_huggingface", "to_huggingface"]


def from_huggingface(source: str | Path | dict, name: str | None = None, *, label: str | None = None) -> dict:
    """Load a Hugging Face byte-level BPE ``tokenizer.json`` (a path or the parsed dict).

    Supported: ``model.type == "BPE"`` with byte-level vocab and merges, a ``ByteLevel``
    pre-tokenizer (GPT-2 split) or a ``Split`` regex followed by ``ByteLevel``, no
    normalizer. Added tokens marked ``special`` become special tokens. Merge priority is
    the merge's position in the list, as in Hugging Face.
    """
    label = label or (str(source) if not isinstance(source, dict) else "<dict>")
    data = _read_json(source) if not isinstance(source, dict) else source
    model = data.get("model") if isinstance(data, dict) else None
    if not isinstance(model, dict) or model.get("type", "BPE") != "BPE" or "vocab" not in model:
        raise ValueError(f"{label}: not a Hugging Face BPE tokenizer.json (no model of type 'BPE' with a vocab)")
    if data.get("normalizer"):
        raise ValueError(f"{label}: has a normalizer ({data['normalizer'].get('type')}); only byte-level BPE "
                         "without normalization is supported")
    pattern = _hf_pattern(data.get("pre_tokenizer"), label)
    byte_of = {ch: b for b, ch in bytes_to_unicode().items()}

    def to_bytes(tok: str) -> bytes:
        try:
            return bytes(byte_of[ch] for ch in tok)
        except KeyError as exc:
            raise ValueError(f"{label}: token {tok!r} uses character {exc.args[0]!r}, which is not in the "
                             "GPT-2 byte alphabet; this is not a byte-level BPE") from None

    vocab = {to_bytes(tok): int(tid) for tok, tid in model["vocab"].items()}
    priorities: dict[bytes, int] = {}
    merges = []
    for k, m in enumerate(model.get("merges", [])):
        left, right = m.split(" ") if isinstance(m, str) else m
        lb, rb = to_bytes(left), to_bytes(right)
        if lb not in vocab or rb not in vocab or lb + rb not in vocab:
            raise ValueError(f"{label}: merge {k} ({left!r} + {right!r}) uses or makes a token missing from the vocab")
        priorities.setdefault(lb + rb, k)
        merges.append((vocab[lb], vocab[rb]))
    mergeable = {tok: tid for tok, tid in vocab.items() if len(tok) == 1 or tok in priorities}
    decode_only = {tid: tok for tok, tid in vocab.items() if tok not in mergeable}
    for b in range(256):
        priorities.setdefault(bytes([b]), -1)
    specials = {}
    for added in data.get("added_tokens", []):
        if added.get("special"):
            specials[added["content"]] = int(added["id"])
            decode_only.pop(int(added["id"]), None)
    ignore_merges = bool(model.get("ignore_merges", False))
    return {"mergeable_ranks": mergeable, "pattern": pattern, "special_tokens": specials, "merges": merges,
            "priorities": priorities, "decode_only": decode_only, "whole_chunk_lookup": ignore_merges,
            "name": name or Path(label).stem}


def to_huggingface(tok) -> dict:
    """A Hugging Face ``tokenizer.json`` (as a dict) that encodes like this tokenizer.

    Uses a ``Split`` pre-tokenizer with this pattern, byte-level vocab and merges, and
    ``ignore_merges=True`` (a chunk that is itself a token stays whole, as in tiktoken).
    """
    u = bytes_to_unicode()

    def s(tok: bytes) -> str:
        return "".join(u[b] for b in tok)

    vocab = {s(tok): tid for tok, tid in sorted(tok._encoder.items(), key=lambda kv: kv[1])}
    merges = [[s(tok._decoder[a]), s(tok._decoder[b])] for a, b in tok.merges]
    added = [{"id": tid, "content": text, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for text, tid in sorted(tok.special_tokens.items(),
                                                                             key=lambda kv: kv[1])]
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": _onig_pattern(tok.pattern)}, "behavior": "Isolated",
             "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": True, "vocab": vocab, "merges": merges},
    }


def _onig_pattern(pattern: str) -> str:
    """Rewrite a pattern for Hugging Face's regex engine (Oniguruma).

    Oniguruma reads ``{1,3}+`` as "one to three, repeated", not as a possessive ``{1,3}``;
    a bounded repeat at the end of an alternative never backtracks anyway, so the ``+``
    is dropped. (This is why Llama 3's ``tokenizer.json`` writes ``\\p{N}{1,3}``.)
    """
    return regex.sub(r"(\{\d+(?:,\d*)?\})\+", r"\1", pattern)


def _hf_pattern(pre, label: str) -> str:
    if pre is None:
        raise ValueError(f"{label}: no pre_tokenizer; expected ByteLevel or Split+ByteLevel")
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    pattern = None
    for step in steps:
        kind = step.get("type")
        if kind == "Split":
            pat = step.get("pattern", {})
            if "Regex" not in pat or step.get("behavior") != "Isolated" or step.get("invert"):
                raise ValueError(f"{label}: Split pre-tokenizer must be an isolated, non-inverted regex")
            pattern = pat["Regex"]
        elif kind == "ByteLevel":
            if step.get("add_prefix_space"):
                raise ValueError(f"{label}: ByteLevel add_prefix_space=true is not supported")
            if step.get("use_regex", True):
                if pattern is not None:
                    raise ValueError(f"{label}: both a Split regex and ByteLevel use_regex; unsupported")
                pattern = GPT2_PATTERN
        else:
            raise ValueError(f"{label}: pre-tokenizer {kind!r} is not supported (only Split and ByteLevel)")
    if pattern is None:
        raise ValueError(f"{label}: pre_tokenizer has no regex split")
    return pattern
