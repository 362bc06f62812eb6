"""Checkpoints and configs: Hugging Face ``config.json`` and safetensors in and out.

:func:`load_config` reads and checks a ``config.json`` (:func:`check_llama_config`
refuses what the decoder cannot build); :func:`checkpoint_tensors` reads a
checkpoint folder's tensors, every one accounted for against a model's
``state_dict``; :func:`save_pretrained` writes a model back in the same layout.
:func:`servelab.model.load_pretrained` builds the model from these (this module
never imports the model). All names are also importable from :mod:`servelab.model`.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from servelab.attention import rope_inv_freq
from servelab.specs import ModelConfig

__all__ = [
    "LlamaConfig", "check_llama_config", "load_config", "load_state_dict", "checkpoint_tensors",
    "save_pretrained", "course_model_folder", "count_parameters_from_config", "COURSE_MODELS_DIR",
]

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM",)

#: Where the course's own trained checkpoints live (``servelab-main``, ``servelab-draft``);
#: ``SERVELAB_MODELS_DIR`` overrides it.
COURSE_MODELS_DIR = Path(os.environ.get("SERVELAB_MODELS_DIR",
                                        Path(__file__).resolve().parents[2] / "data" / "models"))
SUPPORTED_MODEL_TYPES = ("llama",)


# ====================================================================== config

#: The one config type (:class:`servelab.specs.ModelConfig`), under the name
#: Hugging Face gives it. ``rms_norm_eps`` defaults to 1e-6, as in ``transformers``.
LlamaConfig = ModelConfig


def check_llama_config(config: ModelConfig) -> ModelConfig:
    """Refuse, with the field named, a config this Llama decoder cannot build.

    The config type also describes GPT-3, Mixtral or DeepSeek shapes for the
    calculators; the model runs only dense SwiGLU Llama-family decoders.
    """
    if not isinstance(config, ModelConfig):
        raise TypeError(f"expected a servelab.specs.ModelConfig (alias LlamaConfig), "
                        f"got {type(config).__name__}")
    if config.architecture not in SUPPORTED_ARCHITECTURES:
        raise ValueError(
            f"config field architectures=[{config.architecture!r}] is not supported; "
            f"servelab.model loads {list(SUPPORTED_ARCHITECTURES)} checkpoints")
    if config.hidden_act != "silu" or not config.mlp_gated:
        raise ValueError(f"config field hidden_act={config.hidden_act!r} (gated={config.mlp_gated}) "
                         "is not supported (Llama uses a gated 'silu' MLP)")
    if config.is_moe or config.kv_lora_rank is not None:
        raise ValueError("mixture-of-experts and latent-attention fields are set; "
                         "servelab.model builds dense Llama decoders only")
    if config.head_dim % 2:
        raise ValueError(f"head_dim must be even for rotary embeddings, got {config.head_dim}")
    rope_inv_freq(config.head_dim, config.rope_theta, config.rope_scaling)  # validates rope_scaling
    return config


def load_config(path: str | Path) -> LlamaConfig:
    """Read ``config.json`` from a checkpoint folder (or the file itself)."""
    path = Path(path)
    file = path / "config.json" if path.is_dir() else path
    if not file.exists():
        raise FileNotFoundError(f"no config.json at {file}")
    d = json.loads(file.read_text())
    model_type = d.get("model_type")
    if model_type is not None and model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"config field model_type={model_type!r} is not supported; expected one of "
                         f"{list(SUPPORTED_MODEL_TYPES)}")
    return check_llama_config(ModelConfig.from_hf_dict(d, name=file.parent.name))


# ====================================================================== checkpoints

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # buffers some old checkpoints saved


def _resolve_dtype(dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str) and dtype.replace("torch.", "") in _DTYPES:
        return _DTYPES[dtype.replace("torch.", "")]
    raise ValueError(f"dtype must be a torch dtype or one of {list(_DTYPES)}, got {dtype!r}")


def _checkpoint_files(folder: Path) -> list[Path]:
    single = folder / "model.safetensors"
    index = folder / "model.safetensors.index.json"
    if single.exists():
        return [single]
    if index.exists():
        weight_map = json.loads(index.read_text()).get("weight_map")
        if not weight_map:
            raise ValueError(f"{index} has no 'weight_map'")
        shards = sorted(set(weight_map.values()))
        for shard in shards:
            if not (folder / shard).exists():
                raise FileNotFoundError(f"shard {shard} named in {index.name} is missing from {folder}")
        return [folder / s for s in shards]
    if any(folder.glob("*.bin")) or any(folder.glob("*.pt")):
        raise ValueError(f"{folder} holds only pickle (.bin/.pt) weights; servelab reads safetensors only "
                         "(convert with transformers: model.save_pretrained(path, safe_serialization=True))")
    raise FileNotFoundError(f"no model.safetensors or model.safetensors.index.json in {folder}")


def _hf_to_servelab_name(name: str) -> str:
    return name[len("model."):] if name.startswith("model.") else name


def load_state_dict(folder: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint folder, names as stored (``model.layers.0...``)."""
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for file in _checkpoint_files(Path(folder)):
        tensors.update(load_file(str(file)))
    return tensors


