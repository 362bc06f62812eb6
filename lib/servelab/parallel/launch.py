"""Start ``world_size`` processes on this machine, joined in one gloo process group.

:func:`launch` is the only way the course starts processes: every group gets a
timeout, every launch a fresh port and a deadline, so a failed peer raises
instead of hanging. The function each rank runs must live in a module (spawned
processes import it by name), never in a notebook.
"""
from __future__ import annotations

import os
import tempfile
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from servelab.ports import free_port

__all__ = ["free_port", "launch", "stall", "DEFAULT_TIMEOUT_S"]

DEFAULT_TIMEOUT_S = 60.0


def _entry(rank: int, fn: Callable, world_size: int, port: int, out_dir: str, args: tuple,
           group_timeout_s: float, threads: int) -> None:
    torch.set_num_threads(threads)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size, timeout=timedelta(seconds=group_timeout_s))
    try:
        result = fn(rank, world_size, *args)
        torch.save(result, Path(out_dir) / f"rank{rank}.pt")
    except BaseException:
        (Path(out_dir) / f"rank{rank}.err").write_text(traceback.format_exc())
        raise
    finally:
        dist.destroy_process_group()


def _forkserver_preload() -> None:
    # The fork server imports torch and the model once; every later launch in this
    # Python process forks from it in milliseconds instead of importing torch again.
    global _PRELOADED
    if not _PRELOADED:
        import multiprocessing
        multiprocessing.set_forkserver_preload(["torch", "torch.distributed", "servelab.model",
                                                "servelab.parallel"])
        _PRELOADED = True


_PRELOADED = False
START_METHODS = ("forkserver", "spawn")


def stall(rank: int, world_size: int, seconds: float) -> int:
    """A rank that just sleeps: lets tests check that :func:`launch` keeps its deadline."""
    time.sleep(seconds)
    return rank


def launch(fn: Callable, world_size: int, args: tuple = (), timeout: float = DEFAULT_TIMEOUT_S,
           threads: int = 1, start_method: str = "forkserver", startup_s: float = 30.0) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` fresh processes; return each rank's result.

    The processes share a gloo group on 127.0.0.1 (a free port per launch) whose
    collectives time out after ``timeout`` seconds; the whole launch must end
    within ``timeout`` seconds too, or every process is killed and
    ``TimeoutError`` raised. A rank's exception is re-raised here with its
    traceback. Processes start from a fork server that has imported torch once
    (``start_method="spawn"`` starts each from scratch). Results travel back through ``torch.save`` files, so tensors,
    numbers and dicts of them are fine.
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
    qualname = getattr(fn, "__qualname__", "<lambda>")
    if (not callable(fn) or getattr(fn, "__module__", "__main__") in ("__main__", None)
            or "<" in qualname):
        raise ValueError("fn must be a function defined in a module (spawned processes import it by "
                         "name, so not a lambda, a nested function or a notebook's); move it into a module under lib/")
    if not timeout > 0:
        raise ValueError(f"timeout must be positive seconds, got {timeout!r}")
    if start_method not in START_METHODS:
        raise ValueError(f"start_method must be one of {START_METHODS}, got {start_method!r}")
    if start_method == "forkserver":
        _forkserver_preload()
    with tempfile.TemporaryDirectory(prefix="servelab-launch-") as out_dir:
        port = free_port()
        ctx = mp.start_processes(_entry, args=(fn, world_size, port, out_dir, tuple(args), timeout, threads),
                                 nprocs=world_size, join=False, start_method=start_method)
        deadline = time.monotonic() + timeout + startup_s  # room to start the interpreters
        try:
            while not ctx.join(timeout=max(0.1, min(1.0, deadline - time.monotonic()))):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{world_size} processes running {fn.__name__} did not finish within "
                                       f"{timeout + startup_s:.0f} s; killed them")
        except mp.ProcessRaisedException as exc:
            raise RuntimeError(f"a rank running {fn.__name__} failed:\n{exc}") from None
        except mp.ProcessExitedException as exc:
            errors = "\n".join(p.read_text() for p in sorted(Path(out_dir).glob("*.err")))
            raise RuntimeError(f"a rank running {fn.__name__} exited: {exc}\n{errors}") from None
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.terminate()
            for p in ctx.processes:
                p.join(timeout=5)
        return [torch.load(Path(out_dir) / f"rank{r}.pt", weights_only=False) for r in range(world_size)]
