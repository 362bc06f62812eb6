"""Exercise 18 · Prefill meets decode: a chunk size for a gap target, a prefill:decode split. Hidden tests.

Expected values come from :func:`servelab.sim.pools.largest_chunk` and
:func:`servelab.sim.pools.best_split`, the functions chapter 18 uses.
"""
from servelab.grading import Case, Question
from servelab.sim.pools import best_split, largest_chunk


def _chunk(*args, label):
    return Case(args=args, expected=largest_chunk(*args), label=label)


Q1 = Question(
    id="q1", title="The largest chunk for a gap target", function="largest_chunk", points=4, level="medium",
    minutes=10,
    visible=[_chunk(0.050, 0.006, 70e-6, 20e-6, 32, label="50 ms target, 6 ms fixed, 70 us/token, 32 rows")],
    hidden=[
        _chunk(0.030, 0.010, 50e-6, 100e-6, 64, label="30 ms, 10 ms fixed, 64 rows at 0.1 ms each"),
        _chunk(0.1, 0.002, 1e-5, 0.0, 0, label="no decodes running"),
        _chunk(0.050, 0.006, 70e-6, 20e-6, 1, label="one stream"),
        Case(args=(0.0105, 0.0005, 1e-5, 0.0, 0), expected=1000,
             label="room of exactly 1,000 tokens: 1,000, not 999 or 1,001"),
        Case(args=(0.01, 0.006, 70e-6, 1e-4, 64), raises=ValueError,
             label="the decodes alone overrun the target: no chunk fits"),
        Case(args=(0.0, 0.006, 70e-6, 1e-4, 4), raises=ValueError, label="a zero target"),
        Case(args=(0.05, 0.006, 0.0, 1e-4, 4), raises=ValueError, label="prompt tokens that cost nothing"),
    ],
)


def _split(*args, label):
    return Case(args=args, expected=best_split(*args), label=label)


Q2 = Question(
    id="q2", title="Balance prefill against decode", function="prefill_gpus", points=4, level="medium",
    minutes=10,
    visible=[_split(4, 3.2, 0.8, label="4 GPUs, 3.2 GPU-s/s of prefill, 0.8 of decode (a coding tool)")],
    hidden=[
        _split(4, 0.1, 3.33, label="essays: little prefill, much decode"),
        _split(8, 2.0, 2.0, label="equal work on 8 GPUs"),
        _split(4, 1.4, 2.6, label="the even ratio says 1.4 prefill GPUs, but 2 keep the busier pool less busy"),
        _split(10, 1.0, 5.0, label="a 1:5 mix on 10 GPUs"),
        _split(2, 5.0, 0.1, label="two GPUs: one each, whatever the mix"),
        _split(5, 1.0, 1.0, label="equal work on 5 GPUs: 2 and 3 tie, fewer prefill GPUs wins"),
        Case(args=(1, 1.0, 1.0), raises=ValueError, label="one GPU cannot be split"),
        Case(args=(4, 0.0, 1.0), raises=ValueError, label="no prefill work"),
    ],
)

QUESTIONS = [Q1, Q2]
