"""A registry of public model shapes and accelerator chips, each with its source.

Every calculator in the course starts from these two records. Model fields use
Hugging Face ``config.json`` names, so a reader can paste a real config into
:meth:`ModelConfig.from_hf_dict` and get the same arithmetic the chapters show.

Pure Python: no torch, no numpy, so the calculators import in milliseconds.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Mapping

GB = 1e9  # vendors quote memory and bandwidth in decimal units
TB = 1e12
TFLOPS = 1e12
PFLOPS = 1e15


# ---------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------

#: The architecture :class:`servelab.model.LlamaModel` builds (and the default here).
LLAMA_ARCHITECTURE = "LlamaForCausalLM"

#: ``model_type`` -> architecture, for a config.json that names only its type.
_ARCH_OF_MODEL_TYPE = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                       "mixtral": "MixtralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                       "gpt2": "GPT2LMHeadModel", "deepseek_v3": "DeepseekV3ForCausalLM",
                       "gemma": "GemmaForCausalLM"}


@dataclass(frozen=True)
class ModelConfig:
    """The shape of a decoder-only transformer, named as in Hugging Face configs.

    The one config type of the course: the calculators read it, and
    :class:`servelab.model.LlamaModel` is built from it
    (``servelab.model.LlamaConfig`` is this same class). ``num_key_value_heads``
    defaults to ``num_attention_heads`` (plain multi-head attention),
    ``head_dim`` to ``hidden_size // num_attention_heads`` and ``rms_norm_eps``
    to 1e-6, exactly as ``transformers.LlamaConfig`` does (a registry entry
    whose config.json says otherwise gives its own value). Mixture-of-experts
    and multi-head latent attention (MLA) fields stay at their zero/None
    defaults for dense models. ``name`` (keyword only) labels the shape in
    tables; ``eos_token_id`` and friends are carried for the model and engine.
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    max_position_embeddings: int = 2048
    rope_theta: float = 10_000.0
    rope_scaling: Mapping[str, Any] | None = None
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    hidden_act: str = "silu"
    mlp_gated: bool = True  # SwiGLU has three MLP matrices; GPT-3's GELU MLP has two
    attention_bias: bool = False
    mlp_bias: bool = False
    # Mixture of experts (Mixtral: num_local_experts; DeepSeek: n_routed_experts)
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int | None = None
    n_shared_experts: int = 0
    first_k_dense_replace: int = 0
    # Multi-head latent attention (DeepSeek-V2/V3)
    kv_lora_rank: int | None = None
    q_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    qk_nope_head_dim: int | None = None
    v_head_dim: int | None = None
    # Tokens and storage (read by the model and the engine, not by the calculators)
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None
    torch_dtype: str | None = None
    # Bookkeeping
    nominal_params: float | None = None  # the headline size in the model's name, e.g. 8e9
    architecture: str = LLAMA_ARCHITECTURE
    source: str = ""
    name: str = field(default="custom", kw_only=True, compare=False)  # a label, not part of the shape

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size",
                     "num_hidden_layers", "num_attention_heads"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{self.name}: {name} must be a positive integer, got {value!r}")
        if self.num_key_value_heads is None:
            object.__setattr__(self, "num_key_value_heads", self.num_attention_heads)
        if self.head_dim is None:
            if self.hidden_size % self.num_attention_heads:
                raise ValueError(
                    f"{self.name}: hidden_size {self.hidden_size} is not divisible by "
                    f"num_attention_heads {self.num_attention_heads}; give head_dim explicitly")
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        kv, heads = self.num_key_value_heads, self.num_attention_heads
        if not isinstance(kv, int) or kv <= 0 or heads % kv:
            raise ValueError(
                f"{self.name}: num_key_value_heads={kv} must be positive and divide "
                f"num_attention_heads={heads} (each KV head serves a whole group of query heads)")
        if not isinstance(self.head_dim, int) or self.head_dim <= 0:
            raise ValueError(f"{self.name}: head_dim must be a positive integer, got {self.head_dim}")
        if self.num_experts < 0 or self.num_experts_per_tok < 0:
            raise ValueError(f"{self.name}: expert counts cannot be negative")
        if self.num_experts and not 0 < self.num_experts_per_tok <= self.num_experts:
            raise ValueError(
                f"{self.name}: num_experts_per_tok={self.num_experts_per_tok} must be between "
                f"1 and num_experts={self.num_experts}")
        if self.kv_lora_rank is not None and self.qk_rope_head_dim is None:
            raise ValueError(f"{self.name}: MLA needs qk_rope_head_dim next to kv_lora_rank")

    # -- derived facts ------------------------------------------------------
    @property
    def attention_kind(self) -> str:
        """'mla', 'mha', 'mqa' or 'gqa': what the KV cache stores per token."""
        if self.kv_lora_rank is not None:
            return "mla"
        if self.num_key_value_heads == self.num_attention_heads:
            return "mha"
        if self.num_key_value_heads == 1:
            return "mqa"
        return "gqa"

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def queries_per_kv_head(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    @property
    def kv_groups(self) -> int:
        """Query heads per K/V head (1 = MHA, num_attention_heads = MQA); same as
        :attr:`queries_per_kv_head`, under the name the model code uses."""
        return self.queries_per_kv_head

    @property
    def eos_token_ids(self) -> list[int]:
        """``eos_token_id`` as a list (a config may give one id or several)."""
        if self.eos_token_id is None:
            return []
        if isinstance(self.eos_token_id, (list, tuple)):
            return list(self.eos_token_id)
        return [self.eos_token_id]

    # -- Hugging Face interchange ------------------------------------------
    @classmethod
    def from_hf_dict(cls, d: Mapping[str, Any], name: str | None = None,
                     source: str = "") -> "ModelConfig":
        """Build a config from a Hugging Face ``config.json`` dictionary.

        Understands Llama/Mistral/Qwen2 names, Mixtral's ``num_local_experts``,
        DeepSeek's ``n_routed_experts`` and MLA fields, GPT-2 style
        ``n_embd``/``n_layer``/``n_head``, and both the classic ``rope_theta`` +
        ``rope_scaling`` fields and the ``rope_parameters`` dict written by
        ``transformers`` 5. Unknown keys are ignored, as ``transformers``
        ignores them; a missing required key raises. Whether a model can be
        *built* from it is :func:`servelab.model.check_llama_config`'s question.
        """
        if not isinstance(d, Mapping):
            raise TypeError(f"from_hf_dict expects a dict parsed from config.json, got {type(d).__name__}")
        d = dict(d)
        rope_params = d.pop("rope_parameters", None)
        if rope_params:
            rope_params = dict(rope_params)
            d.setdefault("rope_theta", rope_params.pop("rope_theta", 10_000.0))
            if rope_params.get("rope_type", rope_params.get("type", "default")) != "default":
                d.setdefault("rope_scaling", rope_params)
        scaling = d.get("rope_scaling")
        if scaling and scaling.get("rope_type", scaling.get("type")) == "default":
            d["rope_scaling"] = None
        if "dtype" in d and "torch_dtype" not in d:
            d["torch_dtype"] = d["dtype"]
        aliases = {
            "n_embd": "hidden_size", "n_layer": "num_hidden_layers", "n_head": "num_attention_heads",
            "n_positions": "max_position_embeddings", "num_local_experts": "num_experts",
            "n_routed_experts": "num_experts", "n_inner": "intermediate_size",
        }
        known = {f.name for f in fields(cls)} - {"name", "source", "architecture"}
        kwargs: dict[str, Any] = {}
        for key, value in d.items():
            key = aliases.get(key, key)
            if key in known and value is not None:
                kwargs[key] = value
        if d.get("architectures"):
            kwargs["architecture"] = d["architectures"][0]
        elif d.get("model_type") is not None:
            kwargs["architecture"] = _ARCH_OF_MODEL_TYPE.get(d["model_type"], str(d["model_type"]))
        if "intermediate_size" not in kwargs and "hidden_size" in kwargs and "n_embd" in d:
            kwargs["intermediate_size"] = 4 * kwargs["hidden_size"]  # GPT-2 default n_inner
        if d.get("model_type") in ("gpt2", "gpt3"):
            kwargs.setdefault("mlp_gated", False)
            kwargs.setdefault("hidden_act", "gelu")
        missing = [k for k in ("vocab_size", "hidden_size", "intermediate_size",
                               "num_hidden_layers", "num_attention_heads") if k not in kwargs]
        if missing:
            raise ValueError(f"config is missing required field(s) {missing}; "
                             "is this a decoder-only transformer's config.json?")
        kwargs["name"] = name or d.get("_name_or_path") or d.get("model_type") or "custom"
        kwargs["source"] = source
        return cls(**kwargs)

    def to_hf_dict(self) -> dict[str, Any]:
        """The config as a ``config.json`` dict that ``transformers`` and servelab both read."""
        d = {k: v for k, v in asdict(self).items()
             if k not in ("name", "source", "nominal_params", "architecture", "mlp_gated")}
        d["architectures"] = [self.architecture]
        inverse = {arch: mt for mt, arch in _ARCH_OF_MODEL_TYPE.items()}
        if self.architecture in inverse:
            d["model_type"] = inverse[self.architecture]
        if self.num_experts == 0:
            for k in ("num_experts", "num_experts_per_tok", "moe_intermediate_size",
                      "n_shared_experts", "first_k_dense_replace"):
                d.pop(k)
        if self.kv_lora_rank is None:
            for k in ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
                d.pop(k)
        for k in ("bos_token_id", "eos_token_id", "pad_token_id", "torch_dtype"):
            if d[k] is None:
                d.pop(k)
        if d["rope_scaling"] is not None:
            d["rope_scaling"] = dict(d["rope_scaling"])
        return d

    def with_(self, **changes: Any) -> "ModelConfig":
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)


