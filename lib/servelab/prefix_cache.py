"""Prefix caching: find KV blocks another request already computed.

Many requests open with the same words (a system prompt, a shared document, the
earlier turns of a chat). Their KV blocks are identical, so a request can point
its block table at blocks computed for someone else and skip that prefill.

How a block is named: a block's key is a hash of

* its **parent's key** (so a key names the whole prefix up to this block, not
  only these ``block_size`` tokens: the same words after a different opening
  are a different block, because attention saw a different past),
* its **token ids**, and
* **extra keys**, such as a per-tenant salt, mixed into the first block (and so,
  through the chain, into every later one): tenants with different salts never
  share blocks, which stops one tenant from timing another's cache hits.

Only *full* blocks are cached: a partial block is still being written.
A hit also compares the stored token ids and the stored parent key, so even a
hash collision can never hand a request KV computed for different tokens (the same
tokens after a different past are a different block). The salt is not stored: two
tenants whose salted first-block keys collided, with the same tokens, would share
blocks, so tenant separation still rests on the hash. That check is this library's
choice: vLLM finds a block by its hash alone and relies on the hash (SHA-256
by default in recent versions; earlier ones used Python's ``hash()``, whose
predictable values drew a security advisory) to make collisions vanishingly rare.

This module is pure bookkeeping (dicts, no tensors). The allocator in
:mod:`servelab.paged` owns the blocks; it calls :meth:`PrefixCache.evict` when a
freed block is handed out again, which is the moment its contents die.
"""
from __future__ import annotations

import hashlib
from array import array
from typing import Hashable, Iterable, Sequence

__all__ = ["block_key", "block_keys", "max_cacheable_blocks", "PrefixCache"]

BlockKey = bytes
ROOT_KEY: BlockKey = b""  # the parent of a sequence's first block


def block_key(parent: BlockKey, token_ids: Sequence[int],
              extra_keys: Iterable[Hashable] = ()) -> BlockKey:
    """Key of one full block: hash(parent key, token ids, extra keys).

    SHA-256 (first 16 bytes) rather than Python's ``hash()``: the result must not
    change between processes, or a cache shared by several servers would miss.
    """
    h = hashlib.sha256()
    h.update(parent)
    h.update(array("q", token_ids).tobytes())
    extra = tuple(extra_keys)
    if extra:
        h.update(repr(extra).encode())
    return h.digest()[:16]


def block_keys(token_ids: Sequence[int], block_size: int, *, cache_salt: str | None = None,
               num_blocks: int | None = None, start: int = 0,
               parent: BlockKey = ROOT_KEY) -> list[BlockKey]:
    """Keys of the full blocks of ``token_ids`` (the chain from block ``start``).

    ``cache_salt`` goes into the first block only; the chain carries it on.
    ``parent`` is the key of block ``start - 1`` when extending a chain.
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    full = len(token_ids) // block_size
    if num_blocks is not None:
        full = min(full, num_blocks)
    keys = []
    for i in range(start, full):
        extra = (cache_salt,) if (i == 0 and cache_salt is not None) else ()
        parent = block_key(parent, token_ids[i * block_size:(i + 1) * block_size], extra)
        keys.append(parent)
    return keys


def max_cacheable_blocks(num_prompt_tokens: int, block_size: int) -> int:
    """How many leading blocks a prompt may take from the cache.

    At least one prompt token must still run through the model: the logits that
    choose the first output token come from the last prompt position. So only
    blocks lying wholly inside the first ``n - 1`` tokens count (vLLM's rule too).
    A prompt that is exactly two cached blocks reuses the first and recomputes
    the second.
    """
    return max(num_prompt_tokens - 1, 0) // block_size


class PrefixCache:
    """Map from block key to the physical block that holds it.

    ``lookup`` returns a block only if its stored tokens and parent key match too.
    ``insert`` never replaces an existing entry: if two requests computed the
    same block at once, the first one stays cached and the second stays a
    private block of its owner (replacing would not free anything, but keeping
    one entry per key is simpler to reason about).
    """

    def __init__(self) -> None:
        self._block_of: dict[BlockKey, int] = {}
        self._entry_of: dict[int, tuple[BlockKey, BlockKey, tuple[int, ...]]] = {}
        self.hits = 0      # blocks found, counted once per admission (:meth:`record`)
        self.queries = 0   # blocks asked for, likewise

    def __len__(self) -> int:
        return len(self._block_of)

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._entry_of

    def lookup(self, key: BlockKey, token_ids: Sequence[int], parent: BlockKey = ROOT_KEY) -> int | None:
        """Block holding exactly these tokens after exactly this parent, under this key, or None."""
        block = self._block_of.get(key)
        if block is None:
            return None
        stored_key, stored_parent, stored_tokens = self._entry_of[block]
        if stored_key != key or stored_parent != parent or stored_tokens != tuple(token_ids):
            return None  # a hash collision: never trust the key alone
        return block

    def insert(self, key: BlockKey, token_ids: Sequence[int], block_id: int,
               parent: BlockKey = ROOT_KEY) -> bool:
        """Register a full, computed block (``parent``: the key of the block before it).
        Returns False if the key is taken (a duplicate) or the block is already
        registered under another key."""
        if key in self._block_of or block_id in self._entry_of:
            return False
        self._block_of[key] = block_id
        self._entry_of[block_id] = (key, parent, tuple(token_ids))
        return True

    def evict(self, block_id: int) -> bool:
        """Forget a block (its memory is about to be overwritten)."""
        entry = self._entry_of.pop(block_id, None)
        if entry is None:
            return False
        del self._block_of[entry[0]]
        return True

    def key_of(self, block_id: int) -> BlockKey | None:
        entry = self._entry_of.get(block_id)
        return None if entry is None else entry[0]

    def match(self, token_ids: Sequence[int], block_size: int, *,
              cache_salt: str | None = None,
              keys: Sequence[BlockKey] | None = None) -> list[int]:
        """Longest run of cached leading blocks for a prompt (block ids, in order).

        Stops at the first miss: a block is only valid after its exact past.
        Never returns more than :func:`max_cacheable_blocks`. A lookup is not a
        hit yet (the request may still wait): the scheduler calls :meth:`record`
        once, when the request is admitted.
        """
        limit = max_cacheable_blocks(len(token_ids), block_size)
        if keys is None:
            keys = block_keys(token_ids, block_size, cache_salt=cache_salt, num_blocks=limit)
        found: list[int] = []
        parent = ROOT_KEY
        for i in range(min(limit, len(keys))):
            block = self.lookup(keys[i], token_ids[i * block_size:(i + 1) * block_size], parent)
            if block is None:
                break
            found.append(block)
            parent = keys[i]
        return found

    def record(self, num_queried: int, num_hits: int) -> None:
        """Count one admission's lookup: ``num_queried`` blocks asked for, ``num_hits`` found."""
        self.queries += num_queried
        self.hits += num_hits

    def clear(self) -> None:
        self._block_of.clear()
        self._entry_of.clear()

    def check_invariants(self) -> None:
        """The two maps mirror each other (used by the property tests)."""
        assert len(self._block_of) == len(self._entry_of)
        for key, block in self._block_of.items():
            assert self._entry_of[block][0] == key

    def parent_of(self, block_id: int) -> BlockKey | None:
        entry = self._entry_of.get(block_id)
        return None if entry is None else entry[1]
