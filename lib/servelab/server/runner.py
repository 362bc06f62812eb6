"""Building the served engine, and running the app: in a thread, a process, or the shell.

* :func:`build_engine` (from :mod:`servelab.server.core`) - an
  :class:`~servelab.engine.LLMEngine` exactly as ``LLM(...)`` builds it (same
  pool, same tokenizer), so greedy text through the server equals ``LLM.generate``.
* :class:`ServerThread` - uvicorn in a background thread of this process, on
  a port the OS picks (tests, benchmarks).
* :func:`launch` - ``python -m servelab.server`` as a background process
  (chapter 1); ``stop()`` sends SIGTERM and returns the exit code.
* :func:`main` - the command line.

Shutdown: the first SIGTERM (or Ctrl-C) runs the app's drain
(:func:`servelab.server.app.create_app`): new requests get 503 at once, those in
flight have ``--shutdown-grace`` seconds to finish, the rest end with an error
(an error event and ``[DONE]`` for a stream), and the process exits 0. A second
signal cuts the grace short. :meth:`ServerThread.shutdown` does the same in-process.

Exit codes: 0 after a shutdown; **1 when the engine core process died** (killed,
out of memory, crashed). That loss is logged at CRITICAL level, the dead child
is reaped, its requests fail, and the server exits at once rather than answer
503 forever: run it under a supervisor (systemd ``Restart=on-failure``, a
Kubernetes Deployment, ``docker --restart``) so that exit restarts it.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from servelab.ports import free_port  # noqa: F401  (the one free_port; re-exported)
from servelab.server.core import build_engine

__all__ = ["build_engine", "free_port", "ServerThread", "ServerProcess", "launch", "main",
           "DEFAULT_MODEL"]

DEFAULT_MODEL = "data/models/servelab-main"


def _server(app, config):
    """uvicorn's server, with the app's graceful drain run on the first SIGTERM/SIGINT
    (uvicorn alone stops accepting, waits, then cancels the handlers mid-response)."""
    import uvicorn

    class GracefulServer(uvicorn.Server):
        def __init__(self, config):
            super().__init__(config)
            self._loop = None
            self._drain_task = None

        async def serve(self, sockets=None):
            self._loop = asyncio.get_running_loop()
            app.state.request_exit = self.request_exit
            await super().serve(sockets)

        def handle_exit(self, sig, frame):
            if self._loop is None or self._drain_task is not None or self.should_exit:
                super().handle_exit(sig, frame)  # not serving yet, or a second signal: stop now
            else:
                self.begin_shutdown()

        def begin_shutdown(self) -> None:
            """Drain, then stop (safe from any thread or a signal handler)."""
            self._loop.call_soon_threadsafe(self._start_drain)

        def request_exit(self) -> None:
            """Stop now, without a drain (the engine is gone: there is nothing to drain)."""
            self.should_exit = True

        def _start_drain(self) -> None:
            if self._drain_task is None:
                self._drain_task = self._loop.create_task(self._drain())

        async def _drain(self) -> None:
            try:
                await app.state.drain()
            except Exception:  # noqa: BLE001 - stop anyway
                logging.getLogger("servelab.server").exception("the shutdown drain failed")
            finally:
                self.should_exit = True

    return GracefulServer(config)


def _bound_socket(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


class ServerThread:
    """Serve ``app`` from a background thread on ``host`` (loopback by default).

    ``port=0`` lets the OS choose; read it from ``.port`` / ``.url``. Use as a
    context manager, or call ``start()`` and ``stop()``.
    """

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, graceful_s: float = 2.0,
                 log_level: str = "warning"):
        import uvicorn
        self.app = app
        self.sock = _bound_socket(host, port)
        self.host, self.port = self.sock.getsockname()[:2]
        self.config = uvicorn.Config(app, log_level=log_level, lifespan="on",
                                     timeout_graceful_shutdown=graceful_s, access_log=False)
        self.server = _server(app, self.config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       name="servelab-http", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 30.0) -> "ServerThread":
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server thread did not start; see its log")
            time.sleep(0.01)
        return self

    def stop(self, timeout_s: float = 15.0) -> None:
        """Stop now: requests still running are cut (use :meth:`shutdown` for a drain)."""
        self.server.should_exit = True
        self._join(timeout_s)

    def shutdown(self, timeout_s: float = 60.0) -> None:
        """What SIGTERM does to ``python -m servelab.server``: refuse new requests, give
        those in flight the app's ``shutdown_grace_s``, end the rest, stop."""
        if self.thread.is_alive():
            self.server.begin_shutdown()
        self._join(timeout_s)

    def _join(self, timeout_s: float) -> None:
        self.thread.join(timeout_s)
        try:
            self.sock.close()
        except OSError:
            pass
        if self.thread.is_alive():
            raise RuntimeError(f"the server thread did not stop within {timeout_s} s")

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


