import pytest

from servelab import kvcache as kc
from servelab.specs import get_model


def test_bytes_per_token_for_each_attention_kind():
    llama8 = get_model("Llama-3-8B")
    assert kc.kv_bytes_per_token(llama8, "bf16") == 131_072  # 128 KiB
    assert kc.kv_bytes_per_token("Llama-3-70B", "bf16") == 320 * 1024
    assert kc.kv_bytes_per_token(llama8.with_(num_key_value_heads=32)) == 4 * 131_072  # MHA
    assert kc.kv_bytes_per_token(llama8.with_(num_key_value_heads=1)) == 131_072 // 8  # MQA
    assert kc.kv_elements_per_token_per_layer(get_model("DeepSeek-V3")) == 576  # MLA latent + rope key
    assert kc.kv_bytes_per_token("Example-200B", "fp8") == 163_840  # ~160 KB


def test_seed_calculator_defaults():
    r = kc.kv_calculator("small", "bf16", seq_len=4000, concurrent=16)
    assert r.room_bytes == pytest.approx(60.8e9)
    assert r.max_sequence_tokens == 463_867            # "464k"
    assert r.seats_fit == 115 and r.seats_granted == 16 and r.waiting == 0
    assert r.outweigh_tokens == 122_071                # "122k"
    assert round(r.cache_share_of_weights, 2) == 0.52
    assert round(r.seat_bytes / 1e9, 2) == 0.52 and round(r.cache_in_use_bytes / 1e9, 1) == 8.4


def test_fp8_cache_doubles_the_seats():
    bf16, fp8 = kc.kv_calculator(cache_dtype="bf16"), kc.kv_calculator(cache_dtype="fp8")
    assert fp8.bytes_per_token * 2 == bf16.bytes_per_token
    assert fp8.seats_fit in (2 * bf16.seats_fit, 2 * bf16.seats_fit + 1)


def test_70b_on_two_cards_leaves_about_19_gb():
    r = kc.kv_calculator("large")
    assert r.room_bytes == pytest.approx(19e9)


def test_memory_grants_fewer_seats_than_asked():
    r = kc.kv_calculator("large", seq_len=32_000, concurrent=16)
    assert r.seats_granted == r.seats_fit < 16 and r.waiting == 16 - r.seats_fit


@pytest.mark.parametrize("call,match", [
    (lambda: kc.kv_bytes_per_token("Llama-3-8B", "fp12"), "unknown dtype"),
    (lambda: kc.kv_calculator(seq_len=-5), "sequence length"),
    (lambda: kc.kv_calculator(seq_len=0), "sequence length"),
    (lambda: kc.kv_room_bytes(80e9, 140e9), "do not fit"),
    (lambda: kc.kv_room_bytes(80e9, 16e9, margin=1.5), "margin"),
    (lambda: kc.weights_bytes(-1), "positive"),
    (lambda: kc.kv_calculator(tier="huge"), "unknown model tier"),
])
def test_bad_input_raises_a_clear_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_lab_presets_a_famous_failure_and_two_fixes():
    failure = kc.kv_calculator(**kc.preset("failure: 70B class at 32,000 tokens"))
    fp8 = kc.kv_calculator(**kc.preset("fix 1: the same with an fp8 cache"))
    cards = kc.kv_calculator(**kc.preset("fix 2: the same on four cards"))
    assert (failure.seats_granted, failure.requested) == (1, 16)
    assert failure.seats_granted < fp8.seats_granted < 16 == cards.seats_granted
    assert cards.num_chips == 4 and cards.memory_bytes == 4 * 80e9
    with pytest.raises(ValueError, match="unknown preset"):
        kc.preset("nope")
    with pytest.raises(ValueError, match="unknown knob"):
        kc.lab_settings(cards=3)
    with pytest.raises(ValueError, match="num_chips"):
        kc.kv_calculator(num_chips=0)


def test_binding_constraint_and_ledger_lines_say_what_the_numbers_say():
    ok = kc.kv_calculator()
    assert kc.binding_constraint(ok).startswith("Memory does not bind: all 16 requests")
    bad = kc.kv_calculator("large", seq_len=32_000)
    sentence = kc.binding_constraint(bad)
    assert "holds 1 seat of 32,000 tokens" in sentence and "15 of 16 requests wait" in sentence
    lines = kc.ledger_lines(bad)
    assert lines[0].startswith("Weights: 140.0 GB of the 160 GB on 2 cards") and "1 seat of" in lines[1]
    total = bad.weights_bytes + bad.room_bytes + (bad.memory_bytes - bad.weights_bytes - bad.room_bytes)
    assert total == pytest.approx(bad.memory_bytes)


def test_deltas_against_the_defaults_and_what_mattered():
    base = kc.kv_calculator()
    same = dict((label, change) for label, _, change in kc.readout_deltas(base, base))
    assert set(same.values()) == {"same"}
    fp8 = dict((label, change) for label, _, change in
               kc.readout_deltas(kc.kv_calculator(cache_dtype="fp8"), base))
    assert fp8["bytes per token"] == "0.50x" and fp8["seats granted"] == "same"
    rows = kc.what_mattered({"tier": "large", "seq_len": 32_000, "concurrent": 17})
    verdicts = {knob: verdict for knob, _, _, _, verdict in rows}
    assert verdicts == {"tier": "mattered", "seq_len": "mattered", "concurrent": "noise"}
    assert kc.what_mattered({}) == []