def checkpoint_tensors(folder: str | Path, config: ModelConfig,
                       expected: Mapping[str, Sequence[int]]) -> dict[str, torch.Tensor]:
    """The tensors of checkpoint ``folder`` under this library's names, checked against ``expected``.

    ``expected`` maps each name to its shape (a model's ``state_dict``). Every
    tensor must be accounted for: missing, unexpected or wrongly shaped tensors
    raise ``ValueError`` naming them. A tied head (``tie_word_embeddings``) that
    a writer stored anyway must equal the embedding, and is dropped.
    """
    folder = Path(folder)
    expected = {name: tuple(shape) for name, shape in expected.items()}
    tensors = {}
    for name, t in load_state_dict(folder).items():
        if name.endswith(_IGNORED_SUFFIXES):
            continue
        tensors[_hf_to_servelab_name(name)] = t
    if config.tie_word_embeddings and "lm_head.weight" in tensors:
        # Some writers store the tied head anyway; it must equal the embedding.
        head = tensors.pop("lm_head.weight")
        if "embed_tokens.weight" in tensors and not torch.equal(head, tensors["embed_tokens.weight"]):
            raise ValueError("tie_word_embeddings is true but lm_head.weight differs from "
                             "model.embed_tokens.weight; set tie_word_embeddings=false in config.json")
    if config.tie_word_embeddings:
        expected.pop("lm_head.weight", None)
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing:
        raise ValueError(f"checkpoint {folder} is missing tensor(s) "
                         f"{['model.' + m if m != 'lm_head.weight' else m for m in missing][:8]}"
                         f"{' ...' if len(missing) > 8 else ''}")
    if unexpected:
        raise ValueError(f"checkpoint {folder} has unexpected tensor(s) {unexpected[:8]}"
                         f"{' ...' if len(unexpected) > 8 else ''}; is it really a Llama model?")
    for name, shape in expected.items():
        if tuple(tensors[name].shape) != shape:
            raise ValueError(f"tensor {name} has shape {tuple(tensors[name].shape)} but config.json "
                             f"implies {shape}")
    return tensors


def course_model_folder(name: str = "main") -> Path:
    """The folder of the course's model ``name`` (``"main"``, ``"draft"`` or ``"servelab-..."``)."""
    folder = COURSE_MODELS_DIR / (name if name.startswith("servelab-") else f"servelab-{name}")
    if not (folder / "config.json").exists():
        raise FileNotFoundError(f"course model {name!r} not found at {folder}; "
                                f"train it with `python -m servelab.train --preset {name.removeprefix('servelab-')}`")
    return folder


def save_pretrained(model: torch.nn.Module, path: str | Path, extra_config: Mapping[str, Any] | None = None) -> Path:
    """Write a :class:`servelab.model.LlamaModel`'s ``config.json`` + ``model.safetensors`` in Hugging Face layout.

    A tied head is stored once (as the embedding), as ``transformers`` does.
    """
    from safetensors.torch import save_file

    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = model.config.to_hf_dict()
    cfg["torch_dtype"] = str(model.embed_tokens.weight.dtype).replace("torch.", "")
    if extra_config:
        cfg.update(extra_config)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    tensors = {}
    for name, t in model.state_dict().items():
        if name == "lm_head.weight" and model.config.tie_word_embeddings:
            continue
        # a fresh copy: fused projections are views of one shared matrix, which safetensors refuses
        tensors[name if name == "lm_head.weight" else "model." + name] = \
            t.detach().cpu().clone(memory_format=torch.contiguous_format)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def count_parameters_from_config(config: LlamaConfig) -> dict[str, int]:
    """Parameters by part, from the config alone: :func:`servelab.arith.count_params`
    (the course's one counter) as a dict, plus ``per_layer``. The tests check it
    against the real tensors."""
    from servelab import arith
    c = arith.count_params(config)
    per_layer = (c.attention + c.mlp + c.norms - config.hidden_size) // config.num_hidden_layers
    return {"embedding": c.embedding, "attention": c.attention, "mlp": c.mlp, "norms": c.norms,
            "lm_head": c.lm_head, "per_layer": per_layer, "total": c.total}
