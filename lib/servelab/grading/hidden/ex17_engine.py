"""Exercise 17 · The simplified inference engine. Hidden tests.

Q1 is the classic batcher (size cap or wait cap, whichever first); Q2 is the
continuous-batching loop that collects results token by token. Both run on a
simulated clock so the grading is exact. The reference answers live here, so
expected values are computed, never typed.
"""
from servelab.grading import Case, Question

EOS = -1


# --------------------------------------------------------------------------- Q1

def _form_batches(arrivals, max_batch_size, max_wait):
    if max_batch_size < 1:
        raise ValueError("max_batch_size must be at least 1")
    if max_wait < 0:
        raise ValueError("max_wait must be >= 0")
    times = [t for _, t in arrivals]
    if times != sorted(times):
        raise ValueError("arrivals must be sorted by time")
    out, i = [], 0
    while i < len(arrivals):
        deadline = arrivals[i][1] + max_wait
        j = i
        while j < len(arrivals) and j - i < max_batch_size and arrivals[j][1] <= deadline:
            j += 1
        when = arrivals[j - 1][1] if j - i == max_batch_size else deadline
        out.append((when, [rid for rid, _ in arrivals[i:j]]))
        i = j
    return out


def _arr(*times):
    return [(f"r{i}", t) for i, t in enumerate(times)]


_BURSTY = _arr(0.0, 0.001, 0.002, 0.5, 0.5, 0.5, 0.5, 0.5, 0.51, 2.0, 2.0, 3.7)

Q1 = Question(
    id="q1", title="A batcher with a size cap and a wait cap", function="form_batches", points=4,
    level="medium", minutes=15,
    visible=[
        Case(args=(_arr(0.0, 0.1, 0.2), 2, 1.0), expected=_form_batches(_arr(0.0, 0.1, 0.2), 2, 1.0)),
        Case(args=(_arr(0.0, 5.0), 4, 1.0), expected=[(1.0, ["r0"]), (6.0, ["r1"])]),
    ],
    hidden=[
        Case(args=([], 4, 0.1), expected=[], label="no requests"),
        Case(args=(_arr(3.0), 8, 0.25), expected=[(3.25, ["r0"])], label="one request waits the full cap"),
        Case(args=(_arr(0.0, 0.0, 0.0, 0.0, 0.0), 2, 10.0),
             expected=_form_batches(_arr(0.0, 0.0, 0.0, 0.0, 0.0), 2, 10.0), label="five at once, size 2"),
        Case(args=(_BURSTY, 4, 0.05), expected=_form_batches(_BURSTY, 4, 0.05), label="bursty traffic, size 4"),
        Case(args=(_BURSTY, 3, 1.0), expected=_form_batches(_BURSTY, 3, 1.0), label="bursty traffic, long wait"),
        Case(args=(_arr(0.0, 0.1, 0.2), 5, 0.1), expected=_form_batches(_arr(0.0, 0.1, 0.2), 5, 0.1),
             label="a request arriving exactly at the deadline rides along"),
        Case(args=(_arr(0.0, 0.3, 0.6), 1, 5.0), expected=[(0.0, ["r0"]), (0.3, ["r1"]), (0.6, ["r2"])],
             label="size 1: never waits"),
        Case(args=(_arr(0.0, 0.3), 4, 0.0), expected=[(0.0, ["r0"]), (0.3, ["r1"])], label="wait cap 0"),
        Case(args=(_arr(0.0, 1.0), 0, 1.0), raises=ValueError, label="max_batch_size 0"),
        Case(args=(_arr(0.0, 1.0), 2, -1.0), raises=ValueError, label="negative wait"),
        Case(args=(_arr(1.0, 0.0), 2, 1.0), raises=ValueError, label="arrivals out of order"),
    ],
)


# --------------------------------------------------------------------------- Q2

