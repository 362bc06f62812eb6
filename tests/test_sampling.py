"""servelab.sampling: each filter against its definition, seeds, and parameter checks."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

from servelab.sampling import (
    SamplingParams, logprobs, make_generator, sample, sample_batch, sampling_probs, top_k_filter,
    top_logprobs, top_p_filter,
)

LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])


def test_greedy_is_argmax_and_temperature_zero_means_greedy():
    p = SamplingParams(temperature=0)
    assert p.greedy
    assert int(sample(LOGITS, p)) == 0
    assert sample(torch.stack([LOGITS, LOGITS.flip(0)]), p).tolist() == [0, 4]
    assert sampling_probs(LOGITS, p).tolist() == [1.0, 0, 0, 0, 0]


def test_temperature_sharpens_and_flattens():
    cold = sampling_probs(LOGITS, SamplingParams(temperature=0.5))
    base = sampling_probs(LOGITS, SamplingParams(temperature=1.0))
    hot = sampling_probs(LOGITS, SamplingParams(temperature=2.0))
    assert cold[0] > base[0] > hot[0]
    assert torch.allclose(base, torch.softmax(LOGITS, -1))


def test_top_k_keeps_k_and_ties():
    assert torch.isinf(top_k_filter(LOGITS, 2)).tolist() == [False, False, True, True, True]
    assert torch.equal(top_k_filter(LOGITS, 0), LOGITS)
    tied = torch.tensor([1.0, 3.0, 3.0, 0.0])
    assert (~torch.isinf(top_k_filter(tied, 1))).sum() == 2  # both tied maxima kept


def test_top_p_keeps_token_that_crosses_the_line():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log()
    kept = lambda p: (~torch.isinf(top_p_filter(logits, p))).tolist()  # noqa: E731
    assert kept(0.5) == [True, False, False, False]
    assert kept(0.6) == [True, True, False, False]
    assert kept(0.8) == [True, True, False, False]
    assert kept(0.81) == [True, True, True, False]
    assert kept(1.0) == [True] * 4
    assert kept(1e-9) == [True, False, False, False]
    shuffled = logits[[2, 0, 3, 1]]                        # order of the vocabulary does not matter
    assert (~torch.isinf(top_p_filter(shuffled, 0.6))).tolist() == [False, True, False, True]


@settings(max_examples=40, deadline=None)
@given(values=st.lists(st.floats(-8, 8), min_size=1, max_size=30), p=st.floats(0.01, 1.0))
def test_top_p_property_smallest_set_reaching_p(values, p):
    logits = torch.tensor(values)
    kept = ~torch.isinf(top_p_filter(logits, p))
    probs = torch.softmax(logits, -1)
    assert kept.any()
    assert probs[kept].sum() >= p - 1e-5 or kept.all()
    # removing the least likely kept token would fall below p
    smallest = probs[kept].min()
    assert probs[kept].sum() - smallest < p + 1e-5 or kept.sum() == 1 or \
        (probs[kept] == smallest).sum() > 1


def test_seeded_generators_repeat_and_differ():
    logits = torch.randn(50, generator=torch.Generator().manual_seed(0))
    p = SamplingParams(temperature=1.0)
    run = lambda seed: [int(sample(logits, p, g)) for g in [make_generator(seed)] for _ in range(20)]  # noqa: E731
    assert run(1) == run(1)
    assert run(1) != run(2)
    assert make_generator(None) is None


def test_sample_batch_is_independent_of_batch_mates():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 40, generator=g)
    params = [SamplingParams(temperature=0.8, seed=7), SamplingParams(temperature=0), SamplingParams(top_k=5)]
    alone = int(sample(logits[0], params[0], make_generator(7)))
    batch = sample_batch(logits, params, [make_generator(7), None, make_generator(3)])
    assert int(batch[0]) == alone and int(batch[1]) == int(logits[1].argmax())
    assert int(batch[2]) in torch.topk(logits[2], 5).indices.tolist()
    with pytest.raises(ValueError, match="one SamplingParams"):
        sample_batch(logits, params[:2], [None, None])


def test_empirical_frequencies_follow_filtered_distribution():
    p = SamplingParams(temperature=1.0, top_k=3)
    g = make_generator(0)
    draws = sample(LOGITS.expand(20000, -1), p, g)
    freq = torch.bincount(draws, minlength=5).float() / 20000
    assert torch.allclose(freq, sampling_probs(LOGITS, p), atol=0.02)
    assert freq[3:].sum() == 0


def test_logprobs():
    lp = logprobs(LOGITS)
    assert torch.allclose(lp.exp().sum(), torch.tensor(1.0))
    top = top_logprobs(LOGITS, 2)
    assert [t for t, _ in top] == [0, 1] and top[0][1] == pytest.approx(float(lp[0]))


@pytest.mark.parametrize("kwargs,match", [
    (dict(temperature=-0.1), "temperature"), (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"),
    (dict(top_k=-1), "top_k"), (dict(top_k=2.5), "top_k"), (dict(max_tokens=0), "max_tokens"),
    (dict(stop=[""]), "stop"), (dict(logprobs=-1), "logprobs"), (dict(temperature=float("nan")), "temperature"),
])
def test_invalid_parameters_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_stop_string_becomes_list():
    assert SamplingParams(stop="\n\n").stop == ["\n\n"]


def test_n_is_validated_and_single_sequence_paths_refuse_n_above_one():
    import pytest
    from servelab.sampling import SamplingParams
    assert SamplingParams().n == 1
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="n \\(completions per prompt\\)"):
            SamplingParams(n=bad)
    from servelab.generation import generate
    from servelab.model import LlamaConfig, LlamaModel
    model = LlamaModel(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2,
                                         num_key_value_heads=1, max_position_embeddings=64)).init_weights(seed=0).eval()
    with pytest.raises(ValueError, match="one completion; got n=2"):
        generate(model, None, [1, 2, 3], sampling=SamplingParams(temperature=0, n=2))


def test_engine_reads_n_from_sampling_params():
    from servelab.engine import LLM
    from servelab.model import LlamaConfig, LlamaModel
    from servelab.sampling import SamplingParams
    import torch
    torch.manual_seed(0)
    model = LlamaModel(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2,
                                         num_key_value_heads=1, max_position_embeddings=64)).init_weights(seed=0).eval()
    llm = LLM(model, num_kv_blocks=32)
    out = llm.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=3, n=3,
                                                  ignore_eos=True))
    assert len(out) == 1 and len(out[0].outputs) == 3
    assert len({tuple(c.token_ids) for c in out[0].outputs}) == 1


def test_min_p_keeps_tokens_at_least_min_p_times_the_favourite():
    from servelab.sampling import min_p_filter
    probs = torch.softmax(LOGITS, -1)
    for m in (0.0, 0.2, 0.5, 0.99):
        kept = torch.isfinite(min_p_filter(LOGITS, m))
        assert kept.tolist() == (probs >= m * probs.max()).tolist()
    assert torch.isfinite(min_p_filter(LOGITS, 1.0)).sum() == 1  # only the favourite
    p = sampling_probs(LOGITS, SamplingParams(temperature=1.0, min_p=0.3))
    assert p[probs < 0.3 * probs.max()].sum() == 0 and abs(float(p.sum()) - 1) < 1e-6


def test_penalties_follow_their_definitions():
    """repetition_penalty on prompt and output tokens (divide positive logits, multiply
    negative ones); frequency per occurrence and presence once, on output tokens only."""
    from servelab.sampling import apply_penalties
    logits = torch.tensor([2.0, -1.0, 0.5, 3.0, 1.0])
    sp = SamplingParams(temperature=0.0, repetition_penalty=2.0, presence_penalty=0.5,
                        frequency_penalty=0.25)
    out = apply_penalties(logits, [0, 1], [3, 3], sp)
    assert out.tolist() == [1.0, -2.0, 0.5, 3.0 / 2 - 0.5 - 0.5, 1.0]
    assert apply_penalties(logits, [0], [3], SamplingParams()) is logits  # none set: untouched
    # a penalty can change a greedy choice: token 3 led, repeated twice it falls behind token 0
    assert int(sample(apply_penalties(logits, [], [3, 3], SamplingParams(
        temperature=0.0, frequency_penalty=1.0))[None], SamplingParams(temperature=0.0))) == 0


@pytest.mark.parametrize("kwargs,match", [
    (dict(min_p=-0.1), "min_p"), (dict(min_p=1.5), "min_p"),
    (dict(presence_penalty=2.5), "presence_penalty"), (dict(frequency_penalty=-3), "frequency_penalty"),
    (dict(repetition_penalty=0), "repetition_penalty"), (dict(repetition_penalty=True), "repetition_penalty"),
])
def test_penalty_and_min_p_ranges_are_checked(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)
