"""The engine split over processes (``tensor_parallel_size``) gives the one-process engine's tokens.

One workload runs everywhere: prompts sharing a prefix (prefix-cache hits), a
long prompt cut into chunks (chunked prefill) and a pool too small for all of
them at once (preemption). Greedy tokens must equal the single-process engine's
at N = 2 and N = 4 on the course model and on a tiny checkpoint with fewer K/V
heads than processes; seeded sampling too (the sampler runs on rank 0 only).
Each engine is built once per module and shut down at its end.
"""
import pytest
import torch

from servelab.engine import LLM
from servelab.model import COURSE_MODELS_DIR, LlamaConfig, LlamaModel, load_config, save_pretrained
from servelab.sampling import SamplingParams

MAIN = COURSE_MODELS_DIR / "servelab-main"
SETTINGS = dict(block_size=16, num_kv_blocks=20, max_num_seqs=6, max_num_batched_tokens=64,
                long_prefill_token_threshold=32, max_model_len=256, skip_tokenizer_init=True)


def _workload(vocab: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    shared = torch.randint(0, vocab, (40,), generator=g).tolist()
    prompts = [shared + torch.randint(0, vocab, (6,), generator=g).tolist() for _ in range(5)]
    prompts.append(torch.randint(0, vocab, (130,), generator=g).tolist())  # chunked: 130 > 32 per step
    return prompts


GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
SEEDED = [SamplingParams(temperature=0.9, top_p=0.95, seed=100 + i, max_tokens=6, ignore_eos=True)
          for i in range(3)]


def _run(llm, prompts):
    greedy = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]
    seeded = [o.outputs[0].token_ids for o in llm.generate(prompts[:3], SEEDED)]
    log = llm.engine.step_log
    kv = llm.engine.scheduler.kv
    return {"greedy": greedy, "seeded": seeded,
            "preempted": sum(s.num_preempted for s in log),
            "chunked": any(s.num_prefill_tokens == 32 for s in log),
            "prefix_hits": kv.prefix_cache.hits if kv.prefix_cache is not None else 0}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A checkpoint with 2 K/V heads: at 4 ranks each holds a copy of the one its heads read."""
    cfg = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=256)
    model = LlamaModel(cfg).init_weights(std=0.15, seed=3).eval()
    return save_pretrained(model, tmp_path_factory.mktemp("tiny-gqa") / "model")


@pytest.fixture(scope="module")
def main_reference():
    if not (MAIN / "config.json").exists():
        pytest.skip("course model not trained")
    llm = LLM(MAIN, **SETTINGS)
    return _run(llm, _workload(llm.engine.runner.vocab_size))


def _split(path, n):
    llm = LLM(path, tensor_parallel_size=n, **SETTINGS)
    try:
        res = _run(llm, _workload(llm.engine.runner.vocab_size))
        ex = llm.engine.runner
        res["kv_bytes"], res["kv_heads"] = ex.kv_pool_bytes_per_rank, ex.kv_heads_per_rank
        res["weight_bytes"] = ex.weight_bytes_per_rank
        res["pids"] = ex.worker_pids
    finally:
        llm.shutdown()
    res["alive"] = [p.is_alive() for p in ex.procs]
    return res


def _kv_bytes(cfg, kv_heads: int) -> int:
    s = SETTINGS
    return cfg.num_hidden_layers * s["num_kv_blocks"] * s["block_size"] * 2 * kv_heads * cfg.head_dim * 4


def test_the_workload_exercises_prefix_hits_chunks_and_preemption(main_reference):
    assert main_reference["prefix_hits"] > 0
    assert main_reference["chunked"]
    assert main_reference["preempted"] > 0


@pytest.mark.parametrize("n", [2, 4])
def test_course_model_split_gives_the_same_tokens(main_reference, n):
    got = _split(MAIN, n)
    assert got["greedy"] == main_reference["greedy"]
    assert got["seeded"] == main_reference["seeded"]
    assert got["preempted"] == main_reference["preempted"] and got["prefix_hits"] == main_reference["prefix_hits"]
    cfg = load_config(MAIN)
    share = cfg.num_key_value_heads // n
    assert got["kv_heads"] == [share] * n
    assert got["kv_bytes"] == [_kv_bytes(cfg, share)] * n          # the shard's share of the pool
    assert sum(got["kv_bytes"]) == _kv_bytes(cfg, cfg.num_key_value_heads)
    assert not any(got["alive"])                                  # shutdown left no worker


def test_fewer_kv_heads_than_ranks(tiny):
    ref = LLM(tiny, **SETTINGS)
    want = _run(ref, _workload(97))
    got = _split(tiny, 4)
    assert got["greedy"] == want["greedy"]
    assert got["seeded"] == want["seeded"]
    cfg = load_config(tiny)
    assert got["kv_heads"] == [1, 1, 1, 1]                         # 2 K/V heads, each copied on 2 ranks
    assert got["kv_bytes"] == [_kv_bytes(cfg, 1)] * 4


def test_a_split_llama_model_object_works_too(tiny):
    from servelab.model import load_pretrained
    model = load_pretrained(tiny)
    want = [o.outputs[0].token_ids for o in LLM(model, **SETTINGS).generate([[1, 2, 3, 4]], GREEDY)]
    llm = LLM(model, tensor_parallel_size=2, **SETTINGS)
    try:
        ex = llm.engine.runner
        ex.record_collectives(True)
        assert [o.outputs[0].token_ids for o in llm.generate([[1, 2, 3, 4]], GREEDY)] == want
        logs = ex.collective_logs()  # every rank's calls, in the same order
        assert len(logs) == 2 and len(logs[0]) == len(logs[1]) == 10 * 5  # 2 layers x 2 + the head, per step
        assert [c[0] for c in logs[0][:5]] == ["all_reduce"] * 4 + ["gather"]
        assert [(c[0], c[2]) for c in logs[0]] == [(c[0], c[2]) for c in logs[1]]
        rows = ex.probe_all_reduce([1024, 4096], repeats=2, burst_s=1e-4)
        assert [r["bytes"] for r in rows] == [1024, 4096] and all(r["median_s"] > 0 for r in rows)
        assert len(ex.rank_comm_seconds()) == 2
    finally:
        llm.shutdown()
