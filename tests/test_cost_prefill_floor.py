"""A prefill is never faster than one read of the weights (cost.prefix_readout)."""
import pytest

from servelab import cost, kvcache
from servelab.arith import prefill_ops
from servelab.roofline import EXAMPLE_REPLICA


def _weight_read(tier):
    t = kvcache.get_tier(tier)
    r = kvcache.kv_calculator(tier, "bf16", seq_len=1224, concurrent=1)
    return r.weights_bytes / (r.num_chips * t.chip.hbm_bandwidth
                              * EXAMPLE_REPLICA.bandwidth_efficiency)


@pytest.mark.parametrize("tier", ["small", "large"])
def test_short_question_after_a_cached_preamble_costs_a_weight_read(tier):
    p = cost.prefix_readout(tier, preamble_tokens=1200, question_tokens=24)
    # 24 tokens of an 8B/70B model in bf16 are far below the H100's ridge
    assert p.cached_ttft_s == pytest.approx(_weight_read(tier))
    assert p.cached_ttft_s > 4e-3          # 16 GB at 3.35 TB/s is >= 4.8 ms


def test_long_prefill_stays_compute_bound():
    t = kvcache.get_tier("small")
    p = cost.prefix_readout("small", preamble_tokens=1200, question_tokens=24)
    rate = t.chip.peak_flops("bf16") * EXAMPLE_REPLICA.compute_efficiency
    assert p.edited_ttft_s == pytest.approx(prefill_ops(t.num_params, 1224, t.config) / rate)
    assert p.edited_ttft_s > _weight_read("small")
    assert p.usd_saved_per_million_requests > 0
