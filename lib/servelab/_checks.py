"""Input checks shared by the calculators: each raises a ValueError that names the argument."""
from __future__ import annotations

import math


def _is_number(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float))


def check_positive(name: str, value: float) -> None:
    if not _is_number(value) or not value > 0 or math.isinf(value):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")


def check_non_negative(name: str, value: float) -> None:
    if not _is_number(value) or not value >= 0 or math.isinf(value):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


def check_fraction(name: str, value: float) -> None:
    if not _is_number(value) or not 0 < value <= 1:
        raise ValueError(f"{name} must be a fraction in (0, 1] (e.g. 0.6 for 60% of peak), got {value!r}")


def check_count(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive whole number, got {value!r}")


def check_tokens(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a whole number of tokens >= 0, got {value!r}")
