"""LLMEngine: requests in, tokens out, one step at a time.

The loop a server drives::

    engine.add_request("r1", "Hello", SamplingParams(max_tokens=20), callback=print)
    while engine.has_unfinished_requests():
        for out in engine.step():   # one forward pass for every running request
            ...

One ``step()`` = the scheduler plans (who computes which tokens), the model
runner executes that plan in one batched forward pass, the sampler picks a
token for every sequence that caught up, and each such sequence is checked
against its stop conditions. Streaming callbacks get the new text as it becomes
safe to show.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable

import torch

from servelab.engine.config import EngineConfig
from servelab.engine.detokenizer import IncrementalDetokenizer
from servelab.engine.model_runner import prepare_step
from servelab.engine.sampler import Sampler
from servelab.engine.scheduler import Scheduler
from servelab.engine.sequence import CompletionOutput, LazyRequestOutput, RequestOutput, Sequence
from servelab.engine.stop import StopChecker
from servelab.generation import encode_prompt
from servelab.sampling import SamplingParams

__all__ = ["LLMEngine", "StepStats"]

log = logging.getLogger("servelab.engine")


@dataclass
class StepStats:
    """What one step did (kept in ``engine.step_log`` for plots and tests)."""

    num_seqs: int
    num_batched_tokens: int
    num_prefill_tokens: int
    num_decodes: int
    num_preempted: int
    num_waiting: int
    kv_blocks_used: int
    duration: float


class LLMEngine:
    """The continuous-batching engine over any model runner.

    ``runner`` is a :class:`~servelab.engine.model_runner.ModelRunner` (a real
    model) or a :class:`~servelab.engine.toy.ToyRunner` (tests, demos).
    ``tokenizer`` needs ``encode(str)`` and ``decode(ids)``; without one, prompts
    must be token ids and outputs carry no text.
    """

    def __init__(self, runner, config: EngineConfig | None = None, tokenizer=None,
                 eos_token_ids=(), seed: int = 0, keep_step_log: bool = True,
                 spec_decoder=None):
        self.config = config or EngineConfig()
        self.runner = runner
        self.tokenizer = tokenizer
        self.eos_token_ids = frozenset(eos_token_ids)
        self.scheduler = Scheduler(self.config)
        self.sampler = Sampler(seed)
        self.requests: dict[str, Sequence] = {}
        self._callbacks: dict[str, Callable[[RequestOutput], object]] = {}
        self._detok: dict[str, IncrementalDetokenizer] = {}
        # n > 1: a parent request fans out into n child sequences (vLLM V1's ParentRequest)
        self._groups: dict[str, list[Sequence]] = {}    # parent id -> its children, by index
        self._deferred: dict[str, list[Sequence]] = {}  # children waiting for the first one's prompt
        self.keep_step_log = keep_step_log
        self.step_log: list[StepStats] = []
        self.num_steps = 0
        self._step_outputs: list[RequestOutput] | None = None  # set while a step runs
        self.spec_decoder = spec_decoder  # servelab.engine.spec_decode.SpecDecoder, or None

    @classmethod
    def from_model(cls, model, tokenizer=None, *, seed: int = 0, kv_dtype=None,
                   speculative_config=None, enforce_eager: bool = True, **config) -> "LLMEngine":
        """Build an engine (paged pool included) around a :class:`servelab.model.LlamaModel`.

        ``enforce_eager=False`` compiles the model's forward pass (``torch.compile``,
        attention left out of the graph: :class:`~servelab.engine.model_runner.ModelRunner`),
        vLLM's default; here eager is the default, because compiling takes seconds
        to minutes on a CPU, per process.

        ``max_model_len`` defaults to the model's ``max_position_embeddings``, or
        to the pool's size if that is smaller. Refused at start-up, with the fix
        named: a ``max_model_len`` above ``max_position_embeddings``, or a pool
        too small for one sequence of the ``max_model_len`` asked for.
        """
        from servelab.engine.model_runner import ModelRunner
        cfg = cls._engine_config(model.config, config)
        runner = ModelRunner(model, cfg.num_kv_blocks, cfg.block_size, kv_dtype=kv_dtype,
                             compile=not enforce_eager)
        eos = cls._eos(model.config, tokenizer)
        spec = None
        if speculative_config is not None:  # vLLM's dict: {"model": ..., "num_speculative_tokens": k}
            from servelab.engine.spec_decode import SpecDecoder
            spec = SpecDecoder(speculative_config, model, cfg.max_model_len)
        return cls(runner, cfg, tokenizer, eos_token_ids=eos, seed=seed, spec_decoder=spec)

    @classmethod
    def tensor_parallel(cls, model, tokenizer=None, *, tensor_parallel_size: int, seed: int = 0,
                        dtype="float32", kv_dtype=None, distributed_executor_backend: str | None = None,
                        timeout_s: float | None = None, **config) -> "LLMEngine":
        """An engine whose model is split over ``tensor_parallel_size`` processes
        (:class:`~servelab.engine.executor.TensorParallelExecutor`); same scheduler,
        sampler and outputs as :meth:`from_model`.

        ``model`` is a checkpoint folder (each rank reads its own slices) or a
        :class:`servelab.model.LlamaModel`. ``timeout_s`` bounds each collective: a
        worker silent for that long is declared dead. Call :meth:`shutdown` (or let the
        process end) to stop the workers.
        """
        from servelab.engine.executor import DEFAULT_TP_TIMEOUT_S, TensorParallelExecutor
        from servelab.model import LlamaModel, _resolve_dtype, load_config
        model_config = model.config if isinstance(model, LlamaModel) else load_config(model)
        cfg = cls._engine_config(model_config, config)
        executor = TensorParallelExecutor(
            model, tensor_parallel_size, num_kv_blocks=cfg.num_kv_blocks, block_size=cfg.block_size,
            dtype=_resolve_dtype(dtype), kv_dtype=kv_dtype, backend=distributed_executor_backend,
            timeout_s=DEFAULT_TP_TIMEOUT_S if timeout_s is None else timeout_s)
        return cls(executor, cfg, tokenizer, eos_token_ids=cls._eos(model_config, tokenizer), seed=seed)

    @staticmethod
    def _eos(model_config, tokenizer) -> list[int]:
        eos = model_config.eos_token_ids
        if not eos and tokenizer is not None and getattr(tokenizer, "eot_token", None) is not None:
            eos = [tokenizer.eot_token]
        return eos

    @staticmethod
    def _engine_config(model_config, config: dict) -> EngineConfig:
        """The engine's settings checked against the model's context (see :meth:`from_model`)."""
        config = dict(config)
        limit = model_config.max_position_embeddings
        explicit = config.get("max_model_len") is not None
        if not explicit:  # the model's context, or what the pool holds if that is less
            probe = EngineConfig(**{**config, "max_model_len": limit})
            config["max_model_len"] = min(limit, probe.pool_tokens)
        cfg = EngineConfig(**config)
        if cfg.max_model_len > limit:
            raise ValueError(f"max_model_len={cfg.max_model_len} is above the model's "
                             f"max_position_embeddings={limit}; lower max_model_len")
        if cfg.pool_tokens < cfg.max_model_len:  # vLLM refuses this too, rather than cut requests short
            raise ValueError(f"the KV pool holds {cfg.pool_tokens} tokens ({cfg.num_kv_blocks} blocks of "
                             f"{cfg.block_size}), less than one sequence of max_model_len="
                             f"{cfg.max_model_len}; raise num_kv_blocks to at least "
                             f"{-(-cfg.max_model_len // cfg.block_size)} or lower max_model_len")
        return cfg

    # -- requests -------------------------------------------------------------
    def add_request(self, request_id: str, prompt: str | list[int], sampling_params=None, *,
                    arrival_time: float | None = None,
                    callback: Callable[[RequestOutput], object] | None = None,
                    cache_salt: str | None = None, n: int | None = None) -> Sequence:
        """Queue a request. Raises ``ValueError`` (and queues nothing) if it can never run.

        ``n`` (default: ``sampling_params.n`` if the params have it, else 1) asks
        for n completions of the one prompt, as vLLM V1 does it: the request fans
        out into n child sequences (ids ``"<id>#<i>"``; a seeded request's child i
        draws with ``seed + i``). The first child computes the prompt; the others
        are queued once its prompt is computed, so they find its full blocks in
        the prefix cache and share them. Outputs keep the parent's id and say
        which completion they carry (``out.index``); the finished output holds
        all n completions, in index order.
        """
        if sampling_params is None:
            sampling_params = SamplingParams()
        if not isinstance(sampling_params, SamplingParams):
            raise TypeError(f"sampling_params must be a servelab.sampling.SamplingParams, "
                            f"got {type(sampling_params).__name__}")
        sampling_params.validate()  # fields may have been changed since construction
        if n is None:
            n = getattr(sampling_params, "n", 1)
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"n (completions per prompt) must be an integer >= 1, got {n!r}")
        if request_id in self.requests or request_id in self._groups or (
                n > 1 and any(f"{request_id}#{i}" in self.requests for i in range(n))):
            raise ValueError(f"request id {request_id!r} is already in use; pick a unique id")
        text = None
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this engine has no tokenizer: pass the prompt as a list of token ids")
            text, prompt_ids = prompt, encode_prompt(self.tokenizer, prompt)
        else:
            prompt_ids = [int(t) for t in prompt]
        self._validate(prompt_ids, sampling_params)
        seed = getattr(sampling_params, "seed", None)
        if arrival_time is None:
            arrival_time = time.perf_counter()
        children = []
        for i in range(n):
            sid = request_id if n == 1 else f"{request_id}#{i}"
            generator = torch.Generator().manual_seed(seed + i) if seed is not None else None
            seq = Sequence(sid, prompt_ids, sampling_params, self.config.block_size,
                           prompt=text, arrival_time=arrival_time, max_len=self.config.max_sequence_len,
                           cache_salt=cache_salt, generator=generator)
            seq.stop_checker = StopChecker(sampling_params, self.eos_token_ids, self.config.max_sequence_len)
            if n > 1:
                seq.parent_id, seq.index = request_id, i
            self.requests[sid] = seq
            if self.tokenizer is not None:
                self._detok[sid] = IncrementalDetokenizer(self.tokenizer)
            children.append(seq)
        if callback is not None:
            self._callbacks[request_id] = callback
        self.scheduler.add(children[0])
        if n > 1:
            self._groups[request_id] = children
            if self.config.enable_prefix_caching:  # the rest follow once the prompt is cached
                self._deferred[request_id] = children[1:]
            else:
                for seq in children[1:]:
                    self.scheduler.add(seq)
        return children[0]

    def _release_deferred(self) -> None:
        """Queue the children whose first sibling's prompt is now computed (and cached)."""
        for pid, rest in list(self._deferred.items()):
            first = self._groups[pid][0]
            if first.is_finished or first.num_computed_tokens >= first.num_prompt_tokens:
                del self._deferred[pid]
                for seq in rest:
                    if not seq.is_finished:
                        self.scheduler.add(seq)

    def _validate(self, prompt_ids: list[int], sp) -> None:
        cfg = self.config
        n = len(prompt_ids)
        if n == 0:
            raise ValueError("the prompt is empty; send at least one token")
        vocab = getattr(self.runner, "vocab_size", None)
        if vocab is not None and any(not 0 <= t < vocab for t in prompt_ids):
            bad = next(t for t in prompt_ids if not 0 <= t < vocab)
            raise ValueError(f"prompt token id {bad} is outside the vocabulary [0, {vocab})")
        if n >= cfg.max_model_len:
            raise ValueError(f"the prompt has {n} tokens but the model's context is {cfg.max_model_len} "
                             f"(max_model_len), leaving no room for output; shorten the prompt")
        if n >= cfg.pool_tokens:
            raise ValueError(f"the prompt has {n} tokens but the whole KV pool holds only "
                             f"{cfg.pool_tokens} ({cfg.num_kv_blocks} blocks of {cfg.block_size}); "
                             f"raise num_kv_blocks or shorten the prompt")
        if not cfg.enable_chunked_prefill and n > cfg.max_num_batched_tokens:
            raise ValueError(f"the prompt has {n} tokens, more than max_num_batched_tokens="
                             f"{cfg.max_num_batched_tokens}, and chunked prefill is off; enable it "
                             f"or raise the budget")
        if sp.stop and self.tokenizer is None:
            raise ValueError("stop strings need text, but this engine has no tokenizer; "
                             "use stop_token_ids or give the engine a tokenizer")

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Stop a request now (client went away); its blocks are freed at once.
        (For ``n > 1``: every unfinished completion of it.)

        Returns the request's final output (``finish_reason == "abort"``), or None
        if it had already finished. Called during a step (from a streaming
        callback), it returns None: that step's result reports the final output,
        so a request finishes exactly once for whoever drives ``step()``."""
        group = self._groups.get(request_id)
        live = ([s for s in group if not s.is_finished] if group is not None
                else [s for s in [self.requests.get(request_id)] if s is not None and not s.is_finished])
        if not live:
            return None
        for seq in live:
            self.scheduler.finish(seq, "abort")
        self._deferred.pop(request_id, None)
        out = self._output(live[-1])
        in_step = self._step_outputs is not None
        if in_step:  # called from a streaming callback: the step reports it, and only the step
            self._step_outputs.append(out)
        for seq in live[:-1]:
            self._forget(seq)
        self._release(live[-1], out)
        return None if in_step else out

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished() or bool(self._deferred)

    def get_num_unfinished_requests(self) -> int:
        return (len(self.scheduler.waiting) + len(self.scheduler.running)
                + sum(len(r) for r in self._deferred.values()))

    # -- the step ---------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Plan, run, sample, check stops. Returns an output per request that
        got a token or finished in this step."""
        t0 = time.perf_counter()
        if self._deferred:
            self._release_deferred()
        spec = self.spec_decoder
        drafts = spec.propose(self.scheduler.running, self.sampler.generator) if spec else {}
        plan = self.scheduler.schedule()
        if drafts:
            spec.fit_plan(plan, drafts, self.scheduler.running)
        if plan.is_empty:
            if self.has_unfinished_requests():  # admission checks make this unreachable
                raise RuntimeError("the scheduler planned nothing while requests are waiting; "
                                   "this is an engine bug, please report it")
            return []
        num_decodes = sum(1 for s in plan.scheduled
                          if s.num_new_tokens == 1 and s.start >= s.seq.num_prompt_tokens)
        num_decodes += sum(d.num_rows for d in drafts.values())  # a verify pass's rows decode too
        step = prepare_step(plan)
        logits = self.runner.execute(step)
        self.scheduler.commit(plan)
        sampling, rows, r = [], [], 0
        verifying = []  # (sequence, its drafts, its rows of logits)
        for s in plan.scheduled:  # logits come in plan order, num_logits rows each
            r += s.num_logits
            d = drafts.get(id(s.seq))
            if d is not None:
                verifying.append((s.seq, d, logits[r - s.num_logits:r]))
                continue
            if s.samples and s.num_logits:
                sampling.append(s.seq)
                rows.append(r - 1)  # a sequence samples from its last row
        if rows != list(range(r)):
            logits = logits[rows]
        tokens, failed = self._sample(logits, sampling) if sampling else ([], {})
        now = time.perf_counter()
        outputs = self._step_outputs = []
        try:
            for seq, token in zip(sampling, tokens):
                if seq.is_finished:  # aborted by a callback earlier in this step
                    continue
                if token is None:  # its sampling raised: it ends alone, with the reason
                    outputs.append(self._fail(seq, failed[seq.request_id]))
                    continue
                outputs.append(self._append_token(seq, token, now))
            for seq, d, seq_rows in verifying:
                if seq.is_finished:  # aborted by a callback: its drafts never count
                    del seq.token_ids[d.num_tokens_before:]
                    continue
                kept = spec.verify(seq, d, seq_rows, self.sampler.generator)
                for j, (token, lp, top) in enumerate(kept):  # one output per request, after its last token
                    if lp is not None:  # recorded token by token: a stop mid-run keeps ids and logprobs equal
                        seq.logprobs.append(lp)
                        if top is not None:
                            seq.top_logprobs.append(top)
                    out = self._append_token(seq, token, now, emit=j == len(kept) - 1)
                    if seq.is_finished:
                        break
                outputs.append(out)
                if not seq.is_finished:  # keep the K/V of the tokens kept, free the rest
                    self.scheduler.truncate(seq, seq.num_tokens)
        finally:
            self._step_outputs = None
        if self._deferred:  # prompts computed in this step: their siblings can queue now
            self._release_deferred()
        self.num_steps += 1
        if self.keep_step_log:
            self.step_log.append(StepStats(
                num_seqs=len(plan.scheduled), num_batched_tokens=plan.num_batched_tokens,
                num_prefill_tokens=plan.num_batched_tokens - num_decodes, num_decodes=num_decodes,
                num_preempted=len(plan.preempted), num_waiting=len(self.scheduler.waiting),
                kv_blocks_used=self.scheduler.kv.allocator.num_used, duration=now - t0))
        return outputs

    def _sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> tuple[list, dict[str, str]]:
        """One token per row, isolating requests whose sampling fails.

        The batched sampler runs first (the fast path). A row of NaN logits, or a
        per-request setting the sampler cannot handle, must end *that* request
        only: if the batch raises, every row is sampled again on its own, from
        the random states the batch started from (so the rows that succeed draw
        exactly what they would have drawn together), and the rows that raise
        get ``None`` and a message. NaN rows are caught before sampling
        (a greedy argmax over NaN would silently pick a token).
        """
        failed: dict[str, str] = {}
        nan_rows = torch.isnan(logits).any(dim=-1)
        if bool(nan_rows.any()):
            for i in nan_rows.nonzero().flatten().tolist():
                failed[seqs[i].request_id] = "the model produced NaN logits for this request"
        if not failed:
            states = self._rng_states(seqs)
            try:
                return self.sampler(logits, seqs), failed
            except Exception:  # noqa: BLE001 - find the culprit(s) row by row
                self._restore_rng(states, seqs)
        tokens: list = []
        for i, seq in enumerate(seqs):
            if seq.request_id in failed:
                tokens.append(None)
                continue
            n_lp = None if seq.logprobs is None else len(seq.logprobs)
            n_top = None if seq.top_logprobs is None else len(seq.top_logprobs)
            try:
                tokens.append(self.sampler(logits[i:i + 1], [seq])[0])
            except Exception as exc:  # noqa: BLE001 - this request alone fails
                if n_lp is not None:
                    del seq.logprobs[n_lp:]
                if n_top is not None:
                    del seq.top_logprobs[n_top:]
                failed[seq.request_id] = f"sampling failed for this request: {type(exc).__name__}: {exc}"
                tokens.append(None)
        return tokens, failed

    def _rng_states(self, seqs) -> list:
        """Random states of the generators these rows draw from (their own, or the engine's)."""
        states = []
        shared = False
        for s in seqs:
            if getattr(s.sampling_params, "temperature", 0) == 0:
                states.append(None)
            elif s.generator is not None:
                states.append(s.generator.get_state())
            else:
                states.append(None)
                shared = True
        return [self.sampler.generator.get_state() if shared else None, states]

    def _restore_rng(self, states, seqs) -> None:
        shared, own = states
        if shared is not None:
            self.sampler.generator.set_state(shared)
        for s, st in zip(seqs, own):
            if st is not None:
                s.generator.set_state(st)

    def _fail(self, seq: Sequence, message: str) -> RequestOutput:
        """End one request with ``finish_reason == "error"``; its blocks go back now."""
        self.scheduler.finish(seq, "error")
        seq.error = message
        out = self._output(seq)
        if seq.parent_id is None:  # one of n completions failing is that choice's finish reason
            out.error = message
        self._release(seq, out)
        return out

    def _append_token(self, seq: Sequence, token: int, now: float, emit: bool = True) -> RequestOutput | None:
        """Append one token and apply the stop rules. ``emit=False`` (a speculative
        run's tokens before its last) reports nothing unless the sequence finishes."""
        seq.token_ids.append(token)
        m = seq.metrics
        if m.first_token_time is None:
            m.first_token_time = now
        m.token_times.append(now)
        checker: StopChecker = seq.stop_checker
        n_out = seq.num_output_tokens
        hit = checker.check_token(token, n_out)  # end or stop token: kept in ids, not in text
        reason, stop_reason = hit if hit is not None else (None, None)
        detok = self._detok.get(seq.request_id)
        if detok is not None and hit is None:
            detok.add(token)
            seq.output_text = detok.text
            found = checker.check_text(seq.output_text, seq.emitted_text_len, n_out)
            if found is not None:
                end, stop_reason = found
                seq.output_text = seq.output_text[:end]
                reason = "stop"
        if reason is None:
            reason = checker.check_length(n_out, seq.num_tokens)
        if reason is not None:
            if detok is not None and not isinstance(stop_reason, str):
                detok.flush()  # the end: show any half-decoded character as is
                seq.output_text = detok.text
                # the flushed characters may complete a stop string: it still ends the text there
                found = checker.check_text(seq.output_text, seq.emitted_text_len, n_out)
                if found is not None:
                    end, stop_reason = found
                    seq.output_text = seq.output_text[:end]
                    reason = "stop"
            self.scheduler.finish(seq, reason, stop_reason)
        if not emit and not seq.is_finished:
            return None
        cb = self._callbacks.get(seq.parent_id or seq.request_id)
        out = self._output(seq, eager=cb is not None)
        if seq.is_finished:
            self._release(seq, out)
        elif cb is not None:
            try:
                cb(out)
            except Exception as exc:  # noqa: BLE001 - a broken callback ends its own request only
                return self._fail(seq, f"the request's callback raised {type(exc).__name__}: {exc}")
        return out

    # -- outputs ------------------------------------------------------------------
    @staticmethod
    def _holdback(seq: Sequence) -> int:
        """Characters not yet safe to stream: they might be the start of a stop string."""
        return 0 if seq.is_finished else seq.stop_checker.holdback

    def _output(self, seq: Sequence, eager: bool = True) -> RequestOutput:
        """What the request reports now: the new text and ids (the delta) and the
        whole output so far. ``eager=False`` (a running request no callback is
        waiting for) defers building the whole output until someone reads it."""
        text = seq.output_text
        safe = max(len(text) - self._holdback(seq), seq.emitted_text_len)
        delta_text = text[seq.emitted_text_len:safe]
        seq.emitted_text_len = safe
        n_out = seq.num_output_tokens
        delta_ids = seq.token_ids[seq.num_prompt_tokens + seq.emitted_token_count:]
        seq.emitted_token_count = n_out
        if not eager and not seq.is_finished:
            return LazyRequestOutput(seq, n_out, safe, delta_text, delta_ids)
        completion = self._completion(seq, safe)
        rid, finished, outputs = seq.request_id, seq.is_finished, [completion]
        if seq.parent_id is not None:  # one of n: the parent finishes with its last child
            group = self._groups[seq.parent_id]
            rid, finished = seq.parent_id, all(s.is_finished for s in group)
            if finished:
                outputs = [completion if s is seq else self._completion(s, s.emitted_text_len)
                           for s in group]
        return RequestOutput(rid, seq.prompt, seq.prompt_token_ids, outputs,
                             finished=finished, metrics=seq.metrics,
                             delta_text=delta_text, delta_token_ids=delta_ids, index=seq.index)

    @staticmethod
    def _completion(seq: Sequence, safe: int) -> CompletionOutput:
        text = seq.output_text
        return CompletionOutput(seq.index, text[:safe] if not seq.is_finished else text,
                                seq.output_token_ids, seq.finish_reason, seq.stop_reason,
                                None if seq.logprobs is None else list(seq.logprobs),
                                None if seq.top_logprobs is None else list(seq.top_logprobs))

    def _forget(self, seq: Sequence) -> None:
        """Drop a finished sequence's engine-side state (its blocks are already free)."""
        if self.spec_decoder is not None:
            self.spec_decoder.release(seq.request_id)
        self._detok.pop(seq.request_id, None)
        self.requests.pop(seq.request_id, None)

    def _release(self, seq: Sequence, out: RequestOutput) -> None:
        self._forget(seq)
        rid = out.request_id
        if out.finished:
            self._groups.pop(rid, None)
            self._deferred.pop(rid, None)
            cb = self._callbacks.pop(rid, None)
        else:  # one of n completions ended; its siblings go on
            cb = self._callbacks.get(rid)
        if cb is not None:
            try:
                cb(out)
            except Exception:  # noqa: BLE001 - the request is over; its callback's failure is its own
                log.warning("the final callback of request %s raised", seq.request_id, exc_info=True)

    # -- convenience ------------------------------------------------------------
    def run_to_completion(self) -> dict[str, RequestOutput]:
        """Step until every queued request is done; final output per request id."""
        final: dict[str, RequestOutput] = {}
        while self.has_unfinished_requests():
            for out in self.step():
                if out.finished:
                    final[out.request_id] = out
        return final

    def kv_usage(self):
        return self.scheduler.kv_usage()

    @property
    def errored(self) -> bool:
        """True once the engine cannot step any more (a tensor-parallel worker died or hung)."""
        return getattr(self.runner, "dead", None) is not None

    def shutdown(self) -> None:
        """Stop the runner's worker processes, if it has any (a tensor-parallel engine); safe to call twice."""
        stop = getattr(self.runner, "shutdown", None)
        if stop is not None:
            stop()
