"""The engine on many processes: tensor parallelism as vLLM runs it.

``LLM(model, tensor_parallel_size=N)`` splits the model over ``N`` processes
(:mod:`servelab.parallel.tensor`: whole heads and a slice of the MLP per rank,
two all-reduces per layer, the head split by vocabulary). The scheduler, the
sampler and the stop rules stay in one place, the engine core. Each process is
a *rank*:

* **rank 0 is the engine core** (vLLM's "driver worker"): it plans each step,
  runs its own shard's forward pass and samples;
* **ranks 1..N-1 are workers**: each holds its weight shard, read straight
  from the checkpoint (:func:`~servelab.parallel.tensor.load_shard`), and its own
  K/V heads' block pool. The pools have the same blocks on every rank, so one
  block table, kept by rank 0's scheduler, serves all of them.

Every step, rank 0 sends every worker the same step plan
(:class:`~servelab.engine.model_runner.StepInput`: token ids, positions, slot
mapping, block tables, which rows need logits) once. Then every rank runs the
model's one forward path over its shard; the all-reduces inside the layers
keep the ranks in step. The gathered logits reach every rank; rank 0 samples.

The plans travel through the group's TCP key-value store (:class:`PlanChannel`):
posting one never waits for a worker, and an idle engine posts nothing while its
workers wait. The forward pass's collectives run on a gloo group with a
timeout: a worker that hangs makes rank 0's next collective fail after
``timeout_s`` seconds, and a worker that dies closes its sockets, which fails
the collective at once. Either way
the engine is then dead (:class:`EngineDeadError`, naming the rank and, when
this process started it, its exit code, or for a hung one how many of rank 0's
messages it had taken and finished, counted in shared memory, and what its
process is doing); the engine's requests fail with that message and the
executor kills what is left of its workers. Under torchrun a hung rank is not
named: the ranks share no memory.

The ranks start in one of two ways:

* **spawned** (the default): rank 0 starts ``N-1`` local processes;
* **under torchrun** (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
  ``MASTER_PORT`` in the environment): every process runs the same script; on
  rank 0 ``LLM(...)`` returns an engine, on the others it serves as a worker
  until rank 0 shuts down, then exits the process. The same script spans
  machines with no code change::

      torchrun --nnodes 2 --node-rank 0 --nproc-per-node 4 \\
          --master-addr 10.0.0.1 --master-port 29500 script.py   # machine A
      torchrun --nnodes 2 --node-rank 1 --nproc-per-node 4 \\
          --master-addr 10.0.0.1 --master-port 29500 script.py   # machine B
"""
from __future__ import annotations

import atexit
import os
import pickle
import signal
import tempfile
import time
import traceback
import weakref
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from servelab.engine.model_runner import ModelRunner, StepInput
from servelab.model import LlamaConfig, LlamaModel, load_config
from servelab.parallel.launch import free_port
from servelab.parallel.tensor import (build_shard, comm_counters, load_shard, record_collectives, shard_config,
                                      shard_state_dict)

__all__ = ["EngineDeadError", "TensorParallelExecutor", "check_tensor_parallel_size", "valid_tensor_parallel_sizes",
           "under_torchrun", "run_worker", "DEFAULT_TP_TIMEOUT_S"]

DEFAULT_TP_TIMEOUT_S = 60.0


class EngineDeadError(RuntimeError):
    """The engine cannot step any more: a tensor-parallel worker died or stopped answering.

    vLLM's name for the same condition. Every request the engine held fails
    with this message; a server reports itself unhealthy.
    """


# ---------------------------------------------------------------------------
# the sizes that work
# ---------------------------------------------------------------------------

def valid_tensor_parallel_sizes(config: LlamaConfig, limit: int = 64) -> list[int]:
    """Every world size up to ``limit`` that :func:`~servelab.parallel.tensor.shard_config` accepts."""
    ok = []
    for w in range(1, limit + 1):
        try:
            shard_config(config, w)
        except ValueError:
            continue
        ok.append(w)
    return ok


