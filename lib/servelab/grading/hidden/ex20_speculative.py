"""Exercise 20 · Speculative decoding: the acceptance step, tokens per pass, choosing k.

Expected answers come from :mod:`servelab.speculative`, so the exercise and the
library cannot drift apart.
"""
from servelab.grading import Case, Question
from servelab.speculative import accept_with_uniforms, expected_tokens_per_pass, worth_speculating

# ------------------------------------------------------------------ Q1 data
# Four-token vocabulary. p: target rows (k + 1 of them), q: draft rows (k).
P3 = [[0.1, 0.6, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25], [0.0, 0.0, 1.0, 0.0], [0.4, 0.3, 0.2, 0.1]]
Q3 = [[0.1, 0.3, 0.3, 0.3], [0.7, 0.1, 0.1, 0.1], [0.1, 0.1, 0.7, 0.1]]


def _case(draft, p, q, u, final_u, label):
    return Case(args=(draft, p, q, u, final_u), expected=accept_with_uniforms(draft, p, q, u, final_u),
                label=label)


Q1_VISIBLE = [
    _case([1, 0, 2], P3, Q3, [0.5, 0.9, 0.2], 0.5, "second draft rejected: residual draw"),
    _case([1, 1, 2], P3, Q3, [0.5, 0.1, 0.9], 0.95, "all three kept: bonus token from the last row"),
]
Q1_HIDDEN = [
    # p/q = 2 for draft 1 at position 0: always kept, whatever u
    _case([1], P3[:2], Q3[:1], [0.99], 0.1, "p > q is always accepted"),
    # first draft rejected: p(2) = 0.2 < q(2) = 0.3, u = 0.9 > 0.667; residual only on token 1
    _case([2, 1, 2], P3, Q3, [0.9, 0.0, 0.0], 0.0, "rejected at once: one token, from the residual"),
    _case([2, 1, 2], P3, Q3, [0.9, 0.0, 0.0], 0.999, "residual is [0, 1, 0, 0] whatever the final u"),
    # u exactly at the ratio is a rejection (accept when u < p/q)
    _case([0], [[0.1, 0.9], [0.5, 0.5]], [[0.2, 0.8]], [0.5], 0.0, "u equal to p/q rejects"),
    _case([], [[0.3, 0.7]], [], [], 0.5, "no drafts: just one token from the target"),
    _case([0, 0], [[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]], [[1.0, 0.0], [1.0, 0.0]], [0.999, 0.999], 0.0,
          "greedy rows agree: both kept plus the bonus"),
    _case([1, 0], [[0.0, 1.0], [0.0, 1.0], [0.5, 0.5]], [[0.0, 1.0], [1.0, 0.0]], [0.0, 0.0], 0.9,
          "greedy disagreement at position 1: the target's argmax"),
    _case([3, 2, 2], P3, Q3, [0.2, 0.5, 0.5], 0.35, "first kept by a small u, the rest by p > q, bonus"),
    _case([3, 0, 2], P3, Q3, [0.2, 0.5, 0.5], 0.35, "first kept (u < p/q), second rejected"),
]

Q1 = Question(
    id="q1", title="The acceptance step", function="accept_step", points=5, level="medium", minutes=15,
    visible=Q1_VISIBLE, hidden=Q1_HIDDEN,
)

# ------------------------------------------------------------------ Q2
Q2 = Question(
    id="q2", title="Tokens per target pass", function="tokens_per_pass", points=2, level="easy", minutes=5,
    visible=[Case(args=(0.8, 4), expected=expected_tokens_per_pass(0.8, 4), rel=1e-9)],
    hidden=[
        Case(args=(0.5, 1), expected=1.5, rel=1e-9, label="a = 0.5, k = 1"),
        Case(args=(0.0, 6), expected=1.0, rel=1e-9, label="nothing accepted still yields one token"),
        Case(args=(1.0, 4), expected=5.0, rel=1e-9, label="a = 1 (no division by zero)"),
        Case(args=(0.9, 8), expected=expected_tokens_per_pass(0.9, 8), rel=1e-9),
        Case(args=(0.6, 0), expected=1.0, rel=1e-9, label="k = 0: plain decoding"),
        Case(args=(1.2, 3), raises=ValueError, label="a above 1"),
        Case(args=(0.5, -1), raises=ValueError, label="negative k"),
    ],
)

