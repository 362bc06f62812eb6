"""The tiny served model, and the engine builders the server tests run *inside* an engine-core
process (``EngineCoreClient("tiny", builder="server_builders:<name>")``).

Kept apart from the test modules on purpose: the core process imports this module to build
its engine, and a test module would bring pytest, httpx and FastAPI along (seconds per core
start on a small machine). Only torch and the library are imported here.
"""
import torch

from servelab.model import LlamaConfig, LlamaModel

#: A random-weight tiny Llama with the course tokenizer's vocabulary.
CONFIG = dict(vocab_size=4096, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
#: A request with this seed breaks the engine's step once it has 2 tokens (``failing_tiny_engine``).
FAIL_SEED = 4242


def tiny_model():
    """float64, so that batched and unbatched argmaxes agree and greedy text compares exactly."""
    torch.manual_seed(0)
    return LlamaModel(LlamaConfig(**CONFIG)).init_weights(std=0.3, seed=0).double().eval()


def tiny_engine(model=None, **options):
    """The tiny model served with the course tokenizer (``model`` is the client's label)."""
    from servelab.bpe import load_course_tokenizer
    from servelab.server.core import build_engine
    return build_engine(tiny_model(), load_course_tokenizer(), **options)


def picky_engine(model=None, **options):
    """A tiny engine whose sampler breaks for seed-13 requests after their third token
    (and, from then on, refuses them at the admission dry run)."""
    import servelab.sampling as sampling
    real = sampling.sample
    calls = {"n": 0}

    def picky(logits, params, generator=None):
        if params.seed == 13:
            calls["n"] += 1
            if calls["n"] > 4:  # the admission dry run and three tokens pass
                raise RuntimeError("this sampler broke on seed 13")
        return real(logits, params, generator)

    sampling.sample = picky
    return tiny_engine(model, **options)


def fail_steps_of_seed(engine):
    """Make ``engine.step()`` raise (a simulated kernel failure: the whole step fails)
    while a request seeded ``FAIL_SEED`` has decoded two tokens."""
    real = engine.step

    def step():
        if any(s.sampling_params.seed == FAIL_SEED and s.num_output_tokens >= 2
               for s in engine.requests.values()):
            raise RuntimeError("simulated kernel failure")
        return real()
    engine.step = step
    return engine


def failing_tiny_engine(model=None, **options):
    """The tiny engine, failing its steps for ``FAIL_SEED``."""
    return fail_steps_of_seed(tiny_engine(model, **options))


#: A request with this seed makes the engine unable to step (``dying_engine``).
DEATH_SEED = 999


def make_mortal(engine):
    """Make the engine die as a tensor-parallel engine does when a worker is killed: once a
    ``DEATH_SEED`` request runs, every step raises ``EngineDeadError`` and
    ``engine.errored`` is True."""
    from servelab.engine import EngineDeadError
    real = engine.step

    def step():
        if getattr(engine.runner, "dead", None) is None and any(
                s.sampling_params.seed == DEATH_SEED for s in engine.requests.values()):
            engine.runner.dead = "rank 1 (pid 4242) was killed by SIGKILL"
        if getattr(engine.runner, "dead", None) is not None:
            raise EngineDeadError(f"tensor-parallel worker {engine.runner.dead}")
        return real()
    engine.step = step
    return engine


def dying_engine(model=None, **options):
    """The tiny engine, dead for good once a ``DEATH_SEED`` request runs."""
    return make_mortal(tiny_engine(model, **options))
