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
import os
from pathlib import Path

from servelab.engine.engine import LLMEngine
from servelab.engine.sequence import CompletionOutput, RequestOutput

__all__ = ["LLM", "load_tokenizer", "normalize_prompts"]

# The keys of vLLM's prompt dicts (TextPrompt, TokensPrompt) that this engine runs.
_PROMPT_KEYS = ("prompt", "prompt_token_ids", "cache_salt")
_FORMS = ('a string, a list of token ids, {"prompt": "..."} or {"prompt_token_ids": [...]}, '
          'or a list of these')


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

    Two of ``vllm.LLM``'s arguments are accepted under vLLM's names, so a script
    written for vLLM runs here unchanged: ``skip_tokenizer_init=True`` (no
    tokenizer: prompts are token ids, outputs carry ids and empty text) and
    ``num_gpu_blocks_override`` (the KV pool's blocks, same as ``num_kv_blocks``).

    ``tensor_parallel_size=N`` splits the model over N processes, as vLLM does
    (:mod:`servelab.engine.executor`): this process plans, samples and runs shard
    0; N-1 workers run the others. Same tokens as one process. A size that does
    not divide the model's heads is refused with the sizes that work; so are
    quantization, speculative decoding and ``enforce_eager=False``, which the
    split does not run yet. Under torchrun (``distributed_executor_backend``
    ``None`` or ``"torchrun"``), ``LLM(...)`` returns on rank 0 only: on the other
    ranks it serves as a worker and then exits the process. ``shutdown()`` stops
    the workers; ``tensor_parallel_timeout_s`` (default 60) is how long a silent
    worker may take before the engine is declared dead (:class:`EngineDeadError`).
    """

    DEFAULT_POOL_TOKENS = 32_768

    def __init__(self, model, tokenizer=None, *, block_size: int = 16, num_kv_blocks: int | None = None,
                 max_num_seqs: int = 64, max_num_batched_tokens: int = 2048,
                 enable_prefix_caching: bool = True, enable_chunked_prefill: bool = True,
                 long_prefill_token_threshold: int | None = None, max_model_len: int | None = None,
                 dtype="float32", kv_dtype=None, seed: int = 0, quantization: str | None = None,
                 speculative_config: dict | None = None, enforce_eager: bool = True,
                 skip_tokenizer_init: bool = False, num_gpu_blocks_override: int | None = None,
                 tensor_parallel_size: int = 1, distributed_executor_backend: str | None = None,
                 tensor_parallel_timeout_s: float | None = None):
        from servelab.model import LlamaModel, load_config, load_pretrained
        if num_gpu_blocks_override is not None:
            if num_kv_blocks is not None and num_kv_blocks != num_gpu_blocks_override:
                raise ValueError(f"num_kv_blocks={num_kv_blocks} and num_gpu_blocks_override="
                                 f"{num_gpu_blocks_override} disagree; they name the same pool, pass one")
            num_kv_blocks = num_gpu_blocks_override
        if skip_tokenizer_init and tokenizer is not None:
            raise ValueError("skip_tokenizer_init=True with a tokenizer given; drop one of them")
        folder = None
        if tensor_parallel_size != 1:
            _refuse_for_tensor_parallel(tensor_parallel_size, quantization, speculative_config, enforce_eager)
            from servelab.engine.executor import check_tensor_parallel_size, run_worker, under_torchrun
            if not isinstance(model, LlamaModel):
                folder = Path(model)
            config = model.config if folder is None else load_config(folder)
            check_tensor_parallel_size(config, tensor_parallel_size)  # refused here, before any process starts
            if num_kv_blocks is None:
                num_kv_blocks = self._default_blocks(config, max_model_len, max_num_seqs, block_size)
            if (distributed_executor_backend in (None, "torchrun") and under_torchrun()
                    and int(os.environ["RANK"]) != 0):
                if folder is None:
                    raise ValueError("under torchrun every rank reads its shard from a checkpoint folder; "
                                     "pass the folder, not a LlamaModel")
                # a worker rank: serve rank 0's engine until it shuts down, then leave
                run_worker(folder, dtype=dtype, kv_dtype=kv_dtype, num_kv_blocks=num_kv_blocks,
                           block_size=block_size, timeout_s=tensor_parallel_timeout_s or 60.0)
                raise SystemExit(0)
            if tokenizer is None and not skip_tokenizer_init:
                tokenizer = load_tokenizer(folder)
            self.model = None  # the weights live in the ranks' shards
            self.tokenizer = tokenizer
            self.engine = LLMEngine.tensor_parallel(
                model, tokenizer, tensor_parallel_size=tensor_parallel_size, seed=seed, dtype=dtype,
                kv_dtype=kv_dtype, distributed_executor_backend=distributed_executor_backend,
                timeout_s=tensor_parallel_timeout_s, block_size=block_size, num_kv_blocks=num_kv_blocks,
                max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                enable_prefix_caching=enable_prefix_caching, enable_chunked_prefill=enable_chunked_prefill,
                long_prefill_token_threshold=long_prefill_token_threshold, max_model_len=max_model_len)
            self._ids = itertools.count()
            return
        if not isinstance(model, LlamaModel):
            folder = Path(model)
            model = load_pretrained(folder, dtype=dtype)
        if quantization is not None:
            model = _quantize(model, quantization)
        if tokenizer is None and not skip_tokenizer_init:
            tokenizer = load_tokenizer(folder)
        self.model = model
        self.tokenizer = tokenizer
        if num_kv_blocks is None:
            num_kv_blocks = self._default_blocks(model.config, max_model_len, max_num_seqs, block_size)
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
        """Outputs in the order of ``prompts``.

        ``prompts`` takes what ``vllm.LLM.generate`` takes: one prompt or a list of
        them, each a string, a list of token ids, ``{"prompt": str}`` (vLLM's
        ``TextPrompt``) or ``{"prompt_token_ids": [...]}`` (``TokensPrompt``); a dict
        may carry its own ``"cache_salt"``. Anything else raises ``ValueError``
        naming the prompt and the fix (:func:`normalize_prompts`).
        ``sampling_params`` is one :class:`~servelab.sampling.SamplingParams`
        for all prompts or a list with one per prompt.
        """
        items = normalize_prompts(prompts)
        prompts = [p for p, _ in items]
        if sampling_params is None:
            from servelab.sampling import SamplingParams
            sampling_params = SamplingParams()
        params = sampling_params if isinstance(sampling_params, (list, tuple)) else [sampling_params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"got {len(params)} sampling params for {len(prompts)} prompts; "
                             "pass one SamplingParams for all, or a list with one per prompt")
        salts = [salt if salt is not None else cache_salt for _, salt in items]
        results: list[RequestOutput | None] = [None] * len(prompts)
        ids = {}
        for i, (prompt, sp, salt) in enumerate(zip(prompts, params, salts)):
            rid = str(next(self._ids))
            try:
                self.engine.add_request(rid, prompt, sp, cache_salt=salt)
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
        for out, sp in zip(results, params):
            if not getattr(sp, "detokenize", True):  # vLLM's detokenize=False: ids only
                out.delta_text = ""
                for c in out.outputs:
                    c.text = ""
        return results

    @property
    def config(self):
        return self.engine.config

    def shutdown(self) -> None:
        """Stop the engine's worker processes (a tensor-parallel engine); safe to call twice."""
        self.engine.shutdown()

    @classmethod
    def _default_blocks(cls, config, max_model_len, max_num_seqs: int, block_size: int) -> int:
        """At least one full-length sequence always fits; at most ``DEFAULT_POOL_TOKENS`` slots."""
        context = max_model_len or config.max_position_embeddings
        pool = max(min(max_num_seqs * context, cls.DEFAULT_POOL_TOKENS), context)
        return -(-pool // block_size)


def normalize_prompts(prompts) -> list[tuple[str | list[int], str | None]]:
    """vLLM's prompt forms as ``[(text or token ids, cache salt or None), ...]``.

    One prompt (a string, a list of token ids, ``{"prompt": str}``,
    ``{"prompt_token_ids": list[int]}``) or a list (or tuple) of them, mixed
    freely; ``[]`` is no prompts. A list of ints is one token-id prompt; a list
    of lists is several. Anything else -- another type, a dict with neither key
    or with keys this engine does not run (``multi_modal_data``, ...), a token
    that is not an int -- raises ``ValueError`` that names the prompt and the
    fix, before anything is queued. Content checks (empty, too long, ids outside
    the vocabulary) stay per request: such a prompt comes back as an error output.
    """
    if isinstance(prompts, (str, dict)) or (isinstance(prompts, (list, tuple)) and prompts
                                            and _is_number(prompts[0])):
        return [_one_prompt(prompts, None)]
    if not isinstance(prompts, (list, tuple)):
        raise ValueError(f"prompts must be {_FORMS}; got {type(prompts).__name__}"
                         + (" (a lazy iterable: pass list(...) of it)" if hasattr(prompts, "__iter__") else ""))
    return [_one_prompt(p, i) for i, p in enumerate(prompts)]


def _is_number(x) -> bool:  # a list starting with one is meant as token ids
    import numbers
    return isinstance(x, numbers.Number) and not isinstance(x, bool)


def _is_token(x) -> bool:
    import numbers
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _one_prompt(p, index: int | None) -> tuple[str | list[int], str | None]:
    where = "prompt" if index is None else f"prompts[{index}]"
    if isinstance(p, str):
        return p, None
    if isinstance(p, dict):
        unknown = sorted(str(k) for k in p if k not in _PROMPT_KEYS)
        if unknown:
            raise ValueError(f"{where} has keys this engine does not run: {unknown}; a prompt dict "
                             f"takes only {list(_PROMPT_KEYS)} (text models, no multimodal input)")
        salt = p.get("cache_salt")
        if salt is not None and not isinstance(salt, str):
            raise ValueError(f"{where}['cache_salt'] must be a string, got {type(salt).__name__}")
        if "prompt_token_ids" in p:  # vLLM's TokensPrompt; a "prompt" beside it is only a label
            ids = p["prompt_token_ids"]
            if not isinstance(ids, (list, tuple)):
                raise ValueError(f"{where}['prompt_token_ids'] must be a list of token ids, "
                                 f"got {type(ids).__name__}")
            return _token_list(ids, f"{where}['prompt_token_ids']"), salt
        if "prompt" in p:  # vLLM's TextPrompt
            if not isinstance(p["prompt"], str):
                raise ValueError(f"{where}['prompt'] must be a string, got {type(p['prompt']).__name__}; "
                                 f"token ids go under 'prompt_token_ids'")
            return p["prompt"], salt
        raise ValueError(f"{where} is a dict with neither 'prompt' nor 'prompt_token_ids'; "
                         f"write {{'prompt': text}} or {{'prompt_token_ids': [ids]}}")
    if isinstance(p, (list, tuple)):
        return _token_list(p, where), None
    raise ValueError(f"{where} must be {_FORMS}; got {type(p).__name__}")


def _token_list(ids, where: str) -> list[int]:
    bad = next((i for i, t in enumerate(ids) if not _is_token(t)), None)
    if bad is not None:
        raise ValueError(f"{where}[{bad}] is {ids[bad]!r} ({type(ids[bad]).__name__}), not a token id; "
                         f"a token-id prompt is a flat list of ints (several prompts: a list of such lists)")
    return [int(t) for t in ids]


def _refuse_for_tensor_parallel(size, quantization, speculative_config, enforce_eager) -> None:
    """What a split engine does not run yet, refused before any process starts, with the reason."""
    if quantization is not None:
        raise ValueError(f"quantization={quantization!r} with tensor_parallel_size={size}: the shards are "
                         "cut from the full-precision checkpoint and the quantized layers have no split "
                         "form yet; pass quantization=None or tensor_parallel_size=1")
    if speculative_config is not None:
        raise ValueError(f"speculative decoding with tensor_parallel_size={size}: the draft model would "
                         "need its own split and K/V pools on every rank, which this engine does not "
                         "build yet; drop speculative_config or use tensor_parallel_size=1")
    if not enforce_eager:
        raise ValueError(f"enforce_eager=False with tensor_parallel_size={size}: the compiled step has no "
                         "place for the collectives between layers yet; keep enforce_eager=True")


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
