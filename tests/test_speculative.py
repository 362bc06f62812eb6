"""servelab.speculative: the formula, the exact rule, both proposers, the batch-of-one loop."""
import math

import numpy as np
import pytest
import torch

from servelab.generation import generate
from servelab.model import LlamaConfig, LlamaModel
from servelab.sampling import SamplingParams
from servelab.speculative import (DraftModelProposer, NgramProposer, SpeculativeConfig,
                                  accept_tokens, best_num_speculative_tokens,
                                  expected_speedup, expected_tokens_per_pass,
                                  speculative_generate)


class Letters:
    """A toy tokenizer: id i is the letter chr(97 + i % 26)."""

    def encode(self, text):
        return [ord(c) - 97 for c in text]

    def decode(self, ids):
        return "".join(chr(97 + i % 26) for i in ids)


TOK = Letters()


def _model(vocab=32, layers=2, seed=0, hidden=32):
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=256)
    return LlamaModel(cfg).init_weights(std=0.3, seed=seed).eval()


# ------------------------------------------------------------------ formula

def test_expected_tokens_per_pass_is_the_geometric_sum():
    for a in (0.0, 0.3, 0.8, 0.99):
        for k in range(0, 9):
            assert expected_tokens_per_pass(a, k) == pytest.approx(sum(a ** i for i in range(k + 1)))
    assert expected_tokens_per_pass(1.0, 4) == 5.0
    assert expected_tokens_per_pass(0.0, 4) == 1.0


def test_expected_speedup_and_best_k():
    assert expected_speedup(0.8, 4, 0.0) == pytest.approx(expected_tokens_per_pass(0.8, 4))
    assert expected_speedup(0.8, 4, 0.05) == pytest.approx(expected_tokens_per_pass(0.8, 4) / 1.2)
    # a free, perfect guesser: longer is always better
    assert best_num_speculative_tokens(1.0, 0.0, k_max=8) == 8
    # a poor guesser with a costly draft: k = 1 is best, and still below 1x
    assert best_num_speculative_tokens(0.2, 0.5) == 1
    assert expected_speedup(0.2, 1, 0.5) < 1
    k = best_num_speculative_tokens(0.8, 0.05)
    assert all(expected_speedup(0.8, k, 0.05) >= expected_speedup(0.8, j, 0.05) for j in range(1, 17))


@pytest.mark.parametrize("bad", [dict(a=-0.1, k=2), dict(a=1.1, k=2), dict(a=0.5, k=-1)])
def test_formula_rejects_bad_input(bad):
    with pytest.raises(ValueError):
        expected_tokens_per_pass(**bad)
    with pytest.raises(ValueError):
        expected_speedup(0.5, 2, -1)


# ------------------------------------------------------------------ config

def test_config_from_vllm_dicts():
    c = SpeculativeConfig.from_dict({"model": "data/models/servelab-draft", "num_speculative_tokens": 4})
    assert c.method == "draft_model" and c.num_speculative_tokens == 4
    c = SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 3,
                                     "prompt_lookup_max": 4, "prompt_lookup_min": 2})
    assert c.method == "ngram" and isinstance(c.build_proposer(), NgramProposer)


@pytest.mark.parametrize("d, words", [
    ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
    ({"method": "medusa", "num_speculative_tokens": 2}, "unknown speculative method"),
    ({"num_speculative_tokens": 2}, "needs 'model'"),
    ({"method": "ngram"}, "needs 'num_speculative_tokens'"),
    ({"method": "ngram", "num_speculative_tokens": 2, "lookahead": 3}, "unknown speculative_config keys"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 3,
      "prompt_lookup_max": 2}, "prompt_lookup_min"),
])
def test_bad_configs_raise_clear_errors(d, words):
    with pytest.raises(ValueError, match=words):
        SpeculativeConfig.from_dict(d)


def test_draft_with_another_vocabulary_is_refused():
    cfg = SpeculativeConfig(num_speculative_tokens=2, model=_model(vocab=40))
    with pytest.raises(ValueError, match="vocabulary"):
        cfg.build_proposer(_model(vocab=32))


# ------------------------------------------------------------------ the rule

def test_rule_greedy_accepts_the_agreeing_prefix_then_corrects():
    eye = torch.eye(5)
    p = eye[[1, 2, 3, 4]]          # target argmax at each of 4 rows
    q = eye[[1, 2, 0]]             # draft proposes 1, 2, 0
    assert accept_tokens([1, 2, 0], p, q) == [1, 2, 3]   # two kept, then the target's own
    assert accept_tokens([1, 2, 3], p, eye[[1, 2, 3]]) == [1, 2, 3, 4]   # all kept + bonus
    assert accept_tokens([], eye[[4]], None) == [4]


