"""Exercise 24: each question's classic mistakes, as mutants of the worked solution.

Every mutant is the solution notebook's code with one small edit (the mistake a
candidate makes); the hidden tests must take that question's points away. The
functions are graded directly through the hidden module's questions, so this
file runs in about a second.
"""
from mutants_common import mutant_tests

EXERCISE = "ex24_cost"
# (question, the mistake, text in the solution, the mistaken text, words the reason must contain)
MUTANTS = [
    ('q1', 'forgets the chips', 'chip_seconds_per_token = num_chips * step_seconds / batch', 'chip_seconds_per_token = step_seconds / batch', ''),
    ('q1', 'forgets the batch', 'chip_seconds_per_token = num_chips * step_seconds / batch', 'chip_seconds_per_token = num_chips * step_seconds', ''),
    ('q1', 'per thousand, not per million', 'return chip_seconds_per_token * price_per_chip_hour / 3600 * 1e6', 'return chip_seconds_per_token * price_per_chip_hour / 3600 * 1e3', ''),
    ('q2', 'ignores the cached share', 'chip_seconds_per_input_token = (1 - cached_share) * chip_seconds_per_fresh_token', 'chip_seconds_per_input_token = chip_seconds_per_fresh_token', ''),
    ('q2', 'bills cached tokens, not fresh ones', 'chip_seconds_per_input_token = (1 - cached_share) * chip_seconds_per_fresh_token', 'chip_seconds_per_input_token = max(cached_share, 1e-9) * chip_seconds_per_fresh_token', ''),
    ('q2', 'one operation per parameter', 'seconds_per_fresh_token = 2 * params / (num_chips * flops_per_chip * efficiency)', 'seconds_per_fresh_token = params / (num_chips * flops_per_chip * efficiency)', ''),
    ('q3', 'inverts the ratio', 'return output_chip_seconds / input_chip_seconds', 'return input_chip_seconds / output_chip_seconds', ''),
    ('q3', 'forgets the chips in the output token', 'output_chip_seconds = num_chips * step_seconds / batch', 'output_chip_seconds = step_seconds / batch', ''),
    ('q4', 'the caches neither fill memory nor slow the step',
     'read = weights_bytes + batch * context * kv_bytes_per_token', 'read = weights_bytes', ''),
    ('q4', "a step's whole chip time charged to one token", 'chip_seconds = chips * step / batch           # per output token',
     'chip_seconds = chips * step', ''),
    ('q4', 'one chip reads at the whole replica\'s pace twice over', 'step = read / (chips * bandwidth)   # the chips read in parallel',
     'step = read / (chips * chips * bandwidth)', ''),
]


(test_the_solution_scores_every_question, test_each_classic_mistake_loses_its_question,
 test_every_question_has_two_or_more_mistakes) = mutant_tests(EXERCISE, MUTANTS)
