"""Byte-level byte-pair encoding (BPE): train it, load it, encode and decode with it.

A model never sees text, only integers. This module turns text into those integers
the way GPT-2, GPT-4 and Llama 3 do:

1. **Pre-split** the text with a regular expression into chunks (words with their
   leading space, runs of digits, punctuation, whitespace). Merges never cross a
   chunk boundary, so " the" and "the" stay separate and digits never glue to letters.
2. **Bytes**: each chunk becomes its UTF-8 bytes. Every one of the 256 byte values is
   a token, so no input is ever unknown: the worst case is one token per byte.
3. **Merges**: training repeatedly finds the most frequent adjacent pair of tokens
   and makes it a new token. Encoding replays that history: inside a chunk, the pair
   whose merged bytes have the lowest rank (were learned earliest) is merged first,
   leftmost on ties, until no adjacent pair forms a known token.

Encoding follows ``tiktoken``'s rules exactly (rank of the concatenated bytes, a chunk
that is itself a token becomes that token, special tokens raise unless allowed), so
``Tokenizer.from_tiktoken(ranks, pattern).encode(s)`` equals
``tiktoken.Encoding(..., ranks, pattern).encode(s)`` for every string.

Training tie rule (documented, deterministic): the pair with the highest count wins;
among equal counts, the pair with the smallest ``(left_id, right_id)`` wins. Token ids
are assigned in merge order (bytes are 0..255, the first merge is 256, ...), so the
same text, size and pattern always give the same merges.

This module is the runtime tokenizer (encode, decode, its own file format,
tiktoken interchange, the course tokenizer and chat template). The building
blocks live in :mod:`servelab.bpe_blocks`, training in :mod:`servelab.bpe_train`
and Hugging Face ``tokenizer.json`` in and out in :mod:`servelab.bpe_hf`; none of
them imports this module, and their names are importable from here.
"""

from __future__ import annotations

import base64
import json
from collections import Counter
from functools import lru_cache
from pathlib import Path
from typing import Collection, Iterable, Literal, Sequence

import regex

from servelab import bpe_hf
from servelab.bpe_blocks import (  # noqa: F401  (re-exported: the building blocks live there)
    GPT2_PATTERN, GPT4_PATTERN, _bpe_long, _bpe_scan, _fix_surrogates, _read_json, _special_split_regex,
    bpe_encode_chunk, bytes_to_unicode, count_pairs, merge_pair,
)
from servelab.bpe_hf import _hf_pattern, _onig_pattern  # noqa: F401  (re-exported)
from servelab.bpe_train import train_naive, train_ranks  # noqa: F401  (re-exported)

__all__ = [
    "GPT2_PATTERN",
    "GPT4_PATTERN",
    "COURSE_SPECIAL_TOKENS",
    "COURSE_TOKENIZER_PATH",
    "Tokenizer",
    "DisallowedSpecialTokenError",
    "load_course_tokenizer",
    "render_chat",
    "count_pairs",
    "merge_pair",
    "bpe_encode_chunk",
    "train_naive",
    "bytes_to_unicode",
]

#: The course tokenizer's special tokens: ``<|endoftext|>`` separates documents; a chat is
#: ``<|system|>``/``<|user|>``/``<|assistant|>`` turns, each closed by ``<|end|>`` (see ``render_chat``).
COURSE_SPECIAL_TOKENS = ("<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>")
COURSE_VOCAB_SIZE = 4096
COURSE_TOKENIZER_PATH = Path(__file__).resolve().parents[2] / "data" / "tokenizer" / "servelab-bpe-4k.json"

FORMAT_NAME = "servelab-bpe"
FORMAT_VERSION = 1
_CACHE_LIMIT = 200_000  # encode-cache entries before it is cleared


class DisallowedSpecialTokenError(ValueError):
    """Text contains a special token's text, but that special token was not allowed."""


# ---------------------------------------------------------------------------
# The tokenizer
# ---------------------------------------------------------------------------

