"""Exercise 10 · The KV cache: the work it saves and the bytes it costs. Hidden tests.

Q1's expected counts replay chapter 10's decoding loop (``decode_greedy``): one
pass per new token, the first pass reads the prompt, and without a cache every
pass re-reads everything so far. Q2's expected times come from
:func:`servelab.kvcache.kv_bytes_per_token` and
:func:`servelab.roofline.decode_step_seconds`; Q3's from
:func:`servelab.kvcache.outweigh_tokens`, so the exercise and the library can
never disagree.
"""
from servelab import kvcache, roofline
from servelab.grading import Case, Question
from servelab.specs import get_model

# ---------------------------------------------------------------------------
# Q1 · Token positions pushed through the model
# ---------------------------------------------------------------------------


def _positions(prompt_tokens: int, new_tokens: int) -> tuple[int, int]:
    """Chapter 10's loop, counted: ``new_tokens`` passes; pass i sees prompt + i tokens.

    The last written token gets no pass of its own (nothing follows it), exactly
    as in the chapter's ``decode_greedy`` and its ``kv_rows_cached`` count.
    """
    lengths = range(prompt_tokens, prompt_tokens + new_tokens)  # context of each pass
    uncached = sum(lengths)                                      # every pass re-reads it all
    cached = prompt_tokens + (new_tokens - 1)                    # prompt once, then one token a pass
    return uncached, cached


Q1 = Question(
    id="q1", title="Work saved by the cache", function="token_positions", points=3, level="easy", minutes=8,
    visible=[Case(args=(10, 5), expected=(60, 14), label="10-token prompt, 5 new tokens")],
    hidden=[
        Case(args=(1, 1000), expected=_positions(1, 1000),
             label="1-token prompt, 1,000 new tokens (the chapter's ~N^2/2 vs N)"),
        Case(args=(3000, 1), expected=_positions(3000, 1),
             label="one new token: the cache saves nothing yet"),
        Case(args=(1, 1), expected=(1, 1), label="1-token prompt, 1 new token"),
        Case(args=(2, 2), expected=_positions(2, 2),
             label="the last token needs no pass (2 + 3 vs 2 + 1)"),
        Case(args=(500, 2000), expected=_positions(500, 2000), label="500-token prompt, 2,000 new tokens"),
        Case(args=(8000, 1_000_000), expected=_positions(8000, 1_000_000),
             label="8,000-token prompt, 1,000,000 new tokens (exact whole numbers)"),
        Case(args=(0, 5), raises=ValueError, label="an empty prompt"),
        Case(args=(10, 0), raises=ValueError, label="no new tokens"),
        Case(args=(-3, 5), raises=ValueError, label="a negative prompt length"),
    ],
)

# ---------------------------------------------------------------------------
# Q2 · One decode step, the cache priced from the model's shape
# ---------------------------------------------------------------------------

_DTYPE = {4: "fp32", 2: "bf16", 1: "fp8", 0.5: "fp4"}


def _step(weights, layers, kv_heads, head_dim, bytes_per_value, batch, context, bandwidth,
          efficiency=roofline.DEFAULT_BANDWIDTH_EFFICIENCY, overhead_s=roofline.DEFAULT_STEP_OVERHEAD_S):
    # only the KV heads are cached; as many query heads as KV heads keeps the shape valid
    shape = get_model("Example-200B").with_(num_hidden_layers=layers, num_attention_heads=kv_heads,
                                            num_key_value_heads=kv_heads, head_dim=head_dim)
    bpt = kvcache.kv_bytes_per_token(shape, _DTYPE[bytes_per_value])
    return roofline.decode_step_seconds(weights, bpt, batch, context, bandwidth, efficiency, overhead_s)


# The 200B running example's replica: 200 GB of 8-bit weights, 80 layers x 8 KV heads of 128 at 1 byte, 8 x 8 TB/s.
_SEED = (200e9, 80, 8, 128, 1)
_BW = 64e12