_LLAMA3_SOURCE = "https://huggingface.co/meta-llama/Meta-Llama-3-{}/blob/main/config.json"

MODELS: dict[str, ModelConfig] = {}


def _register(config: ModelConfig) -> ModelConfig:
    MODELS[config.name.lower()] = config
    return config


LLAMA3_8B = _register(ModelConfig(
    name="Llama-3-8B", vocab_size=128_256, hidden_size=4096, intermediate_size=14_336,
    num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
    max_position_embeddings=8192, rope_theta=500_000.0, nominal_params=8e9,
    rms_norm_eps=1e-5,  # as its config.json (transformers defaults to 1e-6)
    source=_LLAMA3_SOURCE.format("8B")))

LLAMA3_70B = _register(ModelConfig(
    name="Llama-3-70B", vocab_size=128_256, hidden_size=8192, intermediate_size=28_672,
    num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
    max_position_embeddings=8192, rope_theta=500_000.0, nominal_params=70e9,
    rms_norm_eps=1e-5,  # as its config.json (transformers defaults to 1e-6)
    source=_LLAMA3_SOURCE.format("70B")))

LLAMA31_8B = _register(ModelConfig(
    name="Llama-3.1-8B", vocab_size=128_256, hidden_size=4096, intermediate_size=14_336,
    num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
    max_position_embeddings=131_072, rope_theta=500_000.0,
    rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    nominal_params=8e9,
    rms_norm_eps=1e-5,  # as its config.json (transformers defaults to 1e-6)
    source="https://huggingface.co/meta-llama/Llama-3.1-8B/blob/main/config.json"))

