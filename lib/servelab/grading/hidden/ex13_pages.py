"""Exercise 13 · Pages and prefixes. Hidden tests.

Q1 a reference-counted block allocator with LRU reuse, Q2 the chained prefix
hash, Q3 how much of a prompt a prefix cache can skip. The reference answers
live here; expected values are computed from them.
"""
import random

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


Q1 = Question(
    id="q1", title="A block allocator with reference counts", function="BlockAllocator", points=4,
    level="medium", minutes=15, test=_q1_behaviour,
    visible=[Case(args=(0,), raises=ValueError, label="0 blocks (the notebook check; the grader "
                  "then allocates, shares and frees)")],
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

QUESTIONS = [Q1, Q2, Q3]
