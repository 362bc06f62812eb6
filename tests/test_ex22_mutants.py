"""Exercise 22: each question's classic mistakes, as mutants of the worked solution.

Every mutant is the solution notebook's code with one small edit (the mistake a
candidate makes); the hidden tests must take that question's points away. The
functions are graded directly through the hidden module's questions, so this
file runs in about a second.
"""
from mutants_common import mutant_tests

EXERCISE = "ex22_fleet"
# (question, the mistake, text in the solution, the mistaken text, words the reason must contain)
MUTANTS = [
    ("q1", "forgets the refill since the last update", "now = min(capacity, level + elapsed_s * per_second)",
     "now = min(capacity, level)", ""),
    ("q1", "the per-minute rate used per second", "per_second = per_minute / 60", "per_second = per_minute", ""),
    ("q1", "waits for the whole amount, not the shortfall", "return (amount - now) / per_second",
     "return amount / per_second", ""),
    ("q1", "no error for a request larger than the bucket",
     'raise ValueError("a request larger than the bucket can never pass")', "pass", ""),
    ("q2", "sizes for the mean", "max(rates) * headroom", "sum(rates) / len(rates) * headroom", ""),
    ("q2", "int(x) + 1 instead of a ceiling", "math.ceil(max(rates) * headroom / per_replica_rate)",
     "int(max(rates) * headroom / per_replica_rate) + 1", ""),
    ("q2", "rounds instead of a ceiling", "math.ceil(max(rates) * headroom / per_replica_rate)",
     "round(max(rates) * headroom / per_replica_rate)", ""),
    ("q2", "forgets the headroom", "max(rates) * headroom / per_replica_rate", "max(rates) / per_replica_rate", ""),
]


(test_the_solution_scores_every_question, test_each_classic_mistake_loses_its_question,
 test_every_question_has_two_or_more_mistakes) = mutant_tests(EXERCISE, MUTANTS)