LLAMA31_70B = _register(ModelConfig(
    name="Llama-3.1-70B", vocab_size=128_256, hidden_size=8192, intermediate_size=28_672,
    num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
    max_position_embeddings=131_072, rope_theta=500_000.0,
    rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    nominal_params=70e9,
    rms_norm_eps=1e-5,  # as its config.json (transformers defaults to 1e-6)
    source="https://huggingface.co/meta-llama/Llama-3.1-70B/blob/main/config.json"))

LLAMA31_405B = _register(ModelConfig(
    name="Llama-3.1-405B", vocab_size=128_256, hidden_size=16_384, intermediate_size=53_248,
    num_hidden_layers=126, num_attention_heads=128, num_key_value_heads=8,
    max_position_embeddings=131_072, rope_theta=500_000.0,
    rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    nominal_params=405e9,
    rms_norm_eps=1e-5,  # as its config.json (transformers defaults to 1e-6)
    source="https://huggingface.co/meta-llama/Llama-3.1-405B/blob/main/config.json"))

LLAMA2_70B = _register(ModelConfig(
    name="Llama-2-70B", vocab_size=32_000, hidden_size=8192, intermediate_size=28_672,
    num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
    max_position_embeddings=4096, nominal_params=70e9,
    rms_norm_eps=1e-5,  # as its config.json (transformers defaults to 1e-6)
    source="https://huggingface.co/meta-llama/Llama-2-70b-hf/blob/main/config.json"))

