"""Speculative decoding inside the continuous-batching engine: exact, and leak-free."""
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from servelab.engine import LLM, LLMEngine
from servelab.model import LlamaConfig, LlamaModel, load_course_model
from servelab.sampling import SamplingParams

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}


def _tiny(seed, layers=2, vocab=64):
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    return LlamaModel(cfg).init_weights(std=0.3, seed=seed).eval()


TARGET, DRAFT = _tiny(0, layers=3), _tiny(1, layers=1)
PROMPTS = [[1, 2, 3, 1, 2, 3, 1, 2], [5, 6, 7, 8], [9] * 6, [4, 10, 11, 4, 10], list(range(12, 40))]


def _engine(spec=None, **kw):
    kw.setdefault("num_kv_blocks", 64)
    kw.setdefault("block_size", 4)
    return LLMEngine.from_model(TARGET, speculative_config=spec, **kw)


def _run(engine, prompts, params, order=None):
    order = order or range(len(prompts))
    for i in order:
        engine.add_request(f"r{i}", prompts[i], params)
    outs = engine.run_to_completion()
    return {rid: o.outputs[0].token_ids for rid, o in outs.items()}


def _assert_pool_clean(engine):
    kv = engine.scheduler.kv
    assert not engine.scheduler.running and not engine.scheduler.waiting
    # every block is back: free, or parked in the prefix cache with no holder
    assert all(rc == 0 for rc in kv.allocator.ref_count)


GREEDY = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)


@pytest.mark.parametrize("spec", [NGRAM, {"model": DRAFT, "num_speculative_tokens": 3}])
def test_greedy_tokens_equal_plain_decoding(spec):
    plain = _run(_engine(), PROMPTS, GREEDY)
    eng = _engine(spec)
    assert _run(eng, PROMPTS, GREEDY) == plain
    assert eng.spec_decoder.stats.proposed > 0
    _assert_pool_clean(eng)


@pytest.mark.parametrize("kw", [
    dict(num_kv_blocks=20, max_num_seqs=8),                 # tight pool: preemption by recompute
    dict(max_num_batched_tokens=6),                         # drafts cut by the token budget
    dict(enable_prefix_caching=False),
    dict(block_size=16, num_kv_blocks=16),
])
def test_greedy_equal_under_preemption_budgets_and_caching(kw):
    plain = _run(_engine(**kw), PROMPTS, GREEDY)
    eng = _engine(NGRAM, **kw)
    assert _run(eng, PROMPTS, GREEDY) == plain
    _assert_pool_clean(eng)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(order=st.permutations(list(range(len(PROMPTS)))), k=st.integers(1, 5),
       budget=st.sampled_from([5, 8, 64]))
def test_greedy_equal_for_random_orders_k_and_budgets(order, k, budget):
    spec = dict(NGRAM, num_speculative_tokens=k)
    plain = _run(_engine(max_num_batched_tokens=budget), PROMPTS, GREEDY, order)
    eng = _engine(spec, max_num_batched_tokens=budget, num_kv_blocks=24)
    assert _run(eng, PROMPTS, GREEDY, order) == plain
    _assert_pool_clean(eng)


def test_stop_token_and_max_tokens_inside_an_accepted_run():
    plain = _run(_engine(), PROMPTS[:1], SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True))
    ids = plain["r0"]
    stop = ids[6]
    first = ids.index(stop)
    params = SamplingParams(temperature=0.0, max_tokens=16, stop_token_ids=[stop], ignore_eos=True)
    eng = _engine(NGRAM)
    eng.add_request("s", PROMPTS[0], params)
    out = eng.run_to_completion()["s"].outputs[0]
    assert out.token_ids == ids[:first + 1] and out.finish_reason == "stop"
    for n in (1, 2, 5, 7):
        eng = _engine(NGRAM)
        got = _run(eng, PROMPTS[:1], SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))
        assert got["r0"] == ids[:n]
        _assert_pool_clean(eng)


def test_logprobs_match_the_ids_when_a_stop_ends_an_accepted_run():
    plain = _run(_engine(), PROMPTS[:1], SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True))
    ids = plain["r0"]
    agreeing = {"model": TARGET, "num_speculative_tokens": 3}  # every draft accepted: stops fall inside runs
    for stop in sorted(set(ids)):
        params = SamplingParams(temperature=0.0, max_tokens=16, stop_token_ids=[stop], ignore_eos=True,
                                logprobs=2)
        eng = _engine(agreeing)
        eng.add_request("s", PROMPTS[0], params)
        out = eng.run_to_completion()["s"].outputs[0]
        assert out.token_ids == ids[:ids.index(stop) + 1]
        assert len(out.logprobs) == len(out.top_logprobs) == len(out.token_ids), stop


def test_logprobs_are_the_raw_rows_under_min_tokens_as_without_speculation():
    ids = _run(_engine(), PROMPTS[:1], SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))["r0"]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, stop_token_ids=ids[1:6],
                            min_tokens=10, logprobs=3)
    outs = []
    for spec in (None, NGRAM):
        eng = _engine(spec)
        eng.add_request("m", PROMPTS[0], params)
        outs.append(eng.run_to_completion()["m"].outputs[0])
    plain, spec = outs
    assert spec.token_ids == plain.token_ids
    assert spec.logprobs == pytest.approx(plain.logprobs, abs=1e-5)
    for a, b in zip(spec.top_logprobs, plain.top_logprobs):
        assert [t for t, _ in a] == [t for t, _ in b]
        assert [v for _, v in a] == pytest.approx([v for _, v in b], abs=1e-5)


