"""``python -m servelab.server --tensor-parallel-size 2``, spawned or under torchrun: the one-process
engine's text, no process left after."""
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from servelab.engine import LLM
from servelab.model import COURSE_MODELS_DIR
from servelab.sampling import SamplingParams

MAIN = COURSE_MODELS_DIR / "servelab-main"


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (ppid := _ppid(int(entry))) is not None:
            children.setdefault(ppid, []).append(int(entry))
    out, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.add(c)
            todo.append(c)
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return not f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return False


PROMPT, N = "def add(a, b):", 12


@pytest.fixture(scope="module")
def want():
    if not (MAIN / "config.json").exists():
        pytest.skip("course model not trained")
    return LLM(MAIN, num_kv_blocks=64, max_model_len=256).generate(
        [PROMPT], SamplingParams(temperature=0, max_tokens=N))[0].outputs[0].text


def _complete(url: str) -> str:
    body = json.dumps({"model": "servelab-main", "prompt": PROMPT, "max_tokens": N, "temperature": 0}).encode()
    req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())["choices"][0]["text"]


def test_server_flag_splits_the_engine(want):
    from servelab.server.runner import launch
    server = launch(MAIN, args=["--tensor-parallel-size", "2", "--kv-blocks", "64", "--max-model-len", "256"],
                    timeout_s=180)
    try:
        got = _complete(server.url)
        family = _descendants(server.pid)
        assert len(family) >= 2          # the engine core and its worker (and the fork server)
    finally:
        code = server.stop()
    assert got == want
    assert code == 0, server.log()[-2000:]
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in family) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in family if _alive(p)]


def _rank(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
    except OSError:
        return None
    return env.get(b"RANK", b"").decode() or None


def test_server_under_torchrun_serves_from_rank_0_and_stops_cleanly(want, tmp_path):
    """The same command on every rank: rank 0 serves HTTP, rank 1 is its worker; SIGTERM to rank 0
    drains it, its worker follows, and torchrun exits 0 with nothing left running."""
    from servelab.parallel.launch import free_port
    port_file = tmp_path / "port"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "-m", "servelab.server",
           "--model", str(MAIN), "--tensor-parallel-size", "2", "--kv-blocks", "64", "--max-model-len", "256",
           "--port", "0", "--port-file", str(port_file)]
    launcher = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    family: set[int] = set()
    try:
        deadline = time.monotonic() + 180
        while not (port_file.exists() and port_file.read_text()) and time.monotonic() < deadline:
            assert launcher.poll() is None, launcher.stdout.read()[-3000:]
            time.sleep(0.2)
        got = _complete(f"http://127.0.0.1:{port_file.read_text()}")
        family = _descendants(launcher.pid)
        ranks = {p: _rank(p) for p in family}
        # the rank-0 server is torchrun's own child (its engine core, a grandchild, has RANK=0 too)
        rank0 = [p for p, r in ranks.items() if r == "0" and _ppid(p) == launcher.pid]
        assert "1" in ranks.values() and len(rank0) == 1, ranks
        os.kill(rank0[0], signal.SIGTERM)
        code = launcher.wait(timeout=60)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert got == want
    assert code == 0, launcher.stdout.read()[-3000:]
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in family) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in family if _alive(p)]
