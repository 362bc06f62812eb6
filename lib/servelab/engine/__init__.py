"""servelab.engine: a small continuous-batching inference engine.

One responsibility per file, read in this order:

* ``config.py``       - the knobs (vLLM names).
* ``sequence.py``     - a request's state, and the outputs it reports.
* ``scheduler.py``    - who computes which tokens each step: budget, seats,
  chunked prefill, prefix hits, preemption by recompute.
* ``model_runner.py`` - THE step preparation (``prepare_step``) and one forward pass of
  the model's own layers over a ragged batch, attention reading a paged step context.
* ``sampler.py``      - the next token per sequence (greedy, temperature, top-k/p, seeds).
* ``stop.py``         - when a sequence ends (end/stop tokens, stop strings, length),
  shared with ``servelab.generate``.
* ``detokenizer.py``  - ids to text, a token at a time.
* ``engine.py``       - ``LLMEngine``: add_request / step / abort_request, stop rules, streaming.
* ``llm.py``          - ``LLM``: offline ``generate`` in vLLM's shape.
* ``executor.py``     - the engine on many processes (``tensor_parallel_size``): rank 0
  plans and samples, every rank runs its shard of the model.
* ``static.py``       - the static-batching baseline, for comparison.
* ``toy.py``          - a model-free runner for tests and demos.
* ``profile.py``      - ``python -m servelab.engine.profile``: where a step's time goes.
"""
from servelab.engine.config import EngineConfig
from servelab.engine.engine import LLMEngine, StepStats
from servelab.engine.executor import EngineDeadError, TensorParallelExecutor
from servelab.engine.llm import LLM, load_tokenizer
from servelab.engine.model_runner import ModelRunner, StepInput, prepare_step
from servelab.engine.scheduler import Scheduler, SchedulerOutput, ScheduledSequence
from servelab.engine.sequence import (CompletionOutput, RequestMetrics, RequestOutput, Sequence,
                                      SequenceStatus)
from servelab.engine.static import StaticBatchEngine
from servelab.engine.toy import ToyRunner, toy_greedy_generate, toy_logits

__all__ = [
    "EngineConfig", "LLMEngine", "StepStats", "LLM", "load_tokenizer", "ModelRunner", "StepInput",
    "prepare_step", "Scheduler", "SchedulerOutput", "ScheduledSequence", "CompletionOutput",
    "RequestMetrics", "RequestOutput", "Sequence", "SequenceStatus", "StaticBatchEngine",
    "ToyRunner", "toy_greedy_generate", "toy_logits", "SamplingParams", "EngineDeadError",
    "TensorParallelExecutor",
]


def __getattr__(name):
    if name == "SamplingParams":  # convenience: the engine's params live in servelab.sampling
        from servelab.sampling import SamplingParams
        return SamplingParams
    raise AttributeError(f"module 'servelab.engine' has no attribute {name!r}")
