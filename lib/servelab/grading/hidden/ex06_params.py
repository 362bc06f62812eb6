"""Exercise 6 · Counting parameters and the work per token. Hidden tests.

Expected values come from :func:`servelab.arith.count_params` at import time
(cheap, pure Python), plus one golden number measured once by summing the
parameters of a ``transformers.LlamaForCausalLM``; ``tests/test_ex06_params.py``
rebuilds that model and checks the golden number still holds.
"""
from servelab import arith
from servelab.grading import Case, Question
from servelab.specs import ModelConfig, get_model

#: The keys a Llama-style config.json uses for the parameter count.
_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
         "num_key_value_heads", "head_dim", "tie_word_embeddings")


def hf_config(name: str, drop: tuple[str, ...] = (), **changes) -> dict:
    """A registered model's config.json as a dict of the Llama keys (optionally without some)."""
    d = get_model(name).with_(**changes).to_hf_dict()
    return {k: d[k] for k in _KEYS if k in d and k not in drop}


def expected_params(config: dict) -> int:
    return arith.count_params(ModelConfig.from_hf_dict(config, name="case")).total


# SmolLM-135M's published config.json (https://huggingface.co/HuggingFaceTB/SmolLM-135M):
# tied embeddings, GQA 9 query heads : 3 KV heads, no head_dim key.
SMOLLM_135M = {"vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
               "num_attention_heads": 9, "num_key_value_heads": 3, "tie_word_embeddings": True}
# Llama 2 7B's shape written as old MHA configs were: no num_key_value_heads, no head_dim.
LLAMA2_7B_MHA = {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
                 "num_attention_heads": 32, "tie_word_embeddings": False}
# Heads wider than width / heads (as Gemma does): q and o are hidden x (heads x head_dim), not hidden².
WIDE_HEADS = {"vocab_size": 32000, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 12,
              "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 256, "tie_word_embeddings": False}
# A missing tie_word_embeddings key means untied (the LlamaConfig default).
NO_TIE_KEY = {k: v for k, v in hf_config("Llama-3-8B", num_hidden_layers=4).items() if k != "tie_word_embeddings"}

#: Golden: sum(p.numel() for p in transformers.LlamaForCausalLM(LlamaConfig(**TRANSFORMERS_GOLDEN_CONFIG))
#: .parameters()) with transformers 5.24 (tied, GQA 6:2, head_dim 24 != 96 / 6).
TRANSFORMERS_GOLDEN_CONFIG = {"vocab_size": 1000, "hidden_size": 96, "intermediate_size": 256,
                              "num_hidden_layers": 3, "num_attention_heads": 6, "num_key_value_heads": 2,
                              "head_dim": 24, "tie_word_embeddings": True}
TRANSFORMERS_GOLDEN_PARAMS = 428_448
assert expected_params(TRANSFORMERS_GOLDEN_CONFIG) == TRANSFORMERS_GOLDEN_PARAMS

Q1 = Question(
    id="q1", title="Parameters from a config.json", function="count_llama_params", points=4, level="medium",
    minutes=12,
    visible=[Case(args=(hf_config("Llama-3-8B"),), expected=8_030_261_248, label="Llama-3-8B config")],
    hidden=[
        Case(args=(hf_config("Llama-3-70B"),), expected=expected_params(hf_config("Llama-3-70B")),
             label="Llama-3-70B config (GQA 64:8)"),
        Case(args=(hf_config("Llama-3.1-405B"),), expected=expected_params(hf_config("Llama-3.1-405B")),
             label="Llama-3.1-405B config (GQA 128:8)"),
        Case(args=(SMOLLM_135M,), expected=expected_params(SMOLLM_135M), label="SmolLM-135M (tied, GQA 9:3)"),
        Case(args=(LLAMA2_7B_MHA,), expected=expected_params(LLAMA2_7B_MHA),
             label="Llama-2-7B, MHA without num_key_value_heads"),
        Case(args=(WIDE_HEADS,), expected=expected_params(WIDE_HEADS), label="explicit head_dim=256, 16 heads, d=2048"),
        Case(args=(hf_config("Llama-3-8B", num_key_value_heads=1),),
             expected=expected_params(hf_config("Llama-3-8B", num_key_value_heads=1)), label="an MQA config"),
        Case(args=(NO_TIE_KEY,), expected=expected_params(NO_TIE_KEY), label="no tie_word_embeddings key"),
        Case(args=(TRANSFORMERS_GOLDEN_CONFIG,), expected=TRANSFORMERS_GOLDEN_PARAMS,
             label="tiny tied GQA config, counted by transformers"),
    ],
)


def _parts(config: dict) -> dict:
    c = arith.count_params(ModelConfig.from_hf_dict(config, name="case"))
    return {"embedding": c.embedding, "attention": c.attention, "mlp": c.mlp, "norms": c.norms,
            "lm_head": c.lm_head}


def _expected_ops(config: dict) -> int:
    return 2 * arith.count_params(ModelConfig.from_hf_dict(config, name="case")).matmul_active


#: The course's tiny model (data/models/servelab-main): tied, GQA 8:4.
SERVELAB_MAIN = {"vocab_size": 4096, "hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 6,
                 "num_attention_heads": 8, "num_key_value_heads": 4, "tie_word_embeddings": True}

Q2 = Question(
    id="q2", title="Operations per token from the parts", function="matmul_ops_per_token", points=3,
    level="easy", minutes=6,
    visible=[Case(args=(_parts(SERVELAB_MAIN),), expected=11_534_336, label="the tiny model's parts (tied head)")],
    hidden=[
        Case(args=(_parts(hf_config("Llama-3-8B")),), expected=_expected_ops(hf_config("Llama-3-8B")),
             label="Llama-3-8B parts (untied head)"),
        Case(args=(_parts(SMOLLM_135M),), expected=_expected_ops(SMOLLM_135M), label="SmolLM-135M parts (tied)"),
        Case(args=(_parts(LLAMA2_7B_MHA),), expected=_expected_ops(LLAMA2_7B_MHA), label="Llama-2-7B parts"),
        Case(args=({"embedding": 10, "attention": 0, "mlp": 0, "norms": 4, "lm_head": 0},), expected=20,
             label="only a tied head"),
        Case(args=({"embedding": 0, "attention": 3, "mlp": 5, "norms": 100, "lm_head": 7},), expected=30,
             label="norms never count"),
    ],
)

QUESTIONS = [Q1, Q2]
