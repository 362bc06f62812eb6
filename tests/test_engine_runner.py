"""The runner runs the model's own layers over a step context: several logits rows per
sequence, the fresh-prompt path, kv_dtype converting only gathered blocks, start-up
checks of the context and the pool, and LLM(quantization=)."""
import importlib.util

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from servelab.engine import LLM, EngineConfig, LLMEngine, ModelRunner, prepare_step
from servelab.engine.scheduler import ScheduledSequence, SchedulerOutput
from servelab.engine.sequence import Sequence
from servelab.model import LlamaConfig, LlamaModel
from servelab.paged import KVCacheManager
from servelab.sampling import SamplingParams

VOCAB = 64
CONFIG = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)


def small_model(dtype=torch.float64):
    return LlamaModel(LlamaConfig(**CONFIG)).init_weights(std=0.3, seed=0).to(dtype).eval()


def full_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids]))[0].float()


def schedule(kv, seqs_and_counts):
    """A plan by hand: (sequence, new tokens, logits rows); blocks allocated for them."""
    plan = SchedulerOutput()
    for seq, n, k in seqs_and_counts:
        assert kv.allocate(seq.block_table, seq.num_computed_tokens + n)
        plan.scheduled.append(ScheduledSequence(seq, n, num_logits=k))
    return plan


def commit(plan):
    for s in plan.scheduled:
        s.seq.num_computed_tokens += s.num_new_tokens


def test_several_logits_rows_of_one_sequence_in_one_step():
    model = small_model()
    runner = ModelRunner(model, num_blocks=32, block_size=4)
    kv = KVCacheManager(32, 4, enable_prefix_caching=False)
    a = Sequence("a", list(range(1, 12)), SamplingParams(), 4)
    b = Sequence("b", [5, 6, 7], SamplingParams(), 4)
    plan = schedule(kv, [(a, 7, 0), (b, 3, 1)])          # a: first chunk, no logits; b: whole prompt
    runner.execute(prepare_step(plan))
    commit(plan)
    b.token_ids.append(9)
    plan = schedule(kv, [(a, 4, 3), (b, 1, 1)])           # a: the rest, the last 3 rows scored
    step = prepare_step(plan)
    assert step.num_decode_rows == 1 and step.logits_per_seq == [3, 1]
    logits = runner.execute(step)
    assert logits.shape == (4, VOCAB)
    ref_a, ref_b = full_logits(model, a.token_ids), full_logits(model, b.token_ids)
    assert torch.allclose(logits[:3], ref_a[-3:], atol=1e-6)
    assert torch.allclose(logits[3], ref_b[-1], atol=1e-6)
    with pytest.raises(ValueError, match="num_logits"):
        ScheduledSequence(b, 1, num_logits=2)


def test_the_runner_calls_the_models_own_layers():
    model = small_model()
    calls = []
    hooks = [layer.register_forward_hook(lambda *_: calls.append(1)) for layer in model.layers]
    hooks += [layer.self_attn.register_forward_hook(lambda *_: calls.append(2)) for layer in model.layers]
    eng = LLMEngine.from_model(model, block_size=4, num_kv_blocks=32)
    eng.add_request("r", [1, 2, 3], SamplingParams(temperature=0, max_tokens=3))
    eng.run_to_completion()
    for h in hooks:
        h.remove()
    assert calls.count(1) == calls.count(2) == 3 * len(model.layers)  # 3 steps, every layer


class _ToCopies(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.sizes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.__name__.startswith(("_to_copy", "to.")):
            self.sizes.append(args[0].numel())
        return func(*args, **(kwargs or {}))


def test_a_low_precision_pool_converts_only_the_gathered_blocks():
    model = small_model(torch.float32)
    num_blocks, bs = 64, 4
    eng = LLMEngine.from_model(model, block_size=bs, num_kv_blocks=num_blocks, kv_dtype=torch.bfloat16)
    eng.add_request("r", list(range(1, 10)), SamplingParams(temperature=0, max_tokens=3))
    eng.step()  # the prompt
    one_layer_k = num_blocks * bs * CONFIG["num_key_value_heads"] * (CONFIG["hidden_size"] // 4)
    with _ToCopies() as seen:
        eng.step()  # a decode: gathers 3 blocks per layer
    assert seen.sizes and max(seen.sizes) < one_layer_k // 4
    out = eng.run_to_completion()["r"]
    ref = [int(t) for t in full_logits(model, list(range(1, 10)))[-1:].argmax(-1)]
    assert out.token_ids[0] == ref[0]


def test_start_up_refuses_a_context_beyond_the_model_or_the_pool():
    model = small_model()
    with pytest.raises(ValueError, match="max_position_embeddings"):
        LLMEngine.from_model(model, block_size=4, num_kv_blocks=100, max_model_len=256)
    with pytest.raises(ValueError, match="raise num_kv_blocks to at least 32"):
        LLMEngine.from_model(model, block_size=4, num_kv_blocks=20, max_model_len=128)
    eng = LLMEngine.from_model(model, block_size=4, num_kv_blocks=20)  # default: what the pool holds
    assert eng.config.max_model_len == 80
    assert LLMEngine.from_model(model, block_size=4, num_kv_blocks=64).config.max_model_len == 128


@pytest.mark.skipif(importlib.util.find_spec("servelab.quant") is None, reason="servelab.quant not written yet")
def test_llm_quantization_option_quantizes_the_model():
    from servelab import quant

    class Chars:
        def encode(self, text):
            return [ord(c) % VOCAB for c in text]

        def decode(self, ids):
            return "".join(chr(97 + i % 26) for i in ids)
    model = LlamaModel(LlamaConfig(**dict(CONFIG, hidden_size=128, intermediate_size=256))).init_weights(seed=0)
    llm = LLM(model, Chars(), block_size=4, num_kv_blocks=64, quantization="int8")
    assert quant.is_quantized(llm.model)
    out = llm.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=4))[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 4


def test_llm_quantization_without_the_module_names_the_problem(monkeypatch):
    import builtins
    real_import = builtins.__import__

    def no_quant(name, *args, **kwargs):
        if name == "servelab.quant":
            raise ImportError("no module named servelab.quant")
        return real_import(name, *args, **kwargs)
    monkeypatch.setattr(builtins, "__import__", no_quant)
    with pytest.raises(ValueError, match="quantization"):
        LLM(small_model(torch.float32), block_size=4, num_kv_blocks=64, quantization="int8")
