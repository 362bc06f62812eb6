"""The static-batching baselines (servelab.engine.static): padded and ragged waves.

Both variants must give exactly the tokens of the continuous engine (and of the
reference greedy decoder), run the same waves in the same number of steps, and
differ only in the rows they compute: the padded one what one batched tensor
computes, the ragged one only useful rows. Both go through ``prepare_step``.
"""
import random

import pytest
import torch
from hypothesis import given, settings, strategies as st

import servelab.engine.static as static_mod
from servelab.engine import (EngineConfig, LLMEngine, ModelRunner, StaticBatchEngine, ToyRunner,
                             toy_greedy_generate)
from servelab.model import LlamaConfig, LlamaModel
from servelab.sampling import SamplingParams

VOCAB = 26


def greedy(n):
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


def engine(cls=StaticBatchEngine, num_blocks=200, block_size=4, seats=4, **kw):
    cfg = EngineConfig(block_size=block_size, num_kv_blocks=num_blocks, max_num_seqs=seats,
                       max_model_len=256)
    return cls(ToyRunner(num_blocks, block_size, VOCAB), cfg, **kw)


def run(eng, reqs):
    for i, (p, n) in enumerate(reqs):
        eng.add_request(str(i), p, greedy(n))
    final = eng.run_to_completion()
    return [final[str(i)].token_ids for i in range(len(reqs))]


def rows(eng):
    return sum(s.num_batched_tokens for s in eng.step_log)


requests = st.lists(st.tuples(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=20),
                              st.integers(1, 12)), min_size=1, max_size=9)


