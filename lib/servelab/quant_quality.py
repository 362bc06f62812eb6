"""What quantization costs in quality and what it saves in time, measured on this machine.

* :func:`perplexity` and :func:`quality_table` (perplexity on the corpus's
  validation split, top-1 agreement and KL divergence against fp32);
* :func:`outlier_demo` (one large weight channel and its fixes, rotation
  included), :func:`outlier_activations` and :func:`activation_outlier_errors`
  (int8 against E4M3 on activations with an outlier channel);
* :func:`time_projection`: one projection at batch 1 in each format, timed
  (for a chapter's live cell; never used by a test's assertion).

Also importable from :mod:`servelab.quant`.
"""
from __future__ import annotations

import functools
import math
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from servelab.quant_codecs import fake_quantize, scaled_round_trip
from servelab.quant_formats import INT8_MAX, bits_per_weight
from servelab.quant_layers import PROJECTIONS, QuantizedLinear, linear_weight_bytes, quantize_model
from servelab.timing import time_call

__all__ = ["validation_tokens", "perplexity", "QUALITY_VARIANTS", "quality_table", "outlier_demo",
           "outlier_activations", "activation_outlier_errors", "time_projection"]


# ====================================================================== quality

def validation_tokens(max_tokens: int | None = None) -> torch.Tensor:
    """The corpus's validation split as token ids (course tokenizer), first ``max_tokens`` of them."""
    from servelab.train import encode_corpus

    tokens = encode_corpus("val")
    return tokens if max_tokens is None else tokens[:max_tokens]


@torch.no_grad()
def perplexity(model: nn.Module, tokens: torch.Tensor, seq_len: int = 256, batch_size: int = 8,
               return_logits: bool = False):
    """exp(mean next-token loss) over consecutive non-overlapping windows of ``tokens``.

    With ``return_logits=True`` also returns the logits of every window
    (``[windows, seq_len, vocab]``, fp32) for comparing two models position by position.
    """
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    n = (len(tokens) - 1) // seq_len
    if n < 1:
        raise ValueError(f"need more than seq_len={seq_len} tokens, got {len(tokens)}")
    model.eval()
    total, count, logits_all = 0.0, 0, []
    for start in range(0, n, batch_size):
        idx = range(start, min(n, start + batch_size))
        rows = torch.stack([tokens[i * seq_len:i * seq_len + seq_len + 1] for i in idx]).long()
        logits = model(rows[:, :-1]).float()
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), rows[:, 1:].reshape(-1), reduction="sum")
        total += loss.item()
        count += rows[:, 1:].numel()
        if return_logits:
            logits_all.append(logits)
    ppl = math.exp(total / count)
    return (ppl, torch.cat(logits_all)) if return_logits else ppl


QUALITY_VARIANTS = ("fp32", "bf16", "int8", "int4-g128", "int4-g32", "mxfp4", "nvfp4")


