"""servelab.engine.workload: the benchmark's request mix and its statistics."""
from __future__ import annotations

import random

import numpy as np
import pytest

from servelab.engine.workload import expected_longest, mixed_workload, percentile


def test_workload_is_seeded_and_within_its_bounds():
    a = mixed_workload(200, vocab_size=50, seed=3, prompt_min=4, prompt_max=300, output_cap=64)
    b = mixed_workload(200, vocab_size=50, seed=3, prompt_min=4, prompt_max=300, output_cap=64)
    assert a == b
    assert a != mixed_workload(200, vocab_size=50, seed=4, prompt_min=4, prompt_max=300, output_cap=64)
    assert all(4 <= len(r.prompt_token_ids) <= 300 for r in a)
    assert all(1 <= r.max_tokens <= 64 for r in a)
    assert all(0 <= t < 50 for r in a for t in r.prompt_token_ids)


def test_workload_has_a_long_tail():
    w = mixed_workload(2000, vocab_size=10, seed=0)
    outs = [r.max_tokens for r in w]
    assert 85 < np.mean(outs) < 105            # exponential, mean 96 (slightly trimmed by the cap)
    assert percentile(outs, 99) > 3.5 * np.median(outs)
    prompts = [len(r.prompt_token_ids) for r in w]
    assert 115 < np.median(prompts) < 140       # log-normal, median 128


@pytest.mark.parametrize("n,vocab", [(-1, 10), (3, 0)])
def test_workload_refuses_bad_sizes(n, vocab):
    with pytest.raises(ValueError, match="n >= 0"):
        mixed_workload(n, vocab_size=vocab)


def test_percentile_matches_numpy():
    rng = random.Random(0)
    xs = [rng.random() for _ in range(37)]
    for q in (0, 5, 50, 95, 99, 100):
        assert percentile(xs, q) == pytest.approx(np.percentile(xs, q))
    with pytest.raises(ValueError, match="empty"):
        percentile([], 50)


def test_expected_longest_is_the_harmonic_number_and_matches_sampling():
    assert expected_longest(1) == 1.0
    assert expected_longest(2) == 1.5
    assert round(expected_longest(32), 2) == 4.06
    rng = np.random.default_rng(0)
    for n in (4, 32):
        longest = rng.exponential(1.0, size=(20_000, n)).max(axis=1).mean()
        assert longest == pytest.approx(expected_longest(n), rel=0.02)
    with pytest.raises(ValueError, match="at least one"):
        expected_longest(0)
