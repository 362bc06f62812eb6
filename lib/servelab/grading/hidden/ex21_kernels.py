"""Exercise 21 · Kernels: bytes moved by a fused vs unfused sequence, the overhead share of a
step, and the on-chip bytes of a FlashAttention tile. Hidden tests.

Expected values come from :mod:`servelab.kernels` (``bytes_moved``, ``tile_bytes``), so the
exercise and the library cannot disagree; Q2's formula is the one ``kernels.step_overhead`` uses.
"""
from servelab import kernels
from servelab.grading import Case, Question


def _ops(pairs):
    return [kernels.Op(f"op{i}", r, w) for i, (r, w) in enumerate(pairs)]


def _bytes_case(pairs, fused_reads, fused_writes, numel, bpe, label):
    ops = _ops(pairs)
    expected = (kernels.bytes_moved(ops, numel, bpe),
                kernels.bytes_moved(ops, numel, bpe, fused=True, fused_reads=fused_reads, fused_writes=fused_writes))
    return Case(args=(pairs, fused_reads, fused_writes, numel, bpe), expected=list(expected), label=label)


_RMS = [(op.reads, op.writes) for op in kernels.SEQUENCES["rmsnorm_residual"]["ops"]]
_SWIGLU = [(op.reads, op.writes) for op in kernels.SEQUENCES["swiglu"]["ops"]]

Q1 = Question(
    id="q1", title="Bytes moved, fused and unfused", function="bytes_moved", points=4, level="easy", minutes=8,
    visible=[_bytes_case(_SWIGLU, 2, 1, 1_000_000, 2, "SwiGLU [(1, 1), (2, 1)], fused 2 in 1 out, 1M bf16")],
    hidden=[
        _bytes_case(_RMS, 2, 2, 64 * 8192, 2, "RMSNorm + residual, 64 tokens x 8192, bf16"),
        _bytes_case(_RMS, 2, 2, 4096, 4, "RMSNorm + residual, fp32"),
        _bytes_case([(1, 1)], 1, 1, 10, 4, "a single op: fusing saves nothing"),
        _bytes_case([(1, 1)] * 6, 1, 1, 1000, 2, "six chained unary ops"),
        _bytes_case([(2, 1), (1, 0), (1, 1)], 2, 1, 7, 1, "an op that only reads (a reduction)"),
        _bytes_case(_SWIGLU, 2, 1, 0, 2, "empty tensors"),
        _bytes_case([], 0, 0, 100, 2, "no ops"),
        Case(args=(_SWIGLU, 2, 1, -5, 2), raises=ValueError, label="negative numel"),
        Case(args=(_SWIGLU, 2, 1, 100, 0), raises=ValueError, label="0 bytes per element"),
    ],
)


def _share(ops, per_op_us, step_ms):
    return min(1.0, ops * per_op_us * 1e-6 / (step_ms * 1e-3))


def _share_case(ops, per_op_us, step_ms, label):
    return Case(args=(ops, per_op_us, step_ms), expected=_share(ops, per_op_us, step_ms), label=label)


Q2 = Question(
    id="q2", title="Overhead share of a step", function="overhead_share", points=3, level="easy", minutes=6,
    visible=[_share_case(270, 2.0, 1.1, "270 ops at 2 µs in a 1.1 ms step")],
    hidden=[
        _share_case(3000, 4.0, 30.0, "3,000 kernels at 4 µs in a 30 ms GPU step"),
        _share_case(3000, 4.0, 8.0, "launches exceed the step: the share is capped at 1"),
        _share_case(0, 5.0, 1.0, "no ops"),
        _share_case(1, 1.0, 0.001, "one op that is the whole step"),
        Case(args=(100, 2.0, 0.0), raises=ValueError, label="a 0 ms step"),
        Case(args=(-1, 2.0, 1.0), raises=ValueError, label="negative ops"),
        Case(args=(10, -2.0, 1.0), raises=ValueError, label="negative per-op cost"),
    ],
)


def _tile_case(bq, bk, d, bpe, label):
    return Case(args=(bq, bk, d, bpe), expected=kernels.tile_bytes(bq, bk, d, bpe)["total"], label=label)


Q3 = Question(
    id="q3", title="On-chip bytes of a FlashAttention tile", function="tile_bytes", points=3, level="medium",
    minutes=8,
    visible=[_tile_case(128, 64, 128, 2, "128 queries x 64 keys, head dim 128, bf16")],
    hidden=[
        _tile_case(64, 64, 64, 2, "64 x 64, head dim 64, bf16"),
        _tile_case(256, 128, 128, 2, "256 x 128, head dim 128 (too big for one SM)"),
        _tile_case(128, 128, 128, 1, "fp8 inputs: only Q, K, V shrink"),
        _tile_case(1, 1, 1, 4, "one query, one key, head dim 1, fp32"),
        _tile_case(16, 256, 64, 2, "a decode-like tile: few queries, many keys"),
        Case(args=(0, 64, 128, 2), raises=ValueError, label="block_q 0"),
        Case(args=(64, 64, -1, 2), raises=ValueError, label="negative head dim"),
    ],
)

QUESTIONS = [Q1, Q2, Q3]
