"""Tests for servelab.paged: allocator, block tables, manager, paged attention."""
import random

import pytest
import torch
from hypothesis import given, settings, strategies as st

from servelab.paged import (BlockAllocator, BlockTable, KVCacheManager, NoFreeBlocksError,
                            blocks_for, gather_kv, paged_attention, reference_attention,
                            write_kv)
from servelab.prefix_cache import max_cacheable_blocks


# --------------------------------------------------------------------------- allocator

def test_allocator_hands_out_least_recently_freed_first():
    a = BlockAllocator(4)
    blocks = [a.allocate() for _ in range(4)]
    assert blocks == [0, 1, 2, 3]
    with pytest.raises(NoFreeBlocksError):
        a.allocate()
    a.free(2)
    a.free(0)
    assert a.free_blocks() == [2, 0]
    assert a.allocate() == 2


def test_reclaim_removes_from_the_middle_of_the_free_list():
    a = BlockAllocator(3)
    for b in [a.allocate() for _ in range(3)]:
        a.free(b)
    a.reclaim(1)
    assert a.free_blocks() == [0, 2] and a.ref_count[1] == 1
    a.check_invariants()


def test_double_free_and_bad_share_raise():
    a = BlockAllocator(2)
    b = a.allocate()
    a.free(b)
    with pytest.raises(ValueError, match="double free"):
        a.free(b)
    with pytest.raises(ValueError, match="reclaim"):
        a.share(b)


def test_on_reuse_is_called_when_a_freed_block_is_handed_out_again():
    seen = []
    a = BlockAllocator(1, on_reuse=seen.append)
    a.free(a.allocate())
    a.allocate()
    assert seen == [0, 0]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("afsr"), st.integers(0, 7)), max_size=60))
def test_allocator_invariants_under_any_operations(ops):
    a = BlockAllocator(8)
    refs = [0] * 8
    for op, b in ops:
        if op == "a":
            if a.num_free:
                refs[a.allocate()] += 1
            else:
                with pytest.raises(NoFreeBlocksError):
                    a.allocate()
        elif op == "f":
            if refs[b]:
                a.free(b)
                refs[b] -= 1
            else:
                with pytest.raises(ValueError):
                    a.free(b)
        elif op == "s" and refs[b]:
            a.share(b)
            refs[b] += 1
        elif op == "r":
            a.reclaim(b)
            refs[b] += 1
        a.check_invariants()
        assert a.ref_count == refs


# --------------------------------------------------------------------------- tables

def test_block_table_slots():
    t = BlockTable(4, block_ids=[7, 2])
    assert t.slot(0) == 28 and t.slot(5) == 9
    assert t.slots(2, 6) == [30, 31, 8, 9]
    assert t.capacity == 8
    assert blocks_for(9, 4) == 3 and blocks_for(8, 4) == 2 and blocks_for(0, 4) == 0


# --------------------------------------------------------------------------- manager