def test_rule_with_deterministic_proposer_keeps_target_distribution():
    # prompt lookup proposes x with certainty: P(out = y) must still equal p(y)
    p = torch.tensor([[0.5, 0.3, 0.2], [1.0, 0.0, 0.0]])
    g = torch.Generator().manual_seed(0)
    counts = np.zeros(3)
    for _ in range(6000):
        counts[accept_tokens([1], p, None, g)[0]] += 1
    assert np.allclose(counts / counts.sum(), [0.5, 0.3, 0.2], atol=0.02)


def test_rule_validates_shapes():
    with pytest.raises(ValueError, match="k \\+ 1"):
        accept_tokens([1, 2], torch.eye(3)[:2])
    with pytest.raises(ValueError, match="probability 0"):
        accept_tokens([1], torch.eye(3)[:2], torch.eye(3)[[2]])


# ------------------------------------------------------------------ proposers

def test_ngram_proposer_copies_what_followed_the_latest_match():
    prop = NgramProposer(min_n=1, max_n=3)
    ids = [5, 6, 7, 8, 9, 1, 5, 6, 7]
    assert prop.propose(ids, 3)[0] == [8, 9, 1]
    assert prop.propose([1, 2, 3], 2)[0] == []               # nothing repeats
    assert prop.propose([4, 1, 4], 5)[0] == [1, 4]           # bounded by the text
    with pytest.raises(ValueError):
        NgramProposer(3, 2)


def test_ngram_proposer_prefers_the_latest_match_with_k_tokens_after_it():
    prop = NgramProposer(min_n=1, max_n=2)
    loop = [9, 1, 2, 1, 2, 1, 2]                 # a period-2 loop: the tail "1 2" recurs
    assert prop.propose(loop, 4)[0] == [1, 2, 1, 2]          # not [1, 2] from the latest match
    assert prop.propose(loop, 2)[0] == [1, 2]                # the latest match has enough
    # no match has k after it: the one with the most (the earliest, here)
    assert prop.propose([3, 1, 2, 1, 2, 1, 2], 5)[0] == [1, 2, 1, 2]
    # a longer n-gram still wins over a shorter one with more tokens after it
    assert prop.propose([7, 8, 5, 6, 8, 4, 6, 7, 8], 3)[0] == [5, 6, 8]


def test_stats_count_only_the_drafts_that_were_judged():
    from servelab.speculative import SpecStats
    st = SpecStats()
    st.record(4, 1)      # kept one, rejected the second; drafts 3 and 4 never judged
    st.record(4, 4)
    st.record(2, 0)
    assert st.reached_at == [3, 2, 1, 1] and st.accepted_at == [2, 1, 1, 1]
    assert st.acceptance_rate == 5 / 7
    assert st.acceptance_by_position == [2 / 3, 0.5, 1.0, 1.0]
    with pytest.raises(ValueError):
        st.record(2, 3)


def test_draft_proposer_rolls_back_to_the_common_prefix():
    draft = _model(seed=3)
    prop = DraftModelProposer(draft, max_len=64)
    a, _ = prop.propose([1, 2, 3], 4)
    b, _ = prop.propose([1, 2, 3], 4)                         # same context: same greedy drafts
    assert a == b
    c, _ = prop.propose([1, 2, 3, 9], 3)                      # diverged: cache cropped, recomputed
    fresh = DraftModelProposer(draft, max_len=64)
    assert c == fresh.propose([1, 2, 3, 9], 3)[0]


# ------------------------------------------------------------------ exactness, greedy

@pytest.mark.parametrize("k", [1, 3, 6])
def test_greedy_speculation_equals_plain_decoding(k):
    target, draft = _model(seed=0, layers=3), _model(seed=1, layers=1)
    torch.manual_seed(0)
    for prompt in ([1, 2, 3], [7], list(range(20))):
        plain = generate(target, TOK, prompt, max_new_tokens=25, eos_token_id=[])
        for proposer in (DraftModelProposer(draft), NgramProposer(1, 3)):
            spec = speculative_generate(target, TOK, prompt, proposer, k,
                                        SamplingParams(temperature=0.0, max_tokens=25))
            assert spec.token_ids == plain.token_ids
            assert spec.stats.target_passes <= len(plain.token_ids)


