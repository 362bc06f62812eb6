"""Exercise 4 · Embeddings and the stack: the table, the tied head and the residual stream. Hidden tests.

Q1's expected values come from :func:`servelab.arith.embedding_numbers` and
:func:`servelab.arith.weights_memory`, Q2's from :func:`servelab.arith.count_params`
(its ``embedding`` and ``lm_head`` parts, the head zero when tied), so the
exercise and the library can never disagree. The library has no helper for the
size of the residual stream, so Q3's come from the short reference below.
"""
from servelab import arith
from servelab.grading import Case, Question
from servelab.grading.hidden._configs import hf_config as _hf
from servelab.specs import ModelConfig

_BITS_BY_BYTES = {4: 32, 2: 16, 1: 8, 0.5: 4}


def _cfg(config: dict) -> ModelConfig:
    return ModelConfig.from_hf_dict(config, name="case")


def _table(config: dict, bytes_per_value: float) -> tuple:
    numbers = arith.embedding_numbers(_cfg(config))
    return numbers, arith.weights_memory(numbers, _BITS_BY_BYTES[bytes_per_value])


def _head_and_table(config: dict) -> int:
    count = arith.count_params(_cfg(config))
    return count.embedding + count.lm_head


def _stream(config: dict, tokens: int, bytes_per_value: float) -> tuple:
    """One snapshot of the stream (a width-d vector per token) and the layers + 1 snapshots
    ``LlamaModel.hidden_states`` returns (after the embedding and after every layer)."""
    c = _cfg(config)
    one = tokens * c.hidden_size * bytes_per_value
    return one, (c.num_hidden_layers + 1) * one


# Qwen2.5-0.5B's published config.json (https://huggingface.co/Qwen/Qwen2.5-0.5B): a tied head.
QWEN25_05B = {"vocab_size": 151_936, "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
              "num_attention_heads": 14, "num_key_value_heads": 2, "tie_word_embeddings": True}
#: The course's tiny model (data/models/servelab-main): 4,096 x 256 table, 6 layers, tied head.
SERVELAB_MAIN = {"vocab_size": 4096, "hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 6,
                 "num_attention_heads": 8, "num_key_value_heads": 4, "tie_word_embeddings": True}
# A missing tie_word_embeddings key means untied (the LlamaConfig default).
_NO_TIE_KEY = _hf("Llama-3-70B", drop=("tie_word_embeddings",))

Q1 = Question(
    id="q1", title="The embedding table", function="embedding_table", points=2, level="easy", minutes=5,
    visible=[Case(args=(_hf("Llama-3-8B"), 2), expected=(525_336_576, 1_050_673_152),
                  label="Llama-3-8B config, 2 bytes")],
    hidden=[
        Case(args=(_hf("Llama-3-70B"), 2), expected=_table(_hf("Llama-3-70B"), 2), label="Llama-3-70B config, bf16"),
        Case(args=(_hf("GPT-3-175B"), 2), expected=_table(_hf("GPT-3-175B"), 2),
             label="GPT-3-175B config (50,257 x 12,288), bf16"),
        Case(args=(_hf("Qwen2.5-7B"), 2), expected=_table(_hf("Qwen2.5-7B"), 2),
             label="Qwen2.5-7B config (152,064 x 3,584), bf16"),
        Case(args=(_hf("Example-200B"), 1), expected=_table(_hf("Example-200B"), 1),
             label="the 200B running example's 150,000 x 12,288 table, fp8"),
        Case(args=(_hf("Llama-3-8B"), 4), expected=_table(_hf("Llama-3-8B"), 4), label="Llama-3-8B config, fp32"),
        Case(args=(_hf("DeepSeek-V3"), 0.5), expected=_table(_hf("DeepSeek-V3"), 0.5),
             label="DeepSeek-V3 config, fp4 (half a byte)"),
        Case(args=(QWEN25_05B, 2), expected=_table(QWEN25_05B, 2), label="Qwen2.5-0.5B (tied: still one table)"),
    ],
)

Q2 = Question(
    id="q2", title="Table plus output head", function="head_and_table_params", points=3, level="medium",
    minutes=8,
    visible=[Case(args=(_hf("Llama-3-8B"),), expected=1_050_673_152, label="Llama-3-8B config (untied)"),
             Case(args=(SERVELAB_MAIN,), expected=1_048_576, label="the course's tiny model (tied)")],
    hidden=[
        Case(args=(_hf("GPT-3-175B"),), expected=_head_and_table(_hf("GPT-3-175B")),
             label="GPT-3-175B config (tie_word_embeddings true)"),
        Case(args=(QWEN25_05B,), expected=_head_and_table(QWEN25_05B), label="Qwen2.5-0.5B (tied)"),
        Case(args=(_hf("Qwen2.5-7B"),), expected=_head_and_table(_hf("Qwen2.5-7B")),
             label="Qwen2.5-7B config (untied)"),
        Case(args=(_hf("Llama-3-8B", tie_word_embeddings=True),),
             expected=_head_and_table(_hf("Llama-3-8B", tie_word_embeddings=True)),
             label="Llama-3-8B edited to tie its head"),
        Case(args=(_NO_TIE_KEY,), expected=_head_and_table(_NO_TIE_KEY),
             label="Llama-3-70B without a tie_word_embeddings key (untied)"),
        Case(args=(_hf("GPT-3-175B", tie_word_embeddings=False),),
             expected=_head_and_table(_hf("GPT-3-175B", tie_word_embeddings=False)),
             label="GPT-3-175B edited to untie its head"),
        Case(args=(_hf("DeepSeek-V3"),), expected=_head_and_table(_hf("DeepSeek-V3")),
             label="DeepSeek-V3 config (MoE, untied)"),
    ],
)

Q3 = Question(
    id="q3", title="The residual stream in memory", function="residual_stream_bytes", points=3, level="medium",
    minutes=8,
    visible=[Case(args=(SERVELAB_MAIN, 17, 4), expected=(17_408, 121_856),
                  label="the chapter's tiny model, 17 tokens, fp32")],
    hidden=[
        Case(args=(_hf("Llama-3-8B"), 8192, 2), expected=_stream(_hf("Llama-3-8B"), 8192, 2),
             label="Llama-3-8B config, 8,192 tokens, bf16"),
        Case(args=(_hf("Llama-3-70B"), 1, 2), expected=_stream(_hf("Llama-3-70B"), 1, 2),
             label="Llama-3-70B config, one token (a decode step), bf16"),
        Case(args=(_hf("Llama-3.1-405B"), 131_072, 2), expected=_stream(_hf("Llama-3.1-405B"), 131_072, 2),
             label="Llama-3.1-405B config, a 131,072-token prompt, bf16"),
        Case(args=(_hf("DeepSeek-V3"), 4000, 1), expected=_stream(_hf("DeepSeek-V3"), 4000, 1),
             label="DeepSeek-V3 config (61 layers, width 7,168), 4,000 tokens, fp8"),
        Case(args=(_hf("GPT-3-175B"), 2048, 4), expected=_stream(_hf("GPT-3-175B"), 2048, 4),
             label="GPT-3-175B config, 2,048 tokens, fp32"),
        Case(args=(_hf("Llama-3-8B"), 0, 2), raises=ValueError, label="zero tokens"),
        Case(args=(_hf("Llama-3-8B"), -16, 2), raises=ValueError, label="a negative token count"),
    ],
)

QUESTIONS = [Q1, Q2, Q3]
