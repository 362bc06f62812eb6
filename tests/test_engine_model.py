"""The engine on a real (random-weight) Llama model.

Greedy tokens must not depend on how the engine got there: paged vs contiguous
cache, prefix caching on or off, any chunk size, forced preemption, any batch
composition or arrival order. The model runs in float64 so that the different
(but mathematically equal) summation orders of batched and single runs can
never flip an argmax.
"""
import random

import pytest
import torch

from servelab.engine import LLM, EngineConfig, LLMEngine, ModelRunner, StaticBatchEngine
from servelab.engine.model_runner import StepInput
from servelab.model import LlamaConfig, LlamaModel, save_pretrained
from servelab.paged import BlockTable

from servelab.generation import generate
from servelab.sampling import SamplingParams

VOCAB = 64
CONFIG = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return LlamaModel(LlamaConfig(**CONFIG)).init_weights(std=0.3, seed=0).double().eval()


def reference_greedy(model, prompt, n):
    """One request, the model's own contiguous KV cache, one token at a time."""
    cache = model.new_cache(1, max_len=len(prompt) + n)
    out = []
    with torch.no_grad():
        logits = model(torch.tensor([prompt]), cache=cache)
        for _ in range(n):
            t = int(logits[0, -1].argmax())
            out.append(t)
            logits = model(torch.tensor([[t]]), cache=cache)
    return out


def workload(seed, n=8, shared_prefix=0):
    rng = random.Random(seed)
    prefix = [rng.randrange(VOCAB) for _ in range(shared_prefix)]
    return [(prefix + [rng.randrange(VOCAB) for _ in range(rng.randint(1, 30))], rng.randint(1, 24))
            for _ in range(n)]


@pytest.fixture(scope="module")
def expected(model):
    reqs = workload(0, shared_prefix=20)
    return reqs, [reference_greedy(model, p, n) for p, n in reqs]


def run(model, reqs, order=None, **config):
    config.setdefault("block_size", 4)
    config.setdefault("num_kv_blocks", 200)
    eng = LLMEngine.from_model(model, **config)
    order = order or list(range(len(reqs)))
    for i in order:
        p, n = reqs[i]
        eng.add_request(str(i), p, SamplingParams(temperature=0.0, max_tokens=n))
    final = eng.run_to_completion()
    assert eng.scheduler.kv.allocator.num_used == 0
    return [final[str(i)].token_ids for i in range(len(reqs))], eng