def check_tensor_parallel_size(config: LlamaConfig, size) -> int:
    """``size`` if the model splits into that many ranks; else ``ValueError`` naming the sizes that do."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"tensor_parallel_size must be a positive integer, got {size!r}")
    try:
        shard_config(config, size)
    except ValueError as exc:
        sizes = ", ".join(str(w) for w in valid_tensor_parallel_sizes(config))
        raise ValueError(f"tensor_parallel_size={size} cannot split this model: {exc}. "
                         f"Sizes that work for it: {sizes}") from None
    return size


def under_torchrun() -> bool:
    """True when torchrun (or another launcher) set this process's rank in the environment."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


# ---------------------------------------------------------------------------
# messages: one plan per step, through the group's key-value store
# ---------------------------------------------------------------------------

class PlanChannel:
    """Rank 0 posts each message under the next key of the group's TCP store; workers wait for it.

    Posting never waits for a worker (a hung one cannot stall rank 0 here: the
    next collective's timeout catches it), and an idle engine posts nothing
    while its workers wait as long as it takes. A message is deleted one message
    later, when every rank has used it (each step ends in a collective).
    """

    def __init__(self, store, poll_s: float = 3600.0):
        self.store = dist.PrefixStore("servelab-plan", store)
        self.n = 0
        self.poll = timedelta(seconds=poll_s)

    def send(self, obj) -> None:
        self.store.set(f"m{self.n}", pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
        if self.n:
            self.store.delete_key(f"m{self.n - 1}")
        self.n += 1

    def receive(self):
        key = f"m{self.n}"
        while True:
            try:
                self.store.wait([key], self.poll)
                break
            except Exception as exc:  # noqa: BLE001 - a quiet engine: keep waiting; a gone one: leave
                if "timeout" not in str(exc).lower() and "timed out" not in str(exc).lower():
                    raise
        self.n += 1
        return pickle.loads(self.store.get(key))


def _private_groups(rank: int, world: int, port: int, timeout_s: float, startup_s: float, host="127.0.0.1",
                    procs=()):
    """A compute group (deadline ``timeout_s``) and a plan channel on a TCP store of their
    own: not the process's default group, so one process may hold several engines (tests,
    a notebook). Rank 0 waits for every worker to check in, watching ``procs``: a worker
    that dies while starting fails the start at once."""
    store = dist.TCPStore(host, port, world, rank == 0, timeout=timedelta(seconds=startup_s),
                          wait_for_workers=False)
    if rank:
        store.set(f"joined/{rank}", "1")
    else:
        deadline = time.monotonic() + startup_s
        keys = [f"joined/{r}" for r in range(1, world)]
        while not store.check(keys):
            dead = [f"rank {r + 1} {_describe_exit(p.exitcode)}" for r, p in enumerate(procs) if not p.is_alive()]
            if dead:
                raise RuntimeError("a worker ended while starting: " + "; ".join(dead))
            if time.monotonic() > deadline:
                raise TimeoutError(f"the workers did not check in within {startup_s:g} s")
            time.sleep(0.02)
    compute = dist.ProcessGroupGloo(dist.PrefixStore("compute", store), rank, world,
                                    timedelta(seconds=timeout_s))
    return store, compute, PlanChannel(store)


def _torchrun_groups(timeout_s: float):
    """Under torchrun: the default group (from the environment) computes; its store carries the plans."""
    if not dist.is_initialized():
        dist.init_process_group("gloo", timeout=timedelta(seconds=timeout_s))
    from torch.distributed.distributed_c10d import _get_default_store
    return None, dist.group.WORLD, PlanChannel(_get_default_store())


# ---------------------------------------------------------------------------
# one rank's shard and pool
# ---------------------------------------------------------------------------

def _build_runner(source: dict, rank: int, world: int, options: dict, group) -> ModelRunner:
    """This rank's shard (read from the checkpoint or its shard file) in a paged-pool runner."""
    dtype = options["dtype"]
    if source["kind"] == "path":
        config, state = load_shard(source["path"], rank, world, dtype)
    else:
        config = LlamaConfig(**source["config"])
        state = {k: v.to(dtype) for k, v in torch.load(source["shards"][rank], weights_only=True).items()}
    model = build_shard(config, state, rank, world, group=group)  # collectives on the compute group
    return ModelRunner(model, options["num_blocks"], options["block_size"], kv_dtype=options.get("kv_dtype"))


def _gather(row: torch.Tensor, group) -> torch.Tensor:
    """Every rank's ``row``, stacked ``[world, len(row)]`` (on every rank)."""
    parts = [torch.empty_like(row) for _ in range(group.size())]
    dist.all_gather(parts, row, group=group)
    return torch.stack(parts)


def _holdings(runner: ModelRunner) -> list[int]:
    weights = sum(p.numel() * p.element_size() for p in runner.model.parameters())
    cfg = runner.config
    return [runner.kv_pool_bytes, weights, cfg.num_attention_heads, cfg.num_key_value_heads]


def _serve(runner: ModelRunner, compute, control, rank: int, progress=None) -> None:
    """The worker loop: receive a plan, run it, until rank 0 says stop.

    Every message but the last ends in something rank 0 waits for (a collective,
    or a posted log), so rank 0 knows it was read before it deletes it.
    ``progress`` (spawned workers: shared memory): this rank counts the messages
    it received and finished there, so rank 0 can name a rank that hangs.
    """
    _gather(torch.tensor(_holdings(runner), dtype=torch.long), compute)
    log: list = []
    while True:
        if progress is not None:
            progress[2 * rank + 1] = control.n  # every earlier message finished
        msg = control.receive()
        if progress is not None:
            progress[2 * rank] = control.n
        kind = msg[0]
        if kind == "step":
            runner.execute(msg[1])
        elif kind == "record":
            log = record_collectives(runner.model, msg[1])
            _gather(torch.zeros(1), compute)
        elif kind == "probe":
            _probe(compute, msg[1], msg[2], msg[3])
        elif kind == "log":
            control.store.set(f"log/{rank}/{msg[1]}", pickle.dumps(log))
            log.clear()
        elif kind == "stats":
            counters = comm_counters(runner.model)
            row = torch.tensor([counters["all_reduce_seconds"], counters["gather_seconds"]], dtype=torch.float64)
            _gather(row, compute)
        elif kind == "stop":
            return
        else:  # pragma: no cover - a bug in rank 0
            raise RuntimeError(f"unknown message {kind!r}")


def _probe(group, sizes: list[int], repeats: int, burst_s: float = 0.0) -> list[dict]:
    """Time gloo's all-reduce on ``group`` at each size (fp32 messages), the ranks lined up
    by a one-number all-reduce before each timed call; every rank runs it, rank 0 keeps its times.

    ``burst_s`` > 0: each rank multiplies matrices for about that long between lining up
    and the timed call, as a step computes between its exchanges."""
    out = []
    one = torch.zeros(1)
    a = torch.randn(64, 256)
    b = torch.randn(256, 768)
    for nbytes in sizes:
        x = torch.ones(max(1, nbytes // 4))
        times = []
        for _ in range(repeats):
            dist.all_reduce(one, group=group)
            t = time.perf_counter()
            while time.perf_counter() - t < burst_s:
                a @ b
            t0 = time.perf_counter()
            dist.all_reduce(x, group=group)
            times.append(time.perf_counter() - t0)
        out.append({"bytes": x.numel() * 4, "median_s": sorted(times)[len(times) // 2], "min_s": min(times)})
    return out


def _die_with_parent() -> None:
    """Linux: this process gets SIGKILL when its parent dies (no orphan worker)."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the closed sockets end the worker instead
        pass


def _spawned_worker(rank: int, world: int, port: int, source: dict, options: dict, err_dir: str,
                    progress=None) -> None:
    """Entry point of a spawned worker process."""
    _die_with_parent()
    torch.set_num_threads(options.get("threads", 1))
    try:
        store, compute, control = _private_groups(rank, world, port, options["timeout_s"], options["startup_s"])
        runner = _build_runner(source, rank, world, options, compute)
        with torch.inference_mode():
            _serve(runner, compute, control, rank, progress)
    except BaseException:  # noqa: BLE001 - rank 0 reads why
        Path(err_dir, f"rank{rank}.err").write_text(traceback.format_exc())
        os._exit(1)
    os._exit(0)  # skip torch's teardown: rank 0 is waiting for this process to go


def run_worker(model, *, dtype="float32", kv_dtype=None, num_kv_blocks: int, block_size: int = 16,
               timeout_s: float = DEFAULT_TP_TIMEOUT_S) -> None:
    """Under torchrun, on a rank other than 0: serve as a worker until rank 0 shuts down.

    :class:`~servelab.engine.llm.LLM` calls it (then exits the process) when it is
    built on such a rank; ``python -m servelab.server`` does the same.
    """
    from servelab.model import _resolve_dtype
    _die_with_parent()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    _, compute, control = _torchrun_groups(timeout_s)
    options = {"dtype": _resolve_dtype(dtype), "kv_dtype": kv_dtype, "num_blocks": num_kv_blocks,
               "block_size": block_size}
    runner = _build_runner({"kind": "path", "path": str(model)}, rank, world, options, compute)
    with torch.inference_mode():
        try:
            _serve(runner, compute, control, rank)
        except RuntimeError:  # rank 0 went away: nothing left to serve
            pass


# ---------------------------------------------------------------------------
# rank 0
# ---------------------------------------------------------------------------

def _describe_exit(code) -> str:
    if code is None:
        return "is still running (it stopped answering)"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


_STATES = {"R": "running (busy, not answering)", "S": "sleeping (waiting on something)", "D": "waiting on I/O",
           "T": "stopped (a signal such as SIGSTOP)", "t": "stopped by a debugger", "Z": "a zombie (it exited)"}


def _process_state(pid: int) -> str:
    """What the process ``pid`` is doing, from Linux's /proc ("unknown" elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            code = f.read().rsplit(") ", 1)[-1][:1]
    except OSError:
        return "unknown"
    return _STATES.get(code, f"in state {code!r}")


def _kill(procs, grace_s: float = 2.0) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + grace_s
    for p in procs:
        p.join(timeout=max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(timeout=5)


class TensorParallelExecutor:
    """Rank 0's side: the engine's runner for a model split over ``world_size`` processes.

    It has the runner's interface (``execute(step) -> logits``, ``vocab_size``,
    ``kv_pool_bytes``), so :class:`~servelab.engine.engine.LLMEngine` drives it
    like one process's :class:`~servelab.engine.model_runner.ModelRunner`.

    ``source`` is a checkpoint folder (every rank reads its own slices) or a
    :class:`~servelab.model.LlamaModel` (its shards are written to a temporary
    folder, one file per rank). ``timeout_s`` bounds every collective of the
    forward pass: a hung worker is declared dead after that long.

    ``stats`` (rank 0's clock): ``steps``, ``step_seconds`` (plan sent to
    logits back), ``plan_seconds`` (sending the plans), ``all_reduce_seconds``
    and ``gather_seconds`` (inside the forward pass's collectives, transfer plus
    any wait for a slower rank), ``all_reduces``, ``all_reduce_bytes``, ``gathers``,
    ``gather_bytes``.
    """

    def __init__(self, source, world_size: int, *, num_kv_blocks: int, block_size: int, dtype=torch.float32,
                 kv_dtype=None, timeout_s: float = DEFAULT_TP_TIMEOUT_S, startup_s: float = 120.0,
                 threads: int = 1, backend: str | None = None):
        if isinstance(source, LlamaModel):
            config = source.config
        else:
            source = Path(source)
            config = load_config(source)
        check_tensor_parallel_size(config, world_size)
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be positive seconds, got {timeout_s!r}")
        if backend not in (None, "mp", "torchrun"):
            raise ValueError(f"distributed_executor_backend must be None, 'mp' or 'torchrun', got {backend!r}")
        if backend is None:
            backend = "torchrun" if under_torchrun() else "mp"
        self.world_size = world_size
        self.backend = backend
        self.timeout_s = float(timeout_s)
        self.config = config
        self.dead: str | None = None
        self.procs: list = []
        self._progress = None  # spawned workers: per rank, messages received and messages finished
        self._tmp = None
        self._store = None
        options = {"dtype": dtype, "kv_dtype": kv_dtype, "num_blocks": num_kv_blocks, "block_size": block_size,
                   "timeout_s": self.timeout_s, "startup_s": startup_s, "threads": threads}
        src = self._source(source, config, world_size)
        if backend == "torchrun":
            if int(os.environ["WORLD_SIZE"]) != world_size:
                raise ValueError(f"tensor_parallel_size={world_size} but torchrun started "
                                 f"{os.environ['WORLD_SIZE']} processes; make them equal")
            if int(os.environ["RANK"]) != 0:
                raise RuntimeError("the executor runs on rank 0; other ranks call run_worker()")
            self._store, self.compute, self.control = _torchrun_groups(self.timeout_s)
            atexit.register(self.shutdown)  # the other ranks wait for "stop": never leave them waiting
        else:
            self._err_dir = tempfile.mkdtemp(prefix="servelab-tp-")
            port = free_port()
            from servelab.parallel.launch import _forkserver_preload
            _forkserver_preload()  # workers fork from a server that imported torch once
            ctx = torch.multiprocessing.get_context("forkserver")
            self._progress = ctx.Array("q", 2 * world_size, lock=False)  # each rank writes its own two
            for rank in range(1, world_size):
                p = ctx.Process(target=_spawned_worker, args=(rank, world_size, port, src, options, self._err_dir,
                                                              self._progress),
                                daemon=True, name=f"servelab-tp-worker-{rank}")
                p.start()
                self.procs.append(p)
            self._finalizer = weakref.finalize(self, _kill, list(self.procs))
            atexit.register(self._finalizer)
            try:
                self._store, self.compute, self.control = _private_groups(0, world_size, port, self.timeout_s,
                                                                          startup_s, procs=self.procs)
            except Exception as exc:
                _kill(self.procs)
                raise RuntimeError(f"the tensor-parallel workers did not start: {exc}. A script that builds "
                                   f"the engine at its top level needs `if __name__ == '__main__':` (the "
                                   f"workers import it).\n{self._worker_errors()}") from None
        try:
            self.runner = _build_runner(src, 0, world_size, options, self.compute)
            table = _gather(torch.tensor(_holdings(self.runner), dtype=torch.long), self.compute)
        except Exception as exc:
            self._lose(exc, "starting")
        rows = table.tolist()
        self.kv_pool_bytes_per_rank = [r[0] for r in rows]
        self.weight_bytes_per_rank = [r[1] for r in rows]
        self.heads_per_rank = [r[2] for r in rows]
        self.kv_heads_per_rank = [r[3] for r in rows]
        self.stats = {"steps": 0, "step_seconds": 0.0, "plan_seconds": 0.0}
        self._comm0 = comm_counters(self.runner.model)

    def _source(self, source, config, world: int) -> dict:
        if isinstance(source, Path):
            return {"kind": "path", "path": str(source)}
        state = {k: v.detach() for k, v in source.state_dict().items()}
        self._tmp = tempfile.TemporaryDirectory(prefix="servelab-tp-shards-")
        files = []
        for r in range(world):
            path = Path(self._tmp.name) / f"shard{r}.pt"
            torch.save(shard_state_dict(state, config, r, world), path)
            files.append(str(path))
        return {"kind": "shards", "config": asdict(config), "shards": files}

    # -- what the engine reads -------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def kv_pool_bytes(self) -> int:
        """Rank 0's pool (each rank holds the same share)."""
        return self.kv_pool_bytes_per_rank[0]

    @property
    def model(self):
        """Rank 0's shard."""
        return self.runner.model

    # -- the step ----------------------------------------------------------------
    def check_workers(self) -> None:
        """Raise :class:`EngineDeadError` if the engine is dead or a worker this process started has exited."""
        if self.dead is not None:
            raise EngineDeadError(self.dead)
        gone = [(r + 1, p) for r, p in enumerate(self.procs) if not p.is_alive()]
        if gone:
            self._lose(None, "idle")

    def execute(self, step: StepInput) -> torch.Tensor:
        """Send the plan to every worker, run rank 0's shard, return the gathered logits."""
        self.check_workers()
        t0 = time.perf_counter()
        try:
            self.control.send(("step", step))
            t1 = time.perf_counter()
            logits = self.runner.execute(step)
        except Exception as exc:  # noqa: BLE001 - a peer died or hung: the engine is dead
            self._lose(exc, "running a step")
        t2 = time.perf_counter()
        s = self.stats
        s["steps"] += 1
        s["plan_seconds"] += t1 - t0
        s["step_seconds"] += t2 - t0
        return logits

    def comm_stats(self) -> dict:
        """:attr:`stats` plus rank 0's collective counters since start-up (or the last ``reset_stats``)."""
        now = comm_counters(self.runner.model)
        out = dict(self.stats)
        out.update({k: now[k] - self._comm0[k] for k in now})
        return out

    def reset_stats(self) -> None:
        self.stats = {"steps": 0, "step_seconds": 0.0, "plan_seconds": 0.0}
        self._comm0 = comm_counters(self.runner.model)

    def rank_comm_seconds(self) -> list[tuple[float, float]]:
        """Every rank's (all-reduce, gather) seconds since start-up: one extra message, one gather."""
        self.check_workers()
        counters = comm_counters(self.runner.model)
        row = torch.tensor([counters["all_reduce_seconds"], counters["gather_seconds"]], dtype=torch.float64)
        try:
            self.control.send(("stats",))
            table = _gather(row, self.compute)
        except Exception as exc:  # noqa: BLE001
            self._lose(exc, "reading counters")
        return [tuple(r) for r in table.tolist()]

    def record_collectives(self, on: bool = True) -> None:
        """Every rank starts (or stops) logging each collective call: see :meth:`collective_logs`."""
        self.check_workers()
        try:
            self.control.send(("record", on))
            self._log = record_collectives(self.runner.model, on)
            _gather(torch.zeros(1), self.compute)
        except Exception as exc:  # noqa: BLE001
            self._lose(exc, "starting a log")

    def probe_all_reduce(self, sizes, repeats: int = 10, burst_s: float = 0.0) -> list[dict]:
        """gloo's all-reduce timed on the engine's own processes and group, between steps:
        per size, ``bytes``, ``median_s`` and ``min_s`` on rank 0 (each call after the ranks
        line up, and after ``burst_s`` of matrix products on every rank when > 0, as inside
        a step). What chapter 15's alpha-beta model is fitted on."""
        self.check_workers()
        sizes = [int(x) for x in sizes]
        try:
            self.control.send(("probe", sizes, int(repeats), float(burst_s)))
            return _probe(self.compute, sizes, int(repeats), float(burst_s))
        except Exception as exc:  # noqa: BLE001
            self._lose(exc, "timing the all-reduce")

    def collective_logs(self) -> list[list[tuple[str, float, int]]]:
        """Each rank's log since the last call: ``logs[rank][i] = (kind, seconds, bytes)``.

        The ranks make the same calls in the same order, so ``logs[r][i]`` is the
        same call on every rank. A call's time on the rank that arrived last is
        the transfer alone; the others also waited for that rank.
        """
        self.check_workers()
        tag = self._log_tag = getattr(self, "_log_tag", -1) + 1
        logs = [list(getattr(self, "_log", []))]
        try:
            self.control.send(("log", tag))
            for r in range(1, self.world_size):
                key = f"log/{r}/{tag}"
                logs.append(pickle.loads(self.control.store.get(key)))
                self.control.store.delete_key(key)
        except Exception as exc:  # noqa: BLE001
            self._lose(exc, "reading the logs")
        if hasattr(self, "_log"):
            self._log.clear()
        return logs

    # -- faults and the end --------------------------------------------------------
    def _worker_errors(self) -> str:
        err_dir = getattr(self, "_err_dir", None)
        if err_dir is None:
            return ""
        return "\n".join(p.read_text() for p in sorted(Path(err_dir).glob("*.err")))

    def _lose(self, exc, doing: str):
        """Name what went wrong, end every worker, raise :class:`EngineDeadError`."""
        timed_out = exc is not None and "timed out" in str(exc).lower()
        deadline = time.monotonic() + (0.0 if timed_out else 1.0)  # a crashed worker is gone within moments
        while self.procs and all(p.is_alive() for p in self.procs) and time.monotonic() < deadline:
            time.sleep(0.02)
        gone = [f"worker rank {r + 1} (pid {p.pid}) {_describe_exit(p.exitcode)}"
                for r, p in enumerate(self.procs) if not p.is_alive()]
        if gone:
            what = "; ".join(gone)
        elif timed_out:
            what = "; ".join(self._laggards()) or (f"a worker did not answer within timeout_s={self.timeout_s:g} s "
                                                   f"(hung, or far slower than rank 0)")
        else:
            what = "a worker stopped answering"
        detail = "" if exc is None else f" ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})"
        self.dead = (f"the tensor-parallel engine lost a rank while {doing}: {what}{detail}; "
                     f"every running request fails, and the engine must be restarted")
        errors = self._worker_errors()
        if errors:
            self.dead += "\n" + errors
        self._stop_workers(graceful=False)
        raise EngineDeadError(self.dead) from None

    def _laggards(self) -> list[str]:
        """Spawned workers that had not finished every message rank 0 sent, each named with how far
        it got and what its process is doing (from /proc); empty when it cannot tell."""
        if self._progress is None:
            return []
        sent = self.control.n
        out = []
        for rank, p in enumerate(self.procs, start=1):
            got, done = self._progress[2 * rank], self._progress[2 * rank + 1]
            if done >= sent:
                continue
            where = (f"it was still on message {got} of {sent}" if got == sent
                     else f"it had taken {got} of the {sent} messages rank 0 sent")
            out.append(f"worker rank {rank} (pid {p.pid}) did not answer within timeout_s={self.timeout_s:g} s: "
                       f"{where}, and its process is {_process_state(p.pid)}")
        return out

    def _stop_workers(self, graceful: bool) -> None:
        if graceful and self.dead is None:
            try:
                self.control.send(("stop",))
            except Exception:  # noqa: BLE001 - they are ended below either way
                pass
            deadline = time.monotonic() + 10.0
            for p in self.procs:
                p.join(timeout=max(0.0, deadline - time.monotonic()))
        _kill(self.procs, grace_s=2.0 if graceful else 0.0)
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def shutdown(self) -> None:
        """Stop the workers (they leave their loop, or are killed); safe to call twice."""
        if getattr(self, "_closed", False):
            return
        self._closed = True
        self._stop_workers(graceful=True)
        if self.dead is None:
            self.dead = "the engine was shut down"
        if self.backend == "torchrun":
            atexit.unregister(self.shutdown)
            if dist.is_initialized():
                dist.destroy_process_group()
        finalizer = getattr(self, "_finalizer", None)
        if finalizer is not None:
            atexit.unregister(finalizer)
            finalizer.detach()

    @property
    def worker_pids(self) -> list[int]:
        return [p.pid for p in self.procs]
