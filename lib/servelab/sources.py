"""Published figures the chapters quote, each with its value, unit and source.

A chapter never types a published number: it reads it from here and glues it,
so the references appendix (``book/appendix/references.md``) and the prose
cannot drift apart. Chip datasheet rates used by the calculators live in
:mod:`servelab.specs` (each ``Chip`` has a ``source=``); the entries here that
repeat one of them are checked equal to it by ``tests/test_sources.py``.

Use::

    from servelab import sources
    sources.value("vllm_continuous_throughput")   # 1900.0
    sources.get("vllm_continuous_throughput").url
    sources.SOURCES["kv_reservation_waste_high"].value
    sources.cite("vllm_continuous_throughput")    # "Anyscale ... (2023)"
    sources.references()                          # one Reference per cited work

Pure Python: no torch, no numpy.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Source:
    """One published figure: ``value`` in ``unit``, what it measures, and where it is printed."""

    key: str
    value: float
    unit: str
    what: str
    title: str
    url: str
    note: str = ""


@dataclass(frozen=True)
class Reference:
    """One cited work and the registry keys that quote it."""

    title: str
    url: str
    keys: tuple[str, ...]


# Cited works (title, URL), named once so entries that share a work agree.
_ANYSCALE = ("Cade Daniel, Chen Shen, Eric Liang and Richard Liaw, \"How continuous batching enables "
             "23x throughput in LLM inference while reducing p50 latency\", Anyscale blog (2023)",
             "https://www.anyscale.com/blog/continuous-batching-llm-inference")
_PAGED = ("Woosuk Kwon et al., \"Efficient Memory Management for Large Language Model Serving with "
          "PagedAttention\", SOSP 2023",
          "https://arxiv.org/abs/2309.06180")
_DGX_B200 = ("NVIDIA DGX B200 datasheet", "https://www.nvidia.com/en-us/data-center/dgx-b200/")
_H100 = ("NVIDIA H100 Tensor Core GPU datasheet", "https://www.nvidia.com/en-us/data-center/h100/")
_NVL72 = ("NVIDIA GB200 NVL72 product page (specifications, with an HGX B200 column)", "https://www.nvidia.com/en-us/data-center/gb200-nvl72/")
_GPT4O = ("OpenAI, \"Hello GPT-4o\" (2024), language tokenization table",
          "https://openai.com/index/hello-gpt-4o/")
_OPENAI_TOKENS = ("OpenAI Help Center, \"What are tokens and how to count them?\"",
                  "https://help.openai.com/en/articles/4936856-what-are-tokens-and-how-to-count-them")
_LLAMA3 = ("Llama Team, AI @ Meta, \"The Llama 3 Herd of Models\" (2024), section 3.2 (tokenizer)",
           "https://arxiv.org/abs/2407.21783")
_TIKTOKEN = ("OpenAI, tiktoken, tiktoken_ext/openai_public.py (the encodings' special-token ids)",
             "https://github.com/openai/tiktoken/blob/main/tiktoken_ext/openai_public.py")
_FP8 = ("Paulius Micikevicius et al., \"FP8 Formats for Deep Learning\" (2022)",
        "https://arxiv.org/abs/2209.05433")
_GLU = ("Noam Shazeer, \"GLU Variants Improve Transformer\" (2020)", "https://arxiv.org/abs/2002.05202")
_OPENAI_CACHE = ("OpenAI, \"Prompt Caching in the API\" (2024)",
                 "https://openai.com/index/api-prompt-caching/")
_ANTHROPIC_CACHE = ("Anthropic documentation, \"Prompt caching\"",
                    "https://docs.anthropic.com/en/docs/build-with-claude/prompt-caching")
_OPENAI_CACHE_DOCS = ("OpenAI API documentation, \"Prompt caching\" (guide, with its retention policies)",
                      "https://developers.openai.com/docs/guides/prompt-caching")
_DSV2 = ("DeepSeek-AI, \"DeepSeek-V2: A Strong, Economical, and Efficient Mixture-of-Experts Language "
         "Model\" (2024)", "https://arxiv.org/abs/2405.04434")
_DSV3 = ("DeepSeek-AI, \"DeepSeek-V3 Technical Report\" (2024)", "https://arxiv.org/abs/2412.19437")
_DSV3_CONFIG = ("deepseek-ai/DeepSeek-V3, config.json on Hugging Face (n_group, topk_group)",
                "https://huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json")
_DEEPEP = ("DeepSeek-AI, DeepEP, V1 performance (docs/legacy.md): low-latency kernels on H800 GPUs, each with a "
           "CX7 InfiniBand 400 Gb/s card; 128 tokens per batch, 7168 hidden, top-8 experts, FP8 dispatching "
           "and BF16 combining", "https://github.com/deepseek-ai/DeepEP/blob/main/docs/legacy.md")
_SPEC = ("Yaniv Leviathan, Matan Kalman and Yossi Matias, \"Fast Inference from Transformers via "
         "Speculative Decoding\", ICML 2023", "https://arxiv.org/abs/2211.17192")
_H100_ARCH = ("NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022)",
              "https://resources.nvidia.com/en-us-tensor-core")
_FLASH2 = ("Tri Dao, \"FlashAttention-2: Faster Attention with Better Parallelism and Work "
           "Partitioning\" (2023)", "https://arxiv.org/abs/2307.08691")
_FLASH = ("Tri Dao et al., \"FlashAttention: Fast and Memory-Efficient Exact Attention with "
          "IO-Awareness\", NeurIPS 2022", "https://arxiv.org/abs/2205.14135")
_NCCL_H100 = ("NVIDIA/nccl issue #1264, \"Only ~783GByte/s out of theoretical 900GB/s HGX H100 SXM "
              "Nvlink4\" (2024), its nvidia-smi output", "https://github.com/NVIDIA/nccl/issues/1264")
_TRTLLM_B200 = ("NVIDIA/TensorRT-LLM issue #10278, \"b200x8 deepseek-ai/DeepSeek-V3.2-Exp max perf\" "
                "(2025), its nvidia-smi output", "https://github.com/NVIDIA/TensorRT-LLM/issues/10278")
_VLLM_APC = ("vLLM documentation, \"Automatic Prefix Caching\" (design notes)",
             "https://docs.vllm.ai/en/latest/design/prefix_caching/")
_GU_AUDIT = ("Chenchen Gu, Xiang Lisa Li, Rohith Kuditipudi, Percy Liang and Tatsunori Hashimoto, "
             "\"Auditing Prompt Caching in Language Model APIs\", ICML 2025",
             "https://arxiv.org/abs/2502.07776")
_VLLM_HASH_ADVISORY = ("vLLM security advisory GHSA-rm76-4mrf-v9r8 (2025): predictable hash collisions in "
                       "prefix caching, fixed in 0.7.2 by pull request #12621",
                       "https://github.com/vllm-project/vllm/security/advisories/GHSA-rm76-4mrf-v9r8")
_VLLM_SALT = ("vLLM security advisory GHSA-4qjh-9fv9-r85r (CVE-2025-46570): a timing side channel in prefix "
              "caching; the cache_salt request field of pull request #17045 answers it",
              "https://github.com/vllm-project/vllm/security/advisories/GHSA-4qjh-9fv9-r85r")
_SGLANG = ("Lianmin Zheng et al., \"SGLang: Efficient Execution of Structured Language Model Programs\", "
           "NeurIPS 2024", "https://arxiv.org/abs/2312.07104")
_LLAMA31_BLOG = ("Meta, \"Introducing Llama 3.1: Our most capable models to date\" (2024)",
                 "https://ai.meta.com/blog/meta-llama-3-1/")
_VLLM_CACHE_CONFIG = ("vLLM documentation, \"vllm.config.cache\" (CacheConfig.gpu_memory_utilization), "
                      "vLLM 0.32", "https://docs.vllm.ai/en/stable/api/vllm/config/cache/")
_GEMMA2 = ("Gemma Team, Google DeepMind, \"Gemma 2: Improving Open Language Models at a Practical Size\" "
           "(2024), section 2 (architecture)", "https://arxiv.org/abs/2408.00118")

_MARLIN = ("Elias Frantar, Roberto L. Castro, Jiale Chen, Torsten Hoefler and Dan Alistarh, \"MARLIN: "
           "Mixed-Precision Auto-Regressive Parallel Inference on Large Language Models\" (2024), and its "
           "README (IST-DASLab/marlin)", "https://github.com/IST-DASLab/marlin")
_GPT_OSS_CARD = ("OpenAI, \"gpt-oss-120b & gpt-oss-20b Model Card\" (2025), section 2 (quantization)",
                 "https://arxiv.org/abs/2508.10925")

_SGLANG_V04 = ("LMSYS Org, \"SGLang v0.4: Zero-Overhead Batch Scheduler, Cache-Aware Load Balancer, Faster "
               "Structured Outputs\" (December 2024)", "https://lmsys.org/blog/2024-12-04-sglang-v0-4/")
_DYNAMO_ROUTER = ("NVIDIA Dynamo documentation, \"KV Cache Routing\" (the KV-aware router)",
                  "https://docs.nvidia.com/dynamo/latest/router/kv_cache_routing.html")
_LLM_D_KV = ("llm-d documentation, \"KV Cache Management\" (prefix-cache aware routing in the llm-d Router)",
             "https://llm-d.ai/docs/architecture/advanced/kv-management")

_SARATHI_SERVE = ("Amey Agrawal et al., \"Taming Throughput-Latency Tradeoff in LLM Inference with "
                  "Sarathi-Serve\", OSDI 2024", "https://arxiv.org/abs/2403.02310")
_GPT_FAST = ("Team PyTorch, \"Accelerating Generative AI with PyTorch II: GPT, Fast\", PyTorch blog (2023)",
             "https://pytorch.org/blog/accelerating-generative-ai-2/")
_SPLITWISE = ("Pratyush Patel et al., \"Splitwise: Efficient Generative LLM Inference Using Phase Splitting\", "
              "ISCA 2024", "https://arxiv.org/abs/2311.18677")
_DISTSERVE = ("Yinmin Zhong et al., \"DistServe: Disaggregating Prefill and Decoding for Goodput-optimized "
              "Large Language Model Serving\", OSDI 2024", "https://arxiv.org/abs/2401.09670")
_MOONCAKE = ("Ruoyu Qin et al., \"Mooncake: A KVCache-centric Disaggregated Architecture for LLM Serving\" "
             "(2024)", "https://arxiv.org/abs/2407.00079")

_NCCL_TUNING = ("NVIDIA NCCL source, src/graph/tuning.cc: the default tuner constants (baseLatencies, "
                "hwLatencies) of its cost model, commit 5067397 (2026)",
                "https://github.com/NVIDIA/nccl/blob/master/src/graph/tuning.cc")

def _s(key, value, unit, what, work, note=""):
    return Source(key, float(value), unit, what, work[0], work[1], note)


SOURCES: dict[str, Source] = {s.key: s for s in [
    # Scheduling: static vs continuous batching
    _s("vllm_static_throughput", 81, "tokens/s",
       "decode throughput of a 13B model under static batching (Hugging Face pipelines)", _ANYSCALE),
    _s("vllm_continuous_throughput", 1900, "tokens/s",
       "decode throughput of the same model and GPU under vLLM's continuous batching", _ANYSCALE,
       "the post's 23x headline is this pair's ratio"),
    # KV-cache memory
    _s("kv_reservation_waste_low", 0.60, "fraction",
       "KV-cache memory wasted by reservation-based systems (low end)", _PAGED,
       "only 20.4%-38.2% of their KV memory held token states"),
    _s("kv_reservation_waste_high", 0.80, "fraction",
       "KV-cache memory wasted by reservation-based systems (high end)", _PAGED),
    _s("paged_kv_waste", 0.04, "fraction",
       "KV-cache memory wasted under PagedAttention (an upper bound: 'under 4%')", _PAGED),
    _s("vllm_gpu_memory_utilization", 0.92, "fraction",
       "share of a GPU's memory vLLM uses by default for weights, activations and KV cache "
       "(gpu_memory_utilization; it holds back the rest)", _VLLM_CACHE_CONFIG,
       "earlier releases defaulted to 0.9"),
    # Chips and links
    _s("b200_dense_fp8_flops", 4.5e15, "FLOP/s",
       "B200 dense fp8 rate per GPU (the HGX B200 column lists 9 PFLOPS fp8 per GPU with "
       "2:4 sparsity; dense is half)", _NVL72),
    _s("b200_dense_bf16_flops", 2.25e15, "FLOP/s",
       "B200 dense bf16 rate per GPU (the HGX B200 column lists 4.5 PFLOPS FP16/BF16 per "
       "GPU with 2:4 sparsity; dense is half)", _NVL72),
    _s("b200_hbm_bandwidth", 8e12, "bytes/s",
       "B200 HBM bandwidth per GPU (64 TB/s over 8 GPUs)", _DGX_B200),
    _s("b200_usable_memory", 180e9, "bytes",
       "B200 memory per GPU as the DGX ships it (1,440 GB over 8 GPUs)", _DGX_B200),
    _s("nvlink5_bandwidth", 1.8e12, "bytes/s",
       "NVLink bandwidth per B200 GPU (fifth generation, both directions)", _DGX_B200),
    _s("nvlink4_bandwidth", 900e9, "bytes/s",
       "NVLink bandwidth per H100 SXM GPU (fourth generation, both directions)", _H100),
    _s("nccl_ring_base_latency_ll_us", 6.6, "us",
       "NCCL's fixed cost of one ring all-reduce with the LL protocol (baseLatencies, Ring/LL)", _NCCL_TUNING),
    _s("nccl_ring_hop_latency_ll_us", 0.6, "us",
       "NCCL's cost per ring step over NVLink with the LL protocol (hwLatencies, NVLINK, Ring/LL)",
       _NCCL_TUNING, "a ring all-reduce over p GPUs in one server pays 2(p - 1) steps"),
    _s("nccl_ring_base_latency_simple_us", 8.4, "us",
       "NCCL's fixed cost of one ring all-reduce with the Simple protocol (baseLatencies, Ring/Simple)",
       _NCCL_TUNING),
    _s("nccl_ring_hop_latency_simple_us", 3.4, "us",
       "NCCL's cost per ring step over NVLink with the Simple protocol (hwLatencies, NVLINK, Ring/Simple)",
       _NCCL_TUNING),
    _s("nccl_nvls_latency_us", 25, "us",
       "NCCL's cost of one in-switch (NVLS, NVLink SHARP) all-reduce inside one server "
       "(hwLatencies, NVLINK, NVLS/Simple; its base latency is 0)", _NCCL_TUNING),
    _s("nvl72_gpus", 72, "GPUs", "Blackwell GPUs in one GB200 NVL72 NVLink domain", _NVL72),
    _s("h100_driver_memory_mib", 81_559, "MiB",
       "memory nvidia-smi reports on an H100 SXM sold as 80 GB (85.5e9 bytes, 79.6 GiB)", _NCCL_H100),
    _s("b200_driver_memory_mib", 183_359, "MiB",
       "memory nvidia-smi reports on a B200 listed at 180 GB in the DGX B200 (192.3e9 bytes, "
       "179.1 GiB)", _TRTLLM_B200),
    _s("llama31_405b_fp8_nodes", 1, "server node",
       "Llama 3.1 405B in fp8 (Meta's quantization from bf16) runs within a single server node",
       _LLAMA31_BLOG),
    _s("nvl72_nvlink_bandwidth", 130e12, "bytes/s",
       "combined NVLink bandwidth of one GB200 NVL72 rack", _NVL72),
    _s("h100_sxm_sms", 132, "SMs", "streaming multiprocessors (SMs) on an H100 SXM5", _H100_ARCH),
    _s("h100_register_file_per_sm", 256 * 1024, "bytes",
       "register file per H100 SM (256 KB; 65,536 32-bit registers)", _H100_ARCH),
    _s("h100_l1_shared_per_sm", 256 * 1024, "bytes",
       "combined L1 data cache and shared memory per H100 SM (256 KB)", _H100_ARCH),
    _s("h100_l2_cache", 50 * 1024 * 1024, "bytes", "L2 cache of an H100 SXM5 (50 MB)", _H100_ARCH),
    # Tokenizers
    _s("gpt4o_english_tokens_cl100k", 27, "tokens",
       "an English sample sentence in GPT-4's tokenizer (cl100k_base)", _GPT4O),
    _s("gpt4o_english_tokens_o200k", 24, "tokens",
       "the same English sentence in GPT-4o's tokenizer (o200k_base)", _GPT4O),
    _s("gpt4o_hindi_tokens_cl100k", 90, "tokens",
       "the same sentence in Hindi, GPT-4's tokenizer (cl100k_base)", _GPT4O),
    _s("gpt4o_hindi_tokens_o200k", 31, "tokens",
       "the same sentence in Hindi, GPT-4o's tokenizer (o200k_base)", _GPT4O),
    _s("openai_words_per_token", 0.75, "words/token",
       "rule of thumb for English text in OpenAI's tokenizers (1 token is about 3/4 of a word)",
       _OPENAI_TOKENS),
    _s("llama3_chars_per_token", 3.94, "characters/token",
       "Llama 3's 128K-token tokenizer on a sample of English data", _LLAMA3),
    _s("llama2_chars_per_token", 3.17, "characters/token",
       "Llama 2's 32K-token tokenizer on the same English sample", _LLAMA3),
    _s("cl100k_n_vocab", 100_277, "token ids",
       "ids in GPT-4's tokenizer cl100k_base (its highest special-token id, 100,276, plus one)",
       _TIKTOKEN, "tiktoken's n_vocab; 100,256 learned byte sequences, the rest special or unused"),
    _s("o200k_n_vocab", 200_019, "token ids",
       "ids in GPT-4o's tokenizer o200k_base (its highest special-token id, 200,018, plus one)",
       _TIKTOKEN, "tiktoken's n_vocab; 199,998 learned byte sequences, the rest special or unused"),
    # Number formats and layer shapes
    _s("fp8_e4m3_mantissa_bits", 3, "bits", "explicit mantissa bits of the e4m3 fp8 format", _FP8),
    _s("fp8_e4m3_max", 448, "", "largest finite e4m3 value", _FP8),
    _s("swiglu_width_factor", 8 / 3, "x model width",
       "gated-MLP width that keeps a SwiGLU layer at a plain 4x MLP's parameters (2/3 of 4d)", _GLU),
    _s("flashattention_speedup_gpt2", 3, "x",
       "FlashAttention's end-to-end training speedup on GPT-2 (sequence length 1K)", _FLASH),
    _s("gpt_fast_eager_tokens_s", 25.5, "tokens/s",
       "Llama-2-7B decoding at batch 1 on an A100-80GB (power-limited to 330 W) with a plain eager "
       "PyTorch implementation: bound by the CPU's kernel launches", _GPT_FAST),
    _s("gpt_fast_compiled_tokens_s", 107.0, "tokens/s",
       "the same after torch.compile (mode=\"reduce-overhead\": CUDA graphs) with a static KV cache",
       _GPT_FAST),
    _s("flashattention2_util_low", 0.50, "fraction",
       "FlashAttention-2's forward pass, share of the A100's peak FLOP/s (low end)", _FLASH2),
    _s("flashattention2_util_high", 0.73, "fraction",
       "FlashAttention-2's forward pass, share of the A100's peak FLOP/s (high end)", _FLASH2),
    # Prompt (prefix) caching as providers sell it
    _s("openai_cached_input_discount", 0.50, "fraction",
       "discount on cached input tokens in OpenAI's API at launch", _OPENAI_CACHE),
    _s("openai_cache_idle_minutes_low", 5, "minutes",
       "OpenAI: caches are typically cleared after 5-10 minutes of inactivity (low end)", _OPENAI_CACHE,
       "and always within one hour of last use"),
    _s("openai_cache_idle_minutes_high", 10, "minutes",
       "OpenAI: caches are typically cleared after 5-10 minutes of inactivity (high end)", _OPENAI_CACHE),
    _s("openai_cache_min_tokens", 1024, "tokens",
       "OpenAI: prompts are cached from this length on (shorter prompts never hit)", _OPENAI_CACHE),
    _s("openai_cache_increment_tokens", 128, "tokens",
       "OpenAI: a cached prefix grows in increments of this many tokens", _OPENAI_CACHE),
    _s("anthropic_cache_ttl_minutes", 5, "minutes",
       "Anthropic: default cache lifetime, refreshed each time the cached prefix is read", _ANTHROPIC_CACHE),
    _s("anthropic_cache_write_factor", 1.25, "x base input price",
       "Anthropic: price of writing a prefix to the cache (5-minute lifetime)", _ANTHROPIC_CACHE),
    _s("anthropic_cache_read_factor", 0.10, "x base input price",
       "Anthropic: price of reading a cached prefix", _ANTHROPIC_CACHE),
    _s("anthropic_cache_ttl_long_minutes", 60, "minutes",
       "Anthropic: the optional longer cache lifetime (ttl \"1h\" in cache_control)", _ANTHROPIC_CACHE),
    _s("anthropic_cache_write_factor_long", 2.0, "x base input price",
       "Anthropic: price of writing a prefix to the cache with the 1-hour lifetime", _ANTHROPIC_CACHE),
    _s("openai_cache_extended_retention_hours", 24, "hours",
       "OpenAI: extended prompt cache retention (prompt_cache_retention \"24h\") keeps a cached prefix "
       "up to this long", _OPENAI_CACHE_DOCS,
       "the in-memory policy keeps it minutes; which models offer which policy varies"),
    _s("openai_cache_input_saving_max", 0.90, "fraction",
       "OpenAI: prompt caching can cut input token costs by up to this share", _OPENAI_CACHE_DOCS,
       "the discount on cached input depends on the model"),
    # Prefix caching inside an engine, and what it leaks
    _s("vllm_prefix_hash_bits", 256, "bits",
       "vLLM names a cached block by a SHA-256 hash of its parent's hash, its tokens and extra keys, "
       "and finds blocks by that hash alone", _VLLM_APC,
       "SHA-256 is the default since v0.10.2, and the key is the hash alone since then (earlier V1 "
       "releases also kept each block's token ids in the key); earlier versions used Python's built-in "
       "hash()"),
    _s("vllm_hash_none_constant_python", 3.12, "Python version",
       "Python release from which hash(None), where vLLM's built-in-hash block chain started, is a "
       "constant, so collisions could be planted; vLLM 0.7.2 started the chain from a random seed",
       _VLLM_HASH_ADVISORY, "SHA-256 came as an option in 0.8.3 and became the default in v0.10.2"),
    _s("vllm_cache_salt_blocks", 1, "block",
       "vLLM mixes a request's cache_salt into the hash of its first block only; the chain carries it "
       "to every later block, so requests with different salts share no block", _VLLM_SALT,
       "cache_salt is an ordinary request field: a gateway must set it per tenant, or a client can "
       "copy another's salt"),
    _s("prompt_cache_shared_providers", 7, "API providers",
       "API providers whose prompt cache the audit found shared across users, so that a fast first "
       "token can reveal another user's prompt", _GU_AUDIT),
    _s("sglang_throughput_max", 6.4, "x",
       "SGLang's highest throughput gain over the inference systems it compared against, with "
       "RadixAttention (a radix tree of cached prefixes, LRU eviction) among its techniques", _SGLANG),
    # Shrinking the cache, speculative decoding
    _s("deepseek_v2_kv_reduction", 0.933, "fraction",
       "KV-cache reduction of DeepSeek-V2 (MLA) against DeepSeek 67B", _DSV2),
    _s("gemma2_sliding_window", 4096, "tokens",
       "sliding window of Gemma 2's local attention layers, which alternate with global-attention layers",
       _GEMMA2),
    # Mixture of experts
    _s("deepseek_v3_max_nodes_per_token", 4, "nodes",
       "nodes one token's routed experts may span in DeepSeek-V3 (node-limited routing, M = 4)", _DSV3),
    _s("deepseek_v3_attention_tp", 4, "GPUs",
       "tensor-parallel degree of DeepSeek-V3's attention when served (TP4, with sequence parallelism), "
       "prefill and decode alike", _DSV3),
    _s("deepseek_v3_prefill_gpus", 32, "GPUs",
       "GPUs in DeepSeek-V3's smallest prefill deployment (4 nodes): attention TP4 x DP8, MoE EP32", _DSV3),
    _s("deepseek_v3_decode_gpus", 320, "GPUs",
       "GPUs in DeepSeek-V3's smallest decode deployment (40 nodes): attention TP4 x DP80, MoE EP320", _DSV3),
    _s("deepseek_v3_decode_experts_per_gpu", 1, "experts",
       "routed experts each GPU holds in DeepSeek-V3's decode deployment", _DSV3),
    _s("deepseek_v3_decode_spare_gpus", 64, "GPUs",
       "GPUs of DeepSeek-V3's decode deployment that host the redundant experts and the shared expert, "
       "the shared expert treated as a routed one that every token picks", _DSV3),
    _s("deepseek_v3_prefill_redundant_per_gpu", 1, "experts",
       "redundant (copied hot) expert each GPU of DeepSeek-V3's prefill deployment hosts besides its "
       "8 routed experts", _DSV3),
    _s("deepseek_v3_decode_expert_batch", 256, "tokens",
       "tokens per expert in DeepSeek-V3's decode: 'usually within 256', so memory access, not "
       "computation, is the bottleneck", _DSV3),
    _s("deepseek_v3_expert_groups", 8, "groups",
       "expert groups of DeepSeek-V3's released router (n_group)", _DSV3_CONFIG),
    _s("deepseek_v3_topk_groups", 4, "groups",
       "expert groups one token's routed experts may come from in DeepSeek-V3's released router "
       "(topk_group); training bounded a token to 4 nodes instead", _DSV3_CONFIG),
    _s("deepep_ll_dispatch_us_ep32", 155, "us",
       "DeepEP low-latency dispatch at expert parallelism 32 over InfiniBand, 128 tokens per GPU", _DEEPEP),
    _s("deepep_ll_combine_us_ep32", 273, "us",
       "DeepEP low-latency combine at expert parallelism 32 over InfiniBand, 128 tokens per GPU", _DEEPEP),
    _s("deepep_ll_tokens", 128, "tokens",
       "tokens per GPU in DeepEP's low-latency benchmark (a typical DeepSeek-V3 decode batch)", _DEEPEP),
    _s("speculative_speedup_low", 2, "x",
       "speculative decoding's speedup on T5-XXL without changing outputs (low end)", _SPEC),
    _s("speculative_speedup_high", 3, "x",
       "speculative decoding's speedup on T5-XXL without changing outputs (high end)", _SPEC),
    # Quantized kernels
    _s("marlin_batch_low", 16, "tokens",
       "Marlin's FP16xINT4 kernel keeps close to its ideal 4x speedup over FP16 weights up to batches "
       "of 16-32 tokens (low end)", _MARLIN, "prior kernels held a comparable speedup to 1-2 tokens"),
    _s("marlin_batch_high", 32, "tokens",
       "Marlin's FP16xINT4 kernel keeps close to its ideal 4x speedup up to batches of 16-32 tokens "
       "(high end)", _MARLIN),
    _s("marlin_batch_fading_low", 64, "tokens",
       "Marlin's FP16xINT4 kernel keeps a significant but decreasing speedup up to batches of 64-128 "
       "tokens (low end)", _MARLIN, "measured on Ampere GPUs (A10 above all); the README says the kernel "
       "is not yet optimized for Hopper"),
    _s("marlin_batch_fading_high", 128, "tokens",
       "Marlin's FP16xINT4 kernel keeps a significant but decreasing speedup up to batches of 64-128 "
       "tokens (high end)", _MARLIN),
    _s("gpt_oss_120b_gpu_gb", 80, "GB",
       "GPU memory gpt-oss-120b fits in thanks to its MoE weights in MXFP4 (a single 80 GB GPU)",
       _GPT_OSS_CARD),
    _s("deepseek_v3_fp8_weight_block", 128, "weights",
       "side of the square weight block (128x128) that shares one scale in DeepSeek-V3's FP8 "
       "block-wise quantization", _DSV3),
    _s("deepseek_v3_fp8_activation_tile", 128, "channels",
       "channels of one token (a 1x128 tile) that share one activation scale in DeepSeek-V3's FP8 "
       "quantization", _DSV3),
    # Routing a fleet by cache (chapter 22)
    _s("sglang_router_throughput", 1.9, "x",
       "throughput gain of SGLang's cache-aware load balancer (sgl-router) over a cache-blind one, "
       "up to", _SGLANG_V04),
    _s("sglang_router_hit_rate", 3.8, "x",
       "cache hit rate of SGLang's cache-aware load balancer against a cache-blind one", _SGLANG_V04),
    _s("dynamo_kv_overlap_weight", 1, "weight",
       "default weight (--kv-overlap-score-weight) of the prefix-cache overlap against load in the cost "
       "by which NVIDIA Dynamo's KV router picks a worker; 0 is pure load balancing", _DYNAMO_ROUTER),
    _s("llm_d_prefix_routing_modes", 2, "implementations",
       "prefix-cache aware routing implementations in the llm-d Router: approximate (from its own "
       "routing history) and precise (from the engines' KV-cache events)", _LLM_D_KV),
    # Prefill meets decode: chunked prefill and disaggregation (chapter 18)
    _s("sarathi_serve_capacity", 2.6, "x",
       "serving capacity of Mistral-7B on one A100 within tail-latency limits with chunked prefills and "
       "stall-free batching, against vLLM", _SARATHI_SERVE),
    _s("splitwise_throughput", 1.4, "x",
       "throughput of a cluster with prompt and token phases on separate machines against current "
       "designs, up to, at 20% lower cost", _SPLITWISE),
    _s("distserve_goodput", 7.4, "x",
       "goodput (the highest request rate at which over 90% of requests meet both the TTFT and TPOT "
       "promises) of disaggregated prefill and decode against vLLM and DeepSpeed-MII, up to", _DISTSERVE),
    _s("mooncake_more_requests", 0.75, "fraction",
       "more requests Kimi handles under real workloads on Mooncake's disaggregated prefill and decode "
       "clusters", _MOONCAKE),
]}


def get(key: str) -> Source:
    """The registry entry ``key``; ``ValueError`` names the known keys when it is missing."""
    try:
        return SOURCES[key]
    except (KeyError, TypeError):
        raise ValueError(f"no sourced constant {key!r}; known: {sorted(SOURCES)}") from None


def value(key: str) -> float:
    """The published value of ``key`` in its unit (``get(key).unit``)."""
    return get(key).value


def cite(key: str) -> str:
    """The work ``key`` comes from, as a short citation string."""
    return get(key).title


def references() -> list[Reference]:
    """Every cited work once, in first-use order, with the keys that quote it."""
    works: dict[tuple[str, str], list[str]] = {}
    for s in SOURCES.values():
        works.setdefault((s.title, s.url), []).append(s.key)
    return [Reference(title, url, tuple(keys)) for (title, url), keys in works.items()]


def _format_value(s: Source) -> str:
    v = s.value
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G")):
        if s.unit in ("FLOP/s", "bytes/s", "bytes") and v >= scale:
            unit = {"FLOP/s": "FLOP/s", "bytes/s": "B/s", "bytes": "B"}[s.unit]
            return f"{v / scale:g} {prefix}{unit}"
    if s.unit == "fraction":
        return f"{v:.0%}"
    text = f"{v:,.4g}" if v != int(v) else f"{int(v):,}"
    return f"{text} {s.unit}".strip()


def references_markdown() -> str:
    """The body of the references appendix: one section per work, its figures listed."""
    lines = []
    for ref in references():
        lines.append(f"- {ref.title}. <{ref.url}>")
        for key in ref.keys:
            s = SOURCES[key]
            lines.append(f"  - `{key}`: {_format_value(s)}, {s.what}" + (f" ({s.note})" if s.note else ""))
    return "\n".join(lines) + "\n"


__all__ = ["Source", "Reference", "SOURCES", "get", "value", "cite", "references", "references_markdown"]
