"""Exercise 13 · Pages and prefixes. Hidden tests.

Q1 a reference-counted block allocator with LRU reuse (in O(1)), Q2 the chained
prefix hash, Q3 how much of a prompt a prefix cache can skip, Q4 decode attention
gathered from block tables (checked against dense attention), Q5 a prefix cache
under a block budget (hits and evictions request by request). The reference answers
live here; expected values are computed from them.
"""
import random
import time
from collections import OrderedDict

from servelab.grading import Case, Question


# --------------------------------------------------------------------------- Q1

def _q1_behaviour(cls):
    a = cls(4)
    if a.num_free != 4:
        raise AssertionError(f"a new allocator of 4 blocks reports num_free={a.num_free}")
    got = [a.allocate() for _ in range(4)]
    if got != [0, 1, 2, 3]:
        raise AssertionError(f"fresh blocks should come out in order 0, 1, 2, 3; got {got}")
    try:
        a.allocate()
    except RuntimeError:
        pass
    else:
        raise AssertionError("allocate() on an empty pool must raise RuntimeError")
    a.free(2)
    a.free(0)
    if a.allocate() != 2:
        raise AssertionError("allocate() must hand out the block freed longest ago (LRU): freed 2 then 0")
    a.share(1)
    a.free(1)
    if a.num_free != 1:
        raise AssertionError("a shared block must stay in use until its last reference is freed")
    a.free(1)
    if a.num_free != 2:
        raise AssertionError("freeing the last reference must return the block to the pool")
    try:
        a.free(1)
    except ValueError:
        pass
    else:
        raise AssertionError("freeing a free block (double free) must raise ValueError")
    try:
        a.share(1)
    except ValueError:
        pass
    else:
        raise AssertionError("share() of a free block must raise ValueError")
    try:
        cls(0)
    except ValueError:
        pass
    else:
        raise AssertionError("an allocator of 0 blocks must raise ValueError")
    # random operations against a model of the same rules
    rng = random.Random(0)
    n = 16
    a = cls(n)
    refs = [0] * n
    free_order = list(range(n))
    for _ in range(2000):
        op = rng.random()
        used = [b for b in range(n) if refs[b]]
        if op < 0.4:
            if free_order:
                b = a.allocate()
                want = free_order.pop(0)
                if b != want:
                    raise AssertionError(f"LRU order broken after many operations: got block {b}, expected {want}")
                refs[b] = 1
        elif op < 0.55 and used:
            b = rng.choice(used)
            a.share(b)
            refs[b] += 1
        elif used:
            b = rng.choice(used)
            a.free(b)
            refs[b] -= 1
            if refs[b] == 0:
                free_order.append(b)
        if a.num_free != len(free_order):
            raise AssertionError(f"num_free={a.num_free} but {len(free_order)} blocks are free (a leak?)")


_BIG_POOL = 1 << 20


def _per_call_seconds(cls, num_blocks: int, rounds: int = 200, budget: float = 0.5) -> float:
    """Seconds per allocate-or-free call on a pool of ``num_blocks`` (best of 3 runs of up to
    ``rounds`` allocate-free pairs, each run cut short after ``budget`` seconds)."""
    a = cls(num_blocks)
    best = float("inf")
    for _ in range(3):
        start, done = time.perf_counter(), 0
        while done < rounds and (done < 5 or time.perf_counter() - start < budget):
            a.free(a.allocate())
            done += 1
        best = min(best, (time.perf_counter() - start) / (2 * done))
    return best


def _q1_constant_time(cls):
    """allocate and free must not grow with the pool: a million blocks cost about what 64 do.
    (A ratio of two timings on the same machine; an O(n) scan or list.pop(0) is hundreds of
    times slower at this size, an O(1) structure within noise.)"""
    small = _per_call_seconds(cls, 64)
    for _ in range(2):
        big = _per_call_seconds(cls, _BIG_POOL, budget=0.25)
        if big < 6 * small or big < small + 2e-4:
            return
    raise AssertionError(f"allocate/free take {big * 1e6:,.0f} µs a call with {_BIG_POOL:,} blocks against "
                         f"{small * 1e6:,.1f} µs with 64: they grow with the pool, and the spec asks for O(1) "
                         "(no scan, no list.pop(0))")


def _q1_visible(cls):
    """The notebook's check: a small pool hands out blocks in order and takes them back."""
    a = cls(3)
    if a.num_free != 3:
        raise AssertionError(f"a new allocator of 3 blocks reports num_free={a.num_free}")
    got = [a.allocate(), a.allocate()]
    if got != [0, 1]:
        raise AssertionError(f"a fresh allocator should hand out blocks 0 then 1; got {got}")
    a.free(0)
    if a.num_free != 2:
        raise AssertionError(f"after freeing one of two allocated blocks num_free should be 2, got {a.num_free}")


def _q1_hidden(cls):
    _q1_behaviour(cls)
    _q1_constant_time(cls)


Q1 = Question(
    id="q1", title="A block allocator with reference counts", function="BlockAllocator", points=4,
    level="medium", minutes=15, test=_q1_hidden, visible_test=_q1_visible, timeout=30.0,
    visible=[Case(args=(0,), raises=ValueError, label="0 blocks")],
)


