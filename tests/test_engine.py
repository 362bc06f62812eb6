"""Engine tests with the model-free ToyRunner: scheduling, paging, prefix reuse,
chunking, preemption, stops, aborts, admission errors, streaming, static baseline.

The ToyRunner reads each sequence's context back through its block table, so any
mix-up of slots changes the output; the expected output is greedy decoding of
the toy model on the true token list (``toy_greedy_generate``).
"""
import random

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from servelab.engine import (EngineConfig, LLMEngine, StaticBatchEngine, ToyRunner,
                             toy_greedy_generate)
from servelab.engine.detokenizer import IncrementalDetokenizer
from servelab.sampling import SamplingParams

VOCAB = 26


def greedy(max_tokens, **kw):
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, **kw)


def make_engine(num_blocks=64, block_size=4, cls=LLMEngine, tokenizer=None, eos=(), **kw):
    kw.setdefault("max_model_len", 256)
    cfg = EngineConfig(block_size=block_size, num_kv_blocks=num_blocks, **kw)
    return cls(ToyRunner(num_blocks, block_size, VOCAB), cfg, tokenizer=tokenizer, eos_token_ids=eos)


class CharTokenizer:
    """a..z <-> 0..25, one character per token."""

    def encode(self, text):
        return [ord(c) - 97 for c in text]

    def decode(self, ids):
        return "".join(chr(97 + i) for i in ids)


def check_clean(engine):
    """Nothing left behind: every block back on the free list, no request pending."""
    kv = engine.scheduler.kv
    kv.allocator.check_invariants()
    assert kv.allocator.num_used == 0
    assert not engine.has_unfinished_requests()
    assert engine.requests == {}


# --------------------------------------------------------------------------- correctness

workload = st.lists(st.tuples(st.lists(st.integers(0, 2), min_size=1, max_size=30),
                              st.integers(1, 20)), min_size=1, max_size=10)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.large_base_example])
@given(reqs=workload,
       num_blocks=st.sampled_from([12, 24, 200]),
       block_size=st.sampled_from([1, 4, 16]),
       chunk=st.sampled_from([1, 7, 64, None]),
       prefix=st.booleans(),
       max_num_seqs=st.integers(1, 6),
       budget=st.sampled_from([8, 32, 512]),
       chunked=st.booleans(),
       arrival_seed=st.integers(0, 2**16))
