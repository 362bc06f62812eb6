"""The engine's knobs, named as in vLLM, checked once."""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EngineConfig"]


@dataclass
class EngineConfig:
    """Scheduler and cache settings.

    * ``block_size`` - token slots per KV block.
    * ``num_kv_blocks`` - blocks in the pool (the KV memory, in blocks).
    * ``max_num_seqs`` - seats: sequences running at once.
    * ``max_num_batched_tokens`` - the token budget of one step (decodes count 1).
    * ``enable_chunked_prefill`` - let a prompt take several steps, sharing each
      step with the decodes, instead of waiting for a step with room for all of it.
    * ``long_prefill_token_threshold`` - most prompt tokens one sequence may
      compute in one step (the chunk size); ``None`` = only the budget limits it.
      Used only with chunked prefill.
    * ``enable_prefix_caching`` - reuse cached K/V blocks of earlier prompts.
    * ``max_model_len`` - longest prompt + output (the model's context).
    """

    block_size: int = 16
    num_kv_blocks: int = 512
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int | None = None
    enable_prefix_caching: bool = True
    max_model_len: int = 2048

    def __post_init__(self):
        for name in ("block_size", "num_kv_blocks", "max_num_seqs", "max_num_batched_tokens",
                     "max_model_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        t = self.long_prefill_token_threshold
        if t is not None and (not isinstance(t, int) or t <= 0):
            raise ValueError(f"long_prefill_token_threshold must be a positive integer or None, got {t!r}")

    @property
    def pool_tokens(self) -> int:
        return self.block_size * self.num_kv_blocks

    @property
    def max_sequence_len(self) -> int:
        """Longest sequence that can ever run: the context, or the whole pool if smaller."""
        return min(self.max_model_len, self.pool_tokens)