# --------------------------------------------------------------------------- Q2

def _chained(token_ids, block_size):
    if not isinstance(block_size, int) or block_size <= 0:
        raise ValueError("block_size must be a positive integer")
    out, parent = [], 0
    for i in range(len(token_ids) // block_size):
        parent = hash((parent, tuple(token_ids[i * block_size:(i + 1) * block_size])))
        out.append(parent)
    return out


_LONG = list(range(100))

Q2 = Question(
    id="q2", title="The chained prefix hash", function="chained_block_hashes", points=3, level="easy",
    minutes=10,
    visible=[Case(args=([1, 2, 3, 4, 5], 2), expected=_chained([1, 2, 3, 4, 5], 2))],
    hidden=[
        Case(args=([], 4), expected=[], label="no tokens"),
        Case(args=([1, 2, 3], 4), expected=[], label="less than one block"),
        Case(args=(_LONG, 16), expected=_chained(_LONG, 16), label="100 tokens, blocks of 16"),
        Case(args=([7, 7, 7, 7], 1), expected=_chained([7, 7, 7, 7], 1),
             label="repeated tokens: same block, different parents"),
        Case(args=([9, 9, 3, 4], 2), expected=_chained([9, 9, 3, 4], 2)),
        Case(args=([1, 2], 0), raises=ValueError, label="block_size 0"),
    ],
)


# --------------------------------------------------------------------------- Q3

def _skip(prompt_len, block_hashes, cached, block_size):
    if block_size <= 0 or prompt_len < 0:
        raise ValueError("bad sizes")
    hit = 0
    for h in block_hashes:
        if h not in cached:
            break
        hit += 1
    return min(hit, max(prompt_len - 1, 0) // block_size) * block_size


Q3 = Question(
    id="q3", title="How much of the prompt a prefix cache skips", function="cached_prefix_tokens", points=3,
    level="easy", minutes=8,
    visible=[Case(args=(40, ["a", "b"], {"a", "b"}, 16), expected=32),
             Case(args=(40, ["a", "b"], {"b"}, 16), expected=0)],
    hidden=[
        Case(args=(32, ["a", "b"], {"a", "b"}, 16), expected=16,
             label="32 tokens, both blocks cached: the last block is recomputed"),
        Case(args=(33, ["a", "b"], {"a", "b"}, 16), expected=32, label="one token past the cached blocks"),
        Case(args=(5, [], set(), 4), expected=0, label="nothing cached"),
        Case(args=(64, ["a", "b", "c", "d"], {"a", "b", "d"}, 16), expected=32, label="a gap stops the match"),
        Case(args=(1, [], {"a"}, 16), expected=0, label="a one-token prompt"),
        Case(args=(10, ["a"], {"a"}, 0), raises=ValueError, label="block_size 0"),
    ],
)



# --------------------------------------------------------------------------- Q4

def _paged_attention(q, k_cache, v_cache, block_table, context_len):
    """Reference: gather the context from the pool, then dense attention with grouped heads."""
    import torch

    n_heads, d = q.shape
    block_size, n_kv = k_cache.shape[1], k_cache.shape[2]
    if context_len < 1 or len(block_table) * block_size < context_len or n_heads % n_kv:
        raise ValueError("bad context length, block table or head counts")
    pos = torch.arange(context_len)
    blocks = torch.tensor(block_table)[pos // block_size]
    k = k_cache[blocks, pos % block_size]            # [T, n_kv, d]
    v = v_cache[blocks, pos % block_size]
    group = n_heads // n_kv
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.einsum("hd,thd->ht", q, k) / d ** 0.5
    return torch.einsum("ht,thd->hd", scores.softmax(-1), v)


def _pool(seed, num_blocks, block_size, n_kv, d, n_heads):
    import torch

    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n_heads, d, generator=g, dtype=torch.float64),
            torch.randn(num_blocks, block_size, n_kv, d, generator=g, dtype=torch.float64),
            torch.randn(num_blocks, block_size, n_kv, d, generator=g, dtype=torch.float64))


def _c13(seed, num_blocks, block_size, n_kv, d, n_heads, table, context_len, label):
    q, k, v = _pool(seed, num_blocks, block_size, n_kv, d, n_heads)
    return Case(args=(q, k, v, table, context_len),
                expected=_paged_attention(q, k, v, table, context_len).tolist(),
                rel=1e-6, abs=1e-9, label=label)


def _bad13(table, context_len, n_heads=4, label=""):
    q, k, v = _pool(0, 8, 4, 2, 8, n_heads)
    return Case(args=(q, k, v, table, context_len), raises=ValueError, label=label)


Q4 = Question(
    id="q4", title="Decode attention straight from the block pool", function="paged_decode_attention",
    points=5, level="hard", minutes=20,
    visible=[_c13(0, 8, 4, 2, 8, 4, [5, 2, 7], 10, "3 blocks out of order, 10 tokens, 4 heads on 2 KV heads")],
    hidden=[
        _c13(1, 8, 4, 2, 8, 4, [3], 1, "one token"),
        _c13(2, 8, 4, 2, 8, 4, [6, 1], 8, "two full blocks"),
        _c13(3, 8, 4, 2, 8, 4, [6, 1, 4], 9, "one token into the third block: the rest of it is stale"),
        _c13(4, 16, 2, 1, 4, 8, [15, 0, 7, 3, 9], 9, "multi-query: 8 heads share one KV head"),
        _c13(5, 6, 8, 4, 4, 4, [2, 2], 12, "the same block twice (a shared prefix block)"),
        _c13(6, 6, 4, 4, 8, 8, [0, 1, 2, 3, 4, 5], 23, "2 query heads per KV head, 23 tokens"),
        _bad13([1, 2], 9, label="the table covers 8 tokens, the context has 9"),
        _bad13([1], 0, label="an empty context"),
        _bad13([1, 2], 5, n_heads=3, label="3 query heads on 2 KV heads"),
    ],
)


# --------------------------------------------------------------------------- Q5

def _prefix_cache_run(requests, num_blocks, block_size):
    """Reference: requests served one at a time; hits claimed first; LRU free list; tails freed first."""
    if num_blocks < 1 or block_size < 1:
        raise ValueError("bad pool")
    free = OrderedDict((b, None) for b in range(num_blocks))
    cached = {}
    out = []
    for prompt, output_len in requests:
        prompt = tuple(prompt)
        if not prompt or output_len < 0:
            raise ValueError("bad request")
        need = -(-(len(prompt) + output_len) // block_size)
        if need > num_blocks:
            raise ValueError("the request does not fit the pool")
        full = [prompt[:(i + 1) * block_size] for i in range(len(prompt) // block_size)]
        table = []
        for prefix in full:
            if len(prefix) == len(prompt) or prefix not in cached:
                break
            table.append(cached[prefix])
            del free[cached[prefix]]
        hits, evicted = len(table), 0
        while len(table) < need:
            block, old = free.popitem(last=False)
            if old is not None:
                del cached[old]
                evicted += 1
            table.append(block)
        holds = {table[i]: full[i] for i in range(hits)}
        for i in range(hits, len(full)):
            if full[i] not in cached:
                cached[full[i]] = table[i]
                holds[table[i]] = full[i]
        for block in reversed(table):
            free[block] = holds.get(block)
        out.append((hits * block_size, evicted))
    return out


_S = list(range(101, 109))   # an 8-token system prompt


def _c5(requests, num_blocks, block_size, label):
    return Case(args=(requests, num_blocks, block_size),
                expected=[tuple(x) for x in _prefix_cache_run(requests, num_blocks, block_size)], label=label)


Q5 = Question(
    id="q5", title="A prefix cache under a block budget", function="prefix_cache_run",
    points=6, level="hard", minutes=25,
    visible=[_c5([(_S + [1, 2, 3], 4), (_S + [4, 5], 4), ([7] * 12, 8), (_S + [1, 2, 3], 4)], 6, 4,
                 "a shared system prompt; a long unrelated request pushes out its second block")],
    hidden=[
        _c5([(_S + [1, 2, 3, 4], 4), (list(range(50, 62)), 0), (_S + [9, 9], 1)], 5, 4,
            "an unrelated request needs three blocks: the first user's tail must go, not the system prompt"),
        _c5([(_S, 2), (_S, 2), (_S, 2)], 4, 4,
            "the same prompt, a whole number of blocks, three times (one prompt token is always computed)"),
        _c5([(_S + [1], 3), (_S + [2], 3), (_S + [1], 3)], 3, 4,
            "every request fills the whole pool: hit blocks must not be handed out again"),
        _c5([(_S + [1], 0), ([7] * 9, 0), ([8] * 9, 0), (_S + [2], 0)], 6, 4,
            "the block freed longest ago goes first"),
        _c5([(_S + [1], 0), ([7] * 9, 0), (_S + [2], 0), ([8] * 9, 0), ([9] * 5, 0), (_S + [3], 0)], 7, 4,
            "a system prompt used often stays: a hit counts as a use"),
        _c5([([51, 51, 50], 4), ([51, 51], 1), ([100, 101, 102, 103, 1, 1, 2, 2, 2], 1)], 5, 2,
            "a prefix computed again while cached: the cache keeps its older block"),
        _c5([([1, 2, 3], 1), ([1, 2, 4], 1), ([1, 2, 3], 0)], 5, 1, "blocks of one token"),
        _c5([([5] * 6, 0)], 2, 4, "a lone request, nothing to hit"),
        Case(args=([(_S, 9)], 4, 4), raises=ValueError, label="a request that needs 5 blocks of a 4-block pool"),
        Case(args=([([], 3)], 4, 4), raises=ValueError, label="an empty prompt"),
        Case(args=([(_S, 1)], 4, 0), raises=ValueError, label="blocks of 0 tokens"),
        Case(args=([(_S, -1)], 4, 4), raises=ValueError, label="a negative output length"),
    ],
    timeout=10.0,
)

QUESTIONS = [Q1, Q2, Q3, Q4, Q5]
