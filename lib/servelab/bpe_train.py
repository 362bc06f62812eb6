"""Training a byte-level BPE: the incremental trainer, the textbook one, and the course tokenizer's build.

:func:`train_ranks` is what :meth:`servelab.bpe.Tokenizer.train` runs: pair
counts kept up to date after each merge by touching only the chunks that hold
the merged pair, and a heap with lazy deletion to find the best pair.
:func:`train_naive` recounts every pair after every merge (slow; the tests
check both give the same merges). Tie rule: highest count, then smallest ``(left_id, right_id)``. The runtime
tokenizer lives in :mod:`servelab.bpe`, which re-exports these names.
"""
from __future__ import annotations

import heapq
from collections import Counter, defaultdict
from typing import Iterable, Sequence

import regex

from servelab.bpe_blocks import GPT4_PATTERN, _fix_surrogates, _special_split_regex, count_pairs, merge_pair

__all__ = ["train_ranks", "train_naive"]


def train_ranks(text: str | Iterable[str], vocab_size: int, pattern: str = GPT4_PATTERN,
                special_tokens: Sequence[str] = (), progress: bool | None = None):
    """Learn a byte-level BPE from ``text``: ``(ranks, specials, merges)`` for :class:`servelab.bpe.Tokenizer`.

    ``vocab_size`` counts the 256 bytes, the merges and the special tokens (which get the last ids).
    ``progress=None`` shows a progress bar only for inputs over 2 MB.
    """
    special_tokens = list(dict.fromkeys(special_tokens))
    n_merges = vocab_size - 256 - len(special_tokens)
    if n_merges < 0:
        raise ValueError(f"vocab_size={vocab_size} is too small: it must hold the 256 bytes and "
                         f"{len(special_tokens)} special tokens, so at least {256 + len(special_tokens)}")
    chunk_counts, n_chars = _count_chunks(text, pattern, special_tokens)
    if progress is None:
        progress = n_chars > 2_000_000
    merges, vocab = _train_incremental(chunk_counts, n_merges, progress)
    ranks = {tok: i for i, tok in enumerate(vocab)}
    if len(ranks) != len(vocab):
        raise AssertionError("training produced a duplicate token")  # cannot happen: duplicates reuse ids
    specials = {s: len(vocab) + k for k, s in enumerate(special_tokens)}
    return ranks, specials, merges


def _count_chunks(text, pattern: str, special_tokens: Sequence[str]) -> tuple[Counter, int]:
    """Counts of unique pre-split chunks (as str) over the text or documents; specials split the text."""
    compiled = regex.compile(pattern)
    splitter = _special_split_regex(special_tokens) if special_tokens else None
    docs = [text] if isinstance(text, str) else text
    counts: Counter = Counter()
    n_chars = 0
    for doc in docs:
        if not isinstance(doc, str):
            raise TypeError(f"training text must be str or an iterable of str, got an item of type {type(doc).__name__}")
        n_chars += len(doc)
        segments = splitter.split(doc) if splitter else [doc]
        for seg in segments:
            counts.update(compiled.findall(seg))
    return counts, n_chars


def _token_id(vocab: list[bytes], id_of: dict[bytes, int], merged: bytes) -> tuple[int, bool]:
    """The id of token ``merged``, added at the end of ``vocab`` if new: ``(id, added)``.
    (Two merges can make the same bytes; the second reuses the first's id.)"""
    new_id = id_of.get(merged)
    if new_id is not None:
        return new_id, False
    id_of[merged] = len(vocab)
    vocab.append(merged)
    return id_of[merged], True


def _train_incremental(chunk_counts: Counter, n_merges: int, progress: bool):
    vocab: list[bytes] = [bytes([b]) for b in range(256)]
    id_of: dict[bytes, int] = {tok: i for i, tok in enumerate(vocab)}
    words: list[list[int]] = []
    freqs: list[int] = []
    for chunk, f in chunk_counts.items():
        ids = list(_fix_surrogates(chunk).encode("utf-8"))
        if len(ids) > 1:
            words.append(ids)
            freqs.append(f)
    counts: dict[tuple[int, int], int] = defaultdict(int)
    where: dict[tuple[int, int], set] = defaultdict(set)
    for wi, w in enumerate(words):
        f = freqs[wi]
        for pair in zip(w, w[1:]):
            counts[pair] += f
            where[pair].add(wi)
    heap = [(-c, a, b) for (a, b), c in counts.items()]
    heapq.heapify(heap)
    merges: list[tuple[int, int]] = []
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=n_merges, desc="BPE merges", unit="merge")
    try:
        while len(vocab) - 256 < n_merges and heap:
            negc, a, b = heapq.heappop(heap)
            current = counts.get((a, b), 0)
            if current != -negc:
                if current > 0:
                    heapq.heappush(heap, (-current, a, b))  # stale entry: its count only went down
                continue
            new_id, added = _token_id(vocab, id_of, vocab[a] + vocab[b])
            if added and bar is not None:
                bar.update(1)
            merges.append((a, b))
            touched: set = set()
            for wi in where.pop((a, b), ()):
                w = words[wi]
                nw = merge_pair(w, (a, b), new_id)
                if len(nw) == len(w):
                    continue  # stale index entry: this chunk no longer holds the pair
                f = freqs[wi]
                for pair in zip(w, w[1:]):
                    counts[pair] -= f
                for pair in zip(nw, nw[1:]):
                    counts[pair] += f
                    if pair[0] == new_id or pair[1] == new_id:
                        where[pair].add(wi)
                        touched.add(pair)
                words[wi] = nw
            counts.pop((a, b), None)
            for pair in touched:
                c = counts.get(pair, 0)
                if c > 0:
                    heapq.heappush(heap, (-c, pair[0], pair[1]))
    finally:
        if bar is not None:
            bar.close()
    return merges, vocab


def train_naive(text: str, vocab_size: int, pattern: str = GPT4_PATTERN, special_tokens: Sequence[str] = (),
                max_merges: int | None = None):
    """The textbook trainer that recounts every pair after every merge (slow; for comparison and tests).

    Same tie rule, id assignment and vocabulary accounting as :meth:`Tokenizer.train`, so the
    merges must be identical. Returns the list of merges ``(left_id, right_id)``.
    """
    chunk_counts, _ = _count_chunks(text, pattern, special_tokens)
    words = [list(c.encode("utf-8")) for c in chunk_counts]
    freqs = list(chunk_counts.values())
    vocab = [bytes([b]) for b in range(256)]
    id_of = {tok: i for i, tok in enumerate(vocab)}
    merges = []
    n_merges = vocab_size - 256 - len(set(special_tokens))
    while len(vocab) - 256 < n_merges and (max_merges is None or len(merges) < max_merges):
        counts: dict = {}
        for w, f in zip(words, freqs):
            count_pairs(w, counts, f)
        if not counts:
            break
        (a, b), _ = min(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        new_id, _ = _token_id(vocab, id_of, vocab[a] + vocab[b])
        merges.append((a, b))
        words = [merge_pair(w, (a, b), new_id) for w in words]
    return merges
