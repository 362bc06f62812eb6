"""servelab.cost: chip-seconds and dollars per chat, and what moves them."""
import math

import pytest
from hypothesis import given, settings, strategies as st

from servelab import cost, roofline as rl


def test_prices_have_sources():
    assert set(cost.CHIP_HOURLY_USD) == set(cost.PRICE_SOURCES)
    assert all(p > 0 for p in cost.CHIP_HOURLY_USD.values())
    assert all("http" in s for s in cost.PRICE_SOURCES.values())


def test_chat_cost_by_hand():
    R = rl.EXAMPLE_REPLICA
    c = cost.chat_cost(conversation_tokens=8000, reply_tokens=500, cached_share=0.5,
                       price_per_chip_hour=4.0, config=None)
    assert c.cached_tokens == 4000 and c.fresh_tokens == 4000
    prefill_replica_s = 2 * 200e9 * 4000 / (8 * 4.5e15 * 0.5)
    assert c.prefill_chip_s == pytest.approx(prefill_replica_s * 8)
    step = R.step_seconds(128, 8250)
    assert c.batch == 128 and c.step_s == pytest.approx(step)
    assert c.decode_chip_s == pytest.approx(500 * step / 128 * 8)
    assert c.usd_per_chat == pytest.approx(c.chip_s * 4.0 / 3600)
    assert c.output_usd_per_million == pytest.approx(step / 128 * 8 * 4.0 / 3600 * 1e6)
    assert c.input_usd_per_million == pytest.approx(prefill_replica_s * 8 / 4000 * 4.0 / 3600 * 1e6)
    assert c.blended_input_usd_per_million == pytest.approx(c.input_usd_per_million / 2)


def test_output_tokens_cost_more_than_input():
    c = cost.chat_cost()
    assert c.output_usd_per_million > 2 * c.input_usd_per_million
    assert c.output_to_input_ratio == pytest.approx(c.output_usd_per_million / c.input_usd_per_million)


def test_attention_adds_to_prefill():
    with_attn = cost.chat_cost(config="Example-200B")
    without = cost.chat_cost(config=None)
    assert with_attn.prefill_chip_s > without.prefill_chip_s
    assert with_attn.decode_chip_s == without.decode_chip_s


def test_batch_lowered_when_memory_is_short():
    c = cost.chat_cost(conversation_tokens=500_000, reply_tokens=1000)
    assert c.batch == rl.EXAMPLE_REPLICA.people(500_500) < 128


def test_fully_cached_prompt_costs_no_prefill():
    c = cost.chat_cost(cached_share=1.0)
    assert c.prefill_chip_s == 0 and c.input_usd_per_million == 0
    assert math.isinf(c.output_to_input_ratio)


def test_default_price_by_chip_and_other_chip():
    assert cost.chat_cost().price_per_chip_hour == cost.CHIP_HOURLY_USD["B200"]
    r = rl.Replica.for_model("Llama-3-70B", "H100", 2, weight_dtype="bf16", cache_dtype="bf16", dtype="bf16")
    c = cost.chat_cost(replica=r, config="Llama-3-70B", conversation_tokens=2000)
    assert c.price_per_chip_hour == cost.CHIP_HOURLY_USD["H100 SXM"]
    with pytest.raises(ValueError, match="no listed price"):
        cost.chat_cost(replica=rl.Replica.for_model("Llama-3-70B", "A100 80GB", 2, weight_dtype="bf16",
                                                    dtype="bf16"))


@pytest.mark.parametrize("kwargs", [
    {"conversation_tokens": 0}, {"reply_tokens": -1}, {"cached_share": 1.5}, {"cached_share": -0.1},
    {"price_per_chip_hour": 0}, {"price_per_chip_hour": -2.0}, {"batch": 0}, {"prefill_efficiency": 0},
    {"prefill_efficiency": 1.2}, {"replica": "B200"}, {"config": "no-such-model"},
    {"conversation_tokens": 20_000_000},  # one conversation does not fit
])
def test_bad_input(kwargs):
    with pytest.raises(ValueError):
        cost.chat_cost(**kwargs)