def test_streaming_callback_sees_every_token_once():
    eng = _engine(NGRAM)
    seen = []
    eng.add_request("c", PROMPTS[0], GREEDY, callback=lambda o: seen.extend(o.delta_token_ids))
    final = eng.run_to_completion()["c"].outputs[0].token_ids
    assert seen == final


def test_seeded_sampling_repeats_and_logprobs_are_reported():
    params = SamplingParams(temperature=0.8, top_k=20, max_tokens=12, seed=7, logprobs=2, ignore_eos=True)
    a = _engine(NGRAM)
    a.add_request("x", PROMPTS[0], params)
    out_a = a.run_to_completion()["x"].outputs[0]
    b = _engine(NGRAM)
    b.add_request("x", PROMPTS[0], params)
    out_b = b.run_to_completion()["x"].outputs[0]
    assert out_a.token_ids == out_b.token_ids
    assert len(out_a.logprobs) == len(out_a.token_ids) == len(out_a.top_logprobs)
    _assert_pool_clean(a)


def test_abort_mid_run_frees_everything():
    eng = _engine(NGRAM)
    for i, p in enumerate(PROMPTS):
        eng.add_request(f"r{i}", p, GREEDY)
    for _ in range(3):
        eng.step()
    eng.abort_request("r0")
    eng.abort_request("r3")
    eng.run_to_completion()
    _assert_pool_clean(eng)


def test_bad_configs_are_refused():
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        _engine({"method": "ngram", "num_speculative_tokens": 0})
    with pytest.raises(ValueError, match="vocabulary"):
        _engine({"model": _tiny(2, vocab=80), "num_speculative_tokens": 2})
    with pytest.raises(ValueError, match="unknown speculative method"):
        _engine({"method": "eagle9", "num_speculative_tokens": 2})


def test_llm_accepts_vllm_shaped_config_with_the_course_pair():
    llm = LLM("data/models/servelab-main", speculative_config={
        "model": "data/models/servelab-draft", "num_speculative_tokens": 3}, max_num_seqs=4,
        num_kv_blocks=256)
    plain = LLM(load_course_model("main"), max_num_seqs=4, num_kv_blocks=256)
    params = SamplingParams(temperature=0.0, max_tokens=24)
    prompts = ["def add(a, b):\n    return", "import os\nimport"]
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, params)] == \
        [o.outputs[0].token_ids for o in plain.generate(prompts, params)]


def test_a_perfect_draft_is_always_accepted_and_saves_steps():
    plain_engine = _engine()
    plain = _run(plain_engine, PROMPTS, GREEDY)
    eng = _engine({"model": TARGET, "num_speculative_tokens": 3})
    assert _run(eng, PROMPTS, GREEDY) == plain
    st = eng.spec_decoder.stats
    assert st.accepted == st.proposed > 0
    assert eng.num_steps < plain_engine.num_steps
    _assert_pool_clean(eng)
    # sampled, the same model drafting: p == q, so every draft is accepted too
    eng = _engine({"model": TARGET, "num_speculative_tokens": 3})
    _run(eng, PROMPTS, SamplingParams(temperature=1.0, max_tokens=12, seed=3, ignore_eos=True))
    assert eng.spec_decoder.stats.acceptance_rate > 0.99
    _assert_pool_clean(eng)


def test_stop_string_inside_an_accepted_run_cuts_the_text_there():
    prompts = ["def add(a, b):\n    return a + b\n\ndef add(a, b):\n", "import os\nimport sys\nimport"]
    plain = LLM(load_course_model("main"), max_num_seqs=4, num_kv_blocks=256)
    free = plain.generate(prompts, SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True))
    for out, prompt in zip(free, prompts):
        text = out.outputs[0].text
        stop = text[len(text) // 2:len(text) // 2 + 2]   # a piece of the middle of the answer
        params = SamplingParams(temperature=0.0, max_tokens=40, stop=[stop], ignore_eos=True)
        want = plain.generate([prompt], params)[0].outputs[0]
        spec = LLM(load_course_model("main"), max_num_seqs=4, num_kv_blocks=256,
                   speculative_config=NGRAM).generate([prompt], params)[0].outputs[0]
        assert spec.text == want.text == text[:text.find(stop)]
        assert spec.finish_reason == "stop" and spec.stop_reason == stop


@pytest.mark.parametrize("spec", [None, NGRAM, {"model": DRAFT, "num_speculative_tokens": 3}])
def test_penalties_give_the_definitions_tokens_with_and_without_speculation(spec):
    """Greedy with penalties: each token is the argmax of the model's logits after the
    penalties of the prompt and the output so far (a loop over the model, no cache), and
    speculation keeps exactly those tokens (each drafted row penalised by its own history)."""
    from servelab.sampling import apply_penalties
    sp = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, repetition_penalty=1.3,
                        presence_penalty=0.4, frequency_penalty=0.3)
    prompts = PROMPTS[:3]
    got = _run(_engine(spec), prompts, sp)
    for i, prompt in enumerate(prompts):
        ids = list(prompt)
        with torch.no_grad():
            for _ in range(sp.max_tokens):
                row = TARGET(torch.tensor([ids]))[0, -1]
                ids.append(int(apply_penalties(row, prompt, ids[len(prompt):], sp).argmax()))
        assert got[f"r{i}"] == ids[len(prompt):]
    plain = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    assert got != _run(_engine(), prompts, plain)  # the penalties changed something
