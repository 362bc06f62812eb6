"""Exercise 11 · Seats: what memory grants. Hidden tests.

Expected values come from :mod:`servelab.kvcache`, so the exercise and the
library can never disagree.
"""
from servelab import kvcache
from servelab.grading import Case, Question
from servelab.grading.hidden._configs import hf_config as _hf, kv_bytes as _bpt, kv_case as _kv_case

GB = 1e9


# An MHA config that leaves num_key_value_heads out (transformers then uses
# num_attention_heads), and configs whose explicit head_dim is neither
# hidden_size // heads nor hidden_size // KV heads (Gemma- and Qwen3-style).
_MHA_IMPLICIT = _hf("Llama-2-70B", drop=("num_key_value_heads", "head_dim"), num_key_value_heads=64)
_WIDE_HEADS = _hf("Llama-3-8B", hidden_size=2048, num_attention_heads=16, num_key_value_heads=1, head_dim=256)
_NARROW_HEADS = _hf("Llama-3-8B", head_dim=64)            # 4096 / 32 = 128, 4096 / 8 = 512
assert _WIDE_HEADS["hidden_size"] // _WIDE_HEADS["num_attention_heads"] != _WIDE_HEADS["head_dim"]
assert _NARROW_HEADS["hidden_size"] // _NARROW_HEADS["num_attention_heads"] != _NARROW_HEADS["head_dim"]

Q1 = Question(
    id="q1", title="KV bytes per token", function="kv_bytes_per_token", points=3, level="easy", minutes=5,
    visible=[Case(args=(_hf("Llama-3-8B"), 2), expected=131_072, label="Llama-3-8B config, 2 bytes")],
    hidden=[
        _kv_case("Llama-3-70B", 2, "Llama-3-70B config, 2 bytes"),
        _kv_case("Llama-3-8B", 1, "Llama-3-8B config, fp8"),
        _kv_case("Qwen2.5-7B", 2, "Qwen2.5-7B config (GQA 7:1)"),
        _kv_case("Llama-3-8B", 2, "an MQA config", num_key_value_heads=1),
        Case(args=(_MHA_IMPLICIT, 2), expected=_bpt("Llama-2-70B", 2, num_key_value_heads=64),
             label="MHA config without num_key_value_heads"),
        Case(args=(_hf("Llama-3-70B", drop=("head_dim",)), 2), expected=_bpt("Llama-3-70B", 2),
             label="GQA config without head_dim (it is hidden_size / attention heads)"),
        Case(args=(_WIDE_HEADS, 4), expected=32 * 2 * 1 * 256 * 4,
             label="explicit head_dim=256 (hidden/heads would say 128), 1 KV head, fp32"),
        Case(args=(_NARROW_HEADS, 2), expected=32 * 2 * 8 * 64 * 2,
             label="explicit head_dim=64 (hidden/heads would say 128), 8 KV heads, bf16"),
    ],
)


def _seats(card, weights, bpt, seq_len, margin=0.05):
    return kvcache.seats_granted(kvcache.kv_room_bytes(card, weights, margin), bpt, seq_len)


Q2 = Question(
    id="q2", title="Seats granted", function="seats_granted", points=3, level="easy", minutes=8,
    visible=[Case(args=(80 * GB, 16 * GB, 131_072, 4000), expected=115)],
    hidden=[
        Case(args=(80 * GB, 16 * GB, 65_536, 4000), expected=_seats(80 * GB, 16 * GB, 65_536, 4000)),
        Case(args=(80 * GB, 16 * GB, 131_072, 4000), kwargs={"margin": 0.0},
             expected=_seats(80 * GB, 16 * GB, 131_072, 4000, 0.0)),
        Case(args=(80 * GB, 16 * GB, 131_072, 1_000_000), expected=0),
        Case(args=(80 * GB, 16 * GB, 131_072, 1), expected=_seats(80 * GB, 16 * GB, 131_072, 1)),
        Case(args=(141 * GB, 70 * GB, 327_680, 8000), expected=_seats(141 * GB, 70 * GB, 327_680, 8000)),
        Case(args=(80 * GB, 140 * GB, 327_680, 4000), raises=ValueError, label="weights bigger than the card"),
        Case(args=(80 * GB, 16 * GB, 131_072, 0), raises=ValueError, label="a zero-length sequence"),
        Case(args=(80 * GB, 16 * GB, 131_072, -10), raises=ValueError, label="a negative length"),
    ],
)

_TP_SIZES = (1, 2, 4, 8)


def _cards(params, bytes_per_param, card, bpt, seq_len, seats, margin=0.05):
    weights = params * bytes_per_param
    for n in _TP_SIZES:
        if weights / n >= card:
            continue
        room = n * kvcache.kv_room_bytes(card, weights / n, margin)
        if seats == 0 or kvcache.seats_granted(room, bpt, seq_len) >= seats:
            return n
    raise AssertionError("test case has no answer")


_BPT_70B = _bpt("Llama-3-70B", 2)
_BPT_405B = _bpt("Llama-3.1-405B", 1)

Q3 = Question(
    id="q3", title="Cards for a model and its seats", function="cards_needed", points=4, level="medium",
    minutes=12,
    visible=[Case(args=(8e9, 2, 80 * GB, 131_072, 4000, 16), expected=1),
             Case(args=(70e9, 2, 80 * GB, _BPT_70B, 4000, 8), expected=2)],
    hidden=[
        Case(args=(70e9, 2, 80 * GB, _BPT_70B, 4000, 16), expected=_cards(70e9, 2, 80 * GB, _BPT_70B, 4000, 16),
             label="70B bf16, 16 seats of 4,000 tokens on 80 GB cards"),
        Case(args=(405e9, 1, 80 * GB, _BPT_405B, 4000, 16),
             expected=_cards(405e9, 1, 80 * GB, _BPT_405B, 4000, 16), label="405B fp8, 16 seats"),
        Case(args=(70e9, 2, 80 * GB, _BPT_70B, 4000, 0), expected=2, label="70B bf16, no seats asked"),
        Case(args=(405e9, 2, 80 * GB, _BPT_405B, 4000, 1), raises=ValueError,
             label="405B bf16: 810 GB of weights on at most 8 x 80 GB"),
        Case(args=(8e9, 2, 80 * GB, 131_072, 4000, 2000), raises=ValueError,
             label="8B with 2,000 seats of 4,000 tokens"),
        Case(args=(8e9, 2, 80 * GB, 131_072, 4000, 200), expected=_cards(8e9, 2, 80 * GB, 131_072, 4000, 200),
             label="8B with 200 seats of 4,000 tokens"),
        Case(args=(70e9, 2, 80 * GB, _BPT_70B, 4000, 130), expected=_cards(70e9, 2, 80 * GB, _BPT_70B, 4000, 130),
             label="70B bf16, 130 seats: the group's room is pooled, not whole seats per card x cards"),
    ],
)

QUESTIONS = [Q1, Q2, Q3]
