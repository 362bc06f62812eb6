"""expected_longest with a cap, and the finite-batch step-ratio model (ch17)."""
import random

import pytest

from servelab.engine.workload import expected_longest, static_over_continuous_steps


def test_capped_longest_is_below_cap_and_tends_to_h_n():
    assert expected_longest(64, cap=256 / 96) < 256 / 96
    assert expected_longest(64, cap=256 / 96) == pytest.approx(2.665, abs=0.005)
    assert expected_longest(16, cap=50.0) == pytest.approx(expected_longest(16), rel=1e-6)
    assert expected_longest(1, cap=1.0) == pytest.approx(1 - 0.36788, abs=1e-4)


def test_capped_longest_matches_sampling():
    rng = random.Random(0)
    n, cap, trials = 16, 2.5, 4000
    got = sum(min(max(rng.expovariate(1) for _ in range(n)), cap) for _ in range(trials)) / trials
    assert got == pytest.approx(expected_longest(n, cap=cap), rel=0.02)


def test_step_ratio_model_limits_and_errors():
    assert static_over_continuous_steps(64, 64) == pytest.approx(1.0)
    many = static_over_continuous_steps(100_000, 16)
    assert many == pytest.approx(expected_longest(16), rel=0.01)
    assert static_over_continuous_steps(128, 16, cap=2.67) > static_over_continuous_steps(128, 64, cap=2.67)
    with pytest.raises(ValueError, match="seats <= requests"):
        static_over_continuous_steps(8, 16)
    with pytest.raises(ValueError, match="cap"):
        expected_longest(4, cap=0)
