"""``n > 1`` in the engine: one request, n completions (vLLM V1's parent/child fan-out).

The first child computes the prompt; the others queue once it is cached and
share its full blocks (prefix-cache hits); outputs keep the parent's id, the
finished one holds all n completions in index order; every block comes back.
Model-free (ToyRunner) except the ``LLM.generate`` case.
"""
from dataclasses import dataclass

import pytest
import torch

from servelab.engine import LLM, EngineConfig, LLMEngine, ToyRunner, toy_greedy_generate
from servelab.sampling import SamplingParams

VOCAB = 26


@dataclass
class NParams(SamplingParams):
    """SamplingParams with vLLM's ``n`` field (the engine reads it when present)."""

    n: int = 1


def make_engine(num_blocks=64, block_size=4, **kw):
    cfg = EngineConfig(block_size=block_size, num_kv_blocks=num_blocks, max_model_len=128, **kw)
    return LLMEngine(ToyRunner(num_blocks, block_size, VOCAB), cfg)


def clean(engine):
    kv = engine.scheduler.kv
    kv.allocator.check_invariants()
    return (kv.allocator.num_used == 0 and not engine.has_unfinished_requests()
            and engine.requests == {} and engine._groups == {} and engine._deferred == {})


PROMPT = list(range(1, 14))  # 13 tokens: three full blocks of 4, one partial


def test_greedy_n2_gives_two_identical_completions_sharing_the_prompt_blocks():
    eng = make_engine()
    eng.add_request("p", PROMPT, SamplingParams(temperature=0, max_tokens=6), n=2)
    final = eng.run_to_completion()
    assert list(final) == ["p"]
    out = final["p"]
    assert [c.index for c in out.outputs] == [0, 1]
    want = toy_greedy_generate(PROMPT, 6, VOCAB)
    assert out.outputs[0].token_ids == out.outputs[1].token_ids == want
    pc = eng.scheduler.kv.prefix_cache
    assert pc.hits == 3  # the second child found the first one's three full prompt blocks
    assert clean(eng)


def test_seeded_n3_gives_distinct_reproducible_completions():
    def run():
        eng = make_engine()
        eng.add_request("p", PROMPT, SamplingParams(temperature=1.0, seed=5, max_tokens=12), n=3)
        out = eng.run_to_completion()["p"]
        assert clean(eng)
        return [c.token_ids for c in out.outputs]

    a, b = run(), run()
    assert a == b and len({tuple(x) for x in a}) == 3
    # child i draws like a single request seeded seed + i
    eng = make_engine()
    eng.add_request("q", PROMPT, SamplingParams(temperature=1.0, seed=6, max_tokens=12))
    assert eng.run_to_completion()["q"].token_ids == a[1]


def test_streaming_reports_carry_the_index_and_the_parent_id_once_finished():
    eng = make_engine()
    seen = []
    eng.add_request("s", PROMPT, SamplingParams(temperature=0, max_tokens=4), n=3, callback=seen.append)
    eng.add_request("other", [3, 4], SamplingParams(temperature=0, max_tokens=4))
    finished = []
    while eng.has_unfinished_requests():
        for out in eng.step():
            assert out.request_id in ("s", "other")
            if out.finished:
                finished.append(out.request_id)
    assert sorted(finished) == ["other", "s"]  # each request finishes exactly once
    per_index = {i: [t for o in seen if o.index == i for t in o.delta_token_ids] for i in range(3)}
    want = toy_greedy_generate(PROMPT, 4, VOCAB)
    assert all(per_index[i] == want for i in range(3))
    assert seen[-1].finished and len(seen[-1].outputs) == 3
    assert clean(eng)


def test_abort_of_a_parent_ends_every_child_and_frees_every_block():
    eng = make_engine()
    eng.add_request("a", PROMPT, SamplingParams(temperature=0, max_tokens=50, ignore_eos=True), n=4)
    eng.step()  # the first child's prefill: the others are still deferred
    assert eng.get_num_unfinished_requests() == 4
    eng.step()
    out = eng.abort_request("a")
    assert out.finished and [c.finish_reason for c in out.outputs] == ["abort"] * 4
    assert eng.abort_request("a") is None
    assert clean(eng)


def test_one_child_failing_is_that_choices_finish_reason():
    eng = make_engine()
    real = eng.sampler

    def picky(logits, seqs):
        if any(s.request_id == "f#1" for s in seqs) and eng.num_steps >= 3:
            raise RuntimeError("child 1 cannot be sampled")
        return real(logits, seqs)

    eng.sampler = picky
    eng.add_request("f", PROMPT, SamplingParams(temperature=0, max_tokens=6), n=2)
    out = eng.run_to_completion()["f"]
    assert [c.finish_reason for c in out.outputs] == ["length", "error"]
    assert out.error is None
    assert clean(eng)


def test_without_prefix_caching_children_start_together_and_nothing_is_shared():
    eng = make_engine(enable_prefix_caching=False)
    eng.add_request("p", PROMPT, SamplingParams(temperature=0, max_tokens=3), n=2)
    eng.step()
    assert len(eng.scheduler.running) == 2
    out = eng.run_to_completion()["p"]
    assert out.outputs[0].token_ids == out.outputs[1].token_ids
    assert clean(eng)


def test_bad_n_is_refused():
    eng = make_engine()
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="n .* must be an integer >= 1"):
            eng.add_request("x", PROMPT, SamplingParams(), n=bad)
    eng.add_request("x#1", PROMPT, SamplingParams(max_tokens=1))
    with pytest.raises(ValueError, match="already in use"):
        eng.add_request("x", PROMPT, SamplingParams(), n=2)
    eng.run_to_completion()
    assert clean(eng)


def test_llm_generate_reads_n_from_the_sampling_params():
    from servelab.model import LlamaConfig, LlamaModel
    from servelab.bpe import load_course_tokenizer
    torch.manual_seed(0)
    model = LlamaModel(LlamaConfig(vocab_size=4096, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=256)).init_weights(std=0.3, seed=0).double().eval()
    llm = LLM(model, load_course_tokenizer(), num_kv_blocks=64)
    outs = llm.generate(["def add(a, b):", "The cache"], [NParams(temperature=0, max_tokens=5, n=2),
                                                          NParams(temperature=0.9, seed=1, max_tokens=5, n=3)])
    assert [len(o.outputs) for o in outs] == [2, 3]
    assert outs[0].outputs[0].text == outs[0].outputs[1].text
    single = llm.generate(["def add(a, b):"], SamplingParams(temperature=0, max_tokens=5))[0]
    assert outs[0].outputs[0].text == single.text
    assert llm.engine.scheduler.kv.allocator.num_used == 0