class Tokenizer:
    """A byte-level BPE tokenizer: mergeable byte strings with ranks, a pre-split pattern, specials.

    Build one with :meth:`train`, :meth:`from_tiktoken`, :meth:`from_huggingface` or :meth:`load`.
    """

    def __init__(self, mergeable_ranks: dict[bytes, int], pattern: str = GPT4_PATTERN,
                 special_tokens: dict[str, int] | None = None, *, merges: Sequence[tuple[int, int]] | None = None,
                 priorities: dict[bytes, int] | None = None, decode_only: dict[int, bytes] | None = None,
                 whole_chunk_lookup: bool = True, name: str = "servelab-bpe"):
        special_tokens = dict(special_tokens or {})
        if not isinstance(mergeable_ranks, dict) or not mergeable_ranks:
            raise ValueError("mergeable_ranks must be a non-empty dict {token bytes: rank}")
        missing = [b for b in range(256) if bytes([b]) not in mergeable_ranks]
        if missing:
            raise ValueError(f"mergeable_ranks lacks {len(missing)} of the 256 single bytes (first: {missing[0]}); "
                             "a byte-level BPE needs every byte as a token so that no text is unknown")
        self._encoder: dict[bytes, int] = {}
        for tok, rank in mergeable_ranks.items():
            if not isinstance(tok, bytes) or not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
                raise ValueError(f"mergeable_ranks entries must be bytes -> non-negative int, got {tok!r}: {rank!r}")
            self._encoder[tok] = rank
        self._decoder: dict[int, bytes] = {rank: tok for tok, rank in self._encoder.items()}
        if len(self._decoder) != len(self._encoder):
            dup = Counter(self._encoder.values()).most_common(1)[0][0]
            raise ValueError(f"two mergeable tokens share id {dup}; every token needs its own id")
        for tid, tok in (decode_only or {}).items():
            if tid in self._decoder:
                raise ValueError(f"decode-only token id {tid} clashes with a mergeable token")
            self._decoder[tid] = tok
        for text, tid in special_tokens.items():
            if not isinstance(text, str) or not text:
                raise ValueError(f"special token names must be non-empty strings, got {text!r}")
            if tid in self._decoder:
                raise ValueError(f"special token {text!r} has id {tid}, which another token already uses")
        self.special_tokens: dict[str, int] = special_tokens
        self._special_decoder = {tid: text.encode("utf-8") for text, tid in special_tokens.items()}
        self._priority = priorities if priorities is not None else self._encoder
        self.pattern = pattern
        try:
            self._regex = regex.compile(pattern)
        except regex.error as exc:
            raise ValueError(f"pre-split pattern does not compile: {exc}") from exc
        self._merges = [tuple(m) for m in merges] if merges is not None else None
        self.whole_chunk_lookup = whole_chunk_lookup
        self.name = name
        self._cache: dict[str, list[int]] = {}
        self._special_regex_cache: dict[frozenset, object] = {}

    # -- sizes and lookups ---------------------------------------------------

    @property
    def n_vocab(self) -> int:
        """One more than the largest id (the size an embedding table needs)."""
        return max(max(self._decoder), max(self.special_tokens.values(), default=-1)) + 1

    def __len__(self) -> int:
        return len(self._decoder) + len(self.special_tokens)

    def __repr__(self) -> str:
        return (f"Tokenizer(name={self.name!r}, n_vocab={self.n_vocab}, mergeable={len(self._encoder)}, "
                f"special={list(self.special_tokens)})")

    @property
    def mergeable_ranks(self) -> dict[bytes, int]:
        """The tiktoken view: token bytes -> id (a copy)."""
        return dict(self._encoder)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one id stands for (a special token's text in UTF-8)."""
        if token_id in self._decoder:
            return self._decoder[token_id]
        if token_id in self._special_decoder:
            return self._special_decoder[token_id]
        raise ValueError(f"token id {token_id} is not in this vocabulary (ids run 0..{self.n_vocab - 1})")

    def token_id(self, token: bytes | str) -> int:
        """The id of a token given as bytes, or as text (special tokens by name)."""
        if isinstance(token, str):
            if token in self.special_tokens:
                return self.special_tokens[token]
            token = token.encode("utf-8")
        if token in self._encoder:
            return self._encoder[token]
        raise ValueError(f"{token!r} is not a single token of this vocabulary")

    @property
    def eot_token(self) -> int | None:
        """The id of ``<|endoftext|>``, or ``None`` when there is no such special token."""
        return self.special_tokens.get("<|endoftext|>")

    @property
    def merges(self) -> list[tuple[int, int]]:
        """Merges as ``(left_id, right_id)`` in rank order; recovered from the ranks when not stored."""
        if self._merges is None:
            self._merges = self._recover_merges()
        return list(self._merges)

    def merge_results(self) -> list[int]:
        """Ids produced by each merge, in order (``merges[i]`` makes ``merge_results()[i]``)."""
        return [self._encoder[self._decoder[a] + self._decoder[b]] for a, b in self.merges]

    def _recover_merges(self) -> list[tuple[int, int]]:
        # Each multi-byte token was made from the two parts BPE produces when only lower
        # ranks are available (the trick tiktoken's educational module uses).
        out = []
        prio = self._priority
        for tok in sorted((t for t in self._encoder if len(t) > 1 and t in prio), key=prio.__getitem__):
            limit = prio[tok]
            parts = bpe_encode_chunk(tok, _RankLimit(prio, limit))
            if len(parts) != 2:
                raise ValueError(f"token {tok!r} (rank {limit}) cannot be built from two lower-ranked tokens; "
                                 "these ranks are not a BPE merge list")
            out.append((self._encoder[parts[0]], self._encoder[parts[1]]))
        return out

    # -- encoding ---------------------------------------------------------------

    def _encode_chunk_bytes(self, piece: bytes) -> list[int]:
        if self.whole_chunk_lookup:
            tid = self._encoder.get(piece)
            if tid is not None:
                return [tid]
        enc = self._encoder
        return [enc[p] for p in bpe_encode_chunk(piece, self._priority)]

    def encode_ordinary(self, text: str) -> list[int]:
        """Encode ``text`` treating any special-token text as plain text (never raises for it)."""
        text = _fix_surrogates(text)
        out: list[int] = []
        extend = out.extend
        cache = self._cache
        get = cache.get
        for chunk in self._regex.findall(text):
            ids = get(chunk)
            if ids is None:
                ids = self._encode_chunk_bytes(chunk.encode("utf-8"))
                if len(cache) >= _CACHE_LIMIT:
                    cache.clear()
                cache[chunk] = ids
            extend(ids)
        return out

    def _special_regex(self, specials: frozenset):
        rx = self._special_regex_cache.get(specials)
        if rx is None:
            rx = self._special_regex_cache[specials] = _special_split_regex(specials)
        return rx

    def encode(self, text: str, *, allowed_special: Literal["all"] | Collection[str] = frozenset(),
               disallowed_special: Literal["all"] | Collection[str] = "all") -> list[int]:
        """Encode ``text`` to ids, with tiktoken's rules for special tokens.

        By default the text of any special token raises :class:`DisallowedSpecialTokenError`
        (a prompt must not smuggle in ``<|endoftext|>``). ``allowed_special="all"`` or a set of
        names encodes those as their single ids; ``disallowed_special=()`` encodes them as text.
        """
        if not isinstance(text, str):
            raise TypeError(f"encode takes a str, got {type(text).__name__}; decode bytes first")
        names = set(self.special_tokens)
        allowed = names if allowed_special == "all" else set(allowed_special)
        unknown = allowed - names
        if unknown:
            raise ValueError(f"allowed_special names {sorted(unknown)} are not special tokens of this tokenizer "
                             f"(it has {sorted(names)})")
        disallowed = names - allowed if disallowed_special == "all" else set(disallowed_special)
        if disallowed:
            m = self._special_regex(frozenset(disallowed)).search(text)
            if m:
                raise DisallowedSpecialTokenError(
                    f"the text contains the special token {m.group()!r} at position {m.start()}, which is not allowed. "
                    f"Pass allowed_special={{{m.group()!r}}} (or 'all') to encode it as a special token, or "
                    f"disallowed_special=() to encode it as ordinary text.")
        if not allowed:
            return self.encode_ordinary(text)
        out: list[int] = []
        start = 0
        for m in self._special_regex(frozenset(allowed)).finditer(text):
            out.extend(self.encode_ordinary(text[start:m.start()]))
            out.append(self.special_tokens[m.group()])
            start = m.end()
        out.extend(self.encode_ordinary(text[start:]))
        return out

    def encode_chunks(self, text: str) -> list[list[int]]:
        """The pre-split chunks of ``text`` with each chunk's ids (for looking inside, not for speed)."""
        return [self._encode_chunk_bytes(c.encode("utf-8")) for c in self._regex.findall(_fix_surrogates(text))]

    def pre_split(self, text: str) -> list[str]:
        """The chunks the pre-split pattern cuts ``text`` into; merges never cross them."""
        return self._regex.findall(text)

    def clear_cache(self) -> None:
        """Forget cached chunk encodings (they are only a speed-up)."""
        self._cache.clear()

    # -- decoding ---------------------------------------------------------------

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """The exact bytes the ids stand for (may end inside a UTF-8 character)."""
        dec, spec = self._decoder, self._special_decoder
        out = []
        for i in ids:
            b = dec.get(i)
            if b is None:
                b = spec.get(i)
                if b is None:
                    raise ValueError(f"token id {i!r} is not in this vocabulary (ids run 0..{self.n_vocab - 1})")
            out.append(b)
        return b"".join(out)

    def decode(self, ids: Iterable[int], errors: str = "replace") -> str:
        """Text for the ids; bytes that do not form valid UTF-8 become U+FFFD (never raises for them)."""
        return self.decode_bytes(ids).decode("utf-8", errors=errors)

    # -- training ------------------------------------------------------------

    @classmethod
    def train(cls, text: str | Iterable[str], vocab_size: int, pattern: str = GPT4_PATTERN,
              special_tokens: Sequence[str] = (), *, progress: bool | None = None,
              name: str = "servelab-bpe") -> "Tokenizer":
        """Learn a byte-level BPE from ``text`` (a string or an iterable of documents).

        ``vocab_size`` counts everything: the 256 bytes, the merges and the special tokens
        (which get the last ids). Special-token text in the input splits it and is never merged.
        Tie rule: highest count, then smallest ``(left_id, right_id)``.
        ``progress=None`` shows a progress bar only for inputs over 2 MB.
        The trainer is :func:`servelab.bpe_train.train_ranks`.
        """
        ranks, specials, merges = train_ranks(text, vocab_size, pattern, special_tokens, progress)
        return cls(ranks, pattern, specials, merges=merges, name=name)

    # -- tiktoken ----------------------------------------------------------------

    @classmethod
    def from_tiktoken(cls, mergeable_ranks: dict[bytes, int], pattern: str,
                      special_tokens: dict[str, int] | None = None, name: str = "from-tiktoken") -> "Tokenizer":
        """Build from tiktoken's pieces (``Encoding._mergeable_ranks``, ``_pat_str``, ``_special_tokens``)."""
        return cls(dict(mergeable_ranks), pattern, dict(special_tokens or {}), name=name)

    def tiktoken_params(self) -> dict:
        """Keyword arguments for ``tiktoken.Encoding(**params)`` that encode exactly like this tokenizer."""
        if self._priority is not self._encoder or not self.whole_chunk_lookup:
            raise ValueError("this tokenizer's merge priorities differ from its ids (it came from a Hugging Face "
                             "file), which tiktoken cannot express; only tokenizers whose rank is the id convert")
        return {"name": self.name, "pat_str": self.pattern, "mergeable_ranks": dict(self._encoder),
                "special_tokens": dict(self.special_tokens)}

    def to_tiktoken(self):
        """A ``tiktoken.Encoding`` with the same ranks, pattern and special tokens."""
        import tiktoken
        return tiktoken.Encoding(**self.tiktoken_params())

    # -- Hugging Face -------------------------------------------------------------

    @classmethod
    def from_huggingface(cls, source: str | Path | dict, name: str | None = None, *,
                         label: str | None = None) -> "Tokenizer":
        """Load a Hugging Face byte-level BPE ``tokenizer.json`` (a path or the parsed dict):
        :func:`servelab.bpe_hf.from_huggingface`."""
        return cls(**bpe_hf.from_huggingface(source, name, label=label))

    def to_huggingface(self) -> dict:
        """A Hugging Face ``tokenizer.json`` (as a dict) that encodes like this tokenizer:
        :func:`servelab.bpe_hf.to_huggingface`."""
        return bpe_hf.to_huggingface(self)

    # -- own file format -------------------------------------------------------

    def to_dict(self) -> dict:
        """This tokenizer in the servelab-bpe format (JSON-ready)."""
        prio = self._priority
        ordered = sorted(self._encoder.items(), key=lambda kv: (prio.get(kv[0], -1), kv[1]))
        data = {
            "format": FORMAT_NAME, "version": FORMAT_VERSION, "name": self.name, "pattern": self.pattern,
            "special_tokens": self.special_tokens,
            "whole_chunk_lookup": self.whole_chunk_lookup,
            "rank_is_id": self._priority is self._encoder,
            # Mergeable tokens in merge-priority order: [id, base64 bytes].
            "tokens": [[tid, base64.b64encode(tok).decode("ascii")] for tok, tid in ordered],
            "decode_only": [[tid, base64.b64encode(tok).decode("ascii")] for tid, tok in sorted(self._decoder.items())
                            if tok not in self._encoder],
        }
        if self._merges is not None:
            data["merges"] = [list(m) for m in self._merges]
        return data

    def save(self, path: str | Path) -> Path:
        """Write the servelab-bpe JSON file (one token per line, diff-friendly)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        data = self.to_dict()
        lines = ["{"]
        head = {k: v for k, v in data.items() if k not in ("tokens", "decode_only", "merges")}
        for k, v in head.items():
            lines.append(f"  {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)},")
        for key in ("tokens", "decode_only", "merges"):
            if key in data:
                body = ",\n    ".join(json.dumps(x) for x in data[key])
                lines.append(f'  "{key}": [\n    {body}\n  ],' if data[key] else f'  "{key}": [],')
        lines[-1] = lines[-1].rstrip(",")
        lines.append("}")
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        return path

    @classmethod
    def from_dict(cls, data: dict, label: str = "<dict>") -> "Tokenizer":
        """Inverse of :meth:`to_dict`; ``label`` names the source in error messages."""
        if not isinstance(data, dict) or data.get("format") != FORMAT_NAME:
            found = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise ValueError(f"{label}: not a servelab-bpe file (format is {found!r}, expected {FORMAT_NAME!r})")
        if data.get("version") != FORMAT_VERSION:
            raise ValueError(f"{label}: servelab-bpe version {data.get('version')!r} is not supported "
                             f"(this library reads version {FORMAT_VERSION})")
        try:
            pattern = data["pattern"]
            specials = {str(k): int(v) for k, v in data.get("special_tokens", {}).items()}
            toks = [(int(tid), base64.b64decode(b64, validate=True)) for tid, b64 in data["tokens"]]
            decode_only = {int(tid): base64.b64decode(b64, validate=True) for tid, b64 in data.get("decode_only", [])}
            merges = [tuple(int(x) for x in m) for m in data["merges"]] if "merges" in data else None
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{label}: corrupt servelab-bpe file ({type(exc).__name__}: {exc})") from exc
        ranks = {tok: tid for tid, tok in toks}
        if len(ranks) != len(toks):
            raise ValueError(f"{label}: corrupt servelab-bpe file (a token appears twice)")
        priorities = None
        if not data.get("rank_is_id", True):
            priorities = {tok: (k if len(tok) > 1 else -1) for k, (_, tok) in enumerate(toks)}
        try:
            return cls(ranks, pattern, specials, merges=merges, priorities=priorities, decode_only=decode_only,
                       whole_chunk_lookup=bool(data.get("whole_chunk_lookup", True)), name=data.get("name", label))
        except ValueError as exc:
            raise ValueError(f"{label}: {exc}") from exc

    @classmethod
    def load(cls, path: str | Path, pattern: str | None = None) -> "Tokenizer":
        """Load a servelab-bpe file, a Hugging Face ``tokenizer.json`` or a ``.tiktoken`` ranks file.

        A ``.tiktoken`` file holds no pattern: pass ``pattern=`` (e.g. ``GPT4_PATTERN``).
        """
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"tokenizer file {path} does not exist")
        raw = path.read_bytes()
        if raw.lstrip()[:1] == b"{":
            data = _read_json(path)
            if isinstance(data, dict) and data.get("format") == FORMAT_NAME:
                return cls.from_dict(data, str(path))
            if isinstance(data, dict) and "model" in data:
                return cls.from_huggingface(data, name=path.stem, label=str(path))
            raise ValueError(f"{path}: JSON, but neither a servelab-bpe file (no \"format\": \"{FORMAT_NAME}\") "
                             "nor a Hugging Face tokenizer.json (no \"model\")")
        ranks = {}
        for lineno, line in enumerate(raw.splitlines(), 1):
            if not line.strip():
                continue
            try:
                tok, rank = line.split()
                ranks[base64.b64decode(tok, validate=True)] = int(rank)
            except (ValueError, TypeError) as exc:
                raise ValueError(f"{path}, line {lineno}: not a servelab-bpe/tokenizer.json file, nor a tiktoken "
                                 f"ranks line '<base64> <rank>' ({exc})") from None
        if pattern is None:
            raise ValueError(f"{path} is a tiktoken ranks file, which stores no pre-split pattern; "
                             "pass pattern=GPT4_PATTERN (or the encoding's pattern)")
        try:
            return cls.from_tiktoken(ranks, pattern, name=path.stem)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from exc


class _RankLimit:
    """A read-only ranks view that hides tokens of rank >= limit (for recovering merges)."""

    __slots__ = ("ranks", "limit")

    def __init__(self, ranks, limit):
        self.ranks, self.limit = ranks, limit

    def get(self, key, default=None):
        r = self.ranks.get(key)
        return r if r is not None and r < self.limit else default





# ---------------------------------------------------------------------------
# The course tokenizer
# ---------------------------------------------------------------------------

@lru_cache(maxsize=1)
def _course_tokenizer(path: str) -> Tokenizer:
    return Tokenizer.load(path)


def load_course_tokenizer(path: str | Path | None = None) -> Tokenizer:
    """The course's own tokenizer: 4,096 ids, GPT-4 split, trained on the course corpus.

    Ids 0..255 are bytes, 256..4090 merges, 4091..4095 the special tokens
    ``<|endoftext|>``, ``<|system|>``, ``<|user|>``, ``<|assistant|>``, ``<|end|>``.
    """
    return _course_tokenizer(str(path or COURSE_TOKENIZER_PATH))


def render_chat(messages: Sequence[dict], add_generation_prompt: bool = True) -> str:
    """Render OpenAI-style ``[{"role": ..., "content": ...}]`` with the course chat template.

    Each turn is ``<|role|>\\n{content}<|end|>\\n``; with ``add_generation_prompt`` the text ends
    with ``<|assistant|>\\n`` so a model continues as the assistant. Encode the result with
    ``allowed_special="all"``.
    """
    out = []
    for k, msg in enumerate(messages):
        role = msg.get("role") if isinstance(msg, dict) else None
        if role not in ("system", "user", "assistant"):
            raise ValueError(f"message {k} has role {role!r}; use 'system', 'user' or 'assistant'")
        content = msg.get("content", "")
        if not isinstance(content, str):
            raise ValueError(f"message {k}: content must be a string")
        out.append(f"<|{role}|>\n{content}<|end|>\n")
    if add_generation_prompt:
        out.append("<|assistant|>\n")
    return "".join(out)


def build_course_tokenizer(out_dir: str | Path | None = None, progress: bool = True) -> Tokenizer:
    """Retrain the course tokenizer on the corpus's training split and write it to ``data/tokenizer/``.

    Writes ``servelab-bpe-4k.json`` (this library's format) and ``tokenizer.json`` (the same
    tokenizer for Hugging Face ``tokenizers``). Training is deterministic: a rebuild gives the
    same files.
    """
    from servelab import corpus

    out_dir = Path(out_dir) if out_dir is not None else COURSE_TOKENIZER_PATH.parent
    text = corpus.load_text("train")
    tok = Tokenizer.train(text, COURSE_VOCAB_SIZE, GPT4_PATTERN, COURSE_SPECIAL_TOKENS, progress=progress,
                          name="servelab-bpe-4k")
    tok.save(out_dir / COURSE_TOKENIZER_PATH.name)
    with open(out_dir / "tokenizer.json", "w", encoding="utf-8") as f:
        json.dump(tok.to_huggingface(), f, ensure_ascii=False, indent=1)
        f.write("\n")
    _course_tokenizer.cache_clear()
    return tok


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["build-course"]:
        print("usage: python -m servelab.bpe build-course   # retrain data/tokenizer/ from the corpus")
        raise SystemExit(2)
    print(build_course_tokenizer())