GPT3_175B = _register(ModelConfig(
    name="GPT-3-175B", vocab_size=50_257, hidden_size=12_288, intermediate_size=4 * 12_288,
    num_hidden_layers=96, num_attention_heads=96, head_dim=128, max_position_embeddings=2048,
    hidden_act="gelu", mlp_gated=False, tie_word_embeddings=True, attention_bias=True,
    nominal_params=175e9, architecture="GPT3",
    rms_norm_eps=1e-5,  # GPT-3 uses LayerNorm; the field keeps its earlier value
    source="Brown et al. 2020, 'Language Models are Few-Shot Learners', Table 2.1 "
           "(arXiv:2005.14165)"))

MIXTRAL_8X7B = _register(ModelConfig(
    name="Mixtral-8x7B", vocab_size=32_000, hidden_size=4096, intermediate_size=14_336,
    num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
    max_position_embeddings=32_768, rope_theta=1e6, num_experts=8, num_experts_per_tok=2,
    moe_intermediate_size=14_336, nominal_params=46.7e9, architecture="MixtralForCausalLM",
    rms_norm_eps=1e-5,  # as its config.json (transformers defaults to 1e-6)
    source="https://huggingface.co/mistralai/Mixtral-8x7B-v0.1/blob/main/config.json"))

DEEPSEEK_V3 = _register(ModelConfig(
    name="DeepSeek-V3", vocab_size=129_280, hidden_size=7168, intermediate_size=18_432,
    num_hidden_layers=61, num_attention_heads=128, num_key_value_heads=128,
    head_dim=192,  # qk_nope_head_dim + qk_rope_head_dim
    max_position_embeddings=163_840, rope_theta=10_000.0, rms_norm_eps=1e-6,
    num_experts=256, num_experts_per_tok=8, moe_intermediate_size=2048,
    n_shared_experts=1, first_k_dense_replace=3,
    kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64, qk_nope_head_dim=128,
    v_head_dim=128, nominal_params=671e9, architecture="DeepseekV3ForCausalLM",
    source="https://huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json; "
           "DeepSeek-V3 Technical Report (arXiv:2412.19437): 671B total, 37B active"))

QWEN25_7B = _register(ModelConfig(
    name="Qwen2.5-7B", vocab_size=152_064, hidden_size=3584, intermediate_size=18_944,
    num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
    max_position_embeddings=131_072, rope_theta=1e6, rms_norm_eps=1e-6, attention_bias=True,
    nominal_params=7.6e9, architecture="Qwen2ForCausalLM",
    source="https://huggingface.co/Qwen/Qwen2.5-7B/blob/main/config.json"))