def test_sensitivity_sorted_and_consistent():
    results = cost.sensitivity()
    assert [s.swing for s in results] == sorted((s.swing for s in results), reverse=True)
    knobs = {s.knob: s for s in results}
    assert set(knobs) == set(cost.SENSITIVITY_RANGES)
    base = cost.chat_cost().usd_per_chat
    assert all(s.base_usd == pytest.approx(base) for s in results)
    price = knobs["price_per_chip_hour"]
    assert price.low_usd == pytest.approx(base / 2) and price.high_usd == pytest.approx(2 * base)
    assert knobs["cached_share"].high_usd < knobs["cached_share"].low_usd
    # the seed's claim: cached share, conversation length and reply length move the answer a lot
    top3 = {s.knob for s in results[:4]}
    assert {"conversation_tokens", "reply_tokens", "cached_share"} <= top3


def test_sensitivity_custom_and_bad_knob():
    res = cost.sensitivity({"reply_tokens": 1000}, {"reply_tokens": ("x0.5", "x2")})
    assert res[0].low_value == 500 and res[0].high_value == 2000
    with pytest.raises(ValueError, match="unknown knob"):
        cost.sensitivity(ranges={"temperature": (0, 1)})


def test_plot_sensitivity():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ax = cost.plot_sensitivity(cost.sensitivity())
    assert len(ax.patches) == len(cost.SENSITIVITY_RANGES)
    plt.close(ax.figure)
    with pytest.raises(ValueError):
        cost.plot_sensitivity([])


@settings(max_examples=40, deadline=None)
@given(conv=st.integers(100, 200_000), reply=st.integers(1, 8000), share=st.floats(0, 1),
       price=st.floats(0.1, 50))
def test_cost_properties(conv, reply, share, price):
    c = cost.chat_cost(conversation_tokens=conv, reply_tokens=reply, cached_share=share,
                       price_per_chip_hour=price)
    assert c.usd_per_chat > 0
    assert c.usd_per_chat == pytest.approx(c.chip_s * price / 3600)
    more_cache = cost.chat_cost(conversation_tokens=conv, reply_tokens=reply, cached_share=min(1.0, share + 0.1),
                                price_per_chip_hour=price)
    assert more_cache.prefill_chip_s <= c.prefill_chip_s + 1e-12
    longer = cost.chat_cost(conversation_tokens=conv, reply_tokens=reply + 100, cached_share=share,
                            price_per_chip_hour=price)
    assert longer.decode_chip_s > c.decode_chip_s


def test_prefix_readout_hit_versus_edit():
    r = cost.prefix_readout("small", preamble_tokens=2000, question_tokens=50)
    # a hit prefills only the question (with attention over the cached preamble),
    # and so short a prefill is one read of the weights (memory-bound), not 40x less
    assert r.cached_ttft_s < r.edited_ttft_s and 5 < r.speedup < 20
    assert r.cached_ttft_s > 0
    assert r.chip_s_saved == pytest.approx(r.edited_ttft_s - r.cached_ttft_s)
    assert r.usd_saved_per_million_requests == pytest.approx(r.chip_s_saved * 3.99 / 3600 * 1e6)
    assert r.preamble_kv_bytes == 2000 * 131_072
    big = cost.prefix_readout("large", 2000, 50)
    assert big.num_chips == 2 and big.edited_ttft_s > r.edited_ttft_s
    with pytest.raises(ValueError):
        cost.prefix_readout(preamble_tokens=0)
    with pytest.raises(ValueError):
        cost.prefix_readout(efficiency=1.5)


def test_prompt_cache_terms_are_sourced():
    for provider, terms in cost.PROMPT_CACHE_TERMS.items():
        assert terms["source"].count("http") == 1, provider
        assert 0 < terms["read_price_share"] < 1 and terms["ttl_minutes"] > 0
