"""Exercise 13: each question's classic mistakes, as mutants of the worked solution.

Every mutant is the solution notebook's code with one small edit (the mistake a
candidate makes); the hidden tests must take that question's points away. The
functions are graded directly through the hidden module's questions, so this
file runs in about a second.
"""
from mutants_common import mutant_tests

EXERCISE = "ex13_pages"
# (question, the mistake, text in the solution, the mistaken text, words the reason must contain)
MUTANTS = [
    ('q1', 'reuses the most recently freed block', 'block, _ = self.free_list.popitem(last=False)', 'block, _ = self.free_list.popitem(last=True)', ''),
    ('q1', 'frees a shared block at its first free', 'self.refs[block] -= 1\n        if self.refs[block] == 0:', 'self.refs[block] = 0\n        if True:', ''),
    ('q1', 'no double-free check', 'if self.refs[block] == 0:\n            raise ValueError(f"double free', 'if False:\n            raise ValueError(f"double free', ''),
    ('q1', 'copies the free list to find its oldest block (O(n) per call)',
     'block, _ = self.free_list.popitem(last=False)',
     'block = list(self.free_list)[0]\n        del self.free_list[block]',
     'grow with the pool'),
    ('q1', 'an __init__ that only raises (passed the old visible check)',
     'if num_blocks < 1:\n            raise ValueError(f"num_blocks must be at least 1, got {num_blocks}")',
     'if True:\n            raise ValueError(f"num_blocks must be at least 1, got {num_blocks}")', ''),
    ('q4', 'indexes the pool by the logical block number',
     'block = torch.as_tensor(block_table)[pos // block_size]  # logical -> physical',
     'block = pos // block_size', ''),
    ('q4', 'attends over the whole last block (stale slots too)',
     'pos = torch.arange(context_len)', 'pos = torch.arange(-(-context_len // block_size) * block_size)', ''),
    ('q4', 'pairs query heads with KV heads round-robin',
     'kv_head = torch.arange(n_heads) // (n_heads // n_kv)', 'kv_head = torch.arange(n_heads) % n_kv', ''),
    ('q4', 'forgets the 1/sqrt(d) scale', 'scores = torch.einsum("hd,thd->ht", q, k) / d ** 0.5',
     'scores = torch.einsum("hd,thd->ht", q, k)', ''),
    ('q2', 'hashes each block alone (no chain)', 'parent = hash((parent, block))', 'parent = hash((0, block))', ''),
    ('q2', 'hashes the partial last block too', 'for i in range(len(token_ids) // block_size):', 'for i in range(-(-len(token_ids) // block_size)):', ''),
    ('q3', 'counts hits after a miss', 'break               # a block is only valid after its exact past', 'continue', ''),
    ('q3', 'lets a fully cached prompt skip every token', 'usable = max(prompt_len - 1, 0) // block_size', 'usable = prompt_len // block_size', ''),
    ('q5', 'frees a request\'s blocks from its first (the shared opening goes first)',
     'for block in reversed(table):            # a prefix', 'for block in table:            # a prefix', ''),
    ('q5', 'reuses the most recently freed block', 'block, old = free.popitem(last=False)',
     'block, old = free.popitem(last=True)', ''),
    ('q5', 'a hit on the whole prompt (nothing left to sample from)',
     'if len(prefix) == len(prompt):\n                break', 'if False:\n                break', ''),
    ('q5', 'leaves its hit blocks on the free list', 'del free[block]\n', 'pass\n', ''),
    ('q5', 'forgets the output tokens\' blocks', 'need = -(-(len(prompt) + output_len) // block_size)',
     'need = -(-len(prompt) // block_size)', ''),
    ('q5', 'a newer copy replaces the cached block', 'if full[i] not in cached:            # (an',
     'if True:            # (an', ''),
]


(test_the_solution_scores_every_question, test_each_classic_mistake_loses_its_question,
 test_every_question_has_two_or_more_mistakes) = mutant_tests(EXERCISE, MUTANTS)


def test_the_visible_check_rejects_an_allocator_that_only_raises():
    from servelab.grading import get_question, grade_question

    class OnlyRaises:
        def __init__(self, num_blocks):
            raise ValueError("no")

    q1 = get_question(EXERCISE, "q1")
    assert not grade_question(q1, OnlyRaises, include_hidden=False).passed
