"""servelab.roofline.request_stages: one request's prefill and decode time on a replica."""
import pytest

from servelab import arith
from servelab import roofline as rl
from servelab.kvcache import kv_bytes_per_token


def _h100_8b(**kw):
    n = arith.count_params("Llama-3-8B").total
    return rl.Replica.for_model("Llama-3-8B", "H100", 1, weight_dtype="bf16", cache_dtype="bf16",
                                num_params=n, **kw)


def test_llama3_8b_on_h100_worked_figures():
    r = _h100_8b()
    s = rl.request_stages(r, 3000, 500, batch=1, config="Llama-3-8B")
    # prefill: (2 x 8.03e9 x 3,000 + attention) / (989.4 TFLOP/s x 0.5) + 2 ms
    ops = arith.prefill_ops(r.num_params, 3000, "Llama-3-8B")
    assert s.prefill_s == pytest.approx(0.002 + ops / (989.4e12 * 0.5))
    assert 0.09 < s.prefill_s < 0.12
    # one decode step alone: (16.06 GB + 3,001 x 131,072 B) / (3.35 TB/s x 0.6) + 2 ms
    kv = kv_bytes_per_token("Llama-3-8B", "bf16")
    assert kv == 131_072
    assert s.first_step_s == pytest.approx((r.weights_bytes + 3001 * kv) / (3.35e12 * 0.6) + 0.002)
    assert 0.009 < s.mean_step_s < 0.011
    assert s.decode_s == pytest.approx(sum(r.step_seconds(1, 3000 + i) for i in range(1, 500)))
    assert s.total_s == pytest.approx(s.prefill_s + s.decode_s)


def test_batching_slows_each_step_but_not_prefill():
    r = _h100_8b()
    alone = rl.request_stages(r, 3000, 100, batch=1, config="Llama-3-8B")
    shared = rl.request_stages(r, 3000, 100, batch=64, config="Llama-3-8B")
    assert shared.prefill_s == alone.prefill_s
    assert shared.mean_step_s > 2 * alone.mean_step_s   # 64 caches of 3,000 tokens read each step
    assert shared.first_step_s < shared.last_step_s     # the context grows a token a step


def test_short_prompt_prefill_is_a_weights_read():
    r = _h100_8b()
    s = rl.request_stages(r, 1, 1)
    assert s.prefill_s == pytest.approx(0.002 + r.weights_bytes / (3.35e12 * 0.6))
    assert s.decode_s == 0 and s.mean_step_s == 0 and s.first_step_s == 0


def test_cached_prefix_skips_its_prefill():
    r = _h100_8b()
    full = rl.request_stages(r, 3000, 10, config="Llama-3-8B")
    hit = rl.request_stages(r, 3000, 10, config="Llama-3-8B", cached_tokens=2000)
    assert hit.prefill_s < full.prefill_s / 2
    assert hit.decode_s == full.decode_s                 # the cache still holds all 3,000 tokens


def test_efficiencies_are_inputs():
    slow = rl.request_stages(_h100_8b(compute_efficiency=0.25), 3000, 2, config="Llama-3-8B")
    fast = rl.request_stages(_h100_8b(compute_efficiency=0.5), 3000, 2, config="Llama-3-8B")
    assert slow.prefill_s - 0.002 == pytest.approx(2 * (fast.prefill_s - 0.002))


@pytest.mark.parametrize("kw", [dict(prompt_tokens=0), dict(reply_tokens=0), dict(batch=0),
                                dict(cached_tokens=3000), dict(cached_tokens=-1),
                                dict(prompt_tokens=2.5), dict(batch=True)])
def test_bad_input_names_the_argument(kw):
    args = dict(prompt_tokens=3000, reply_tokens=10, batch=1)
    args.update(kw)
    name = next(iter(kw))
    with pytest.raises(ValueError, match=name):
        rl.request_stages(_h100_8b(), **args)


def test_replica_must_be_a_replica():
    with pytest.raises(ValueError, match="Replica"):
        rl.request_stages("H100", 10, 10)
