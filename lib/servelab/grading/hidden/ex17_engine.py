"""Exercise 17 · The simplified inference engine. Hidden tests.

Q1 is the classic batcher (size cap or wait cap, whichever first), planned on
a list of arrival times; Q2 is the continuous-batching loop that collects
results token by token (no clock: every request waits at the start); Q3 is the
onsite version, where requests arrive on a simulated clock while the engine
runs and tokens stream out through a callback. The reference answers live
here, so expected values are computed, never typed.
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
    for rid, _, n in requests:
        if n < 1:
            raise ValueError(f"max_tokens must be at least 1, got {n} for {rid!r}")
    queue = list(requests)
    results = {rid: [] for rid, _, _ in requests}
    active = []  # [rid, prompt, max_tokens]
    order = []
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


class _TooManySteps(BaseException):
    """Raised by the graded step function once a run needs far more steps than it should.

    A BaseException, so that a student's ``except Exception`` cannot swallow it.
    """


def _check_run(func, requests, size, label):
    calls = []
    want, want_order = _run_engine(requests, size, _counting_step)
    cap = 2 * sum(n for _, _, n in requests) + 10    # far more than any correct run needs

    def step(batch):
        calls.append([rid for rid, _ in batch])
        if len(calls) > cap:
            raise _TooManySteps()
        return _counting_step(batch)

    try:
        got = func(requests, size, step)
    except _TooManySteps:
        raise AssertionError(f"{label}: still running after {cap} steps: a finished request must "
                             "free its seat (leave the batch) so the loop can end") from None
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
    _check_run(func, [("z", [1], 1), ("y", [2], 3)], 2, "max_tokens 1: one token")
    for requests, size, what in (([("z", [1], 0), ("y", [2], 3)], 2, "max_tokens 0"),
                                 ([("y", [2], 3), ("z", [1], -2)], 2, "a negative max_tokens"),
                                 (reqs, 0, "max_batch_size 0"), (reqs, -3, "a negative max_batch_size")):
        calls = []

        def counted(batch):
            calls.append(batch)
            if len(calls) > 200:
                raise _TooManySteps()
            return _counting_step(batch)

        try:
            func(requests, size, counted)
        except ValueError:
            if calls:
                raise AssertionError(f"{what}: raise ValueError before running any step") from None
        except _TooManySteps:
            raise AssertionError(f"{what} must raise ValueError") from None
        else:
            raise AssertionError(f"{what} must raise ValueError (as SamplingParams does)")
    # the step function must never see a finished request again
    seen_after_finish = []

    def strict_step(batch):
        for rid, ctx in batch:
            if rid == "c" and len(ctx) >= 4:
                seen_after_finish.append(rid)
        return _counting_step(batch)

    calls = []

    def capped_strict(batch):
        calls.append(1)
        if len(calls) > 200:
            raise _TooManySteps()
        return strict_step(batch)

    try:
        func(reqs, 3, capped_strict)
    except _TooManySteps:
        seen_after_finish.append("c")
    if seen_after_finish:
        raise AssertionError("a finished request was sent to the model again (it must free its seat)")


Q2 = Question(
    id="q2", title="The engine loop: continuous batching, token by token", function="run_engine", points=6,
    level="medium", minutes=25,
    visible=[Case(args=([("a", [1, 2], 3), ("b", [4], 1)], 2, _counting_step),
                  expected=_run_engine([("a", [1, 2], 3), ("b", [4], 1)], 2, _counting_step)[0])],
    test=_q2_behaviour,
)


# --------------------------------------------------------------------------- Q3

def _serve(arrivals, max_batch_size, max_wait, step_seconds, step_fn, on_token):
    """The onsite round's reference: arrivals on a simulated clock, a waiting batcher, streamed tokens."""
    if max_batch_size < 1:
        raise ValueError("max_batch_size must be at least 1")
    if max_wait < 0:
        raise ValueError("max_wait must be >= 0")
    if step_seconds <= 0:
        raise ValueError("step_seconds must be positive")
    times = [a[1] for a in arrivals]
    if times != sorted(times):
        raise ValueError("arrivals must be sorted by time")
    for rid, _, _, n in arrivals:
        if n < 1:
            raise ValueError(f"max_tokens must be at least 1, got {n} for {rid!r}")
    pending = list(arrivals)              # not yet admitted, in arrival order
    running = []                          # [rid, arrival, prompt, max_tokens, output]
    ttft = {rid: None for rid, _, _, _ in arrivals}
    now = 0.0
    while pending or running:
        if not running:
            # idle: wait for the first request, then until the batch fills or the oldest has waited max_wait
            now = max(now, pending[0][1])
            fill = pending[max_batch_size - 1][1] if len(pending) >= max_batch_size else float("inf")
            now = max(now, min(pending[0][1] + max_wait, fill))
        while pending and len(running) < max_batch_size and pending[0][1] <= now:
            rid, t, prompt, n = pending.pop(0)
            running.append([rid, t, list(prompt), n, []])
        tokens = step_fn([(r[0], r[2] + r[4]) for r in running])
        now += step_seconds
        still = []
        for r, tok in zip(running, tokens):
            if tok == EOS:
                continue
            r[4].append(tok)
            on_token(now, r[0], tok)
            if ttft[r[0]] is None:
                ttft[r[0]] = now - r[1]
            if len(r[4]) < r[3]:
                still.append(r)
        running = still
    return ttft


