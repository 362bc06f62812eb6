"""``python -m servelab.server --tensor-parallel-size 2``: the one-process engine's text, no process left after."""
import json
import os
import time
import urllib.request

import pytest

from servelab.engine import LLM
from servelab.model import COURSE_MODELS_DIR
from servelab.sampling import SamplingParams

MAIN = COURSE_MODELS_DIR / "servelab-main"


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
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


def test_server_flag_splits_the_engine():
    if not (MAIN / "config.json").exists():
        pytest.skip("course model not trained")
    from servelab.server.runner import launch
    prompt, n = "def add(a, b):", 12
    want = LLM(MAIN, num_kv_blocks=64, max_model_len=256).generate(
        [prompt], SamplingParams(temperature=0, max_tokens=n))[0].outputs[0].text
    server = launch(MAIN, args=["--tensor-parallel-size", "2", "--kv-blocks", "64", "--max-model-len", "256"],
                    timeout_s=180)
    try:
        body = json.dumps({"model": "servelab-main", "prompt": prompt, "max_tokens": n,
                           "temperature": 0}).encode()
        req = urllib.request.Request(server.url + "/v1/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            got = json.loads(r.read())["choices"][0]["text"]
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
