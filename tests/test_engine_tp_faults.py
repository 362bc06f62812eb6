"""A split engine fails loudly and cleanly: a dead or hung worker ends every request with a
clear error within a bounded time, nothing is left running, and start-up refuses what cannot work."""
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from servelab.engine import LLM, EngineDeadError
from servelab.model import LlamaConfig, LlamaModel, save_pretrained
from servelab.sampling import SamplingParams

SETTINGS = dict(num_kv_blocks=16, max_model_len=128, skip_tokenizer_init=True)
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    return save_pretrained(LlamaModel(cfg).init_weights(seed=0), tmp_path_factory.mktemp("tiny") / "m")


def _gone(pid: int, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:  # a zombie has exited: it only waits to be reaped
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(") ")[-1].startswith("Z"):
                    return True
        except OSError:
            return True
        time.sleep(0.05)
    return False


def test_a_killed_worker_fails_its_requests_and_leaves_no_process(tiny):
    llm = LLM(tiny, tensor_parallel_size=2, tensor_parallel_timeout_s=5, **SETTINGS)
    try:
        assert llm.generate([[1, 2, 3]], GREEDY)[0].outputs[0].finish_reason == "length"
        engine, (pid,) = llm.engine, llm.engine.runner.worker_pids
        engine.add_request("a", [4, 5, 6], GREEDY)
        engine.add_request("b", [7, 8], GREEDY)
        engine.step()
        os.kill(pid, signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(EngineDeadError, match=r"worker rank 1 \(pid \d+\) was killed by SIGKILL"):
            engine.step()
        assert time.monotonic() - t0 < 30  # bounded (no hang); generous for a busy machine
        assert engine.errored
        with pytest.raises(EngineDeadError):  # and it stays dead
            engine.step()
        assert _gone(pid)
    finally:
        llm.shutdown()


def test_a_hung_worker_is_declared_dead_after_the_timeout(tiny):
    llm = LLM(tiny, tensor_parallel_size=2, tensor_parallel_timeout_s=2, **SETTINGS)
    (pid,) = llm.engine.runner.worker_pids
    try:
        os.kill(pid, signal.SIGSTOP)
        t0 = time.monotonic()
        # the hung rank named, with how far it got and what its process is doing
        with pytest.raises(EngineDeadError, match=r"worker rank 1 \(pid \d+\) did not answer within "
                                                  r"timeout_s=2 s: it had taken 0 of the 1 messages rank 0 "
                                                  r"sent, and its process is stopped"):
            llm.generate([[1, 2, 3]], GREEDY)
        assert time.monotonic() - t0 < 30  # timeout_s=2 plus slack: bounded, not a speed check
        assert _gone(pid)  # killed, stopped or not
    finally:
        llm.shutdown()


def test_start_up_refuses_what_cannot_work(tiny):
    before = set(multiprocessing.active_children())
    with pytest.raises(ValueError, match=r"tensor_parallel_size=3 .*num_attention_heads=4.*Sizes that work for it: 1, 2, 4"):
        LLM(tiny, tensor_parallel_size=3, **SETTINGS)
    with pytest.raises(ValueError, match="quantization"):
        LLM(tiny, tensor_parallel_size=2, quantization="int8", **SETTINGS)
    with pytest.raises(ValueError, match="speculative decoding"):
        LLM(tiny, tensor_parallel_size=2, speculative_config={"method": "ngram"}, **SETTINGS)
    with pytest.raises(ValueError, match="enforce_eager"):
        LLM(tiny, tensor_parallel_size=2, enforce_eager=False, **SETTINGS)
    assert set(multiprocessing.active_children()) == before  # refused before any process started


def test_workers_die_with_the_engine_process(tiny, tmp_path):
    """rank 0 killed outright (no shutdown, no atexit): its workers follow it."""
    script = tmp_path / "rank0.py"
    script.write_text(textwrap.dedent(f"""
        import os, sys
        from servelab.engine import LLM
        if __name__ == "__main__":
            llm = LLM({str(tiny)!r}, tensor_parallel_size=2, num_kv_blocks=16, max_model_len=128,
                      skip_tokenizer_init=True)
            print(*llm.engine.runner.worker_pids, flush=True)
            os.kill(os.getpid(), 9)
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    pids = [int(p) for p in out.stdout.split()]
    assert pids, out.stderr[-2000:]
    assert all(_gone(p) for p in pids)
