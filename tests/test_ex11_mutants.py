"""Exercise 11: each question's classic mistakes, as mutants of the worked solution.

Every mutant is the solution notebook's code with one small edit (the mistake a
candidate makes); the hidden tests must take that question's points away. The
functions are graded directly through the hidden module's questions, so this
file runs in about a second.
"""
from mutants_common import mutant_tests

EXERCISE = "ex11_seats"
# (question, the mistake, text in the solution, the mistaken text, words the reason must contain)
MUTANTS = [
    ('q1', 'query heads instead of KV heads', 'kv_heads = config.get("num_key_value_heads") or heads', 'kv_heads = heads', ''),
    ('q1', 'ignores an explicit head_dim', 'head_dim = config.get("head_dim") or config["hidden_size"] // heads', 'head_dim = config["hidden_size"] // heads', 'head_dim'),
    ('q1', 'defaults head_dim to hidden / KV heads', 'head_dim = config.get("head_dim") or config["hidden_size"] // heads', 'head_dim = config.get("head_dim") or config["hidden_size"] // kv_heads', ''),
    ('q2', 'forgets the margin', 'room = (card_bytes - weights_bytes) * (1 - margin)', 'room = card_bytes - weights_bytes', ''),
    ('q2', 'takes the margin off the whole card', 'room = (card_bytes - weights_bytes) * (1 - margin)', 'room = card_bytes * (1 - margin) - weights_bytes', ''),
    ('q2', 'rounds a part seat up', 'return int(room // (seq_len * bytes_per_token))', 'return int(-(-room // (seq_len * bytes_per_token)))', ''),
    ('q3', 'whole seats per card x cards', 'room = n * (card_bytes - per_card) * (1 - margin)\n        if room // (seq_len * bytes_per_token) >= seats:', 'room = (card_bytes - per_card) * (1 - margin)\n        if n * (room // (seq_len * bytes_per_token)) >= seats:', 'pooled'),
    ('q3', 'does not split the weights', 'per_card = weights / n', 'per_card = weights', ''),
    ('q3', 'tries groups of any size', 'for n in (1, 2, 4, 8):', 'for n in range(1, 9):', ''),
]


(test_the_solution_scores_every_question, test_each_classic_mistake_loses_its_question,
 test_every_question_has_two_or_more_mistakes) = mutant_tests(EXERCISE, MUTANTS)
