"""Byte-pair encoding's building blocks: the pre-split patterns and the small pure functions.

Pair counting and merging (what exercise 2 asks for), the merge loop inside one
chunk, GPT-2's byte-to-character alphabet, and the text and file helpers that
:mod:`servelab.bpe` (the tokenizer), :mod:`servelab.bpe_train` (training) and
:mod:`servelab.bpe_hf` (Hugging Face files) share. It imports none of them;
:mod:`servelab.bpe` re-exports the public names.
"""
from __future__ import annotations

import heapq
import json
from functools import lru_cache
from typing import Iterable, Sequence

import regex

__all__ = ["GPT2_PATTERN", "GPT4_PATTERN", "count_pairs", "merge_pair", "bpe_encode_chunk", "bytes_to_unicode"]

#: GPT-2's pre-split pattern, in the faster but equivalent form tiktoken ships for ``gpt2``/``r50k_base``.
#: Source: https://github.com/openai/tiktoken/blob/main/tiktoken_ext/openai_public.py
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""

#: GPT-4's (``cl100k_base``) pre-split pattern: case-insensitive contractions, at most three
#: digits per chunk, newlines kept apart from other whitespace. Same source as above.
GPT4_PATTERN = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
                r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s""")


def count_pairs(ids: Sequence[int], counts: dict | None = None, weight: int = 1) -> dict:
    """Count adjacent pairs in ``ids`` (adding ``weight`` each) into ``counts``; return it.

    >>> count_pairs([1, 1, 1, 1])
    {(1, 1): 3}
    """
    counts = {} if counts is None else counts
    for pair in zip(ids, ids[1:]):
        counts[pair] = counts.get(pair, 0) + weight
    return counts


def merge_pair(ids: Sequence[int], pair: tuple[int, int], new_id: int) -> list[int]:
    """Replace every non-overlapping occurrence of ``pair`` in ``ids``, left to right, by ``new_id``.

    >>> merge_pair([1, 1, 1, 1, 1], (1, 1), 9)
    [9, 9, 1]
    """
    a, b = pair
    out: list[int] = []
    i, n = 0, len(ids)
    while i < n:
        if i + 1 < n and ids[i] == a and ids[i + 1] == b:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def bpe_encode_chunk(chunk: bytes, ranks: dict[bytes, int]) -> list[bytes]:
    """Split one pre-split chunk into token byte strings with tiktoken's rule.

    Repeatedly merge the adjacent pair whose concatenation has the lowest rank (leftmost
    on ties) until no adjacent pair is in ``ranks``. Returns the parts, not their ids.
    """
    parts = [chunk[i:i + 1] for i in range(len(chunk))]
    if len(parts) > 64:
        return _bpe_long(parts, ranks)
    return _bpe_scan(parts, ranks)


def _bpe_scan(parts: list[bytes], ranks) -> list[bytes]:
    """The plain quadratic scan: fastest for the short chunks real text is made of."""
    get = ranks.get
    while len(parts) > 1:
        best_rank = None
        best_i = -1
        for i in range(len(parts) - 1):
            r = get(parts[i] + parts[i + 1])
            if r is not None and (best_rank is None or r < best_rank):
                best_rank, best_i = r, i
        if best_rank is None:
            break
        parts[best_i:best_i + 2] = [parts[best_i] + parts[best_i + 1]]
    return parts


def _bpe_long(parts: list[bytes], ranks: dict[bytes, int]) -> list[bytes]:
    """The same rule as ``bpe_encode_chunk`` in O(n log n) for long chunks (a heap over a linked list).

    Heap keys are ``(rank, start offset)``: the lowest rank first and, on ties, the leftmost
    pair, exactly as the quadratic scan chooses. Stale entries are skipped when popped.
    """
    n = len(parts)
    nxt = list(range(1, n + 1))
    prv = list(range(-1, n - 1))
    alive = [True] * n
    heap = []
    get = ranks.get
    for i in range(n - 1):
        r = get(parts[i] + parts[i + 1])
        if r is not None:
            heap.append((r, i, parts[i], parts[i + 1]))
    heapq.heapify(heap)
    while heap:
        r, i, left, right = heapq.heappop(heap)
        j = nxt[i] if alive[i] else n
        if not alive[i] or j >= n or parts[i] is not left or parts[j] is not right:
            continue  # stale: one side has changed since this entry was pushed
        merged = left + right
        parts[i] = merged
        alive[j] = False
        nxt[i] = nxt[j]
        if nxt[j] < n:
            prv[nxt[j]] = i
        p = prv[i]
        if p >= 0:
            rp = get(parts[p] + merged)
            if rp is not None:
                heapq.heappush(heap, (rp, p, parts[p], merged))
        q = nxt[i]
        if q < n:
            rq = get(merged + parts[q])
            if rq is not None:
                heapq.heappush(heap, (rq, i, merged, parts[q]))
    return [parts[i] for i in range(n) if alive[i]]


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from the 256 byte values to printable characters.

    Hugging Face byte-level ``tokenizer.json`` files spell every token in these characters
    (a space is ``Ġ``, a newline ``Ċ``). Source: openai/gpt-2 ``encoder.py``.
    """
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def _special_split_regex(specials: Iterable[str]):
    # Longest first, so that a special token that is a prefix of another never wins by accident.
    ordered = sorted(specials, key=lambda s: (-len(s), s))
    return regex.compile("|".join(regex.escape(s) for s in ordered))


def _fix_surrogates(text: str) -> str:
    # tiktoken does the same: lone surrogates cannot be UTF-8, so they become U+FFFD.
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _read_json(path) -> object:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(f"tokenizer file {path} does not exist") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not valid JSON ({exc}); the file is corrupt or not a tokenizer file") from None
