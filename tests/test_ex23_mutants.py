"""Exercise 23: each question's classic mistakes, as mutants of the worked solution.

Every mutant is the solution notebook's code with one small edit (the mistake a
candidate makes); the hidden tests must take that question's points away. The
functions are graded directly through the hidden module's questions, so this
file runs in about a second.
"""
from mutants_common import mutant_tests

EXERCISE = "ex23_pool"
# (question, the mistake, text in the solution, the mistaken text, words the reason must contain)
MUTANTS = [
    ("q1", "ignores the safety margin", "room = (card_bytes - weights_bytes) * (1 - margin)",
     "room = card_bytes - weights_bytes", ""),
    ("q1", "sizes a seat by the prompt alone", "seat = (prompt_tokens + answer_tokens) * kv_bytes_per_token",
     "seat = prompt_tokens * kv_bytes_per_token", ""),
    ("q1", "rounds to the nearest seat", "return int(room // seat)", "return round(room / seat)", ""),
    ("q1", "takes the whole card as room", "room = (card_bytes - weights_bytes) * (1 - margin)",
     "room = card_bytes * (1 - margin)", ""),
    ("q2", "int(x) + 1 instead of a ceiling", "return math.ceil(in_flight / (seats * utilisation))",
     "return int(in_flight / (seats * utilisation)) + 1", ""),
    ("q2", "rounds instead of a ceiling", "return math.ceil(in_flight / (seats * utilisation))",
     "return round(in_flight / (seats * utilisation))", ""),
    ("q2", "forgets the first-token time", "request_s = ttft_s + output_tokens / tokens_per_s_per_seat",
     "request_s = output_tokens / tokens_per_s_per_seat", ""),
    ("q2", "multiplies by the utilisation", "return math.ceil(in_flight / (seats * utilisation))",
     "return math.ceil(in_flight * utilisation / seats)", ""),
    ("q3", "forgets the chips per replica", "chips = replicas * chips_per_replica", "chips = replicas", ""),
    ("q3", "a 720-hour month", "HOURS_PER_MONTH = 365 * 24 / 12   # 730", "HOURS_PER_MONTH = 720", ""),
    ("q3", "per thousand tokens, not per million", "return monthly_usd, monthly_usd / tokens_per_month * 1e6",
     "return monthly_usd, monthly_usd / tokens_per_month * 1e3", ""),
]


(test_the_solution_scores_every_question, test_each_classic_mistake_loses_its_question,
 test_every_question_has_two_or_more_mistakes) = mutant_tests(EXERCISE, MUTANTS)
