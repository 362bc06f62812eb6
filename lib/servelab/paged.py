"""Paged KV cache: a block allocator, block tables, and attention through them.

A contiguous cache reserves each request's *maximum* length when it starts, and
most requests stop far short of it: the reserved-but-never-written slots are
waste (60 to 80 percent in the measurements that motivated vLLM). Paging borrows
the operating system's answer: cut the cache into fixed-size **blocks** of
``block_size`` token slots, hand a request one block at a time as it grows, and
keep a **block table** per request mapping its logical blocks to physical ones.
The only waste left is the unfilled tail of each request's last block.

Pieces, from the bottom up:

* :class:`BlockAllocator` - reference-counted blocks and a free list. The free
  list is ordered least-recently-freed first and supports O(1) removal from the
  middle, because a freed block may still hold a cached prefix (see
  :mod:`servelab.prefix_cache`) that a later request wants back.
* :class:`BlockTable` - one request's list of physical blocks.
* :class:`KVCacheManager` - what the scheduler talks to: can this request get
  room for ``n`` more tokens? Allocate it, free it, fork it, account for waste.
* :func:`write_kv`, :func:`gather_kv`, :func:`paged_attention` - the tensor side:
  store new K/V at their slots, and attend by gathering K/V through block tables.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from servelab.prefix_cache import ROOT_KEY, BlockKey, PrefixCache, block_keys

__all__ = [
    "NoFreeBlocksError", "BlockAllocator", "BlockTable", "KVUsage", "KVCacheManager",
    "blocks_for", "write_kv", "gather_kv", "group_decode_rows", "PagedAttentionMetadata", "paged_attention",
    "reference_attention",
]


class NoFreeBlocksError(RuntimeError):
    """The pool is empty. The scheduler avoids this by asking ``can_allocate`` first."""


def blocks_for(num_tokens: int, block_size: int) -> int:
    """Blocks needed to hold ``num_tokens`` slots."""
    return -(-num_tokens // block_size)


# --------------------------------------------------------------------------- allocator

class BlockAllocator:
    """Reference-counted blocks with an LRU free list.

    * ``ref_count[b] == 0`` means block ``b`` is free (it sits in the free list).
    * ``allocate`` takes the block that was freed longest ago: any cached prefix
      it holds is the least recently used one, so it is the right one to lose.
      ``on_reuse(b)`` is called first so the prefix cache can forget it.
    * ``reclaim`` takes one *particular* free block back (a prefix-cache hit on a
      freed block) in O(1): the free list is an ``OrderedDict``, a hash map
      threaded on a doubly linked list.
    """

    def __init__(self, num_blocks: int, on_reuse: Callable[[int], object] | None = None):
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        self.num_blocks = num_blocks
        self.ref_count = [0] * num_blocks
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.on_reuse = on_reuse

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def is_free(self, block: int) -> bool:
        return block in self._free

    def free_blocks(self) -> list[int]:
        """Free blocks, next-to-be-reused first."""
        return list(self._free)

    def allocate(self) -> int:
        if not self._free:
            raise NoFreeBlocksError("no free KV blocks; free or preempt a sequence first")
        block, _ = self._free.popitem(last=False)
        if self.on_reuse is not None:
            self.on_reuse(block)
        self.ref_count[block] = 1
        return block

    def share(self, block: int) -> None:
        """One more table points at a block in use."""
        if self.ref_count[block] <= 0:
            raise ValueError(f"block {block} is free; reclaim() it instead of share()")
        self.ref_count[block] += 1

    def reclaim(self, block: int) -> None:
        """Point one more table at ``block``, taking it off the free list if needed."""
        if self.ref_count[block] == 0:
            del self._free[block]  # O(1)
        self.ref_count[block] += 1

    def free(self, block: int) -> None:
        """Drop one reference; at zero the block joins the free list's recent end."""
        if self.ref_count[block] <= 0:
            raise ValueError(f"double free of block {block}")
        self.ref_count[block] -= 1
        if self.ref_count[block] == 0:
            self._free[block] = None

    def check_invariants(self) -> None:
        assert all(c >= 0 for c in self.ref_count), "negative reference count"
        zero = {b for b, c in enumerate(self.ref_count) if c == 0}
        assert zero == set(self._free), "free list out of step with reference counts"
        assert self.num_used + self.num_free == self.num_blocks


# --------------------------------------------------------------------------- tables

