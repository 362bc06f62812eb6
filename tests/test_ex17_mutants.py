"""Exercise 17: each question's classic mistakes, as mutants of the worked solution.

Every mutant is the solution notebook's code with one small edit (the mistake a
candidate makes); the hidden tests must take that question's points away. The
functions are graded directly through the hidden module's questions, so this
file runs in about a second.
"""
from mutants_common import mutant_tests

EXERCISE = "ex17_engine"
# (question, the mistake, text in the solution, the mistaken text, words the reason must contain)
MUTANTS = [
    ('q1', 'starts the timer at the first request ever', 'deadline = arrivals[i][1] + max_wait', 'deadline = arrivals[0][1] + max_wait', ''),
    ('q1', 'sends a full batch at the deadline', 'when = arrivals[j - 1][1] if full else deadline', 'when = deadline', ''),
    ('q1', 'leaves out a request arriving exactly at the deadline', 'arrivals[j][1] <= deadline', 'arrivals[j][1] < deadline', ''),
    ('q2', 'static batching: refills only when the batch is empty', '        while queue and len(running) < max_batch_size:\n            running.append(queue.pop(0))           # first come, first served\n', '        while queue and not running:\n            while queue and len(running) < max_batch_size:\n                running.append(queue.pop(0))\n', ''),
    ('q2', 'an ended request keeps its seat', '                continue                           # finished; the end token is not output', '                still.append((rid, prompt, max_tokens))\n                continue', 'must free its seat'),
    ('q2', 'accepts max_tokens below 1', '        if max_tokens < 1:\n            raise', '        if max_tokens < -10**9:\n            raise', 'must raise ValueError'),
    ('q2', 'accepts a negative batch size', '    if max_batch_size < 1:\n        raise ValueError(f"max_batch_size must be at least 1, got {max_batch_size}")\n    for rid', '    if max_batch_size == 0:\n        raise ValueError(f"max_batch_size must be at least 1, got {max_batch_size}")\n    for rid', 'negative max_batch_size'),
    ('q2', 'outputs the end token', '                continue                           # finished; the end token is not output', '                pass', ''),
    ('q3', 'adds a decode step to the first token', 'ttft[r[0]] = now - r[1]        # first token minus arrival', 'ttft[r[0]] = now + step_seconds - r[1]', ''),
    ('q3', "emits tokens at the step's start", 'on_token(now, r[0], token)', 'on_token(now - step_seconds, r[0], token)', 'event'),
    ('q3', 'an idle batcher never waits', 'now = max(now, min(pending[0][1] + max_wait, fills))', 'now = max(now, pending[0][1])', ''),
    ('q3', 'admits requests before they arrive', '               and pending[0][1] <= now):', '               and True):', ''),
    ('q3', 'static batching: no one joins a running batch', '               and pending[0][1] <= now):', '               and pending[0][1] <= now and not any(r[4] for r in running)):', ''),
    ('q3', 'measures the first token from time 0', 'ttft[r[0]] = now - r[1]        # first token minus arrival', 'ttft[r[0]] = now', ''),
    ('q4', 'preempts the oldest request', 'victim = running.pop()', 'victim = running.pop(0)', 'first difference at [1]'),
    ('q4', 'a preempted request goes to the back of the queue', 'waiting.insert(0, victim)',
     'waiting.append(victim)', ''),
    ('q4', 'admits on seats alone (ignores free blocks)',
     'and need(waiting[0]) <= free):     # FCFS, no skipping', '):', ''),
    ('q4', 'counts a block for the token not yet made',
     'return -(-(len(prompt[rid]) + len(out[rid])) // block_size)',
     'return -(-(len(prompt[rid]) + len(out[rid]) + 1) // block_size)', ''),
    ('q4', 'raises at the memory wall instead of preempting', 'victim = running.pop()',
     'raise RuntimeError("out of KV blocks")', 'RuntimeError'),
    ('q4', 'admits a smaller request past a head that does not fit',
     'and need(waiting[0]) <= free):     # FCFS, no skipping',
     'and any(need(r) <= free for r in waiting)):\n            waiting.sort(key=lambda r: need(r) > free)', ''),
]


(test_the_solution_scores_every_question, test_each_classic_mistake_loses_its_question,
 test_every_question_has_two_or_more_mistakes) = mutant_tests(EXERCISE, MUTANTS)
