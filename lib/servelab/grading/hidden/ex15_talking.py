"""Exercise 15 · Talking between chips: the all-reduce bill of a step. Hidden tests.

Expected values come from :mod:`servelab.comm`.
"""
from servelab import comm
from servelab.grading import Case, Question


def _bytes(layers, batch, hidden, nbytes):
    return comm.allreduces_per_step(layers) * comm.allreduce_message_bytes(batch, hidden, nbytes)


Q1 = Question(
    id="q1", title="All-reduce bytes per step", function="allreduce_bytes_per_step", points=2, level="easy",
    minutes=5,
    visible=[Case(args=(80, 128, 12_288, 2), expected=_bytes(80, 128, 12_288, 2),
                  label="the 200B example: 80 layers, 128 people, 12,288 wide, 2 bytes")],
    hidden=[
        Case(args=(32, 1, 4096, 2), expected=_bytes(32, 1, 4096, 2), label="one person on an 8B-class model"),
        Case(args=(126, 64, 16_384, 1), expected=_bytes(126, 64, 16_384, 1)),
        Case(args=(1, 1, 1, 4), expected=8, label="one layer, one number: two all-reduces"),
        Case(args=(0, 128, 12_288, 2), raises=ValueError, label="zero layers"),
        Case(args=(80, 0, 12_288, 2), raises=ValueError, label="nobody in the batch"),
    ],
)


def _link(gbit, latency=0.0):
    return comm.Link("link", bandwidth=gbit * 1e9 / 8, latency_s=latency)


def _seconds(layers, batch, hidden, nbytes, gbit, latency=0.0):
    bill = comm.tensor_parallel_bill(
        {"vocab_size": 1, "hidden_size": hidden, "intermediate_size": 1, "num_hidden_layers": layers,
         "num_attention_heads": 1}, batch, _link(gbit, latency), nbytes)
    return bill.seconds


Q2 = Question(
    id="q2", title="All-reduce time per step over a network link", function="allreduce_step_seconds",
    points=3, level="medium", minutes=8,
    visible=[Case(args=(80, 128, 12_288, 2, 400), expected=_seconds(80, 128, 12_288, 2, 400), rel=1e-6,
                  label="the 200B example over a 400 Gb/s link")],
    hidden=[
        Case(args=(80, 128, 12_288, 2, 7200), expected=_seconds(80, 128, 12_288, 2, 7200), rel=1e-6,
             label="900 GB/s = 7,200 Gb/s"),
        Case(args=(80, 128, 12_288, 2, 400), kwargs={"latency_s": 10e-6},
             expected=_seconds(80, 128, 12_288, 2, 400, 10e-6), rel=1e-6, label="10 us per exchange"),
        Case(args=(32, 1, 4096, 2, 100), kwargs={"latency_s": 5e-6},
             expected=_seconds(32, 1, 4096, 2, 100, 5e-6), rel=1e-6, label="one person: latency dominates"),
        Case(args=(80, 128, 12_288, 2, 0), raises=ValueError, label="a link with no bandwidth"),
        Case(args=(80, 128, 12_288, 2, 400), kwargs={"latency_s": -1.0}, raises=ValueError,
             label="negative latency"),
    ],
)


def _ring(nbytes, world, bandwidth, latency):
    return comm.allreduce_seconds(nbytes, comm.Link("l", bandwidth=bandwidth, latency_s=latency), world, "ring")


Q3 = Question(
    id="q3", title="Ring all-reduce time", function="ring_allreduce_seconds", points=3, level="medium",
    minutes=8,
    visible=[Case(args=(3_145_728, 8, 900e9, 5e-6), expected=_ring(3_145_728, 8, 900e9, 5e-6), rel=1e-6,
                  label="3 MB among 8 chips on NVLink")],
    hidden=[
        Case(args=(3_145_728, 2, 900e9, 0.0), expected=_ring(3_145_728, 2, 900e9, 0.0), rel=1e-6,
             label="two chips, no latency"),
        Case(args=(1e9, 72, 1.8e12, 5e-6), expected=_ring(1e9, 72, 1.8e12, 5e-6), rel=1e-6),
        Case(args=(4096, 8, 50e9, 10e-6), expected=_ring(4096, 8, 50e9, 10e-6), rel=1e-6,
             label="a small message: latency dominates"),
        Case(args=(3_145_728, 1, 900e9, 5e-6), expected=0.0, abs=1e-15, label="one chip: nothing to send"),
        Case(args=(3_145_728, 0, 900e9, 5e-6), raises=ValueError, label="zero chips"),
    ],
)

QUESTIONS = [Q1, Q2, Q3]
