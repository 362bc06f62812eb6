"""``LLM``: offline batch generation in vLLM's shape.

    from servelab import LLM, SamplingParams
    llm = LLM("data/models/servelab-main")
    outs = llm.generate(["def add(a, b):"], SamplingParams(temperature=0, max_tokens=32))
    outs[0].text, outs[0].token_ids, outs[0].finish_reason, outs[0].metrics.ttft

Everything is queued at once and the engine steps until all are done, so the
scheduler is free to batch, chunk and preempt as it likes. A request that can
never run (too long for the context or for the KV pool, empty, bad ids) comes
back as an output with ``finish_reason == "error"`` and a message in ``error``;
the others are unaffected.
"""
from __future__ import annotations

import itertools
from pathlib import Path

from servelab.engine.engine import LLMEngine
from servelab.engine.sequence import CompletionOutput, RequestOutput

__all__ = ["LLM", "load_tokenizer"]


def load_tokenizer(folder: str | Path | None):
    """The tokenizer stored with a checkpoint, else the course tokenizer."""
    from servelab import bpe
    if folder is not None:
        folder = Path(folder)
        for name in ("tokenizer.json", "servelab-bpe.json", "tokenizer.servelab.json"):
            if (folder / name).exists():
                return bpe.Tokenizer.load(folder / name)
    return bpe.load_course_tokenizer()


class LLM:
    """A model, its tokenizer and an engine, ready for ``generate``.

    ``model`` is a checkpoint folder (config.json + model.safetensors) or a
    :class:`servelab.model.LlamaModel`. ``quantization`` (a scheme name) has
    :func:`servelab.quant.quantize_model` replace the weights before the engine
    is built. Prompt strings may contain special tokens (chat markers), as
    vLLM's may (:func:`servelab.generation.encode_prompt`). ``num_kv_blocks`` defaults to enough
    blocks for every seat to reach ``max_model_len``, but at most
    ``DEFAULT_POOL_TOKENS`` slots (a laptop-sized pool; vLLM instead sizes it
    from the accelerator memory left after the weights).
    """

    DEFAULT_POOL_TOKENS = 32_768

    def __init__(self, model, tokenizer=None, *, block_size: int = 16, num_kv_blocks: int | None = None,
                 max_num_seqs: int = 64, max_num_batched_tokens: int = 2048,
                 enable_prefix_caching: bool = True, enable_chunked_prefill: bool = True,
                 long_prefill_token_threshold: int | None = None, max_model_len: int | None = None,
                 dtype="float32", kv_dtype=None, seed: int = 0, quantization: str | None = None,
                 speculative_config: dict | None = None, enforce_eager: bool = True):
        from servelab.model import LlamaModel, load_pretrained
        folder = None
        if not isinstance(model, LlamaModel):
            folder = Path(model)
            model = load_pretrained(folder, dtype=dtype)
        if quantization is not None:
            model = _quantize(model, quantization)
        if tokenizer is None:
            tokenizer = load_tokenizer(folder)
        self.model = model
        self.tokenizer = tokenizer
        if num_kv_blocks is None:  # at least one full-length sequence always fits
            context = max_model_len or model.config.max_position_embeddings
            pool = max(min(max_num_seqs * context, self.DEFAULT_POOL_TOKENS), context)
            num_kv_blocks = -(-pool // block_size)
        self.engine = LLMEngine.from_model(
            model, tokenizer, seed=seed, kv_dtype=kv_dtype, block_size=block_size,
            speculative_config=speculative_config, enforce_eager=enforce_eager,
            num_kv_blocks=num_kv_blocks, max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens, enable_prefix_caching=enable_prefix_caching,
            enable_chunked_prefill=enable_chunked_prefill,
            long_prefill_token_threshold=long_prefill_token_threshold, max_model_len=max_model_len)
        self._ids = itertools.count()

    def generate(self, prompts, sampling_params=None, *, cache_salt: str | None = None,
                 use_tqdm: bool = False) -> list[RequestOutput]:
        """Outputs in the order of ``prompts`` (strings or token-id lists).

        ``sampling_params`` is one :class:`~servelab.sampling.SamplingParams`
        for all prompts or a list with one per prompt.
        """
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        if sampling_params is None:
            from servelab.sampling import SamplingParams
            sampling_params = SamplingParams()
        params = sampling_params if isinstance(sampling_params, (list, tuple)) else [sampling_params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"got {len(params)} sampling params for {len(prompts)} prompts")
        results: list[RequestOutput | None] = [None] * len(prompts)
        ids = {}
        for i, (prompt, sp) in enumerate(zip(prompts, params)):
            rid = str(next(self._ids))
            try:
                self.engine.add_request(rid, prompt, sp, cache_salt=cache_salt)
                ids[rid] = i
            except ValueError as exc:
                results[i] = _error_output(rid, prompt, str(exc))
        bar = None
        if use_tqdm:
            from tqdm.auto import tqdm
            bar = tqdm(total=len(ids), desc="generate")
        while self.engine.has_unfinished_requests():
            for out in self.engine.step():
                if out.finished and out.request_id in ids:
                    results[ids[out.request_id]] = out
                    if bar is not None:
                        bar.update(1)
        if bar is not None:
            bar.close()
        return results

    @property
    def config(self):
        return self.engine.config


def _quantize(model, scheme: str):
    try:
        from servelab.quant import quantize_model
    except ImportError as exc:
        raise ValueError(f"quantization={scheme!r} needs servelab.quant.quantize_model, which "
                         f"this servelab does not have ({exc}); pass quantization=None") from exc
    return quantize_model(model, scheme)


def _error_output(request_id: str, prompt, message: str) -> RequestOutput:
    text = prompt if isinstance(prompt, str) else None
    ids = [] if isinstance(prompt, str) else list(prompt)
    return RequestOutput(request_id, text, ids, [CompletionOutput(0, "", [], "error")],
                         finished=True, error=message)