def _arrivals(spec):
    """spec: (arrival_time, prompt_length, max_tokens) per request -> the function's input."""
    return [(f"r{i}", t, [1] * p, n) for i, (t, p, n) in enumerate(spec)]


_Q3_CASES = [
    ("two requests, the second arrives while the first runs", _arrivals([(0.0, 2, 4), (0.25, 3, 3)]), 4, 0.1, 0.1),
    ("a quiet start: the batcher waits for its cap", _arrivals([(1.0, 1, 2), (1.05, 1, 2), (3.0, 1, 1)]), 4, 0.2, 0.1),
    ("the batch fills before the wait cap", _arrivals([(0.0, 1, 3), (0.01, 1, 3), (0.02, 1, 3), (0.03, 1, 3)]),
     2, 1.0, 0.05),
    ("arrivals during the run wait for a free seat", _arrivals([(0.0, 1, 6), (0.0, 1, 2), (0.1, 1, 2), (0.1, 1, 9),
                                                                (0.35, 10, 5), (2.0, 1, 1)]), 2, 0.05, 0.1),
    ("wait cap 0: never waits", _arrivals([(0.5, 1, 2), (0.55, 1, 2)]), 8, 0.0, 0.1),
    ("end tokens cut answers short", _arrivals([(0.0, 9, 20), (0.0, 11, 5), (0.2, 12, 3), (0.3, 5, 30)]),
     3, 0.1, 0.1),
    ("one seat", _arrivals([(0.0, 1, 2), (0.0, 1, 2), (0.05, 1, 1)]), 1, 0.5, 0.1),
    ("no requests", [], 4, 0.1, 0.1),
]


def _q3_run(func, arrivals, size, wait, step):
    events = []
    calls = []

    def step_fn(batch):
        calls.append(1)
        if len(calls) > 500:
            raise _TooManySteps()
        return _counting_step(batch)

    try:
        got = func(arrivals, size, wait, step, step_fn, lambda t, rid, tok: events.append((t, rid, tok)))
    except _TooManySteps:
        raise AssertionError("still running after 500 steps: a finished request must free its seat") from None
    return got, events


def _close(a, b):
    return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))


def _fmt_event(e):
    return f"(t={e[0]:.4g}, {e[1]!r}, {e[2]})"


def _q3_behaviour(func):
    for label, arrivals, size, wait, step in _Q3_CASES:
        want_events = []
        want = _serve(arrivals, size, wait, step, _counting_step, lambda t, r, k: want_events.append((t, r, k)))
        got, events = _q3_run(func, arrivals, size, wait, step)
        for k, (g, w) in enumerate(zip(events, want_events)):
            if g[1:] != w[1:] or not _close(g[0], w[0]):
                raise AssertionError(f"{label}: event {k} was {_fmt_event(g)}, expected {_fmt_event(w)}")
        if len(events) != len(want_events):
            raise AssertionError(f"{label}: {len(events)} token events, expected {len(want_events)}")
        if not isinstance(got, dict) or set(got) != set(want):
            raise AssertionError(f"{label}: return a dict request_id -> time to first token for every request")
        for rid, w in want.items():
            g = got[rid]
            if (w is None) != (g is None) or (w is not None and not _close(float(g), w)):
                shown = "None" if g is None else f"{float(g):.4g}"
                raise AssertionError(f"{label}: time to first token of {rid!r} was {shown}, expected "
                                     f"{'None' if w is None else f'{w:.4g}'} (first token time minus arrival)")
    for bad, what in (((_arrivals([(0.0, 1, 0)]), 2, 0.1, 0.1), "max_tokens 0"),
                      ((_arrivals([(0.0, 1, 2)]), 0, 0.1, 0.1), "max_batch_size 0"),
                      ((_arrivals([(0.0, 1, 2)]), 2, -0.1, 0.1), "a negative max_wait"),
                      ((_arrivals([(0.0, 1, 2)]), 2, 0.1, 0.0), "step_seconds 0"),
                      ((_arrivals([(1.0, 1, 2), (0.0, 1, 2)]), 2, 0.1, 0.1), "arrivals out of order")):
        try:
            _q3_run(func, *bad)
        except ValueError:
            continue
        raise AssertionError(f"{what} must raise ValueError")


