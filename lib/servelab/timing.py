"""One way to time a call: warm up, repeat, keep the median or the minimum.

Every measuring function in the library (:mod:`servelab.roofline_measure`,
:mod:`servelab.kernels`, :mod:`servelab.quant_quality`,
:mod:`servelab.parallel.collectives`) times its calls through :func:`time_call`
or :func:`call_seconds`:

* ``warmup`` untimed calls first (caches, allocator, lazy initialisation);
* on a GPU (``device="cuda"`` or ``"cuda:N"``) the device is synchronised
  before the clock starts and after every call, so the time is the kernels'
  and not only their launch;
* ``clock="wall"`` (default) reads ``time.perf_counter``; ``clock="cpu"``
  reads this process's CPU time (``time.process_time``), which on a machine
  shared with more runnable work than cores counts only this process's work;
* ``before`` (optional) runs untimed before each call: a barrier that lines up
  the ranks of a collective, a cache flush.

The minimum estimates an undisturbed run (interference only ever adds time);
the median is the typical one. Importing this module does not import torch:
only a GPU device does.
"""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable

__all__ = ["STATISTICS", "CLOCKS", "check_device", "synchronizer", "call_seconds", "time_call"]

STATISTICS = ("median", "min")
CLOCKS = ("wall", "cpu")


def check_device(device="cpu") -> str:
    """``device`` as torch spells it ("cpu", "cuda", "cuda:1", or a ``torch.device``); a GPU must be present.

    Returns the device as a string. Anything else (a typo, "gpu", "mps") is a ValueError naming the choices.
    """
    if not isinstance(device, str):
        import torch

        if not isinstance(device, torch.device):
            raise TypeError(f"device must be a string such as 'cpu' or 'cuda', got {device!r}")
        device = str(device)
    kind, _, index = device.partition(":")
    if kind not in ("cpu", "cuda") or (index and not (kind == "cuda" and index.isdigit())):
        raise ValueError(f"measurements run on 'cpu' or 'cuda' ('cuda:N'), got {device!r}")
    if kind == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ValueError(f"device={device!r} but this machine has no CUDA GPU that torch can use; "
                             "measure on device='cpu'")
        if index and int(index) >= torch.cuda.device_count():
            raise ValueError(f"device={device!r} but this machine has {torch.cuda.device_count()} CUDA GPU(s); "
                             "use 'cuda' or a smaller index")
    return device


def synchronizer(device="cpu") -> Callable[[], None]:
    """A function that waits for everything queued on ``device`` (nothing to wait for on a CPU)."""
    device = str(device)
    if device.startswith("cuda"):
        import torch

        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def call_seconds(fn: Callable[[], Any], repeats: int, warmup: int = 1, device="cpu", clock: str = "wall",
                 before: Callable[[], Any] | None = None) -> list[float]:
    """Seconds of each of ``repeats`` timed calls of ``fn``, after ``warmup`` untimed ones.

    ``device`` is checked (:func:`check_device`) and synchronised around every
    timed call; ``before`` runs untimed ahead of each timed call.
    """
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a whole number >= 1, got {repeats!r}")
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {CLOCKS}, got {clock!r}")
    device = check_device(device)
    if clock == "cpu" and device != "cpu":
        raise ValueError("clock='cpu' times CPU work; time a GPU with clock='wall'")
    now = time.perf_counter if clock == "wall" else time.process_time
    sync = synchronizer(device)
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        if before is not None:
            before()
        t0 = now()
        fn()
        sync()
        times.append(now() - t0)
    return times


def time_call(fn: Callable[[], Any], repeats: int = 5, warmup: int = 1, statistic: str = "median",
              device="cpu", clock: str = "wall", before: Callable[[], Any] | None = None) -> float:
    """Seconds one call of ``fn`` takes: the median (default) or minimum of :func:`call_seconds`."""
    if statistic not in STATISTICS:
        raise ValueError(f"statistic must be one of {STATISTICS}, got {statistic!r}")
    times = call_seconds(fn, repeats, warmup, device, clock, before)
    return statistics.median(times) if statistic == "median" else min(times)