def test_runner_logits_equal_the_full_forward(model):
    """A ragged step (a chunk, a whole prompt, a decode) gives the model's own logits."""
    m32 = LlamaModel(LlamaConfig(**CONFIG)).init_weights(std=0.3, seed=0).eval()
    runner = ModelRunner(m32, num_blocks=30, block_size=4)
    rng = random.Random(1)
    seqs = [[rng.randrange(VOCAB) for _ in range(n)] for n in (13, 6, 9)]
    free = list(range(30))
    rng.shuffle(free)
    tables = [BlockTable(4, [free.pop() for _ in range(4)]) for _ in seqs]
    # step 1: first 8 tokens of seq 0, all of seq 1, first 8 of seq 2
    # step 2: rest of seq 0 (5 tokens), nothing for seq 1, last token of seq 2 (a decode-shaped row)
    plans = [[(0, 0, 8), (1, 0, 6), (2, 0, 8)], [(0, 8, 13), (2, 8, 9)]]
    for plan in plans:
        step = StepInput([], [], [], [], [], [], [])
        for i, a, b in plan:
            step.input_ids += seqs[i][a:b]
            step.positions += list(range(a, b))
            step.slot_mapping += tables[i].slots(a, b)
            step.query_lens.append(b - a)
            step.context_lens.append(b)
            step.block_tables.append(tables[i].block_ids)
            step.sample_rows.append(len(step.input_ids) - 1)
        logits = runner.execute(step)
        for row, (i, a, b) in enumerate(plan):
            with torch.no_grad():
                full = m32(torch.tensor([seqs[i][:b]]))[0, -1]
            torch.testing.assert_close(logits[row], full, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("prefix", [True, False])
@pytest.mark.parametrize("chunk", [1, 7, 64, None])
def test_greedy_tokens_do_not_depend_on_chunking_or_prefix_caching(model, expected, prefix, chunk):
    reqs, want = expected
    got, eng = run(model, reqs, enable_prefix_caching=prefix, long_prefill_token_threshold=chunk,
                   max_num_seqs=4, max_num_batched_tokens=48)
    assert got == want
    if prefix:
        assert eng.scheduler.kv.prefix_cache.hits > 0


def test_forced_preemption_gives_the_same_tokens(model, expected):
    reqs, want = expected
    got, eng = run(model, reqs, num_kv_blocks=20, max_num_seqs=8)  # 80 slots for 8 requests
    assert eng.scheduler.num_preemptions > 0
    assert got == want


@pytest.mark.parametrize("seed", [1, 2])
def test_any_batch_composition_and_arrival_order(model, expected, seed):
    reqs, want = expected
    rng = random.Random(seed)
    order = list(range(len(reqs)))
    rng.shuffle(order)
    eng = LLMEngine.from_model(model, block_size=8, num_kv_blocks=100, max_num_seqs=rng.randint(2, 5))
    final = {}
    while order or eng.has_unfinished_requests():
        for _ in range(rng.randint(0, 3)):
            if order:
                i = order.pop()
                eng.add_request(str(i), reqs[i][0], SamplingParams(temperature=0.0, max_tokens=reqs[i][1]))
        final.update({o.request_id: o for o in eng.step() if o.finished})
    assert [final[str(i)].token_ids for i in range(len(reqs))] == want


def test_equal_to_servelab_generate(model, expected):
    reqs, want = expected
    for (prompt, n), tokens in zip(reqs, want):
        out = generate(model, CharTokenizer(), prompt, sampling=SamplingParams(temperature=0.0, max_tokens=n))
        assert out.token_ids == tokens


def test_static_baseline_gives_the_same_tokens(model, expected):
    reqs, want = expected
    cfg = EngineConfig(block_size=4, num_kv_blocks=200, max_num_seqs=3, max_model_len=256)
    eng = StaticBatchEngine(ModelRunner(model, 200, 4), cfg)
    for i, (p, n) in enumerate(reqs):
        eng.add_request(str(i), p, SamplingParams(temperature=0.0, max_tokens=n))
    final = eng.run_to_completion()
    assert [final[str(i)].token_ids for i in range(len(reqs))] == want
    assert eng.scheduler.num_prompt_padding_tokens > 0  # padding rows were computed and changed nothing


def test_seeded_sampling_is_independent_of_the_batch(model):
    params = SamplingParams(temperature=0.8, top_k=20, top_p=0.95, seed=7, max_tokens=15)

    def sample(others):
        eng = LLMEngine.from_model(model, block_size=4, num_kv_blocks=200)
        for j in range(others):
            eng.add_request(f"o{j}", [j + 1] * (j + 2), SamplingParams(temperature=1.0, max_tokens=20))
        eng.add_request("me", [5, 6, 7], params)
        return eng.run_to_completion()["me"].token_ids

    assert sample(0) == sample(4) == sample(7)


def test_kv_usage_waste_is_only_the_last_block_tail(model):
    eng = LLMEngine.from_model(model, block_size=4, num_kv_blocks=200, enable_prefix_caching=False)
    eng.add_request("a", list(range(10)), SamplingParams(temperature=0.0, max_tokens=30))
    eng.add_request("b", list(range(5)), SamplingParams(temperature=0.0, max_tokens=30))
    for _ in range(3):
        eng.step()
    usage = eng.kv_usage()
    # a: 12 computed -> 3 blocks (+1 reserved for the token being computed is allowed), b: 7 -> 2 blocks
    assert usage.used_slots == 12 + 7
    assert usage.reserved_slots - usage.used_slots < 2 * 4


# --------------------------------------------------------------------------- LLM API

class CharTokenizer:
    def encode(self, text):
        return [ord(c) % VOCAB for c in text]

    def decode(self, ids):
        return "".join(chr(48 + i) for i in ids)


def test_llm_generate_keeps_order_and_reports_errors(model):
    llm = LLM(model, CharTokenizer(), block_size=4, num_kv_blocks=50, max_num_seqs=4)
    prompts = ["hello", "x" * 300, "world", ""]
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=5))
    assert [o.finish_reason for o in outs] == ["length", "error", "length", "error"]
    assert "context" in outs[1].error and "empty" in outs[3].error
    assert outs[0].token_ids == reference_greedy(model, CharTokenizer().encode("hello"), 5)
    assert outs[0].text == CharTokenizer().decode(outs[0].token_ids)
    assert outs[2].metrics.ttft >= 0 and len(outs[2].metrics.token_times) == 5


def test_llm_loads_a_checkpoint_folder(tmp_path, model):
    m32 = LlamaModel(LlamaConfig(**CONFIG)).init_weights(std=0.3, seed=0)
    save_pretrained(m32, tmp_path / "ckpt")
    llm = LLM(str(tmp_path / "ckpt"), tokenizer=CharTokenizer(), block_size=8)
    assert llm.config.max_model_len == 256
    assert llm.config.num_kv_blocks == min(64 * 256, LLM.DEFAULT_POOL_TOKENS) // 8
    out = llm.generate("abc", SamplingParams(temperature=0.0, max_tokens=4))[0]
    assert len(out.token_ids) == 4 and out.finish_reason == "length"


@pytest.mark.parametrize("n", [0, 3])
def test_logprobs_equal_generate_even_after_preemption(model, expected, n):
    reqs, want = expected
    eng = LLMEngine.from_model(model, block_size=4, num_kv_blocks=20, max_num_seqs=8)  # forces preemption
    for i, (p, k) in enumerate(reqs):
        eng.add_request(str(i), p, SamplingParams(temperature=0.0, max_tokens=k, logprobs=n))
    final = eng.run_to_completion()
    assert eng.scheduler.num_preemptions > 0
    for i, (p, k) in enumerate(reqs):
        out = final[str(i)].outputs[0]
        ref = generate(model, CharTokenizer(), p, sampling=SamplingParams(temperature=0.0, max_tokens=k, logprobs=n))
        assert out.token_ids == ref.token_ids
        assert len(out.logprobs) == len(out.token_ids)
        assert out.logprobs == pytest.approx(ref.logprobs, abs=1e-9)
        if n:
            assert [[t for t, _ in alts] for alts in out.top_logprobs] == \
                   [[t for t, _ in alts] for alts in ref.top_logprobs]
            assert all(alts[0][0] == tok for alts, tok in zip(out.top_logprobs, out.token_ids))  # greedy
        else:
            assert out.top_logprobs is None


def test_no_logprobs_unless_asked(model):
    eng = LLMEngine.from_model(model, block_size=4, num_kv_blocks=50)
    eng.add_request("a", [1, 2, 3], SamplingParams(temperature=0.0, max_tokens=4))
    out = eng.run_to_completion()["a"].outputs[0]
    assert out.logprobs is None and out.top_logprobs is None
