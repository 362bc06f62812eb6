"""Exercise 09: each question's classic mistakes, as mutants of the worked solution.

Every mutant is the solution notebook's code with one small edit (the mistake a
candidate makes); the hidden tests must take that question's points away. The
functions are graded directly through the hidden module's questions, so this
file runs in about a second.
"""
from mutants_common import mutant_tests

EXERCISE = "ex09_batching"
# (question, the mistake, text in the solution, the mistaken text, words the reason must contain)
MUTANTS = [
    ('q1', 'ignores the cached tokens', 'ops = 2 * num_params * (prompt_tokens - cached_tokens)', 'ops = 2 * num_params * prompt_tokens', ''),
    ('q1', 'one operation per parameter', 'ops = 2 * num_params * (prompt_tokens - cached_tokens)', 'ops = num_params * (prompt_tokens - cached_tokens)', ''),
    ('q1', 'forgets the chips', 'return ops / (num_chips * peak_ops_per_chip * efficiency)', 'return ops / (peak_ops_per_chip * efficiency)', ''),
    ('q2', 'reads one cache, not one per person', 'bytes_read = weights_bytes + batch * tokens_per_person * kv_bytes_per_token', 'bytes_read = weights_bytes + tokens_per_person * kv_bytes_per_token', ''),
    ('q2', 'reads the weights once per person', 'bytes_read = weights_bytes + batch * tokens_per_person * kv_bytes_per_token', 'bytes_read = batch * (weights_bytes + tokens_per_person * kv_bytes_per_token)', ''),
    ('q2', 'forgets the overhead', 'return bytes_read / (bandwidth * efficiency) + overhead_s', 'return bytes_read / (bandwidth * efficiency)', ''),
    ('q3', 'adds a decode step before the first token', 'return queue_seconds + prefill + (tokens - 1) * step_seconds', 'return queue_seconds + prefill + tokens * step_seconds', ''),
    ('q3', 'a fully cached prompt computes nothing', 'fresh = max(prompt_tokens - cached_tokens, 1)', 'fresh = prompt_tokens - cached_tokens', ''),
    ('q3', 'forgets the queue', 'return queue_seconds + prefill + (tokens - 1) * step_seconds', 'return prefill + (tokens - 1) * step_seconds', ''),
    ('q4', 'requests join a running static batch', 'if continuous or not running:         # static: only when idle',
     'if True:', ''),
    ('q4', 'the first token stamped at the start of its step', 'ttft[i] = clock - arrivals[i][0]',
     'ttft[i] = clock - step_seconds - arrivals[i][0]', ''),
    ('q4', 'requests admitted before they arrive', 'and arrivals[waiting[0]][0] <= clock + 1e-12):', '):', ''),
    ('q4', 'an off-by-one percentile rank', 'rank = math.ceil(0.95 * len(arrivals)) - 1    # nearest rank',
     'rank = min(len(arrivals) - 1, math.ceil(0.95 * len(arrivals)))', ''),
]


(test_the_solution_scores_every_question, test_each_classic_mistake_loses_its_question,
 test_every_question_has_two_or_more_mistakes) = mutant_tests(EXERCISE, MUTANTS)
