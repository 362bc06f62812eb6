"""The one face the app drives: :class:`EngineFront`.

The engine runs either as a thread of the API server
(:class:`~servelab.server.engine_loop.EngineLoop`) or in a process of its own
(:class:`~servelab.server.client.EngineCoreClient`). Both are engine fronts:
the app submits requests, aborts them, reads counters and starts and stops
the engine through this protocol alone, and never asks which one it has.
"""
from __future__ import annotations

from typing import Callable, Protocol, runtime_checkable

__all__ = ["EngineFront"]


@runtime_checkable
class EngineFront(Protocol):
    """An engine as the HTTP layer sees it. Every method is called from the event
    loop's thread, and every ``sink`` is called there too."""

    tokenizer: object             # the prompt tokenizer (encode, decode, special_tokens)
    info: dict                    # max_model_len, pool_tokens, num_kv_blocks, max_num_seqs, block_size, vocab_size
    metrics: object               # the app's ServerMetrics (set by create_app), or None
    on_lost: Callable[[str], object] | None  # called with the reason if the engine dies
    abort_log: list               # AbortRecord per abort applied
    num_engine_errors: int        # engine steps that raised
    steps: int                    # engine steps run

    @property
    def alive(self) -> bool: ...

    @property
    def draining(self) -> bool: ...

    @property
    def num_in_flight(self) -> int:
        """Requests submitted and not yet ended (this count is taken at submit)."""

    def submit(self, request_id: str, prompt_token_ids: list[int], sampling_params,
               sink: Callable, arrival_time: float | None = None, n: int = 1) -> None:
        """Queue a request; ``sink`` gets ``"admitted"`` (or an ``"error"``), then its outputs."""

    def abort(self, request_id: str) -> None: ...

    def begin_drain(self) -> None: ...

    def fail_all(self, status: int, message: str, code: str) -> None: ...

    def snapshot(self) -> dict: ...

    async def start(self) -> "EngineFront": ...

    async def astop(self) -> None: ...