Q3 = Question(
    id="q3", title="Onsite: arrivals on a clock, a waiting batcher, streamed tokens", function="serve",
    points=8, level="hard", minutes=40, test=_q3_behaviour, timeout=20.0,
    visible=[Case(args=(_Q3_CASES[0][1], 4, 0.1, 0.1, _counting_step, lambda t, rid, tok: None),
                  expected=_serve(_Q3_CASES[0][1], 4, 0.1, 0.1, _counting_step, lambda t, rid, tok: None),
                  rel=1e-9, label="two requests, the second arrives while the first runs")],
)


# --------------------------------------------------------------------------- Q4

def _blocks(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


def _paged_engine(requests, num_blocks, block_size, max_batch_size, step_fn):
    """Continuous batching under a KV-block budget, preemption by recompute of the newest."""
    if max_batch_size < 1 or num_blocks < 1 or block_size < 1:
        raise ValueError("max_batch_size, num_blocks and block_size must be at least 1")
    for rid, prompt, n in requests:
        if n < 1 or not prompt:
            raise ValueError(f"request {rid!r}: an empty prompt or max_tokens < 1")
        if _blocks(len(prompt) + n - 1, block_size) > num_blocks:
            raise ValueError(f"request {rid!r} can never fit in {num_blocks} blocks")
    prompts = {rid: list(p) for rid, p, _ in requests}
    limit = {rid: n for rid, _, n in requests}
    out = {rid: [] for rid, _, _ in requests}
    waiting = [rid for rid, _, _ in requests]
    running, held = [], {}
    free, step = num_blocks, 0
    preempted, used = [], []

    def need(rid):
        return _blocks(len(prompts[rid]) + len(out[rid]), block_size)

    while waiting or running:
        for rid in list(running):          # running requests grow first, oldest first
            while rid in held and held[rid] < need(rid):
                if free:
                    held[rid] += 1
                    free -= 1
                else:                      # out of blocks: the newest request is recomputed later
                    victim = running.pop()
                    free += held.pop(victim)
                    waiting.insert(0, victim)
                    preempted.append((step, victim))
        while waiting and len(running) < max_batch_size and need(waiting[0]) <= free:
            rid = waiting.pop(0)           # first come, first served; no skipping the head
            held[rid] = need(rid)
            free -= held[rid]
            running.append(rid)
        used.append(num_blocks - free)
        tokens = step_fn([(rid, prompts[rid] + out[rid]) for rid in running])
        done = []
        for rid, tok in zip(running, tokens):
            if tok == EOS:
                done.append(rid)
                continue
            out[rid].append(tok)
            if len(out[rid]) >= limit[rid]:
                done.append(rid)
        for rid in done:
            running.remove(rid)
            free += held.pop(rid)
        step += 1
    return out, preempted, used


def _stop_at_first(batch):
    """Next token = 100 + context length; EOS once the context is as long as its first token says."""
    return [EOS if ctx[0] and len(ctx) >= ctx[0] else 100 + len(ctx) for _, ctx in batch]


def _reqs(*specs):
    """(prompt length, max_tokens, stop length or 0) -> requests named a, b, c..."""
    return [(chr(97 + i), [stop] + [1] * (plen - 1), n) for i, (plen, n, stop) in enumerate(specs)]


_Q4_CASES = [  # label, requests, num_blocks, block_size, max_batch_size
    ("plenty of memory: nothing waits, nothing is preempted",
     _reqs((3, 4, 0), (2, 5, 0), (5, 2, 0)), 64, 4, 8),
    ("the memory wall: only two prompts fit, the rest wait (no error)",
     _reqs((4, 2, 0), (4, 2, 0), (4, 2, 0), (4, 2, 0), (4, 2, 0)), 2, 4, 8),
    ("growth runs out of blocks: the newest request is preempted and recomputed",
     _reqs((2, 6, 0), (2, 6, 0), (2, 6, 0)), 4, 2, 8),
    ("the request that needs a block is itself the newest: it preempts itself",
     _reqs((3, 3, 0), (4, 4, 0)), 4, 2, 8),
    ("an end token frees its blocks for the next step",
     _reqs((4, 8, 5), (4, 3, 0), (4, 3, 0)), 3, 4, 8),
    ("the head of the queue does not fit: smaller requests behind it wait too",
     _reqs((2, 6, 0), (7, 1, 0), (1, 2, 0)), 4, 2, 8),
    ("seats run out before blocks", _reqs((1, 3, 0), (1, 3, 0), (1, 3, 0), (1, 3, 0)), 16, 4, 2),
    ("many requests, tight memory", _reqs(*[(1 + (i * 7) % 5, 2 + (i * 5) % 7, 0) for i in range(10)]), 6, 2, 4),
]


def _q4_behaviour(func):
    for label, requests, num_blocks, block_size, size in _Q4_CASES:
        want = _paged_engine(requests, num_blocks, block_size, size, _stop_at_first)
        calls = []
        cap = 4 * sum(n for _, _, n in requests) + 20

        def step(batch):
            calls.append([rid for rid, _ in batch])
            if len(calls) > cap:
                raise _TooManySteps()
            if len(batch) > size:
                raise AssertionError(f"{label}: a step ran {len(batch)} requests, more than max_batch_size={size}")
            return _stop_at_first(batch)

        try:
            got = func(requests, num_blocks, block_size, size, step)
        except _TooManySteps:
            raise AssertionError(f"{label}: still running after {cap} steps") from None
        if not isinstance(got, (tuple, list)) or len(got) != 3:
            raise AssertionError(f"{label}: return (tokens, preempted, blocks_used)")
        tokens, preempted, used = got
        if dict(tokens) != want[0]:
            bad = next(k for k in want[0] if dict(tokens).get(k) != want[0][k])
            raise AssertionError(f"{label}: request {bad!r} got {dict(tokens).get(bad)}, expected {want[0][bad]}")
        preempted = [tuple(p) for p in preempted]
        if preempted != want[1]:
            raise AssertionError(f"{label}: preempted (step, request) {preempted}, expected {want[1]}")
        if list(used) != want[2]:
            k = next((i for i, (g, w) in enumerate(zip(used, want[2])) if g != w), min(len(used), len(want[2])))
            g = used[k] if k < len(used) else "nothing"
            w = want[2][k] if k < len(want[2]) else "no such step"
            raise AssertionError(f"{label}: blocks in use at step {k}: {g}, expected {w} "
                                 f"({len(want[2])} steps in all)")
    for bad, what in (((_reqs((2, 2, 0)), 4, 2, 0), "max_batch_size 0"),
                      ((_reqs((2, 2, 0)), 0, 2, 4), "no blocks"),
                      ((_reqs((2, 0, 0)), 4, 2, 4), "max_tokens 0"),
                      ((_reqs((6, 4, 0)), 4, 2, 4), "a request that can never fit (9 tokens in 8 slots)")):
        try:
            func(*bad, _stop_at_first)
        except ValueError:
            continue
        raise AssertionError(f"{what} must raise ValueError before any step")


_Q4_VISIBLE = _Q4_CASES[2]

Q4 = Question(
    id="q4", title="Onsite: the engine under a KV-block budget", function="run_paged_engine",
    points=8, level="hard", minutes=35, test=_q4_behaviour, timeout=20.0,
    visible=[Case(args=(_Q4_VISIBLE[1], _Q4_VISIBLE[2], _Q4_VISIBLE[3], _Q4_VISIBLE[4], _stop_at_first),
                  expected=_paged_engine(*_Q4_VISIBLE[1:], _stop_at_first),
                  label="three requests outgrow 4 blocks of 2 tokens")],
)

QUESTIONS = [Q1, Q2, Q3, Q4]
