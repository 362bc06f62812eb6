"""Exercise 18: each question's classic mistakes, as mutants of the worked solution.

Every mutant is the solution notebook's code with one small edit (the mistake a
candidate makes); the hidden tests must take that question's points away. The
functions are graded directly through the hidden module's questions, so this
file runs in about a second.
"""
from mutants_common import mutant_tests

EXERCISE = "ex18_prefill_decode"
# (question, the mistake, text in the solution, the mistaken text, words the reason must contain)
MUTANTS = [
    ("q1", "forgets the decode rows", "room = itl_target_s - base_s - per_decode_row_s * decode_rows",
     "room = itl_target_s - base_s", ""),
    ("q1", "rounds up", "chunk = math.floor(room / per_prompt_token_s + 1e-9)",
     "chunk = math.ceil(room / per_prompt_token_s)", ""),
    ("q1", "loses the exact fit to floating point", "chunk = math.floor(room / per_prompt_token_s + 1e-9)",
     "chunk = int(room / per_prompt_token_s)", ""),
    ("q1", "returns 0 instead of raising", 'raise ValueError("the decodes alone use up the target")',
     "return 0", ""),
    ("q2", "splits by the ratio of loads, rounded", "    best, best_busy = None, None\n",
     "    return max(1, min(gpus - 1, round(gpus * prefill_load / (prefill_load + decode_load))))\n", ""),
    ("q2", "takes the last of a tie", "if best_busy is None or busy < best_busy:",
     "if best_busy is None or busy <= best_busy:", ""),
    ("q2", "balances the less busy pool", "busy = max(prefill_load / p, decode_load / (gpus - p))",
     "busy = min(prefill_load / p, decode_load / (gpus - p))", ""),
    ('q3', 'time to first token without the queue', 'first = max(arrival, free_at[card]) + prompt / prefill_tokens_per_second',
     'first = arrival + prompt / prefill_tokens_per_second', ''),
    ('q3', 'an off-by-one percentile rank', 'p95 = sorted(ttfts)[math.ceil(0.95 * len(ttfts)) - 1]',
     'p95 = sorted(ttfts)[min(len(ttfts) - 1, math.ceil(0.95 * len(ttfts)))]', ''),
    ('q3', "decode seats without the step's fixed part", 'seats = math.floor((tpot - step_base) / step_per_seq + 1e-9)  # per decode card',
     'seats = math.floor(tpot / step_per_seq + 1e-9)', ''),
    ('q3', 'decoding starts at arrival', 'events += [(first, 1), (first + (output - 1) * tpot, -1)]',
     'events += [(arrival, 1), (first + (output - 1) * tpot, -1)]', ''),
    ("q4", "prompts get the whole budget, as if decode tokens were free", "room = budget - len(rows) ",
     "room = budget ", ""),
    ("q4", "the first token stamped at the start of its step", "first[w[0]] = t - trace[w[0]][0]",
     "first[w[0]] = t - step - trace[w[0]][0]", ""),
    ("q4", "the gap timed over every step, even with no stream decoding",
     "        if rows:                                      # someone",
     "        if True:                                      # someone", ""),
    ("q4", "one prompt per step", "            room -= take\n", "            room = 0\n", ""),
    ("q4", "the percentile's rank rounded down", "rank = math.ceil(0.95 * len(trace))",
     "rank = max(1, int(0.95 * len(trace)))", ""),
    ("q4", "the largest budget that keeps both promises", "if best is None or (gap, budget) < (best[2], best[0]):",
     "if best is None or budget > best[0]:", ""),
    ("q4", "an output token too many", "                if trace[w[0]][2] > 1:\n                    decoding[w[0]] = trace[w[0]][2] - 1",
     "                if True:\n                    decoding[w[0]] = trace[w[0]][2]", ""),
    ("q4", "a tie goes to the budget listed first", "if best is None or (gap, budget) < (best[2], best[0]):",
     "if best is None or gap < best[2]:", ""),
    ("q4", "a worst gap exactly at the promise breaks it (strict <)", "if ttft <= ttft_p95_s and gap <= itl_s:",
     "if ttft <= ttft_p95_s and gap < itl_s:", ""),
    ("q4", "a first-token p95 exactly at the promise breaks it (strict <)",
     "if ttft <= ttft_p95_s and gap <= itl_s:", "if ttft < ttft_p95_s and gap <= itl_s:", ""),
]


(test_the_solution_scores_every_question, test_each_classic_mistake_loses_its_question,
 test_every_question_has_two_or_more_mistakes) = mutant_tests(EXERCISE, MUTANTS)