def test_greedy_speculation_with_penalties_equals_plain_decoding():
    """Each drafted row is penalised by the output before it plus the drafts ahead of it."""
    target, draft = _model(seed=0, layers=3), _model(seed=1, layers=1)
    params = SamplingParams(temperature=0.0, max_tokens=20, repetition_penalty=1.3,
                            presence_penalty=0.4, frequency_penalty=0.3)
    for prompt in ([1, 2, 3], list(range(20))):
        plain = generate(target, TOK, prompt, sampling=params, eos_token_id=[])
        assert plain.token_ids != generate(target, TOK, prompt, max_new_tokens=20,
                                           eos_token_id=[]).token_ids  # the penalties bite
        for proposer in (DraftModelProposer(draft), NgramProposer(1, 3)):
            spec = speculative_generate(target, TOK, prompt, proposer, 4, params)
            assert spec.token_ids == plain.token_ids


def test_a_perfect_draft_emits_k_plus_one_tokens_per_pass():
    target = _model(seed=0)
    spec = speculative_generate(target, TOK, [1, 2], DraftModelProposer(target), 4,
                                SamplingParams(temperature=0.0, max_tokens=20))
    assert spec.stats.acceptance_rate == 1.0
    assert spec.stats.target_passes == 4 and len(spec.token_ids) == 20   # 5 + 5 + 5 + 5


def test_stop_token_inside_an_accepted_run_ends_there():
    target = _model(seed=0)
    plain = generate(target, TOK, [1, 2], max_new_tokens=12, eos_token_id=[])
    stop = plain.token_ids[5]
    first = plain.token_ids.index(stop)
    spec = speculative_generate(target, TOK, [1, 2], DraftModelProposer(target), 4,
                                SamplingParams(temperature=0.0, max_tokens=12, stop_token_ids=[stop]))
    assert spec.token_ids == plain.token_ids[:first + 1] and spec.finish_reason == "stop"


def _stop_cases(plain):
    """Stop settings that end the greedy output of ``plain`` in different ways."""
    text, ids = plain.text, plain.token_ids
    return [
        dict(stop=[text[7:9]]),                                        # a stop string, cut before
        dict(stop=[text[7:9]], include_stop_str_in_output=True),       # ... or kept
        dict(stop_token_ids=[ids[2]], min_tokens=6),                   # a stop token, banned first
        dict(stop=[text[1:3]], min_tokens=5),                          # a string too early to count
        dict(min_tokens=9, stop_token_ids=[ids[3]], stop=[text[10:12]]),
    ]


@pytest.mark.parametrize("case", range(5))
def test_stop_rules_are_generates_own(case):
    """speculative_generate ends where generate ends: the same StopChecker rules
    (stop strings with include_stop_str_in_output, min_tokens, stop tokens)."""
    target = _model(seed=0)
    prompt = [1, 2, 3]
    plain = generate(target, TOK, prompt, max_new_tokens=24, eos_token_id=[])
    extra = _stop_cases(plain)[case]
    params = SamplingParams(temperature=0.0, max_tokens=24, **extra)
    want = generate(target, TOK, prompt, sampling=params, eos_token_id=[])
    for proposer in (DraftModelProposer(_model(seed=1, layers=1)), DraftModelProposer(target),
                     NgramProposer(1, 3)):
        got = speculative_generate(target, TOK, prompt, proposer, 4, params)
        assert (got.token_ids, got.text, got.finish_reason, got.stop_reason) == \
            (want.token_ids, want.text, want.finish_reason, want.stop_reason), extra


def test_text_is_decoded_incrementally():
    """Each token decodes a short window, not the whole output again (O(n), not O(n^2))."""
    class Counting(Letters):
        decoded = 0

        def decode(self, ids):
            Counting.decoded += len(ids)
            return super().decode(ids)

    target = _model(seed=0)
    n = 60
    out = speculative_generate(target, Counting(), [1, 2], NgramProposer(1, 3), 4,
                               SamplingParams(temperature=0.0, max_tokens=n, stop=["zzz"]))
    assert len(out.token_ids) == n and out.text == TOK.decode(out.token_ids)
    assert Counting.decoded <= 8 * n      # decoding the whole output each time: n^2 / 2


# ------------------------------------------------------------------ exactness, sampling

def _first_two(rule, n, seed):
    target, draft = _model(vocab=6, seed=10, layers=1, hidden=16), _model(vocab=6, seed=11, layers=1, hidden=16)
    params = SamplingParams(temperature=1.0, max_tokens=2)   # unseeded: torch's global generator
    torch.manual_seed(seed)
    counts = np.zeros(36)
    prop = DraftModelProposer(draft, max_len=16)
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        out = speculative_generate(target, TOK, [1, 2], prop, 2, params,
                                   acceptance=lambda d, p, q, _g: rule(d, p, q, g)).token_ids
        counts[out[0] * 6 + out[1]] += 1
    return counts, target


