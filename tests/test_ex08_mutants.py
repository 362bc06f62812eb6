"""Exercise 08: each question's classic mistakes, as mutants of the worked solution.

Every mutant is the solution notebook's code with one small edit (the mistake a
candidate makes); the hidden tests must take that question's points away. The
functions are graded directly through the hidden module's questions, so this
file runs in about a second.
"""
from mutants_common import mutant_tests

EXERCISE = "ex08_roofline"
# (question, the mistake, text in the solution, the mistaken text, words the reason must contain)
MUTANTS = [
    ('q1', 'forgets the efficiency', 'return bandwidth * efficiency / (num_params * bytes_per_param)', 'return bandwidth / (num_params * bytes_per_param)', ''),
    ('q1', 'counts parameters, not bytes', 'return bandwidth * efficiency / (num_params * bytes_per_param)', 'return bandwidth * efficiency / num_params', ''),
    ('q1', 'accepts an efficiency above 1', 'if not 0 < efficiency <= 1:', 'if not 0 < efficiency:', ''),
    ('q2', 'swaps the two efficiencies', 'return peak_ops * compute_efficiency / (bandwidth * bandwidth_efficiency)', 'return peak_ops * bandwidth_efficiency / (bandwidth * compute_efficiency)', ''),
    ('q2', 'ignores the efficiencies', 'return peak_ops * compute_efficiency / (bandwidth * bandwidth_efficiency)', 'return peak_ops / bandwidth', ''),
    ('q3', 'forgets the bytes per parameter', 'return ridge * bytes_per_param / 2', 'return ridge / 2', ''),
    ('q3', 'forgets the 2 operations per weight', 'return ridge * bytes_per_param / 2', 'return ridge * bytes_per_param', ''),
    ('q3', 'divides by the bytes per parameter', 'return ridge * bytes_per_param / 2', 'return ridge / bytes_per_param / 2', ''),
    ('q4', 'the ridge batch without the cache',
     'per_seq = 2 * params * bandwidth - peak_flops * context * kv_bytes_per_token',
     'per_seq = 2 * params * bandwidth', ''),
    ('q4', 'one operation per parameter', 'per_seq = 2 * params * bandwidth - peak_flops * context * kv_bytes_per_token',
     'per_seq = params * bandwidth - peak_flops * context * kv_bytes_per_token', ''),
    ('q4', 'rounds down', 'return max(1, math.ceil(peak_flops * weights / per_seq - 1e-9))',
     'return max(1, math.floor(peak_flops * weights / per_seq))', ''),
    ('q4', 'no None when the cache outgrows the compute', 'if per_seq <= 0:        # each sequence adds more reading than computing',
     'if per_seq == 0:', ''),
]


(test_the_solution_scores_every_question, test_each_classic_mistake_loses_its_question,
 test_every_question_has_two_or_more_mistakes) = mutant_tests(EXERCISE, MUTANTS)