def quality_table(variants: Sequence[str] = QUALITY_VARIANTS, max_tokens: int = 16_384, seq_len: int = 256,
                  model_name: str = "main") -> list[dict[str, Any]]:
    """Perplexity, top-1 agreement and KL divergence against fp32, for each variant of the course model.

    "fp32" and "bf16" are the whole model in that dtype; a scheme name is the
    fp32 model with its projections quantized (activations stay fp32, so the
    difference is the weights' rounding alone). Scored on the first
    ``max_tokens`` tokens of the validation split, in windows of ``seq_len``.
    """
    from servelab.kvquant import logit_agreement
    from servelab.model import load_course_model

    tokens = validation_tokens(max_tokens)
    ref_ppl, ref_logits = None, None
    rows = []
    for variant in variants:
        if variant in ("fp32", "bf16"):
            model = load_course_model(model_name, dtype=torch.float32 if variant == "fp32" else torch.bfloat16)
            bits = 32 if variant == "fp32" else 16
            weight_bytes = linear_weight_bytes(model)["projections"]
        else:
            model = quantize_model(load_course_model(model_name, dtype=torch.float32), variant)
            bits = bits_per_weight(variant, in_features=model.config.hidden_size)
            weight_bytes = linear_weight_bytes(model)["projections"]
        proj_params = sum(_projection_sizes(model))
        ppl, logits = perplexity(model, tokens, seq_len, return_logits=True)
        if ref_logits is None:
            ref_ppl, ref_logits = ppl, logits
        agree = logit_agreement(ref_logits, logits)
        rows.append({"variant": variant, "bits_per_weight": round(bits, 3), "projection_bytes": weight_bytes,
                     "held_bits_per_weight": round(weight_bytes * 8 / proj_params, 3),
                     "perplexity": ppl, "perplexity_change": ppl / ref_ppl - 1,
                     "top1_agreement": agree["top1_agreement"], "mean_kl": agree["mean_kl"],
                     "tokens": int((len(tokens) - 1) // seq_len * seq_len)})
    return rows


def _projection_sizes(model: nn.Module) -> list[int]:
    sizes = []
    for layer in model.layers:
        for path in PROJECTIONS:
            parent_name, name = path.split(".")
            lin = getattr(getattr(layer, parent_name), name)
            sizes.append(lin.in_features * lin.out_features)
    return sizes


def outlier_demo(out_features: int = 256, in_features: int = 512, factor: float = 40.0, seed: int = 0,
                 tokens: int = 64) -> dict[str, Any]:
    """One large input channel and what it does to int8: relative output error per method.

    A random weight matrix gets one input column ``factor`` times larger than
    the rest (LLM weights and activations have such channels). Each method's
    error is ``|x W^T - x W_hat^T| / |x W^T|`` on random inputs:

    * per-tensor int8: one scale for the whole matrix, set by the outlier:
      every ordinary weight is left with a few levels;
    * per-channel int8 (one scale per output row): every row holds the large
      column, so it does not help here (it does for a large *output* row);
    * int8 with groups of 128 along the row: only the group holding the column suffers;
    * rescaled (SmoothQuant/AWQ-style): divide the column by ``s`` and multiply
      that input channel by ``s`` (folded into the previous norm's weight), then
      per-channel int8: ``x W^T`` is unchanged, the column is ordinary;
    * column kept in high precision (LLM.int8()-style mixed precision), rest per-channel int8;
    * rotated (QuaRot-style): multiply ``W`` by an orthogonal matrix ``R`` (a
      Hadamard matrix with random signs when ``in_features`` is a power of two,
      else a random orthogonal one) and the inputs by the same ``R``:
      ``(x R)(W R)^T = x W^T``, and the large column is spread over every column
      before per-channel int8.
    """
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(out_features, in_features, generator=gen) * 0.02
    col = int(torch.randint(0, in_features, (1,), generator=gen))
    w[:, col] *= factor
    x = torch.randn(tokens, in_features, generator=gen)
    y = x @ w.T

    def err(w_hat, x_used=x):
        return ((x_used @ w_hat.T - y).norm() / y.norm()).item()

    def int8_rows(m):
        return fake_quantize(m, "int8")

    s_tensor = (w.abs().max() / INT8_MAX)
    per_tensor = torch.round(w / s_tensor).clamp(-INT8_MAX, INT8_MAX) * s_tensor
    g = 128 if in_features % 128 == 0 else in_features
    s_group = (w.view(out_features, -1, g).abs().amax(-1, keepdim=True) / INT8_MAX)
    grouped = (torch.round(w.view(out_features, -1, g) / s_group) * s_group).view_as(w)
    smooth = torch.ones(in_features)
    smooth[col] = factor
    rescaled = int8_rows(w / smooth) * smooth          # == quantize(W / s), activations x * s
    rest = w.clone()
    rest[:, col] = 0
    kept = int8_rows(rest)
    kept[:, col] = w[:, col]
    rot = _random_rotation(in_features, gen)
    rotated = int8_rows(w @ rot) @ rot.T                # == quantize(W R), activations x R
    methods = {"per-tensor int8": err(per_tensor), "per-channel int8": err(int8_rows(w)),
               f"int8, groups of {g}": err(grouped), "rescaled channel, per-channel int8": err(rescaled),
               "channel kept in high precision": err(kept),
               "rotated (Hadamard), per-channel int8": err(rotated)}
    clean = w.clone()
    clean[:, col] /= factor
    s_clean = clean.abs().max() / INT8_MAX
    clean_err = ((x @ (torch.round(clean / s_clean) * s_clean - clean).T).norm() / (x @ clean.T).norm()).item()
    return {"column": col, "factor": factor, "group": g, "errors": methods,
            "per_tensor_without_outlier": clean_err}


def _random_rotation(n: int, gen: torch.Generator) -> torch.Tensor:
    """An ``n x n`` orthogonal matrix: Hadamard with random column signs (n a power of two), else QR of a Gaussian."""
    if n > 0 and n & (n - 1) == 0:
        h = torch.ones(1, 1)
        while h.shape[0] < n:
            h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
        signs = torch.randint(0, 2, (n,), generator=gen).float() * 2 - 1
        return h * signs / math.sqrt(n)
    q, r = torch.linalg.qr(torch.randn(n, n, generator=gen))
    return q * torch.sign(torch.diagonal(r))


def outlier_activations(tokens: int = 64, features: int = 512, factor: float = 100.0,
                        seed: int = 0) -> torch.Tensor:
    """Random activations ``[tokens, features]`` whose one channel is ``factor`` times the rest.

    Trained LLMs' activations have such channels in every token (LLM.int8()
    found features up to 20x larger; some reach hundreds). A per-token scale
    cannot avoid them: every row holds the large channel.
    """
    if tokens < 1 or features < 2:
        raise ValueError("need at least 1 token and 2 features")
    if not factor > 0:
        raise ValueError(f"factor must be positive, not {factor!r}")
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, features, generator=gen)
    col = int(torch.randint(0, features, (1,), generator=gen))
    x[:, col] *= factor
    return x


def activation_outlier_errors(factor: float = 100.0, tokens: int = 64, features: int = 512,
                              seed: int = 0) -> dict[str, dict[str, float]]:
    """Relative RMS error of the *ordinary* channels of :func:`outlier_activations`, int8 against E4M3.

    ``{"int8": {"tensor": e, "row": e}, "e4m3": {...}}``: each element rounds
    the whole tensor with one scale per tensor or per token (row); the error
    is measured on every channel but the large one, the values the outlier
    squeezes. int8's levels are evenly spaced, so a scale set by the outlier
    leaves ordinary values a few codes; E4M3's steps shrink with the value,
    so they keep about two significant bits of precision (3 mantissa bits).
    """
    x = outlier_activations(tokens, features, factor, seed)
    col = int(x.abs().amax(0).argmax())
    keep = torch.ones(features, dtype=torch.bool)
    keep[col] = False
    out: dict[str, dict[str, float]] = {}
    for element in ("int8", "e4m3"):
        out[element] = {}
        for g in ("tensor", "row"):
            back = scaled_round_trip(x, element, g)
            d, ref = (back - x)[:, keep], x[:, keep]
            out[element][g] = (d.pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()).item()
    return out


# ====================================================================== live timing

def time_projection(in_features: int = 1024, out_features: int = 2816,
                    schemes: Sequence[str] = ("int8", "int4-g128", "int4-g32", "mxfp4"),
                    repeats: int = 30, seed: int = 0) -> dict[str, float]:
    """Milliseconds for one projection at batch 1: fp32, bf16 and each scheme (bf16 activations).

    A scheme whose layer dequantizes (no kernel reads it) also gets
    ``"<scheme> rebuild"``: the matrix's rebuild alone, without the matmul.

    Each is called once to warm up, then ``repeats`` times; the fastest call
    counts (the least disturbed by other work). A measurement of this machine:
    the numbers vary from run to run and between CPUs.
    """
    if repeats < 1:
        raise ValueError("repeats must be at least 1")
    gen = torch.Generator().manual_seed(seed)
    lin = nn.Linear(in_features, out_features, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(out_features, in_features, generator=gen) * 0.02)
    x32 = torch.randn(1, in_features, generator=gen)
    x16 = x32.bfloat16()
    lin16 = nn.Linear(in_features, out_features, bias=False).bfloat16()
    with torch.no_grad():
        lin16.weight.copy_(lin.weight)
    calls = {"fp32": lambda: lin(x32), "bf16": lambda: lin16(x16)}
    for scheme in schemes:
        layer = QuantizedLinear.from_linear(lin, scheme)
        calls[scheme] = functools.partial(layer, x16)
        if layer.path(1, torch.bfloat16) == "dequantize":
            # the rebuild alone, without the matmul that follows it
            calls[f"{scheme} rebuild"] = functools.partial(layer.dequantized_weight, torch.bfloat16)

    with torch.no_grad():
        return {name: time_call(fn, repeats, warmup=1, statistic="min") * 1e3 for name, fn in calls.items()}
