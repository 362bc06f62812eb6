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

QUESTIONS = [Q1, Q2, Q3]
