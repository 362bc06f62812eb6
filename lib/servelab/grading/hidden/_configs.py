"""Helpers shared by hidden tests that hand students a model's ``config.json``.

Not an exercise (no ``QUESTIONS``): the grader only imports modules named after
an exercise notebook.
"""
from servelab import kvcache
from servelab.specs import get_model

_DTYPE_BY_BYTES = {2: "bf16", 1: "fp8", 4: "fp32"}


def hf_config(name: str, drop: tuple[str, ...] = (), **changes) -> dict:
    """A registry model's Hugging Face ``config.json`` as a plain dict, optionally edited or without some keys."""
    d = get_model(name).with_(**changes).to_hf_dict()
    for key in drop:
        d.pop(key, None)
    return d


def kv_bytes(name: str, bytes_per_value: float, **changes) -> float:
    """The library's KV bytes per token for a registry model (optionally edited), at 1, 2 or 4 bytes a value."""
    return kvcache.kv_bytes_per_token(get_model(name).with_(**changes), _DTYPE_BY_BYTES[bytes_per_value])


def kv_case(name: str, bytes_per_value: float, label: str, **changes):
    """A grading case: the model's (edited) config and a value width in, the library's KV bytes per token out."""
    from servelab.grading import Case

    return Case(args=(hf_config(name, **changes), bytes_per_value),
                expected=kv_bytes(name, bytes_per_value, **changes), label=label)
