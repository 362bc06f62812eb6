"""One script for both engines: vLLM's offline API, run on ``vllm.LLM`` or ``servelab.LLM``.

    python tests/vllm_driver.py vllm     SPEC.json OUT.json   # in .venv-vllm
    python tests/vllm_driver.py servelab SPEC.json OUT.json   # in .venv

The script is written for ``vllm.LLM``; the only line that differs between the
engines is the import. ``tests/test_vs_vllm.py`` runs it in both and compares
the results; ``tests/test_llm_prompts.py`` runs it on servelab alone, so the
claim "a vLLM script runs unchanged on servelab" is tested even where vLLM is
not installed.

SPEC: ``{"engine_args": {...}, "models": [{"name", "path"}], "calls": [...]}``;
a call is ``{"name", "prompts": [token-id lists], "form": "tokens" | "dict"
| "mixed", "params": {...} or [{...} per prompt], "logprobs_k": int}``.
OUT: per model and call, per prompt, per completion: token ids, finish and
stop reasons, and the top ``logprobs_k`` (id, logprob) pairs per token.

vLLM's engine core starts in a spawned process, so the work sits under
``if __name__ == "__main__":``.
"""
from __future__ import annotations

import gc
import json
import sys
import time


def prompt_inputs(call):
    """The call's prompts in vLLM's input forms: TokensPrompt dicts or bare id lists."""
    form = call.get("form", "dict")
    out = []
    for i, ids in enumerate(call["prompts"]):
        as_dict = form == "dict" or (form == "mixed" and i % 2 == 0)
        out.append({"prompt_token_ids": ids} if as_dict else ids)
    return out


def top_logprobs(completion, k):
    """Per generated token, its k best (id, logprob) pairs, best first.

    vLLM reports a dict {token id: Logprob(logprob, rank, ...)} per token (the
    chosen token is always in it, with its own rank); servelab the same pairs as
    ``top_logprobs``. This reader is the one place the two output shapes differ.
    """
    if completion.logprobs is None or k == 0:
        return None
    rows = getattr(completion, "top_logprobs", None)
    if rows is not None:  # servelab
        return [[[int(t), float(lp)] for t, lp in row[:k]] for row in rows]
    return [[[int(t), float(lp.logprob)] for t, lp in sorted(d.items(), key=lambda kv: kv[1].rank)
             if lp.rank is not None and lp.rank <= k] for d in completion.logprobs]


def run(engine: str, spec: dict) -> dict:
    if engine == "vllm":
        import vllm
        from vllm import LLM, SamplingParams
        version = f"vllm {vllm.__version__}"
    else:
        import servelab
        from servelab import LLM, SamplingParams
        version = f"servelab {getattr(servelab, '__version__', '?')}"
    import torch
    result = {"engine": engine, "version": version, "torch": torch.__version__, "models": {}}
    for model in spec["models"]:
        t0 = time.perf_counter()
        llm = LLM(model=model["path"], skip_tokenizer_init=True, dtype="float32",
                  **spec.get("engine_args", {}))
        calls = {"load_s": round(time.perf_counter() - t0, 2)}
        preemptions = preemption_counter(llm)
        for call in spec["calls"]:
            t0 = time.perf_counter()
            p = call["params"]
            params = ([SamplingParams(**q, detokenize=False) for q in p] if isinstance(p, list)
                      else SamplingParams(**p, detokenize=False))
            outs = llm.generate(prompt_inputs(call), params, use_tqdm=False)
            k = call.get("logprobs_k", 0)
            calls[call["name"]] = {
                "seconds": round(time.perf_counter() - t0, 3),
                "outputs": [[{"token_ids": list(c.token_ids), "finish_reason": c.finish_reason,
                              "stop_reason": c.stop_reason, "top_logprobs": top_logprobs(c, k)}
                             for c in sorted(o.outputs, key=lambda c: c.index)] for o in outs]}
        calls["preemptions"] = preemptions()
        result["models"][model["name"]] = calls
        result["torch_threads"] = torch.get_num_threads()  # after the engine set itself up
        del llm
        gc.collect()
    return result


def preemption_counter(llm):
    """A callable giving how many preemptions the engine has made (a diagnostic that reads
    each engine's internals; it returns None where it cannot see them)."""
    engine = getattr(llm, "engine", None)
    if engine is not None and hasattr(engine, "scheduler"):  # servelab
        return lambda: engine.scheduler.num_preemptions
    try:  # vLLM with its engine core in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0)
        scheduler = llm.llm_engine.engine_core.engine_core.scheduler
        preempt = scheduler._preempt_request
    except AttributeError:
        return lambda: None
    count = [0]

    def counting(*args, **kwargs):
        count[0] += 1
        return preempt(*args, **kwargs)

    scheduler._preempt_request = counting
    return lambda: count[0]


if __name__ == "__main__":
    engine, spec_path, out_path = sys.argv[1:4]
    with open(spec_path) as f:
        spec = json.load(f)
    res = run(engine, spec)
    with open(out_path, "w") as f:
        json.dump(res, f)