@settings(max_examples=40, deadline=None)
@given(reqs=requests, seats=st.integers(1, 4), block_size=st.sampled_from([1, 4, 16]))
def test_padded_and_ragged_give_the_reference_tokens_in_the_same_steps(reqs, seats, block_size):
    want = [toy_greedy_generate(p, n, VOCAB) for p, n in reqs]
    padded = engine(seats=seats, block_size=block_size, num_blocks=400)
    ragged = engine(seats=seats, block_size=block_size, num_blocks=400, padded=False)
    assert run(padded, reqs) == run(ragged, reqs) == want
    # the same waves: same number of waves and of steps, one per token of each wave's longest
    assert padded.scheduler.num_waves == ragged.scheduler.num_waves == -(-len(reqs) // seats)
    waves = [reqs[i:i + seats] for i in range(0, len(reqs), seats)]
    assert padded.num_steps == ragged.num_steps == sum(max(n for _, n in w) for w in waves)
    # ragged computes only useful rows: every prompt token, every output token but the last
    useful = sum(len(p) + n - 1 for p, n in reqs)
    assert rows(ragged) == useful
    assert ragged.scheduler.num_padding_tokens == ragged.scheduler.num_prompt_padding_tokens == 0
    # padded computes the tensor: seats x longest prompt, then every seat every decode step
    tensor = sum(len(w) * max(len(p) for p, _ in w) + len(w) * (max(n for _, n in w) - 1) for w in waves)
    assert rows(padded) == tensor
    sched = padded.scheduler
    assert tensor - useful == sched.num_padding_tokens + sched.num_prompt_padding_tokens
    for eng in (padded, ragged):
        assert eng.scheduler.kv.allocator.num_used == 0


def test_static_uses_the_engines_step_preparation(monkeypatch):
    calls = []
    real = static_mod.prepare_step

    def spy(plan):
        calls.append(plan)
        return real(plan)

    monkeypatch.setattr(static_mod, "prepare_step", spy)
    for padded in (True, False):
        calls.clear()
        eng = engine(padded=padded)
        run(eng, [([1, 2, 3], 4), ([5] * 9, 2), ([7], 6)])
        assert len(calls) == eng.num_steps == 6


def test_padded_rows_hold_every_seat_until_the_wave_ends():
    reqs = [([1] * 3, 2), ([2] * 8, 5), ([3] * 5, 1)]
    eng = engine(seats=3)
    run(eng, reqs)
    assert [s.num_seqs for s in eng.step_log] == [3] * 5
    assert [s.num_batched_tokens for s in eng.step_log] == [24, 3, 3, 3, 3]
    ragged = engine(seats=3, padded=False)
    run(ragged, reqs)
    assert [s.num_batched_tokens for s in ragged.step_log] == [16, 2, 1, 1, 1]
    assert [s.num_seqs for s in ragged.step_log] == [3, 2, 1, 1, 1]


def test_continuous_needs_fewer_steps_than_either_static_variant():
    rng = random.Random(5)
    reqs = [([rng.randrange(VOCAB) for _ in range(rng.randint(1, 9))], rng.choice([1, 2, 30]))
            for _ in range(12)]
    cont = engine(LLMEngine, seats=4)
    padded, ragged = engine(seats=4), engine(seats=4, padded=False)
    assert run(cont, reqs) == run(padded, reqs) == run(ragged, reqs)
    assert cont.num_steps < ragged.num_steps == padded.num_steps


def test_abort_inside_a_wave_frees_everything_at_the_end():
    for padded in (True, False):
        eng = engine(seats=3, padded=padded)
        for i, n in enumerate((2, 9, 9)):
            eng.add_request(str(i), [i + 1] * 4, greedy(n))
        eng.add_request("late", [4] * 4, greedy(3))
        eng.step()
        eng.abort_request("1")
        eng.abort_request("late")  # still waiting
        final = eng.run_to_completion()
        assert set(final) == {"0", "2"}
        assert eng.scheduler.kv.allocator.num_used == 0
        assert not eng.has_unfinished_requests()


def test_padded_must_be_a_bool():
    with pytest.raises(TypeError, match="padded"):
        engine(padded="yes")


@pytest.fixture(scope="module")
def model():
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    return LlamaModel(cfg).init_weights(std=0.3, seed=0).double().eval()


def test_both_variants_give_the_continuous_engines_tokens_on_a_real_model(model):
    rng = random.Random(1)
    reqs = [([rng.randrange(64) for _ in range(rng.randint(1, 12))], rng.randint(1, 8)) for _ in range(7)]
    cfg = EngineConfig(block_size=4, num_kv_blocks=200, max_num_seqs=3, max_model_len=256)
    out = {}
    for name, cls, kw in (("continuous", LLMEngine, {}), ("padded", StaticBatchEngine, {}),
                          ("ragged", StaticBatchEngine, {"padded": False})):
        eng = cls(ModelRunner(model, 200, 4), cfg, **kw)
        out[name] = run(eng, reqs)
    assert out["padded"] == out["ragged"] == out["continuous"]


def test_a_callback_that_aborts_another_member_finishes_it_once():
    for padded in (True, False):
        eng = engine(seats=3, padded=padded)
        finished = []

        def abort_b(out):
            if out.request_id == "a" and not out.finished:
                eng.abort_request("b")

        eng.add_request("a", [1, 2], greedy(4), callback=abort_b)
        eng.add_request("b", [3, 4], greedy(4))
        eng.add_request("c", [5], greedy(2))
        while eng.has_unfinished_requests():
            finished += [o.request_id for o in eng.step() if o.finished]
        assert sorted(finished) == ["a", "b", "c"]
        assert eng.scheduler.kv.allocator.num_used == 0


def test_own_reservations_give_the_same_tokens_and_fit_more_in_a_tight_pool():
    rng = random.Random(7)
    reqs = [([rng.randrange(VOCAB) for _ in range(rng.randint(1, 20))], rng.choice([1, 3, 12]))
            for _ in range(12)]
    tight = dict(num_blocks=24, block_size=4, seats=8)
    rect = engine(padded=False, **tight)
    own = engine(padded=False, reserve="own", **tight)
    assert run(rect, reqs) == run(own, reqs) == run(engine(LLMEngine, seats=8), reqs)
    assert own.scheduler.num_waves < rect.scheduler.num_waves
    assert own.num_steps < rect.num_steps
    assert own.scheduler.kv.allocator.num_used == 0


def test_own_reservations_need_ragged_waves_and_a_known_name():
    with pytest.raises(ValueError, match="padded=False"):
        engine(reserve="own")
    with pytest.raises(ValueError, match="reserve"):
        engine(padded=False, reserve="paged")
