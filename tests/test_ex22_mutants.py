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
    ("q3", "a request that ends as another arrives still counts as busy", "if end > arrival]",
     "if end >= arrival]", ""),
    ("q3", "a strict comparison with the slack", "if load[home] <= load[least] + slack:",
     "if load[home] < load[least] + slack:", ""),
    ("q3", "a miss does not leave its prefix on the replica that served it",
     "                cache[prefix] = True\n", "                pass\n", ""),
    ("q3", "a cache that never forgets", "if len(cache) > cache_slots:", "if False:", ""),
    ("q3", "the first replica holding the prefix, not the least busy", "home = min(holders, key=load.__getitem__)",
     "home = holders[0]", ""),
    ("q3", "a hit counted when the prefix was cached anywhere",
     "            if prefix in cache:\n                hits += 1",
     "            if holders:\n                hits += 1\n            if prefix in cache:", ""),
    ("q3", "ties to the highest index", "least = min(range(replicas), key=load.__getitem__)",
     "least = max(range(replicas), key=lambda r: (-load[r], r))", ""),
    ("q3", "a hit does not make its prefix the most recent", "cache.move_to_end(prefix)", "pass", ""),
]


(test_the_solution_scores_every_question, test_each_classic_mistake_loses_its_question,
 test_every_question_has_two_or_more_mistakes) = mutant_tests(EXERCISE, MUTANTS)
