"""Exercise 15: each classic mistake loses its question (graded in-process through QUESTIONS)."""
from servelab.grading import grade_question
from servelab.grading.hidden import ex15_talking as hidden

Q = {q.id: q for q in hidden.QUESTIONS}


def _passes(qid, func):
    return grade_question(Q[qid], func).passed


def _check(*counts):
    if min(counts) <= 0:
        raise ValueError("positive please")


def test_one_all_reduce_per_layer_loses_q1():
    def one_per_layer(layers, batch, hidden_size, nbytes):
        _check(layers, batch, hidden_size, nbytes)
        return layers * batch * hidden_size * nbytes

    def bits_not_bytes(layers, batch, hidden_size, nbytes):
        _check(layers, batch, hidden_size, nbytes)
        return 2 * layers * batch * hidden_size * nbytes * 8

    for mutant in (one_per_layer, bits_not_bytes):
        assert not _passes("q1", mutant), mutant.__name__


def _guard(gbit, latency):
    if gbit <= 0 or latency < 0:
        raise ValueError("bad link")


def test_bits_as_bytes_and_other_slips_lose_q2():
    def bits_as_bytes(layers, batch, hidden_size, nbytes, gbit, latency_s=0.0):
        _guard(gbit, latency_s)
        return 2 * layers * (latency_s + batch * hidden_size * nbytes / (gbit * 1e9))

    def one_per_layer(layers, batch, hidden_size, nbytes, gbit, latency_s=0.0):
        _guard(gbit, latency_s)
        return layers * (latency_s + batch * hidden_size * nbytes / (gbit * 1e9 / 8))

    def latency_once_per_step(layers, batch, hidden_size, nbytes, gbit, latency_s=0.0):
        _guard(gbit, latency_s)
        return latency_s + 2 * layers * batch * hidden_size * nbytes / (gbit * 1e9 / 8)

    for mutant in (bits_as_bytes, one_per_layer, latency_once_per_step):
        assert not _passes("q2", mutant), mutant.__name__


def test_ring_mistakes_lose_q3():
    def reduce_scatter_only(n, p, bw, lat):
        if p < 1:
            raise ValueError("no chips")
        return 0.0 if p == 1 else (p - 1) * (lat + n / p / bw)

    def whole_tensor_each_step(n, p, bw, lat):
        if p < 1:
            raise ValueError("no chips")
        return 0.0 if p == 1 else 2 * (p - 1) * (lat + n / bw)

    def one_latency(n, p, bw, lat):
        if p < 1:
            raise ValueError("no chips")
        return 0.0 if p == 1 else lat + 2 * (p - 1) / p * n / bw

    for mutant in (reduce_scatter_only, whole_tensor_each_step, one_latency):
        assert not _passes("q3", mutant), mutant.__name__
