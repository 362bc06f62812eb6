"""Many chips on one machine: tensor, pipeline, sequence and expert parallelism over ``torch.distributed``.

Every piece runs for real on several processes joined by gloo
(:func:`servelab.parallel.launch.launch`); the arithmetic of what they cost
lives in :mod:`servelab.comm` (pure Python).

* :mod:`~servelab.parallel.tensor` -- split each layer by heads and MLP width, two all-reduces per layer;
* :mod:`~servelab.parallel.collectives` -- a ring all-reduce written on send/recv, timed beside gloo's;
* :mod:`~servelab.parallel.pipeline` -- stages in processes, micro-batches, a measured timeline;
* :mod:`~servelab.parallel.ring` -- ring attention: K/V blocks passed around, merged by online softmax;
* :mod:`~servelab.parallel.experts` -- a mixture-of-experts layer and expert parallelism with all-to-all.
"""
from servelab.parallel.launch import free_port, launch
from servelab.parallel.tensor import (
    shard_config, tensor_parallel_generate, tensor_parallel_logits, run_tensor_parallel,
)

__all__ = ["free_port", "launch", "shard_config", "tensor_parallel_logits", "tensor_parallel_generate",
           "run_tensor_parallel"]