# Gemma 7B: plain multi-head attention whose heads are wider than width / heads
# (16 heads x 256 = 4,096 against a width of 3,072), a GeGLU MLP and a tied head.
GEMMA_7B = _register(ModelConfig(
    name="Gemma-7B", vocab_size=256_000, hidden_size=3072, intermediate_size=24_576,
    num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=16, head_dim=256,
    max_position_embeddings=8192, rope_theta=10_000.0, rms_norm_eps=1e-6,
    hidden_act="gelu", tie_word_embeddings=True,  # config.json: GeGLU (a gated MLP)
    nominal_params=8.54e9,  # the Gemma report's 8.54B (embedding plus non-embedding)
    architecture="GemmaForCausalLM",
    source="https://huggingface.co/google/gemma-7b/blob/main/config.json; Gemma Team, "
           "'Gemma: Open Models Based on Gemini Research and Technology' (arXiv:2403.08295)"))

# The 200B running example of a widely shared illustrated serving guide: a 200B-parameter dense model served at 8 bits,
# 80 layers, 8 KV heads of 128 numbers (160 KB of cache per token at 1 byte).
# Width and vocabulary follow its other examples (12,288 wide, 150,000 entries); the
# guide gives no MLP width, so 57,600 (gated) is chosen to make the shape count ~200B.
EXAMPLE_200B = _register(ModelConfig(
    name="Example-200B", vocab_size=150_000, hidden_size=12_288, intermediate_size=57_600,
    num_hidden_layers=80, num_attention_heads=96, num_key_value_heads=8, head_dim=128,
    nominal_params=200e9, architecture="Example",
    rms_norm_eps=1e-5,  # an illustration: the field keeps its earlier value
    source="the 200B running example of a widely shared illustrated guide to LLM serving "
           "(an illustration, not a real model)"))


def get_model(name: str | ModelConfig) -> ModelConfig:
    """Look a model up by name (case-insensitive); a ModelConfig passes through."""
    if isinstance(name, ModelConfig):
        return name
    try:
        return MODELS[str(name).lower()]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known models: {sorted(c.name for c in MODELS.values())}. "
                         "For another model use ModelConfig.from_hf_dict(config_json)") from None


# ---------------------------------------------------------------------------
# Chips
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Chip:
    """One accelerator: memory, memory bandwidth and dense (no-sparsity) peak rates.

    ``flops`` maps a number format ("bf16", "fp8", "fp4", "fp32") to dense
    operations per second. ``usable_memory_bytes`` is what the vendor says a
    program can use, when that differs from the raw capacity.
    """

    name: str
    memory_bytes: float
    hbm_bandwidth: float  # bytes per second
    flops: Mapping[str, float]
    interconnect_bandwidth: float = 0.0  # bytes/s per chip to its peers (e.g. NVLink)
    usable_memory_bytes: float | None = None
    source: str = ""

    def __post_init__(self) -> None:
        if self.memory_bytes <= 0 or self.hbm_bandwidth <= 0:
            raise ValueError(f"{self.name}: memory and bandwidth must be positive")
        if self.usable_memory_bytes is None:
            object.__setattr__(self, "usable_memory_bytes", self.memory_bytes)

    def peak_flops(self, dtype: str = "bf16") -> float:
        key = _normalise_dtype(dtype)
        if key not in self.flops:
            raise ValueError(f"{self.name} has no dense rate listed for {dtype!r}; "
                             f"listed formats: {sorted(self.flops)}")
        return self.flops[key]

    def ops_per_byte(self, dtype: str = "bf16") -> float:
        """Peak operations per byte of HBM traffic: the roofline's ridge point."""
        return self.peak_flops(dtype) / self.hbm_bandwidth