def _target_joint(target):
    with torch.inference_mode():
        p1 = torch.softmax(target(torch.tensor([[1, 2]]))[0, -1].float(), -1)
        joint = np.zeros(36)
        for a in range(6):
            p2 = torch.softmax(target(torch.tensor([[1, 2, a]]))[0, -1].float(), -1)
            joint[a * 6:(a + 1) * 6] = (p1[a] * p2).numpy()
    return joint


def _chi_square_p(counts, probs):
    """Pearson's test of observed counts against exact probabilities (cells with
    expected < 5 pooled); returns the p-value."""
    n = counts.sum()
    exp = probs * n
    small = exp < 5
    obs = np.append(counts[~small], counts[small].sum())
    exp = np.append(exp[~small], exp[small].sum())
    keep = exp > 0
    stat = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
    dof = int(keep.sum()) - 1
    # survival function of chi-square via the regularised upper gamma (series)
    return _gammaincc(dof / 2, stat / 2)


def _gammaincc(a, x):
    if x <= 0:
        return 1.0
    if x < a + 1:   # series for the lower function
        term = total = 1.0 / a
        for n in range(1, 500):
            term *= x / (a + n)
            total += term
        return 1.0 - total * math.exp(-x + a * math.log(x) - math.lgamma(a))
    b, c, d = x + 1 - a, 1e300, 1 / (x + 1 - a)   # continued fraction for the upper one
    h = d
    for i in range(1, 500):
        an = -i * (i - a)
        b += 2
        d = 1 / (an * d + b)
        c = b + an / c
        h *= d * c
    return h * math.exp(-x + a * math.log(x) - math.lgamma(a))


def _accept_when_p_beats_q(d, p, q, g):   # a classic mistake: deterministic acceptance
    out = []
    for i, x in enumerate(d):
        if p[i, x] >= q[i, x]:
            out.append(x)
            continue
        residual = (p[i] - q[i]).clamp_min(0)
        return out + [int(torch.multinomial(residual / residual.sum(), 1, generator=g))]
    return out + [int(torch.multinomial(p[len(d)], 1, generator=g))]


def _resample_from_p(d, p, q, g):          # a classic mistake: resample from p, not the residual
    out = []
    for i, x in enumerate(d):
        if float(torch.rand((), generator=g)) < min(1.0, float(p[i, x] / q[i, x])):
            out.append(x)
            continue
        return out + [int(torch.multinomial(p[i], 1, generator=g))]
    return out + [int(torch.multinomial(p[len(d)], 1, generator=g))]


def test_sampled_output_distribution_equals_the_targets_and_wrong_rules_fail():
    n = 3000
    counts, target = _first_two(accept_tokens, n, seed=0)
    joint = _target_joint(target)
    assert joint.sum() == pytest.approx(1.0, abs=1e-5)
    assert _chi_square_p(counts, joint) > 1e-3
    for wrong in (_accept_when_p_beats_q, _resample_from_p):
        bad, _ = _first_two(wrong, n, seed=0)
        assert _chi_square_p(bad, joint) < 1e-6, wrong.__name__


def test_chi_square_helper_matches_known_values():
    # P(chi2_2 > x) = exp(-x / 2)
    assert _gammaincc(1.0, 1.5) == pytest.approx(math.exp(-1.5), rel=1e-9)
    assert _gammaincc(1.0, 0.3) == pytest.approx(math.exp(-0.3), rel=1e-9)


def test_speedup_fades_once_the_verify_step_turns_compute_bound():
    from servelab.roofline import EXAMPLE_REPLICA as r
    from servelab.speculative import speedup_at_batch, verify_step_seconds
    a, k, c = 0.8, 4, 0.05
    lone = speedup_at_batch(r, 1, 8000, a, k, c)
    assert lone == pytest.approx(expected_speedup(a, k, c, verify_cost=1.0), rel=0.01)
    assert verify_step_seconds(r, 1, 8000, 0) == pytest.approx(r.step_seconds(1, 8000))
    crowd = [speedup_at_batch(r, b, 1000, a, k, c) for b in (1, 16, 64, 256, 1024)]
    assert crowd == sorted(crowd, reverse=True) and crowd[-1] < 1 < crowd[0]
