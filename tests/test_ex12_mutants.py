"""Exercise 12: each question's classic mistakes, as mutants of the worked solution.

Every mutant is the solution notebook's code with one small edit (the mistake a
candidate makes); the hidden tests must take that question's points away. The
functions are graded directly through the hidden module's questions, so this
file runs in about a second.
"""
from mutants_common import mutant_tests

EXERCISE = "ex12_shrinking"
# (question, the mistake, text in the solution, the mistaken text, words the reason must contain)
MUTANTS = [
    ('q1', "stores MLA's latent twice (as keys and values)", 'return layers * (config["kv_lora_rank"] + config["qk_rope_head_dim"]) * bytes_per_value', 'return 2 * layers * (config["kv_lora_rank"] + config["qk_rope_head_dim"]) * bytes_per_value', ''),
    ('q1', "forgets MLA's rotary key", 'return layers * (config["kv_lora_rank"] + config["qk_rope_head_dim"]) * bytes_per_value', 'return layers * config["kv_lora_rank"] * bytes_per_value', ''),
    ('q1', 'treats MLA like GQA', 'if config.get("kv_lora_rank") is not None:', 'if False:', ''),
    ('q2', 'a window layer always keeps the whole window', 'total += min(seq_len, window)', 'total += window', ''),
    ('q2', 'windows change nothing', 'total += min(seq_len, window)', 'total += seq_len', ''),
    ('q2', 'accepts a window of 0', 'elif window <= 0:', 'elif window < 0:', ''),
    ('q3', 'one scale for the whole tensor', 'scale = np.abs(x).max(axis=1, keepdims=True) / 127', 'scale = np.abs(x).max() / 127 * np.ones((x.shape[0], 1))', ''),
    ('q3', 'divides by 128', 'scale = np.abs(x).max(axis=1, keepdims=True) / 127', 'scale = np.abs(x).max(axis=1, keepdims=True) / 128', ''),
    ('q3', 'truncates instead of rounding', 'codes = np.clip(np.round(x / scale), -127, 127)', 'codes = np.clip(np.trunc(x / scale), -127, 127)', ''),
    ('q3', 'no guard for an all-zero row', 'scale[scale == 0] = 1.0', 'pass', ''),
]


(test_the_solution_scores_every_question, test_each_classic_mistake_loses_its_question,
 test_every_question_has_two_or_more_mistakes) = mutant_tests(EXERCISE, MUTANTS)