def _normalise_dtype(dtype: str) -> str:
    names = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32",
             "float8": "fp8", "int8": "fp8", "float4": "fp4", "int4": "fp4"}
    key = str(dtype).lower()
    return names.get(key, key)


CHIPS: dict[str, Chip] = {}


def _register_chip(chip: Chip) -> Chip:
    CHIPS[chip.name.lower()] = chip
    return chip


H100_SXM = _register_chip(Chip(
    name="H100 SXM", memory_bytes=80 * GB, hbm_bandwidth=3.35 * TB,
    flops={"fp32": 67 * TFLOPS, "tf32": 494.5 * TFLOPS, "bf16": 989.4 * TFLOPS,
           "fp16": 989.4 * TFLOPS, "fp8": 1978.9 * TFLOPS},
    interconnect_bandwidth=900 * GB,
    source="NVIDIA H100 Tensor Core GPU datasheet (SXM5; dense rates are half the "
           "with-sparsity headline): https://www.nvidia.com/en-us/data-center/h100/"))

H200 = _register_chip(Chip(
    name="H200", memory_bytes=141 * GB, hbm_bandwidth=4.8 * TB,
    flops={"fp32": 67 * TFLOPS, "bf16": 989.4 * TFLOPS, "fp16": 989.4 * TFLOPS,
           "fp8": 1978.9 * TFLOPS},
    interconnect_bandwidth=900 * GB,
    source="NVIDIA H200 Tensor Core GPU datasheet (SXM): https://www.nvidia.com/en-us/data-center/h200/"))

B200 = _register_chip(Chip(
    name="B200", memory_bytes=192 * GB, usable_memory_bytes=180 * GB, hbm_bandwidth=8 * TB,
    flops={"fp32": 75 * TFLOPS, "bf16": 2.25 * PFLOPS, "fp16": 2.25 * PFLOPS,
           "fp8": 4.5 * PFLOPS, "fp4": 9 * PFLOPS},
    interconnect_bandwidth=1800 * GB,
    source="NVIDIA DGX B200 datasheet (1,440 GB over 8 GPUs = 180 GB usable each): "
           "https://www.nvidia.com/en-us/data-center/dgx-b200/; rates per GPU from the HGX "
           "B200 column of the GB200 NVL72 specifications (listed with 2:4 sparsity; dense, "
           "half, here): https://www.nvidia.com/en-us/data-center/gb200-nvl72/"))

A100_80GB = _register_chip(Chip(
    name="A100 80GB", memory_bytes=80 * GB, hbm_bandwidth=2.039 * TB,
    flops={"fp32": 19.5 * TFLOPS, "tf32": 156 * TFLOPS, "bf16": 312 * TFLOPS, "fp16": 312 * TFLOPS},
    interconnect_bandwidth=600 * GB,
    source="NVIDIA A100 Tensor Core GPU datasheet (SXM 80GB): https://www.nvidia.com/en-us/data-center/a100/"))

MI300X = _register_chip(Chip(
    name="MI300X", memory_bytes=192 * GB, hbm_bandwidth=5.3 * TB,
    flops={"fp32": 163.4 * TFLOPS, "bf16": 1307.4 * TFLOPS, "fp16": 1307.4 * TFLOPS,
           "fp8": 2614.9 * TFLOPS},
    interconnect_bandwidth=896 * GB,
    source="AMD Instinct MI300X data sheet: https://www.amd.com/en/products/accelerators/instinct/mi300/mi300x.html"))


def get_chip(name: str | Chip) -> Chip:
    """Look a chip up by name (case-insensitive, spaces and dashes ignored)."""
    if isinstance(name, Chip):
        return name
    wanted = str(name).lower().replace("-", " ").replace("_", " ")
    for key, chip in CHIPS.items():
        if wanted in (key, key.replace(" sxm", ""), key.replace(" ", "")):
            return chip
    raise ValueError(f"unknown chip {name!r}; known chips: {sorted(c.name for c in CHIPS.values())}")