# ------------------------------------------------------------------ Q3
_Q3_CASES = [(0.8, 0.05, 16), (0.6, 0.1, 16), (0.9, 0.0, 8), (0.95, 0.02, 16), (0.7, 0.3, 16),
             (0.3, 0.4, 16), (0.5, 0.2, 4), (0.99, 0.01, 12)]

Q3 = Question(
    id="q3", title="Choose k, or switch it off", function="choose_k", points=3, level="medium", minutes=10,
    visible=[Case(args=(0.8, 0.05, 16), expected=worth_speculating(0.8, 0.05, 16))],
    hidden=[Case(args=a, expected=worth_speculating(*a)) for a in _Q3_CASES[1:]]
    + [Case(args=(0.5, 0.5, 8), expected=0, label="a = 0.5, c = 0.5: a speed-up of exactly 1 is not worth it"),
       Case(args=(0.5, -0.1, 8), raises=ValueError, label="negative draft cost"),
       Case(args=(0.5, 0.1, 0), raises=ValueError, label="k_max = 0")],
)

# ------------------------------------------------------------------ Q4

def _plan(alpha, batch, max_k, read_seconds, token_seconds, draft_fraction):
    """Best draft length for a batch under a roofline step model, and its speed-up."""
    if not 0 <= alpha <= 1:
        raise ValueError("alpha must be in [0, 1]")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError("batch must be a positive integer")
    if isinstance(max_k, bool) or not isinstance(max_k, int) or max_k < 0:
        raise ValueError("max_k must be a non-negative integer")
    if read_seconds <= 0 or token_seconds <= 0 or draft_fraction < 0:
        raise ValueError("times must be positive and the draft fraction non-negative")

    def target(tokens):
        return max(read_seconds, tokens * token_seconds)

    plain = batch / target(batch)
    best_k, best = 0, 1.0
    for k in range(1, max_k + 1):
        per_seq = k + 1 if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha)
        rate = batch * per_seq / (k * draft_fraction * target(batch) + target(batch * (k + 1)))
        if rate / plain > best * (1 + 1e-12):
            best_k, best = k, rate / plain
    return best_k, best


_SPEC = (0.02, 2e-5, 0.05)   # a 20 ms weight read, 20 us of compute per token, a 5% draft


def _c20(alpha, batch, max_k, label="", spec=_SPEC):
    args = (alpha, batch, max_k) + spec
    return Case(args=args, expected=_plan(*args), rel=1e-9, label=label)


Q4 = Question(
    id="q4", title="When speculation stops paying as the batch grows", function="plan_speculation",
    points=5, level="hard", minutes=20,
    visible=[_c20(0.8, 1, 8, "batch 1: the target pass is a weight read")],
    hidden=[
        _c20(0.8, 64, 8, "batch 64: still reading weights, longer drafts cost little"),
        _c20(0.8, 400, 8, "batch 400: verifying k + 1 tokens a sequence makes the pass compute-bound"),
        _c20(0.8, 2000, 8, "batch 2,000: compute-bound already, speculation never pays"),
        _c20(0.6, 200, 8, "a weaker draft at a middling batch"),
        _c20(1.0, 16, 6, "every draft accepted (no division by zero)"),
        _c20(0.0, 1, 6, "nothing accepted: do not speculate"),
        _c20(0.9, 1, 0, "max_k 0"),
        _c20(0.7, 100, 12, "no draft cost", spec=(0.02, 2e-5, 0.0)),
        _c20(0.0, 1, 5, "a free draft that is never accepted: a speed-up of exactly 1 is not worth it",
             spec=(0.02, 2e-5, 0.0)),
        Case(args=(1.5, 1, 4) + _SPEC, raises=ValueError, label="alpha above 1"),
        Case(args=(0.5, 0, 4) + _SPEC, raises=ValueError, label="batch 0"),
        Case(args=(0.5, 4, -1) + _SPEC, raises=ValueError, label="negative max_k"),
        Case(args=(0.5, 4, 4, 0.0, 2e-5, 0.05), raises=ValueError, label="a zero read time"),
    ],
)

QUESTIONS = [Q1, Q2, Q3, Q4]
