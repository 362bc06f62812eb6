"""Exercise 10: each question's classic mistakes, as mutants of the worked solution.

Every mutant is the solution notebook's code with one small edit (the mistake a
candidate makes); the hidden tests must take that question's points away. The
functions are graded directly through the hidden module's questions, so this
file runs in about a second.
"""
from mutants_common import mutant_tests

EXERCISE = "ex10_kv_cache"
# (question, the mistake, text in the solution, the mistaken text, words the reason must contain)
MUTANTS = [
    ('q1', 'off by one in the uncached sum', 'uncached = n * p + n * (n - 1) // 2', 'uncached = n * p + n * (n + 1) // 2', ''),
    ('q1', 'the cached run recomputes the prompt', 'cached = p + (n - 1)', 'cached = n * p', ''),
    ('q1', 'counts the new tokens only', 'cached = p + (n - 1)', 'cached = n', ''),
    ('q2', 'forgets keys or values (no factor 2)', 'kv_bytes_per_token = 2 * layers * kv_heads * head_dim * bytes_per_value', 'kv_bytes_per_token = layers * kv_heads * head_dim * bytes_per_value', ''),
    ('q2', 'reads one cache for the whole batch', 'bytes_read = weights_bytes + batch * context_tokens * kv_bytes_per_token', 'bytes_read = weights_bytes + context_tokens * kv_bytes_per_token', ''),
    ('q2', 'multiplies by the efficiency', 'return bytes_read / (bandwidth * efficiency) + overhead_s', 'return bytes_read * efficiency / bandwidth + overhead_s', ''),
    ('q3', 'int(x) + 1 instead of a ceiling', 'return math.ceil(weights_bytes / (batch * kv_bytes_per_token))', 'return int(weights_bytes / (batch * kv_bytes_per_token)) + 1', ''),
    ('q3', 'rounds down', 'return math.ceil(weights_bytes / (batch * kv_bytes_per_token))', 'return int(weights_bytes / (batch * kv_bytes_per_token))', ''),
    ('q3', 'forgets the batch', 'return math.ceil(weights_bytes / (batch * kv_bytes_per_token))', 'return math.ceil(weights_bytes / kv_bytes_per_token)', ''),
]


(test_the_solution_scores_every_question, test_each_classic_mistake_loses_its_question,
 test_every_question_has_two_or_more_mistakes) = mutant_tests(EXERCISE, MUTANTS)