def _run_engine(requests, max_batch_size, step_fn):
    if max_batch_size < 1:
        raise ValueError("max_batch_size must be at least 1")
    queue = list(requests)
    results = {rid: [] for rid, _, _ in requests}
    active = []  # [rid, prompt, max_tokens]
    order = []
    for rid, _, n in list(queue):
        if n <= 0:
            queue.remove((rid, _, n))
            order.append(rid)
    while queue or active:
        while queue and len(active) < max_batch_size:
            active.append(list(queue.pop(0)))
        tokens = step_fn([(rid, list(prompt) + results[rid]) for rid, prompt, _ in active])
        still = []
        for (rid, prompt, n), tok in zip(active, tokens):
            if tok == EOS:
                order.append(rid)
                continue
            results[rid].append(tok)
            if len(results[rid]) >= n:
                order.append(rid)
            else:
                still.append([rid, prompt, n])
        active = still
    return results, order


def _counting_step(batch):
    """Next token = length of the context so far (EOS once the context reaches 12)."""
    return [EOS if len(ctx) >= 12 else len(ctx) for _, ctx in batch]


def _check_run(func, requests, size, label):
    calls = []

    def step(batch):
        calls.append([rid for rid, _ in batch])
        return _counting_step(batch)

    want, want_order = _run_engine(requests, size, _counting_step)
    got = func(requests, size, step)
    if not isinstance(got, dict):
        raise AssertionError(f"{label}: return a dict request_id -> list of tokens, got {type(got).__name__}")
    if got != want:
        bad = next((k for k in want if got.get(k) != want[k]), None)
        raise AssertionError(f"{label}: request {bad!r} got {got.get(bad)}, expected {want[bad]}")
    ref_calls = []

    def ref_step(batch):
        ref_calls.append([rid for rid, _ in batch])
        return _counting_step(batch)

    _run_engine(requests, size, ref_step)
    if len(calls) != len(ref_calls):
        raise AssertionError(f"{label}: took {len(calls)} steps, a continuous batcher needs {len(ref_calls)} "
                             f"(refill a freed seat at the very next step)")
    for k, (c, r) in enumerate(zip(calls, ref_calls)):
        if any(len(b) > size for b in [c]):
            raise AssertionError(f"{label}: step {k} ran {len(c)} requests, more than max_batch_size={size}")
        if c != r:
            raise AssertionError(f"{label}: step {k} ran {c}, expected {r} (first come, first served; "
                                 f"keep running requests in admission order)")


def _q2_behaviour(func):
    reqs = [("a", [1, 2, 3], 4), ("b", [5], 20), ("c", [7, 7], 2), ("d", [1] * 9, 30), ("e", [0], 1)]
    _check_run(func, reqs, 2, "five requests, two seats")
    _check_run(func, reqs, 1, "one seat")
    _check_run(func, reqs, 10, "more seats than requests")
    _check_run(func, [], 3, "no requests")
    _check_run(func, [("z", [1], 0), ("y", [2], 3)], 2, "max_tokens 0 returns an empty list")
    try:
        func(reqs, 0, _counting_step)
    except ValueError:
        pass
    else:
        raise AssertionError("max_batch_size 0 must raise ValueError")
    # the step function must never see a finished request again
    seen_after_finish = []

    def strict_step(batch):
        for rid, ctx in batch:
            if rid == "c" and len(ctx) >= 4:
                seen_after_finish.append(rid)
        return _counting_step(batch)

    func(reqs, 3, strict_step)
    if seen_after_finish:
        raise AssertionError("a finished request was sent to the model again (it must free its seat)")


Q2 = Question(
    id="q2", title="The engine loop: continuous batching, token by token", function="run_engine", points=6,
    level="medium", minutes=25,
    visible=[Case(args=([("a", [1, 2], 3), ("b", [4], 1)], 2, _counting_step),
                  expected=_run_engine([("a", [1, 2], 3), ("b", [4], 1)], 2, _counting_step)[0])],
    test=_q2_behaviour,
)

QUESTIONS = [Q1, Q2]
