"""Exercise 6 · Where the weights sit: counting a GQA model's parameters. Hidden tests.

Expected values come from :func:`servelab.arith.count_params`; one behaviour test
also counts the real tensors of a :class:`servelab.model.LlamaModel`.
"""
from servelab import arith
from servelab.grading import Case, Question
from servelab.specs import ModelConfig, get_model

_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
         "num_key_value_heads", "head_dim", "tie_word_embeddings")


def _hf(name: str, drop=(), **changes) -> dict:
    d = get_model(name).with_(**changes).to_hf_dict()
    return {k: d[k] for k in _KEYS if k in d and k not in drop}


# SmolLM-135M's published config.json (https://huggingface.co/HuggingFaceTB/SmolLM-135M): tied, GQA 3:1.
SMOLLM_135M = {"vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
               "num_attention_heads": 9, "num_key_value_heads": 3, "tie_word_embeddings": True}
# The course's own main model (data/models/servelab-main/config.json).
SERVELAB_MAIN = {"vocab_size": 4096, "hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 6,
                 "num_attention_heads": 8, "num_key_value_heads": 4, "tie_word_embeddings": True}
MHA_IMPLICIT = _hf("Llama-2-70B", drop=("num_key_value_heads", "head_dim"), num_key_value_heads=64)
WIDE_HEADS = _hf("Llama-3-8B", hidden_size=2048, num_attention_heads=8, num_key_value_heads=1, head_dim=256)


def _counts(d: dict) -> arith.ParamCount:
    return arith.count_params(ModelConfig.from_hf_dict(d))


def _attn_layer(d: dict) -> int:
    c = _counts(d)
    return c.attention // d["num_hidden_layers"]


Q1 = Question(
    id="q1", title="Attention parameters in one layer", function="attention_params_per_layer", points=3,
    level="easy", minutes=6,
    visible=[Case(args=(_hf("Llama-3-8B"),), expected=41_943_040, label="Llama-3-8B config")],
    hidden=[
        Case(args=(_hf("Llama-3-70B"),), expected=_attn_layer(_hf("Llama-3-70B")), label="Llama-3-70B (GQA 8:1)"),
        Case(args=(SMOLLM_135M,), expected=_attn_layer(SMOLLM_135M), label="SmolLM-135M (GQA 3:1)"),
        Case(args=(MHA_IMPLICIT,), expected=_attn_layer(MHA_IMPLICIT),
             label="MHA config without num_key_value_heads: 4 d^2"),
        Case(args=(WIDE_HEADS,), expected=_attn_layer(WIDE_HEADS), label="explicit head_dim=256, one KV head"),
    ],
)


def _against_real_tensors(func):
    from servelab.model import LlamaConfig, LlamaModel

    for tied in (False, True):
        cfg = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                   num_attention_heads=8, num_key_value_heads=2, head_dim=16, tie_word_embeddings=tied)
        model = LlamaModel(LlamaConfig(**cfg))
        real = model.num_parameters()
        got = func(dict(cfg))
        assert got == real, (f"count_params: a small GQA model (tie_word_embeddings={tied}) has {real:,} "
                             f"parameters in its real tensors, you counted {got:,}")


Q2 = Question(
    id="q2", title="Total parameters from config.json", function="count_params", points=4, level="medium",
    minutes=12,
    visible=[Case(args=(_hf("Llama-3-8B"),), expected=8_030_261_248, label="Llama-3-8B config")],
    hidden=[
        Case(args=(_hf("Llama-3-70B"),), expected=_counts(_hf("Llama-3-70B")).total, label="Llama-3-70B"),
        Case(args=(SMOLLM_135M,), expected=_counts(SMOLLM_135M).total, label="SmolLM-135M (tied embeddings)"),
        Case(args=(SERVELAB_MAIN,), expected=_counts(SERVELAB_MAIN).total, label="servelab-main (tied)"),
        Case(args=(MHA_IMPLICIT,), expected=_counts(MHA_IMPLICIT).total, label="MHA without num_key_value_heads"),
        Case(args=(WIDE_HEADS,), expected=_counts(WIDE_HEADS).total, label="explicit head_dim=256"),
    ],
    test=_against_real_tensors,
)




def _flops(d: dict) -> int:
    return 2 * _counts(d).matmul_active


Q3 = Question(
    id="q3", title="Operations per generated token", function="flops_per_token", points=3, level="medium",
    minutes=8,
    visible=[Case(args=(_hf("Llama-3-8B"),), expected=_flops(_hf("Llama-3-8B")), label="Llama-3-8B config")],
    hidden=[
        Case(args=(_hf("Llama-3-70B"),), expected=_flops(_hf("Llama-3-70B")), label="Llama-3-70B"),
        Case(args=(SMOLLM_135M,), expected=_flops(SMOLLM_135M), label="SmolLM-135M: the tied head still multiplies"),
        Case(args=(SERVELAB_MAIN,), expected=_flops(SERVELAB_MAIN), label="servelab-main"),
        Case(args=(WIDE_HEADS,), expected=_flops(WIDE_HEADS), label="explicit head_dim=256"),
    ],
)

QUESTIONS = [Q1, Q2, Q3]
