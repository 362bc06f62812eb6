"""Tests for servelab.prefix_cache: chained keys, hits, collisions, the one-token rule."""
from hypothesis import given, settings, strategies as st

from servelab.prefix_cache import (PrefixCache, block_key, block_keys, max_cacheable_blocks)


def test_keys_are_chained_through_the_parent():
    a = block_keys([1, 2, 3, 4, 5, 6], 2)
    b = block_keys([9, 9, 3, 4, 5, 6], 2)
    assert len(a) == 3
    assert a[1] != b[1] and a[2] != b[2]          # same tokens, different past
    assert a[0] == block_key(b"", [1, 2])
    assert a[1] == block_key(a[0], [3, 4])


def test_only_full_blocks_get_keys_and_chains_extend():
    tokens = list(range(11))
    keys = block_keys(tokens, 4)
    assert len(keys) == 2
    assert block_keys(tokens + [11], 4, start=2, parent=keys[1]) == block_keys(tokens + [11], 4)[2:]


def test_salt_changes_every_key():
    a = block_keys([1, 2, 3, 4], 2)
    b = block_keys([1, 2, 3, 4], 2, cache_salt="t1")
    assert a[0] != b[0] and a[1] != b[1]


def test_keys_are_stable_across_processes():
    # sha256-based: a fixed value, not Python's randomized hash()
    assert block_key(b"", [1, 2, 3]).hex() == block_key(b"", (1, 2, 3)).hex()
    assert len(block_key(b"", [1])) == 16


def test_hit_compares_tokens_so_a_collision_is_a_miss():
    c = PrefixCache()
    key = block_key(b"", [1, 2])
    assert c.insert(key, [1, 2], 5)
    assert c.lookup(key, [1, 2]) == 5
    assert c.lookup(key, [3, 4]) is None          # same key, other tokens: a forged collision


def test_insert_keeps_the_first_block_for_a_key():
    c = PrefixCache()
    key = block_key(b"", [1, 2])
    assert c.insert(key, [1, 2], 3)
    assert not c.insert(key, [1, 2], 4)
    assert c.lookup(key, [1, 2]) == 3 and 4 not in c
    assert c.evict(3) and c.lookup(key, [1, 2]) is None and not c.evict(3)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=0, max_size=40), st.sampled_from([1, 2, 3, 4, 16]))
def test_a_full_prefix_hit_still_computes_a_token(prompt, bs):
    c = PrefixCache()
    keys = block_keys(prompt, bs)
    for i, k in enumerate(keys):
        c.insert(k, prompt[i * bs:(i + 1) * bs], i, parent=keys[i - 1] if i else b"")
    hit = c.match(prompt, bs)
    assert len(hit) == max_cacheable_blocks(len(prompt), bs)
    assert len(hit) * bs <= max(len(prompt) - 1, 0)
    assert hit == list(range(len(hit)))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.integers(0, 1), min_size=1, max_size=12), min_size=1, max_size=8))
def test_match_returns_the_longest_cached_chain(prompts):
    bs = 2
    c = PrefixCache()
    block = 0
    for p in prompts[:-1]:
        keys = block_keys(p, bs)
        for i, k in enumerate(keys):
            if c.insert(k, p[i * bs:(i + 1) * bs], block, parent=keys[i - 1] if i else b""):
                block += 1
        c.check_invariants()
    query = prompts[-1]
    hit = c.match(query, bs)
    # brute force: the longest leading run of blocks that some earlier prompt shares
    best = 0
    for p in prompts[:-1]:
        n = 0
        while (n + 1) * bs <= min(len(p), len(query)) and p[:(n + 1) * bs] == query[:(n + 1) * bs]:
            n += 1
        best = max(best, n)
    assert len(hit) == min(best, max_cacheable_blocks(len(query), bs))


def test_a_hit_is_checked_against_the_parent_key_too():
    """A forged collision: the same key and tokens registered after another past must miss."""
    c = PrefixCache()
    key = block_key(b"parent-a", [1, 2])
    assert c.insert(key, [1, 2], 7, parent=b"parent-a")
    assert c.lookup(key, [1, 2], parent=b"parent-a") == 7
    assert c.lookup(key, [1, 2], parent=b"parent-b") is None