@dataclass
class BlockTable:
    """One sequence's physical blocks, in logical order.

    * ``num_filled_slots`` - leading slots whose K/V has been written.
    * ``keys`` - the sequence's one chain of prefix-cache keys, one per full
      block of its tokens. Keys depend on the tokens only, so they survive
      :meth:`KVCacheManager.free` (a preempted sequence does not hash again).
    * ``num_registered_blocks`` - leading blocks already in the prefix cache
      (taken from it, or offered to it by :meth:`KVCacheManager.commit`).
    """

    block_size: int
    block_ids: list[int] = field(default_factory=list)
    num_filled_slots: int = 0
    keys: list[BlockKey] = field(default_factory=list)
    num_registered_blocks: int = 0

    @property
    def capacity(self) -> int:
        return len(self.block_ids) * self.block_size

    def slot(self, position: int) -> int:
        """Flat slot index of token ``position`` in the pool (block * size + offset)."""
        block, offset = divmod(position, self.block_size)
        return self.block_ids[block] * self.block_size + offset

    def slots(self, start: int, end: int) -> list[int]:
        bs, ids = self.block_size, self.block_ids
        return [ids[p // bs] * bs + p % bs for p in range(start, end)]

    def extend_keys(self, token_ids: Sequence[int], num_blocks: int,
                    cache_salt: str | None = None) -> list[BlockKey]:
        """Grow :attr:`keys` to cover the first ``num_blocks`` full blocks of
        ``token_ids`` (hashing only the new ones) and return the chain."""
        if len(self.keys) < num_blocks:
            self.keys.extend(block_keys(token_ids, self.block_size, cache_salt=cache_salt,
                                        num_blocks=num_blocks, start=len(self.keys),
                                        parent=self.keys[-1] if self.keys else ROOT_KEY))
        return self.keys


@dataclass(frozen=True)
class KVUsage:
    """Where the pool's slots are.

    ``reserved`` - slots in blocks held by sequences; ``used`` - slots actually
    holding a token's K/V (a shared block counts once). ``waste`` is the share of
    reserved slots that hold nothing: internal fragmentation.
    """

    total_slots: int
    reserved_slots: int
    used_slots: int
    cached_free_blocks: int = 0

    @property
    def waste(self) -> float:
        return 0.0 if self.reserved_slots == 0 else 1 - self.used_slots / self.reserved_slots

    @property
    def utilization(self) -> float:
        return self.used_slots / self.total_slots


class KVCacheManager:
    """The scheduler's view of KV memory: tables, allocation, prefix reuse.

    The manager never touches tensors. It decides which slots a token's K/V goes
    to; the model runner writes them there.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.block_size = block_size
        self.prefix_cache = PrefixCache() if enable_prefix_caching else None
        on_reuse = self.prefix_cache.evict if self.prefix_cache is not None else None
        self.allocator = BlockAllocator(num_blocks, on_reuse=on_reuse)

    # -- sizes ------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return self.allocator.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.allocator.num_free

    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size

    def new_table(self) -> BlockTable:
        return BlockTable(self.block_size)

    # -- prefix reuse -----------------------------------------------------
    def match_prefix(self, token_ids: Sequence[int], cache_salt: str | None = None,
                     keys: Sequence[BlockKey] | None = None) -> list[int]:
        """Cached leading blocks usable by a new sequence (not yet taken).

        ``keys`` are the sequence's block keys if the caller already has them
        (a request waiting in the queue is looked up again every step).
        """
        if self.prefix_cache is None:
            return []
        return self.prefix_cache.match(token_ids, self.block_size, cache_salt=cache_salt, keys=keys)

    # -- allocation -------------------------------------------------------
    def blocks_needed(self, table: BlockTable, num_tokens: int,
                      prefix_blocks: Sequence[int] = ()) -> int:
        """Free-list blocks consumed to give ``table`` room for ``num_tokens`` tokens.

        A prefix hit on a *freed* block consumes a free block too (it leaves the
        free list), a hit on a block in use does not.
        """
        have = len(table.block_ids) + len(prefix_blocks)
        new = max(blocks_for(num_tokens, self.block_size) - have, 0)
        revived = sum(1 for b in prefix_blocks if self.allocator.is_free(b))
        return new + revived

    def can_allocate(self, table: BlockTable, num_tokens: int,
                     prefix_blocks: Sequence[int] = ()) -> bool:
        return self.blocks_needed(table, num_tokens, prefix_blocks) <= self.allocator.num_free

    def allocate(self, table: BlockTable, num_tokens: int,
                 prefix_blocks: Sequence[int] = ()) -> bool:
        """Grow ``table`` to hold ``num_tokens`` tokens; all or nothing.

        ``prefix_blocks`` (from :meth:`match_prefix`) are only accepted for an
        empty table: they become its first blocks and count as computed.
        """
        if not self.can_allocate(table, num_tokens, prefix_blocks):
            return False
        if prefix_blocks:
            if table.block_ids:
                raise ValueError("prefix blocks can only start an empty block table")
            for i, b in enumerate(prefix_blocks):
                self.allocator.reclaim(b)
                if i == len(table.keys):  # a caller that matched without the table's chain
                    table.keys.append(self.prefix_cache.key_of(b))
            table.block_ids.extend(prefix_blocks)
            table.num_filled_slots = len(prefix_blocks) * self.block_size
            table.num_registered_blocks = len(prefix_blocks)
        while table.capacity < num_tokens:
            table.block_ids.append(self.allocator.allocate())
        return True

    def commit(self, table: BlockTable, token_ids: Sequence[int], num_computed: int,
               cache_salt: str | None = None) -> None:
        """Record that the first ``num_computed`` tokens' K/V are written, and
        offer every newly full block to the prefix cache."""
        if num_computed > table.capacity:
            raise ValueError(f"{num_computed} tokens computed but only {table.capacity} slots")
        table.num_filled_slots = num_computed
        if self.prefix_cache is None:
            return
        full = num_computed // self.block_size
        if full <= table.num_registered_blocks:
            return
        keys = table.extend_keys(token_ids, full, cache_salt)
        bs = self.block_size
        for i in range(table.num_registered_blocks, full):
            self.prefix_cache.insert(keys[i], token_ids[i * bs:(i + 1) * bs], table.block_ids[i],
                                     parent=keys[i - 1] if i else ROOT_KEY)
        table.num_registered_blocks = full

    def free(self, table: BlockTable) -> None:
        """Release every block. Tail blocks are freed first, so they are reused
        first: losing the end of a cached chain costs less than losing its head,
        which would make the rest of the chain unreachable."""
        for b in reversed(table.block_ids):
            self.allocator.free(b)
        table.block_ids.clear()
        table.num_filled_slots = 0
        table.num_registered_blocks = 0  # the keys stay: they depend on the tokens only

    def truncate(self, table: BlockTable, num_tokens: int) -> list[int]:
        """Roll ``table`` back to its first ``num_tokens`` tokens (rejected draft tokens).

        Blocks left empty are freed (returned). Blocks past the new last full
        block leave the prefix cache if this table registered them and no one
        else holds them, and their keys are dropped: a rolled-back block is
        never found by a later request.
        """
        if not 0 <= num_tokens <= table.num_filled_slots:
            raise ValueError(f"can only roll back to a length in [0, {table.num_filled_slots}], "
                             f"got {num_tokens}")
        bs = self.block_size
        full = num_tokens // bs
        keep = blocks_for(num_tokens, bs)
        if keep > full and self.allocator.ref_count[table.block_ids[full]] > 1:
            raise ValueError(f"block {table.block_ids[full]} is shared with another sequence; rolling "
                             "back into it would overwrite their K/V (fork or copy it first)")
        if self.prefix_cache is not None:
            for i in range(full, min(table.num_registered_blocks, len(table.block_ids))):
                b = table.block_ids[i]
                if self.allocator.ref_count[b] == 1:
                    self.prefix_cache.evict(b)
        dropped = table.block_ids[keep:]
        for b in reversed(dropped):
            self.allocator.free(b)
        del table.block_ids[keep:]
        del table.keys[full:]
        table.num_registered_blocks = min(table.num_registered_blocks, full)
        table.num_filled_slots = num_tokens
        return dropped

    def fork(self, table: BlockTable) -> tuple[BlockTable, tuple[int, int] | None]:
        """A child sharing the parent's K/V (parallel sampling, beam search).

        Full blocks are shared by reference count. A partial last block would be
        written by both, so the child gets a private copy now; the caller must
        copy K/V from ``src`` to ``dst`` (returned as ``(src, dst)``, or None).
        """
        child = BlockTable(self.block_size, num_filled_slots=table.num_filled_slots, keys=list(table.keys),
                           num_registered_blocks=table.num_registered_blocks)
        full = table.num_filled_slots // self.block_size
        partial = len(table.block_ids) > full and table.num_filled_slots % self.block_size != 0
        if partial and self.allocator.num_free == 0:
            raise NoFreeBlocksError("fork needs one free block for the partial last block")
        shared = table.block_ids[:full]
        for b in shared:
            self.allocator.share(b)
        child.block_ids.extend(shared)
        copy = None
        if partial:
            dst = self.allocator.allocate()
            child.block_ids.append(dst)
            copy = (table.block_ids[full], dst)
        return child, copy

    def reset_prefix_cache(self) -> int:
        """Forget every cached block that no sequence holds (returns how many)."""
        if self.prefix_cache is None:
            return 0
        dropped = [b for b in self.allocator.free_blocks() if b in self.prefix_cache]
        for b in dropped:
            self.prefix_cache.evict(b)
        return len(dropped)

    # -- accounting ---------------------------------------------------------
    def usage(self, tables: Iterable[BlockTable]) -> KVUsage:
        filled: dict[int, int] = {}
        bs = self.block_size
        for t in tables:
            for i, b in enumerate(t.block_ids):
                n = min(max(t.num_filled_slots - i * bs, 0), bs)
                filled[b] = max(filled.get(b, 0), n)
        cached_free = 0
        if self.prefix_cache is not None:
            cached_free = sum(1 for b in self.allocator.free_blocks() if b in self.prefix_cache)
        return KVUsage(total_slots=self.num_blocks * bs,
                       reserved_slots=self.allocator.num_used * bs,
                       used_slots=sum(filled.values()),
                       cached_free_blocks=cached_free)


# --------------------------------------------------------------------------- tensors
# The pool for one layer is a tensor [num_blocks, block_size, kv_heads, head_dim];
# viewed flat it is [num_slots, kv_heads, head_dim] and slot = block * size + offset.

def write_kv(cache, slots, values) -> None:
    """Store ``values`` [T, kv_heads, head_dim] at flat ``slots`` [T] of ``cache``."""
    cache.view(-1, *cache.shape[2:]).index_copy_(0, slots, values.to(cache.dtype))


def gather_kv(cache, block_ids: Sequence[int], context_len: int):
    """One sequence's K (or V) as a contiguous [context_len, kv_heads, head_dim]."""
    import torch
    n = blocks_for(context_len, cache.shape[1])
    idx = torch.as_tensor(list(block_ids[:n]), dtype=torch.long)
    return cache.index_select(0, idx).flatten(0, 1)[:context_len]


def _attend(q, k, v, mask, scale):
    """q [B, H, Q, D], k/v [B, KVH, K, D], bool mask broadcastable to [B, H, Q, K].

    Grouped-query attention is left to SDPA (``enable_gqa``): K/V heads are not copied.
    """
    import torch.nn.functional as F
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale,
                                          enable_gqa=k.shape[1] != q.shape[1])


def group_decode_rows(rows: Sequence[int], context_lens: Sequence[int], block_size: int,
                      max_padding: float = 0.25) -> list[list[int]]:
    """Split decode rows, in order of growing context, into groups gathered together.

    A group's gather is padded to its longest member's blocks; a row opens a new
    group when adding it would pad the group past ``1 + max_padding`` times the
    blocks its members really hold, so one long conversation does not make many
    short ones gather its whole length.
    """
    groups: list[list[int]] = []
    real = 0
    for i in rows:
        nb = blocks_for(context_lens[i], block_size)
        if groups and (len(groups[-1]) + 1) * nb > (1 + max_padding) * (real + nb):
            groups.append([])
            real = 0
        if not groups:
            groups.append([])
        groups[-1].append(i)
        real += nb
    return groups


@dataclass
class PagedAttentionMetadata:
    """Index tensors for one step, built once and used by every layer.

    Decode rows (one query token each) are attended in batches: their block
    tables are padded to a common length and a mask hides the padding. Rows are
    sorted by context length and cut into groups whose padding stays small
    (``max_padding``), so one 1,000-token conversation does not make thirty
    short ones gather 1,000 slots each. Each longer chunk (a prompt, or a piece
    of one) is attended on its own with a causal mask offset by the context
    already cached.
    """

    num_rows: int
    decode_groups: list = field(default_factory=list)  # (rows [B], tables [B, nblk], mask [B,1,1,K])
    chunks: list = field(default_factory=list)         # (row_start, row_end, slots [c], mask [n, c])

    @classmethod
    def build(cls, block_tables: Sequence[Sequence[int]], query_lens: Sequence[int],
              context_lens: Sequence[int], block_size: int,
              max_padding: float = 0.25) -> "PagedAttentionMetadata":
        import torch
        meta = cls(num_rows=sum(query_lens))
        starts = [0]
        for n in query_lens:
            starts.append(starts[-1] + n)
        decode = sorted((i for i, n in enumerate(query_lens) if n == 1), key=lambda i: context_lens[i])
        for group in group_decode_rows(decode, context_lens, block_size, max_padding):
            nblk = blocks_for(context_lens[group[-1]], block_size)  # sorted: the last is longest
            table = torch.zeros(len(group), nblk, dtype=torch.long)
            for row, i in enumerate(group):
                ids = block_tables[i][:blocks_for(context_lens[i], block_size)]
                table[row, :len(ids)] = torch.as_tensor(ids, dtype=torch.long)
            ctx = torch.as_tensor([context_lens[i] for i in group])
            mask = (torch.arange(nblk * block_size) < ctx[:, None])[:, None, None, :]
            meta.decode_groups.append((torch.as_tensor([starts[i] for i in group]), table, mask))
        for i, n in enumerate(query_lens):
            if n == 1:
                continue
            c = context_lens[i]
            ids = torch.as_tensor(list(block_tables[i][:blocks_for(c, block_size)]), dtype=torch.long)
            slots = (ids[:, None] * block_size + torch.arange(block_size)).flatten()[:c]
            mask = torch.arange(c)[None, :] <= torch.arange(c - n, c)[:, None]
            meta.chunks.append((starts[i], starts[i + 1], slots, mask))
        return meta


def paged_attention(q, k_cache, v_cache, block_tables, query_lens: Sequence[int] | None = None,
                    context_lens: Sequence[int] | None = None, scale: float | None = None):
    """Causal attention for a ragged batch whose K/V live in paged pools.

    ``q`` is [T, heads, head_dim]: the new tokens of every sequence, one after
    another (sequence ``i`` contributes ``query_lens[i]`` rows, the last tokens
    of its ``context_lens[i]``-token context, whose K/V are already written).
    Pass either ``block_tables, query_lens, context_lens`` or a prebuilt
    :class:`PagedAttentionMetadata` as ``block_tables``. Returns [T, heads, head_dim].
    """
    import torch
    if isinstance(block_tables, PagedAttentionMetadata):
        meta = block_tables
    else:
        meta = PagedAttentionMetadata.build(block_tables, query_lens, context_lens, k_cache.shape[1])
    T, H, D = q.shape
    if meta.num_rows != T:
        raise ValueError(f"query_lens sum to {meta.num_rows} but q has {T} rows")
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    out = torch.empty_like(q)
    for rows, table, mask in meta.decode_groups:
        # gather whole blocks: [B, nblk, bs, KVH, D] -> [B, KVH, nblk * bs, D]
        shape = (len(rows), -1) + tuple(k_cache.shape[2:])
        k = k_cache.index_select(0, table.flatten()).view(shape).transpose(1, 2)
        v = v_cache.index_select(0, table.flatten()).view(shape).transpose(1, 2)
        qd = q[rows].unsqueeze(2)                                  # [B, H, 1, D]
        out[rows] = _attend(qd, k, v, mask, scale).squeeze(2)
    k_flat = k_cache.flatten(0, 1)
    v_flat = v_cache.flatten(0, 1)
    for start, end, slots, mask in meta.chunks:
        k = k_flat[slots].transpose(0, 1)[None]                    # [1, KVH, c, D]
        v = v_flat[slots].transpose(0, 1)[None]
        qp = q[start:end].transpose(0, 1)[None]                    # [1, H, n, D]
        out[start:end] = _attend(qp, k, v, mask, scale)[0].transpose(0, 1)
    return out


def reference_attention(q, k, v, scale: float | None = None):
    """Plain causal attention over contiguous q [n, H, D], k/v [n, KVH, D] (for tests)."""
    import torch
    n, H, D = q.shape
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    mask = torch.ones(n, n, dtype=torch.bool).tril()
    return _attend(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                   v.transpose(0, 1)[None], mask, scale)[0].transpose(0, 1)
