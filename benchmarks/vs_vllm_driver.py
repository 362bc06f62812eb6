"""One engine, kept alive, timing the workloads ``bench_vs_vllm.py`` sends it (vLLM's offline API).

    python benchmarks/vs_vllm_driver.py vllm       # in .venv-vllm
    python benchmarks/vs_vllm_driver.py servelab   # in .venv

It reads one JSON command per line on stdin and answers one JSON line on
stdout (anything else it prints goes to stderr):

* ``{"op": "load", "model": DIR, "engine_args": {...}}``: builds
  ``LLM(model=DIR, skip_tokenizer_init=True, dtype="float32", **engine_args)``
  and answers the seconds it took;
* ``{"op": "run", "prompts": [[ids]], "max_tokens": [n]}``: one greedy
  ``generate`` over all prompts (``ignore_eos``, so each output is as long as
  asked); answers wall seconds, CPU seconds of this whole process (every
  thread: vLLM runs its engine core and worker in this process,
  ``VLLM_ENABLE_V1_MULTIPROCESSING=0``), output tokens and the token ids;
* ``{"op": "quit"}``.

The script is written for ``vllm.LLM``; the only line that differs between
the engines is the import. It runs under ``if __name__ == "__main__":``
because vLLM starts helper processes with ``spawn``.
"""
from __future__ import annotations

import json
import sys
import time


def main(engine: str) -> None:
    out = sys.stdout
    sys.stdout = sys.stderr  # engines' prints stay off the answer channel
    if engine == "vllm":
        import vllm
        from vllm import LLM, SamplingParams
        version = vllm.__version__
    else:
        import servelab
        from servelab import LLM, SamplingParams
        version = getattr(servelab, "__version__", "?")
    import torch
    llm = None

    def answer(obj):
        out.write(json.dumps(obj) + "\n")
        out.flush()

    answer({"ready": True, "engine": engine, "version": version, "torch": torch.__version__})
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "quit":
            break
        if cmd["op"] == "load":
            llm = None
            t0 = time.perf_counter()
            llm = LLM(model=cmd["model"], skip_tokenizer_init=True, dtype="float32", **cmd["engine_args"])
            answer({"load_s": time.perf_counter() - t0, "torch_threads": torch.get_num_threads()})
        elif cmd["op"] == "run":
            params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, detokenize=False)
                      for n in cmd["max_tokens"]]
            prompts = [{"prompt_token_ids": ids} for ids in cmd["prompts"]]
            c0, t0 = time.process_time(), time.perf_counter()
            outs = llm.generate(prompts, params, use_tqdm=False)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            ids = [list(o.outputs[0].token_ids) for o in outs]
            answer({"wall_s": wall, "cpu_s": cpu, "output_tokens": sum(map(len, ids)),
                    "prompt_tokens": sum(map(len, cmd["prompts"])), "token_ids": ids,
                    "torch_threads": torch.get_num_threads()})


if __name__ == "__main__":
    main(sys.argv[1])