Q2 = Question(
    id="q2", title="One decode step, cache included", function="decode_step_seconds", points=4,
    level="medium", minutes=10,
    visible=[Case(args=(*_SEED, 128, 8000, _BW), expected=_step(*_SEED, 128, 8000, _BW),
                  label="the 200B example: 128 people at 8,000 tokens (about 11.6 ms)")],
    hidden=[
        Case(args=(*_SEED, 128, 8000, _BW), kwargs={"efficiency": 0.6, "overhead_s": 0.002},
             expected=_step(*_SEED, 128, 8000, _BW), label="the 200B example with its defaults spelled out"),
        Case(args=(200e9, 80, 8, 128, 2, 64, 32_000, _BW), expected=_step(200e9, 80, 8, 128, 2, 64, 32_000, _BW),
             label="bf16 cache, 64 people at 32,000 tokens: the KV reads outweigh the weights"),
        Case(args=(*_SEED, 1, 0, _BW), expected=_step(*_SEED, 1, 0, _BW),
             label="one person, empty cache: weights and overhead only"),
        Case(args=(16e9, 32, 8, 128, 2, 32, 4000, 3.35e12), kwargs={"efficiency": 0.8, "overhead_s": 0.0},
             expected=_step(16e9, 32, 8, 128, 2, 32, 4000, 3.35e12, 0.8, 0.0),
             label="Llama-3-8B shape on one card, 80% efficiency, no overhead"),
        Case(args=(140e9, 80, 64, 128, 2, 8, 4000, 2 * 3.35e12), kwargs={"overhead_s": 0.001},
             expected=_step(140e9, 80, 64, 128, 2, 8, 4000, 2 * 3.35e12, overhead_s=0.001),
             label="an MHA shape (64 KV heads), 1 ms overhead"),
        Case(args=(7e9, 28, 4, 128, 4, 16, 2048, 1e12), expected=_step(7e9, 28, 4, 128, 4, 16, 2048, 1e12),
             label="fp32 cache, 4 KV heads"),
        Case(args=(*_SEED, 0, 8000, _BW), raises=ValueError, label="zero people"),
        Case(args=(*_SEED, 128, -1, _BW), raises=ValueError, label="a negative context"),
        Case(args=(*_SEED, 128, 8000, 0.0), raises=ValueError, label="zero bandwidth"),
        Case(args=(*_SEED, 128, 8000, _BW), kwargs={"efficiency": 1.5}, raises=ValueError,
             label="efficiency 1.5"),
        Case(args=(*_SEED, 128, 8000, _BW), kwargs={"efficiency": 0.0}, raises=ValueError,
             label="efficiency 0"),
    ],
)

# ---------------------------------------------------------------------------
# Q3 · The context at which the cache read equals the weights read
# ---------------------------------------------------------------------------


def _even(weights, batch, bpt):
    # the whole batch's cache at context c is batch x c x bpt bytes; outweigh_tokens
    # rounds weights / bytes-per-context-token up to a whole token
    return kvcache.outweigh_tokens(weights, batch * bpt)


_BPT_SEED = kvcache.kv_bytes_per_token("Example-200B", "fp8")     # 163,840
_BPT_8B = kvcache.kv_bytes_per_token("Llama-3-8B", "bf16")         # 131,072
_BPT_70B = kvcache.kv_bytes_per_token("Llama-3-70B", "bf16")       # 327,680

Q3 = Question(
    id="q3", title="Where the cache read catches up with the weights", function="even_context", points=3,
    level="medium", minutes=10,
    visible=[Case(args=(200e9, 128, _BPT_SEED), expected=_even(200e9, 128, _BPT_SEED),
                  label="the 200B replica, 128 people")],
    hidden=[
        Case(args=(16e9, 1, _BPT_8B), expected=_even(16e9, 1, _BPT_8B),
             label="Llama-3-8B, one person (chapter 11's 122k)"),
        Case(args=(128 * 8000 * _BPT_SEED, 128, _BPT_SEED), expected=8000,
             label="an exact whole context: equal counts, no rounding up past it"),
        Case(args=(140e9, 64, _BPT_70B), expected=_even(140e9, 64, _BPT_70B), label="Llama-3-70B, 64 people"),
        Case(args=(35e9, 32, 40_960.0), expected=_even(35e9, 32, 40_960.0),
             label="fractional ratio, float bytes per token"),
        Case(args=(1000, 4, 1e6), expected=1, label="less than one token still rounds up to 1"),
        Case(args=(200e9, 1, _BPT_SEED), expected=_even(200e9, 1, _BPT_SEED), label="the 200B replica, one person"),
        Case(args=(0, 128, _BPT_SEED), raises=ValueError, label="no weights"),
        Case(args=(200e9, 0, _BPT_SEED), raises=ValueError, label="zero people"),
        Case(args=(200e9, -4, _BPT_SEED), raises=ValueError, label="a negative batch"),
        Case(args=(200e9, 128, -163_840), raises=ValueError, label="negative bytes per token"),
    ],
)

QUESTIONS = [Q1, Q2, Q3]