class PoolModel:
    """Manager plus a fake pool that stores token ids in slots, to check content."""

    def __init__(self, num_blocks, block_size, prefix):
        self.m = KVCacheManager(num_blocks, block_size, enable_prefix_caching=prefix)
        self.pool = [None] * (num_blocks * block_size)
        self.seqs = {}  # id -> (table, tokens)
        self.next_id = 0

    def add(self, tokens):
        m = self.m
        t = m.new_table()
        hit = m.match_prefix(tokens)
        assert len(hit) <= max_cacheable_blocks(len(tokens), m.block_size)
        assert len(hit) * m.block_size < len(tokens)  # at least one token computed
        if not m.allocate(t, len(tokens), hit):
            return False
        start = t.num_filled_slots
        assert start == len(hit) * m.block_size
        # the hit blocks must already hold exactly these tokens
        assert [self.pool[s] for s in t.slots(0, start)] == tokens[:start]
        for pos, s in zip(range(start, len(tokens)), t.slots(start, len(tokens))):
            self.pool[s] = tokens[pos]
        m.commit(t, tokens, len(tokens))
        self.seqs[self.next_id] = (t, list(tokens))
        self.next_id += 1
        return True

    def append(self, sid, new):
        t, tokens = self.seqs[sid]
        m = self.m
        if not m.allocate(t, len(tokens) + len(new)):
            return False
        for pos, s in zip(range(len(tokens), len(tokens) + len(new)),
                          t.slots(len(tokens), len(tokens) + len(new))):
            self.pool[s] = new[pos - len(tokens)]
        tokens.extend(new)
        m.commit(t, tokens, len(tokens))
        return True

    def fork(self, sid):
        t, tokens = self.seqs[sid]
        try:
            child, copy = self.m.fork(t)
        except NoFreeBlocksError:
            return False
        if copy:
            src, dst = copy
            bs = self.m.block_size
            self.pool[dst * bs:(dst + 1) * bs] = self.pool[src * bs:(src + 1) * bs]
        self.seqs[self.next_id] = (child, list(tokens))
        self.next_id += 1
        return True

    def free(self, sid):
        t, _ = self.seqs.pop(sid)
        self.m.free(t)

    def truncate(self, sid, n):
        """Roll back ``n`` tokens (rejected draft tokens), as speculative decoding will."""
        t, tokens = self.seqs[sid]
        new_len = max(len(tokens) - n, 0)
        try:
            self.m.truncate(t, new_len)
        except ValueError as exc:  # rolling back into a block another table shares
            assert "shared" in str(exc)
            return
        del tokens[new_len:]
        assert len(t.block_ids) == -(-new_len // self.m.block_size) and len(t.keys) <= new_len // self.m.block_size

    def check(self):
        m = self.m
        m.allocator.check_invariants()
        if m.prefix_cache is not None:
            m.prefix_cache.check_invariants()
        # reference count == number of tables pointing at the block: no leak, no double free
        counts = [0] * m.num_blocks
        for t, _ in self.seqs.values():
            for b in t.block_ids:
                counts[b] += 1
        assert counts == m.allocator.ref_count
        # every live sequence reads back exactly its own tokens
        for t, tokens in self.seqs.values():
            assert t.num_filled_slots == len(tokens)
            assert [self.pool[s] for s in t.slots(0, len(tokens))] == tokens
        # cached blocks hold the tokens the cache says they hold
        if m.prefix_cache is not None:
            bs = m.block_size
            for b, (key, parent, toks) in m.prefix_cache._entry_of.items():
                assert self.pool[b * bs:(b + 1) * bs] == list(toks)
        usage = m.usage(t for t, _ in self.seqs.values())
        assert 0 <= usage.used_slots <= usage.reserved_slots <= usage.total_slots


op_strategy = st.one_of(
    st.tuples(st.just("add"), st.lists(st.integers(0, 2), min_size=1, max_size=14)),
    st.tuples(st.just("append"), st.integers(0, 20), st.lists(st.integers(0, 2), min_size=1, max_size=5)),
    st.tuples(st.just("fork"), st.integers(0, 20)),
    st.tuples(st.just("free"), st.integers(0, 20)),
    st.tuples(st.just("truncate"), st.integers(0, 20), st.integers(0, 6)),
    st.tuples(st.just("evict")),
)


@pytest.mark.parametrize("prefix", [True, False])
@settings(max_examples=200, deadline=None)
@given(ops=st.lists(op_strategy, max_size=40), block_size=st.sampled_from([1, 2, 4]))
def test_manager_never_leaks_or_corrupts(prefix, ops, block_size):
    p = PoolModel(12, block_size, prefix)
    for op in ops:
        live = sorted(p.seqs)
        if op[0] == "add":
            p.add(op[1])
        elif op[0] == "append" and live:
            p.append(live[op[1] % len(live)], op[2])
        elif op[0] == "fork" and live:
            p.fork(live[op[1] % len(live)])
        elif op[0] == "free" and live:
            p.free(live[op[1] % len(live)])
        elif op[0] == "truncate" and live:
            p.truncate(live[op[1] % len(live)], op[2])
        elif op[0] == "evict":
            p.m.reset_prefix_cache()
        p.check()
    for sid in list(p.seqs):
        p.free(sid)
    p.check()
    assert p.m.allocator.num_free == p.m.num_blocks


def test_prefix_hit_reuses_blocks_and_computes_the_last_token():
    p = PoolModel(16, 4, True)
    prompt = list(range(12))                     # exactly three full blocks
    assert p.add(prompt)
    first = list(p.seqs[0][0].block_ids)
    t = p.m.new_table()
    hit = p.m.match_prefix(prompt)
    assert hit == first[:2]                      # third block recomputed: one token must run
    p.free(0)
    assert p.m.match_prefix(prompt) == first[:2]  # freed but still cached
    assert p.m.allocate(t, 12, hit) and t.num_filled_slots == 8


def test_duplicate_block_stays_private_and_is_not_freed():
    m = KVCacheManager(8, 2)
    a, b = m.new_table(), m.new_table()
    m.allocate(a, 4)
    m.allocate(b, 4)                             # computed in parallel: no hit yet
    m.commit(a, [1, 2, 3, 4], 4)
    m.commit(b, [1, 2, 3, 4], 4)                 # duplicate keys: ignored
    assert all(blk in m.prefix_cache for blk in a.block_ids)
    assert not any(blk in m.prefix_cache for blk in b.block_ids)
    m.free(a)
    assert m.allocator.ref_count[b.block_ids[0]] == 1


def test_cache_salt_separates_tenants():
    m = KVCacheManager(8, 2)
    t = m.new_table()
    m.allocate(t, 5)
    m.commit(t, [1, 2, 3, 4, 5], 5, cache_salt="tenant-a")
    assert m.match_prefix([1, 2, 3, 4, 5]) == []
    assert m.match_prefix([1, 2, 3, 4, 5], cache_salt="tenant-b") == []
    assert len(m.match_prefix([1, 2, 3, 4, 5], cache_salt="tenant-a")) == 2


def test_lru_eviction_keeps_recently_used_prefixes():
    m = KVCacheManager(4, 2)
    old, new = m.new_table(), m.new_table()
    m.allocate(old, 2); m.commit(old, [1, 1], 2)
    m.allocate(new, 2); m.commit(new, [2, 2], 2)
    m.free(old); m.free(new)
    t = m.new_table()
    m.allocate(t, 6)                             # needs 3 of 4 blocks: evicts the older prefix
    assert m.match_prefix([2, 2, 9]) != []
    assert m.match_prefix([1, 1, 9]) == []


def test_usage_counts_only_the_unfilled_tail_as_waste():
    m = KVCacheManager(10, 4, enable_prefix_caching=False)
    t = m.new_table()
    m.allocate(t, 9)
    m.commit(t, list(range(9)), 9)
    u = m.usage([t])
    assert (u.reserved_slots, u.used_slots, u.total_slots) == (12, 9, 40)
    assert u.waste == pytest.approx(0.25)


# --------------------------------------------------------------------------- tensors

def _random_pool(num_blocks, bs, kvh, d, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(num_blocks, bs, kvh, d, generator=g, dtype=torch.float64),
            torch.randn(num_blocks, bs, kvh, d, generator=g, dtype=torch.float64))


@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_paged_attention_equals_contiguous_attention(kv_heads):
    rng = random.Random(0)
    torch.manual_seed(0)
    H, D, bs, nblocks = 4, 8, 4, 40
    k_cache, v_cache = _random_pool(nblocks, bs, kv_heads, D, 1)
    free = list(range(nblocks)); rng.shuffle(free)
    # (context length, query length): decodes, prefill chunks, a whole prompt
    shapes = [(9, 1), (1, 1), (13, 5), (16, 16), (7, 1), (30, 3)]
    tables, ks, vs, qs = [], [], [], []
    for ctx, n in shapes:
        ids = [free.pop() for _ in range(blocks_for(ctx, bs))]
        t = BlockTable(bs, ids)
        k = torch.randn(ctx, kv_heads, D, dtype=torch.float64)
        v = torch.randn(ctx, kv_heads, D, dtype=torch.float64)
        slots = torch.tensor(t.slots(0, ctx))
        write_kv(k_cache, slots, k)
        write_kv(v_cache, slots, v)
        assert torch.equal(gather_kv(k_cache, ids, ctx), k)
        tables.append(ids); ks.append(k); vs.append(v)
        qs.append(torch.randn(ctx, H, D, dtype=torch.float64))
    q = torch.cat([qq[ctx - n:] for qq, (ctx, n) in zip(qs, shapes)])
    out = paged_attention(q, k_cache, v_cache, tables, [n for _, n in shapes],
                          [c for c, _ in shapes])
    row = 0
    for (ctx, n), qq, k, v in zip(shapes, qs, ks, vs):
        ref = reference_attention(qq, k, v)[ctx - n:]
        torch.testing.assert_close(out[row:row + n], ref)
        row += n


def test_paged_attention_rejects_mismatched_lengths():
    k, v = _random_pool(2, 2, 1, 4, 0)
    with pytest.raises(ValueError, match="query_lens"):
        paged_attention(torch.zeros(3, 1, 4, dtype=torch.float64), k, v, [[0]], [2], [2])