def test_any_configuration_gives_the_reference_tokens(reqs, num_blocks, block_size, chunk, prefix,
                                                      max_num_seqs, budget, chunked, arrival_seed):
    arrivals = random.Random(arrival_seed)
    if not chunked:
        budget = max(budget, 32)  # without chunking every prompt (up to 30 tokens) must fit a step
    if (num_blocks * block_size) < 50:
        num_blocks = -(-50 // block_size)  # room for the longest prompt (30) plus output (20)
    eng = make_engine(num_blocks, block_size, max_num_seqs=max_num_seqs, max_num_batched_tokens=budget,
                      long_prefill_token_threshold=chunk, enable_prefix_caching=prefix,
                      enable_chunked_prefill=chunked)
    pending = list(enumerate(reqs))
    arrivals.shuffle(pending)
    final = {}
    while pending or eng.has_unfinished_requests():
        for _ in range(arrivals.randint(0, 2)):  # requests arrive while others run
            if pending:
                i, (prompt, n) = pending.pop()
                eng.add_request(str(i), prompt, greedy(n))
        for out in eng.step():
            if out.finished:
                final[out.request_id] = out
    for i, (prompt, n) in enumerate(reqs):
        out = final[str(i)]
        assert out.token_ids == toy_greedy_generate(prompt, n, VOCAB)
        assert out.finish_reason == "length"
    for s in eng.step_log:
        assert s.num_batched_tokens <= budget and s.num_seqs <= max_num_seqs
    check_clean(eng)


def test_tiny_pool_forces_preemption_and_output_is_unchanged():
    rng = random.Random(1)
    reqs = [([rng.randrange(VOCAB) for _ in range(rng.randint(4, 12))], rng.randint(10, 30))
            for _ in range(8)]
    eng = make_engine(num_blocks=12, block_size=4, max_num_seqs=8)
    for i, (p, n) in enumerate(reqs):
        eng.add_request(str(i), p, greedy(n))
    final = eng.run_to_completion()
    assert eng.scheduler.num_preemptions > 0
    assert sum(out.metrics.num_preemptions for out in final.values()) == eng.scheduler.num_preemptions
    for i, (p, n) in enumerate(reqs):
        assert final[str(i)].token_ids == toy_greedy_generate(p, n, VOCAB)
    check_clean(eng)


def test_newest_running_sequence_is_preempted_first():
    eng = make_engine(num_blocks=6, block_size=2, max_num_seqs=3)
    for i in range(3):
        eng.add_request(str(i), [i, i, i], greedy(20))
    eng.step()
    running = [s.request_id for s in eng.scheduler.running]
    assert running == ["0", "1", "2"]
    while not eng.scheduler.waiting:
        eng.step()
    assert eng.scheduler.waiting[0].request_id == "2"  # the newest lost its seat, and is next in line
    eng.run_to_completion()
    check_clean(eng)


def test_running_sequences_are_served_before_waiting_ones():
    eng = make_engine(num_blocks=100, max_num_seqs=4, max_num_batched_tokens=10)
    eng.add_request("old", [1, 2, 3], greedy(5))
    eng.step()
    eng.add_request("new", list(range(20)), greedy(5))
    eng.step()
    step = eng.runner.steps[-1]
    assert step.query_lens == [1, 9]  # the decode first, then a 9-token chunk of the new prompt
    eng.run_to_completion()


def test_chunked_prefill_mixes_with_decodes():
    eng = make_engine(num_blocks=100, max_num_seqs=4, long_prefill_token_threshold=8)
    eng.add_request("a", [1, 2], greedy(12))
    eng.step()
    eng.add_request("b", [3] * 30, greedy(3))
    eng.step()
    assert eng.runner.steps[-1].query_lens == [1, 8]
    final = eng.run_to_completion()
    assert final["b"].token_ids == toy_greedy_generate([3] * 30, 3, VOCAB)


def test_without_chunking_a_prompt_waits_for_a_step_with_room():
    eng = make_engine(num_blocks=100, max_num_seqs=4, max_num_batched_tokens=12,
                      enable_chunked_prefill=False)
    eng.add_request("a", [1] * 5, greedy(4))
    eng.add_request("b", [2] * 10, greedy(4))
    eng.step()
    assert eng.runner.steps[-1].query_lens == [5]  # b does not fit beside a's prompt
    eng.step()
    assert eng.runner.steps[-1].query_lens == [1, 10]
    eng.run_to_completion()


def test_prefix_hit_skips_the_shared_blocks():
    eng = make_engine(num_blocks=100, block_size=4)
    system = [5] * 16
    eng.add_request("first", system + [1, 2], greedy(3))
    eng.run_to_completion()
    eng.add_request("second", system + [3, 4], greedy(3))
    final = eng.run_to_completion()
    assert final["second"].metrics.num_cached_tokens == 16
    assert eng.runner.steps[-3].query_lens == [2]  # only the new tokens computed
    assert final["second"].token_ids == toy_greedy_generate(system + [3, 4], 3, VOCAB)
    # an exact repeat still computes its last block: one position must be sampled from
    eng.add_request("repeat", system, greedy(2))
    final = eng.run_to_completion()
    assert final["repeat"].metrics.num_cached_tokens == 12
    assert final["repeat"].token_ids == toy_greedy_generate(system, 2, VOCAB)


def test_cache_salt_isolates_tenants():
    eng = make_engine(num_blocks=100, block_size=4)
    eng.add_request("a", [7] * 12, greedy(1), cache_salt="tenant-a")
    eng.run_to_completion()
    eng.add_request("b", [7] * 12, greedy(1), cache_salt="tenant-b")
    eng.add_request("c", [7] * 12, greedy(1), cache_salt="tenant-a")
    final = eng.run_to_completion()
    assert final["b"].metrics.num_cached_tokens == 0
    assert final["c"].metrics.num_cached_tokens == 8


# --------------------------------------------------------------------------- sampling

def test_seeded_sampling_ignores_batch_composition():
    prompt = [1, 2, 3]
    params = SamplingParams(temperature=1.0, top_p=0.9, top_k=10, seed=1234, max_tokens=12)

    def run(others):
        eng = make_engine(num_blocks=200, max_num_seqs=8)
        for j in range(others):
            eng.add_request(f"x{j}", [j % VOCAB] * (j + 1), SamplingParams(temperature=1.0, max_tokens=15))
        eng.add_request("me", prompt, params)
        return eng.run_to_completion()["me"].token_ids

    alone = run(0)
    assert run(3) == alone and run(7) == alone
    different_seed = make_engine(num_blocks=200)
    different_seed.add_request("me", prompt, SamplingParams(temperature=1.0, seed=99, max_tokens=12))
    assert different_seed.run_to_completion()["me"].token_ids != alone


# --------------------------------------------------------------------------- stops, aborts

def test_end_token_stops_and_is_not_in_the_text():
    ref = toy_greedy_generate([1, 2, 3], 10, VOCAB)
    eos = ref[3]
    eng = make_engine(tokenizer=CharTokenizer(), eos=[eos])
    eng.add_request("a", [1, 2, 3], greedy(10))
    out = eng.run_to_completion()["a"]
    stop_at = ref.index(eos)
    assert out.finish_reason == "stop" and out.outputs[0].stop_reason is None
    assert out.token_ids == ref[:stop_at + 1]
    assert out.text == CharTokenizer().decode(ref[:stop_at])
    eng.add_request("b", [1, 2, 3], greedy(10, ignore_eos=True))
    assert eng.run_to_completion()["b"].token_ids == ref


def test_stop_token_ids_and_max_tokens():
    ref = toy_greedy_generate([4, 4], 12, VOCAB)
    eng = make_engine()
    eng.add_request("a", [4, 4], greedy(12, stop_token_ids=[ref[5]]))
    eng.add_request("b", [4, 4], greedy(3))
    final = eng.run_to_completion()
    k = ref.index(ref[5])
    assert final["a"].finish_reason == "stop" and final["a"].outputs[0].stop_reason == ref[5]
    assert final["a"].token_ids == ref[:k + 1]
    assert final["b"].finish_reason == "length" and final["b"].token_ids == ref[:3]


def test_stop_string_truncates_and_is_never_streamed():
    tok = CharTokenizer()
    prompt = [0, 1, 2]
    full = tok.decode(toy_greedy_generate(prompt, 30, VOCAB))
    stop = full[10:13]
    cut = full.index(stop)
    deltas = []
    eng = make_engine(tokenizer=tok)
    eng.add_request("a", tok.decode(prompt), greedy(30, stop=[stop, "zzzzzzzz"]),
                    callback=lambda o: deltas.append(o.delta_text))
    out = eng.run_to_completion()["a"]
    assert out.finish_reason == "stop" and out.outputs[0].stop_reason == stop
    assert out.text == full[:cut]
    assert "".join(deltas) == out.text  # no partial stop string ever left the engine


def test_streaming_callback_sees_every_token_in_order():
    tok = CharTokenizer()
    seen = []
    eng = make_engine(tokenizer=tok)
    eng.add_request("a", "abc", greedy(9), callback=seen.append)
    out = eng.run_to_completion()["a"]
    assert [t for o in seen for t in o.delta_token_ids] == out.token_ids
    assert "".join(o.delta_text for o in seen) == out.text
    assert [o.finished for o in seen] == [False] * 8 + [True]
    m = out.metrics
    assert len(m.token_times) == 9 and m.first_token_time == m.token_times[0]
    assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time <= m.finished_time
    assert all(b >= a for a, b in zip(m.token_times, m.token_times[1:]))
    assert m.ttft >= 0 and len(m.inter_token_latencies) == 8


def test_abort_frees_blocks_and_others_finish():
    eng = make_engine(num_blocks=40)
    eng.add_request("a", [1] * 10, greedy(20))
    eng.add_request("b", [2] * 10, greedy(20))
    eng.add_request("c", [3] * 10, greedy(20))
    for _ in range(3):
        eng.step()
    out = eng.abort_request("b")
    assert out.finished and out.finish_reason == "abort" and len(out.token_ids) == 3
    assert eng.abort_request("b") is None and eng.abort_request("nope") is None
    out = eng.abort_request("c")
    final = eng.run_to_completion()
    assert set(final) == {"a"} and final["a"].token_ids == toy_greedy_generate([1] * 10, 20, VOCAB)
    check_clean(eng)


def test_abort_a_waiting_request():
    eng = make_engine(max_num_seqs=1)
    eng.add_request("a", [1], greedy(5))
    eng.add_request("b", [2], greedy(5))
    eng.step()
    assert eng.abort_request("b").finish_reason == "abort"
    assert set(eng.run_to_completion()) == {"a"}
    check_clean(eng)


# --------------------------------------------------------------------------- admission

@pytest.mark.parametrize("prompt, message", [
    ([], "empty"),
    ([1] * 300, "context"),
    ([1] * 100, "KV pool"),
    ([99], "vocabulary"),
])
def test_bad_requests_are_rejected_alone(prompt, message):
    eng = make_engine(num_blocks=20, block_size=4, max_model_len=256)
    eng.add_request("ok", [1, 2], greedy(4))
    with pytest.raises(ValueError, match=message):
        eng.add_request("bad", prompt, greedy(4))
    final = eng.run_to_completion()
    assert set(final) == {"ok"} and final["ok"].finish_reason == "length"
    check_clean(eng)


def test_duplicate_ids_and_budget_without_chunking_are_rejected():
    eng = make_engine(max_num_batched_tokens=8, enable_chunked_prefill=False)
    eng.add_request("a", [1], greedy(2))
    with pytest.raises(ValueError, match="already in use"):
        eng.add_request("a", [1], greedy(2))
    with pytest.raises(ValueError, match="chunked prefill"):
        eng.add_request("b", [1] * 9, greedy(2))
    with pytest.raises(ValueError, match="token ids"):
        eng.add_request("c", "text", greedy(2))
    with pytest.raises(ValueError, match="tokenizer"):
        eng.add_request("d", [1], greedy(2, stop=["x"]))


def test_output_is_capped_by_the_context_and_by_the_pool():
    eng = make_engine(num_blocks=100, max_model_len=20)
    eng.add_request("a", [1] * 15, greedy(50))
    out = eng.run_to_completion()["a"]
    assert out.finish_reason == "length" and len(out.token_ids) == 5
    eng = make_engine(num_blocks=4, block_size=4, max_model_len=256)  # the pool holds 16 tokens
    eng.add_request("a", [1] * 10, greedy(50))
    eng.add_request("b", [2] * 3, greedy(50))
    final = eng.run_to_completion()
    assert len(final["a"].token_ids) == 6 and len(final["b"].token_ids) == 13
    assert final["a"].token_ids == toy_greedy_generate([1] * 10, 6, VOCAB)
    check_clean(eng)


# --------------------------------------------------------------------------- detokenizer

class ByteTokenizer:
    def decode(self, ids):
        return bytes(ids).decode("utf-8", errors="replace")


def test_incremental_detokenizer_never_emits_half_characters():
    text = "héllo wörld 🙂 ünïcode ✓"
    d = IncrementalDetokenizer(ByteTokenizer())
    deltas = [d.add(b) for b in text.encode()]
    assert "\ufffd" not in "".join(deltas)
    assert "".join(deltas) + d.flush() == text == d.text


# --------------------------------------------------------------------------- static baseline

def test_static_batching_gives_the_same_tokens_in_more_steps():
    rng = random.Random(3)
    reqs = [([rng.randrange(VOCAB) for _ in range(rng.randint(1, 10))], rng.choice([2, 3, 40]))
            for _ in range(8)]
    outs = {}
    for cls in (LLMEngine, StaticBatchEngine):
        eng = make_engine(num_blocks=200, max_num_seqs=4, cls=cls)
        for i, (p, n) in enumerate(reqs):
            eng.add_request(str(i), p, greedy(n))
        outs[cls] = (eng.run_to_completion(), eng)
    cont, cont_eng = outs[LLMEngine]
    stat, stat_eng = outs[StaticBatchEngine]
    for i, (p, n) in enumerate(reqs):
        assert stat[str(i)].token_ids == cont[str(i)].token_ids == toy_greedy_generate(p, n, VOCAB)
    assert stat_eng.num_steps > cont_eng.num_steps
    assert stat_eng.scheduler.num_padding_tokens > 0
    assert stat_eng.scheduler.num_prompt_padding_tokens > 0  # short prompts were padded, answers unchanged
    # every wave is full width until its longest member is done
    assert all(s.num_seqs == 4 for s in stat_eng.step_log)
    assert stat_eng.scheduler.kv.allocator.num_used == 0


def test_static_waves_shrink_to_fit_the_pool():
    reqs = [([i % VOCAB] * 10, 30) for i in range(6)]
    eng = make_engine(num_blocks=30, block_size=4, max_num_seqs=6, cls=StaticBatchEngine)
    for i, (p, n) in enumerate(reqs):
        eng.add_request(str(i), p, greedy(n))
    final = eng.run_to_completion()
    # each member reserves 10 + 30 = 40 slots = 10 blocks, so only 3 fit at once
    assert max(s.num_seqs for s in eng.step_log) == 3
    assert all(final[str(i)].token_ids == toy_greedy_generate(p, n, VOCAB) for i, (p, n) in enumerate(reqs))


def test_step_log_counts_prefill_and_decode_rows():
    eng = make_engine(num_blocks=100, max_num_seqs=4)
    eng.add_request("a", [1] * 6, greedy(3))
    eng.step()
    eng.add_request("b", [2] * 5, greedy(3))
    eng.step()
    first, second = eng.step_log
    assert (first.num_prefill_tokens, first.num_decodes) == (6, 0)
    assert (second.num_prefill_tokens, second.num_decodes, second.num_batched_tokens) == (5, 1, 6)


def test_preempted_sequence_longer_than_the_budget_still_resumes_without_chunking():
    # budget 12 admits 10-token prompts whole; after 10 outputs a preempted sequence holds
    # 20 tokens, more than one step's budget: its recompute must still be scheduled.
    reqs = [([i + 1] * 10, 25) for i in range(3)]
    eng = make_engine(num_blocks=16, block_size=4, max_num_seqs=3, max_num_batched_tokens=12,
                      enable_chunked_prefill=False)
    for i, (p, n) in enumerate(reqs):
        eng.add_request(str(i), p, greedy(n))
    final = eng.run_to_completion()
    assert eng.scheduler.num_preemptions > 0
    assert all(final[str(i)].token_ids == toy_greedy_generate(p, n, VOCAB) for i, (p, n) in enumerate(reqs))
    check_clean(eng)
