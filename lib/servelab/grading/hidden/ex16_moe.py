"""Exercise 16 · Mixture of experts: coverage, bytes read, the slowest rank. Hidden tests.

Expected values come from :mod:`servelab.moe`.
"""
from servelab import moe
from servelab.grading import Case, Question

Q1 = Question(
    id="q1", title="Expert coverage", function="expert_coverage", points=2, level="easy", minutes=5,
    visible=[Case(args=(8, 256, 64), expected=moe.coverage(8, 256, 64), label="DeepSeek-V3 at 64 tokens")],
    hidden=[
        Case(args=(2, 8, 1), expected=0.25, label="one token of Mixtral"),
        Case(args=(2, 8, 3), expected=moe.coverage(2, 8, 3)),
        Case(args=(8, 256, 0), expected=0.0, abs=1e-12, label="no tokens"),
        Case(args=(1, 1, 5), expected=1.0, label="a single expert"),
        Case(args=(8, 256, 1000), expected=moe.coverage(8, 256, 1000)),
        Case(args=(256, 8, 64), raises=ValueError, label="k larger than E (swapped?)"),
        Case(args=(0, 8, 4), raises=ValueError, label="k = 0"),
    ],
)


def _read(total, experts, k, e, batch, bpp):
    return (total - experts + moe.coverage(k, e, batch) * experts) * bpp


Q2 = Question(
    id="q2", title="Weight bytes read per step", function="bytes_read_per_step", points=3, level="medium",
    minutes=8,
    visible=[Case(args=(671e9, 654e9, 8, 256, 64, 1), expected=_read(671e9, 654e9, 8, 256, 64, 1), rel=1e-9,
                  label="a DeepSeek-V3-like model at 64 tokens, 8 bits")],
    hidden=[
        Case(args=(671e9, 654e9, 8, 256, 1, 1), expected=_read(671e9, 654e9, 8, 256, 1, 1), rel=1e-9,
             label="one token reads only what it uses"),
        Case(args=(46.7e9, 45.1e9, 2, 8, 16, 2), expected=_read(46.7e9, 45.1e9, 2, 8, 16, 2), rel=1e-9),
        Case(args=(8e9, 0, 1, 1, 7, 2), expected=16e9, rel=1e-9, label="a dense model"),
        Case(args=(671e9, 654e9, 8, 256, 512, 1), expected=_read(671e9, 654e9, 8, 256, 512, 1), rel=1e-9),
        Case(args=(100e9, 200e9, 2, 8, 4, 1), raises=ValueError, label="more expert than total parameters"),
    ],
)


def _slowest(tokens, ranks):
    return max(moe.rank_loads(tokens, moe.place_experts(len(tokens), ranks)))


Q3 = Question(
    id="q3", title="The slowest rank", function="slowest_rank_tokens", points=3, level="medium", minutes=8,
    visible=[Case(args=([700, 300, 200, 200, 150, 150, 150, 150], 4),
                  expected=_slowest([700, 300, 200, 200, 150, 150, 150, 150], 4),
                  label="8 experts on 4 ranks, expert 0 hot")],
    hidden=[
        Case(args=([10] * 16, 4), expected=40, label="even routing"),
        Case(args=([0, 0, 0, 90], 2), expected=90, label="the hot expert is the last one"),
        Case(args=([5, 1, 1, 1, 1, 1], 1), expected=10, label="one rank holds all"),
        Case(args=([3, 9, 4, 4, 8, 0], 6), expected=9, label="one expert per rank"),
        Case(args=([1, 2, 3], 2), raises=ValueError, label="experts do not divide over ranks"),
    ],
)

QUESTIONS = [Q1, Q2, Q3]
