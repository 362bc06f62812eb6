"""A model-free runner that still reads its past through the paged cache.

:class:`ToyRunner` stores each token's *id* in its pool slot (in place of K/V)
and scores the next token from the context it reads back through the block
table. If paging, prefix reuse, chunking or preemption ever handed a sequence
the wrong slots, the context it reads would differ from its real tokens and its
output would change. So the scheduler can be tested, and shown in a chapter,
in milliseconds and without a model: the expected output is simply
:func:`toy_logits` applied to the true token list.
"""
from __future__ import annotations

import hashlib

import torch

from servelab.engine.model_runner import StepInput

__all__ = ["toy_logits", "toy_greedy_generate", "ToyRunner"]


def toy_logits(context: list[int], vocab_size: int) -> torch.Tensor:
    """Pseudo-random logits that depend on the whole context (order included)."""
    digest = hashlib.blake2b(repr(context).encode(), digest_size=8).digest()
    g = torch.Generator().manual_seed(int.from_bytes(digest, "little") & (2**63 - 1))
    return torch.randn(vocab_size, generator=g) * 3


def toy_greedy_generate(prompt: list[int], max_tokens: int, vocab_size: int,
                        eos_token_id: int | None = None) -> list[int]:
    """The reference: greedy decoding of the toy model, one request, no cache."""
    tokens, out = list(prompt), []
    for _ in range(max_tokens):
        t = int(toy_logits(tokens, vocab_size).argmax())
        out.append(t)
        tokens.append(t)
        if t == eos_token_id:
            break
    return out


class ToyRunner:
    """Same interface as :class:`~servelab.engine.model_runner.ModelRunner`."""

    def __init__(self, num_blocks: int, block_size: int, vocab_size: int = 50):
        self.block_size = block_size
        self.vocab_size = vocab_size
        self.pool = [-1] * (num_blocks * block_size)
        self.steps: list[StepInput] = []  # every step it ran, for inspection

    def execute(self, step: StepInput) -> torch.Tensor:
        self.steps.append(step)
        for slot, token in zip(step.slot_mapping, step.input_ids):
            self.pool[slot] = token
        bs = self.block_size
        # the sequence (in row order) each row belongs to, to read its context back
        owner, row = [], 0
        for i, n in enumerate(step.query_lens):
            owner.extend([i] * n)
            row += n
        starts = [sum(step.query_lens[:i]) for i in range(len(step.query_lens))]
        logits = []
        for r in step.sample_rows:  # logits in the order asked for
            i = owner[r]
            ctx = step.context_lens[i] - step.query_lens[i] + (r - starts[i]) + 1
            blocks = step.block_tables[i]
            context = [self.pool[blocks[p // bs] * bs + p % bs] for p in range(ctx)]
            logits.append(toy_logits(context, self.vocab_size))
        if not logits:
            return torch.empty(0, self.vocab_size)
        return torch.stack(logits)