class ServerProcess:
    """A server running as a child process (see :func:`launch`)."""

    def __init__(self, proc: subprocess.Popen, host: str, port: int, log_path: Path):
        self.proc, self.host, self.port, self.log_path = proc, host, port, log_path

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        try:
            return self.log_path.read_text()
        except OSError:
            return ""

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM (graceful: in-flight requests finish within the grace), then wait; kill if
        it hangs. Exit code (1: the engine core had died)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def launch(model: str | Path = DEFAULT_MODEL, *, host: str = "127.0.0.1", port: int = 0,
           args: list[str] | tuple = (), timeout_s: float = 120.0, env: dict | None = None) -> ServerProcess:
    """Start ``python -m servelab.server`` in the background and wait until /health answers."""
    workdir = Path(tempfile.mkdtemp(prefix="servelab-server-"))
    port_file, log_path = workdir / "port", workdir / "server.log"
    cmd = [sys.executable, "-m", "servelab.server", "--model", str(model), "--host", host,
           "--port", str(port), "--port-file", str(port_file), *map(str, args)]
    full_env = dict(os.environ)
    full_env.setdefault("OMP_NUM_THREADS", "1")
    full_env.setdefault("MKL_NUM_THREADS", "1")
    full_env.update(env or {})
    logf = open(log_path, "w")
    proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=full_env)
    logf.close()
    deadline = time.monotonic() + timeout_s
    server = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with code {proc.returncode}:\n{log_path.read_text()}")
        if server is None and port_file.exists() and port_file.read_text().strip():
            server = ServerProcess(proc, host, int(port_file.read_text()), log_path)
        if server is not None:
            try:
                with urllib.request.urlopen(server.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return server
            except OSError:
                pass
        time.sleep(0.1)
    proc.kill()
    proc.wait(10)
    raise RuntimeError(f"the server did not answer /health within {timeout_s} s:\n{log_path.read_text()}")


# ------------------------------------------------------------------- the shell
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m servelab.server",
                                description="OpenAI-compatible streaming server over the servelab engine")
    p.add_argument("--model", default=DEFAULT_MODEL, help="checkpoint folder (config.json + safetensors)")
    p.add_argument("--served-model-name", default=None, help="the name clients send (default: folder name)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    p.add_argument("--port", type=int, default=8000, help="0 = any free port (see --port-file)")
    p.add_argument("--port-file", default=None, help="write the bound port here once listening")
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--kv-blocks", type=int, default=None, help="KV pool size in blocks (default: LLM's)")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--max-queued-requests", type=int, default=256, help="beyond the seats; more -> 429")
    p.add_argument("--max-body-bytes", type=int, default=1_000_000)
    p.add_argument("--shutdown-grace", type=float, default=5.0, help="seconds for in-flight requests on SIGTERM")
    p.add_argument("--threads", type=int, default=1, help="torch threads for the engine")
    p.add_argument("--dtype", default="float32", help="weights' dtype (float32, bfloat16, float64)")
    p.add_argument("--engine-process", action=argparse.BooleanOptionalAction, default=True,
                   help="run the engine core in its own process (default), or as a thread of this one")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tensor-parallel-size", type=int, default=1,
                   help="split the model over this many processes (vLLM's flag); under torchrun, rank 0 "
                        "serves HTTP and the other ranks serve as its workers")
    p.add_argument("--log-level", default="warning")
    return p


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    import torch
    import uvicorn

    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    from servelab.server.app import ServerSettings, create_app
    options = dict(max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                   num_kv_blocks=args.kv_blocks, block_size=args.block_size,
                   max_model_len=args.max_model_len, enable_prefix_caching=args.enable_prefix_caching,
                   enable_chunked_prefill=args.enable_chunked_prefill, seed=args.seed, dtype=args.dtype)
    if args.tensor_parallel_size != 1:
        options["tensor_parallel_size"] = args.tensor_parallel_size
        from servelab.engine.executor import under_torchrun
        if under_torchrun() and int(os.environ["RANK"]) != 0:  # a torchrun worker rank: no HTTP here
            build_engine(args.model, **options)  # serves rank 0's engine until it shuts down, then exits
            return 0
    if args.engine_process:  # the engine core gets its own process (and interpreter lock)
        from servelab.server.client import EngineCoreClient
        torch.set_num_threads(1)
        engine = EngineCoreClient(args.model, threads=args.threads, **options)
    else:
        torch.set_num_threads(args.threads)
        engine = build_engine(args.model, **options)
    name = args.served_model_name or Path(args.model).name
    settings = ServerSettings(model_name=name, max_body_bytes=args.max_body_bytes,
                              max_queued_requests=args.max_queued_requests,
                              shutdown_grace_s=args.shutdown_grace)
    app = create_app(engine, settings)
    sock = _bound_socket(args.host, args.port)
    port = sock.getsockname()[1]
    # the drain has used the grace before uvicorn's own shutdown starts: what is left is
    # writing out the ended requests' last bytes
    config = uvicorn.Config(app, log_level=args.log_level, lifespan="on", access_log=False,
                            timeout_graceful_shutdown=2)
    server = _server(app, config)

    class _Announce(threading.Thread):
        def run(self):
            while not server.started and not server.should_exit:
                time.sleep(0.02)
            if server.started:
                print(json.dumps({"event": "listening", "url": f"http://{args.host}:{port}",
                                  "model": name}), flush=True)
                if args.port_file:
                    Path(args.port_file).write_text(str(port))

    _Announce(daemon=True).start()
    # uvicorn re-raises a signal that stopped it once it has shut down (a second signal
    # during the drain); by then everything is finished: that delivery should not kill us.
    signal.signal(signal.SIGTERM, lambda *a: None)
    signal.signal(signal.SIGINT, lambda *a: None)  # Ctrl-C: the same clean exit
    try:
        server.run(sockets=[sock])
    finally:
        if args.engine_process:
            engine.close()  # normally already gone: the app's shutdown stopped it
    return 1 if app.state.engine_lost else 0
