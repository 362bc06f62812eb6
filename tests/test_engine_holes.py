"""The holes a review found in the engine, each pinned by a test that failed before the fix:
aborts from callbacks, during chunked prefill and of preempted requests; every request
finishes exactly once; invariants after every step; prefix-cache statistics; one key chain;
start-up checks of the context and the pool; KV roll-back for speculative decoding."""
import random

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from servelab.engine import EngineConfig, LLMEngine, ToyRunner, toy_greedy_generate
from servelab.paged import BlockTable
from servelab.prefix_cache import block_keys
from servelab.sampling import SamplingParams

VOCAB = 26


def greedy(n, **kw):
    return SamplingParams(temperature=0.0, max_tokens=n, **kw)


def make_engine(num_blocks=64, block_size=4, **kw):
    kw.setdefault("max_model_len", min(256, num_blocks * block_size))
    cfg = EngineConfig(block_size=block_size, num_kv_blocks=num_blocks, **kw)
    return LLMEngine(ToyRunner(num_blocks, block_size, VOCAB), cfg)


class Finishes:
    """Every finished output a driver can see: step() results and abort_request() returns."""

    def __init__(self, engine):
        self.engine, self.by_id = engine, {}

    def note(self, out):
        if out is not None and out.finished:
            self.by_id.setdefault(out.request_id, []).append(out)

    def step(self):
        outs = self.engine.step()
        for o in outs:
            self.note(o)
        return outs

    def abort(self, rid):
        out = self.engine.abort_request(rid)
        self.note(out)  # inside a step it returns None: the step reports it
        return out


def check_step_invariants(engine, plan):
    """Each block's refcount equals the tables holding it; no sequence scheduled twice;
    free + used = pool."""
    kv = engine.scheduler.kv
    kv.allocator.check_invariants()
    counts = [0] * kv.num_blocks
    live = list(engine.scheduler.running) + list(engine.scheduler.waiting)
    for seq in live:
        for b in seq.block_table.block_ids:
            counts[b] += 1
    assert counts == kv.allocator.ref_count
    ids = [id(s.seq) for s in plan.scheduled]
    assert len(ids) == len(set(ids)), "a sequence scheduled twice in one step"
    assert kv.allocator.num_free + kv.allocator.num_used == kv.num_blocks
    if kv.prefix_cache is not None:
        kv.prefix_cache.check_invariants()


def record_plans(engine):
    plans = []
    schedule = engine.scheduler.schedule

    def wrapped():
        plan = schedule()
        plans.append(plan)
        return plan
    engine.scheduler.schedule = wrapped
    return plans


# --------------------------------------------------------------------------- aborts

def test_callback_aborting_another_request_of_the_same_step():
    eng = make_engine()
    f = Finishes(eng)
    seen = {"a": [], "b": []}
    tokens_at_abort = {}

    def on_a(out):
        seen["a"].append(out)
        if len(out.token_ids) == 2 and "b" not in tokens_at_abort:
            f.abort("b")
            tokens_at_abort["b"] = list(seen["b"][-1].token_ids) if seen["b"] else []
    eng.add_request("a", [1, 2, 3], greedy(6), callback=on_a)
    eng.add_request("b", [4, 5, 6], greedy(6), callback=seen["b"].append)
    while eng.has_unfinished_requests():
        f.step()
    b_final = [o for o in seen["b"] if o.finished]
    assert len(b_final) == 1 and b_final[0].finish_reason == "abort"
    assert b_final[0].token_ids == tokens_at_abort["b"]  # no token after the abort
    assert [len(f.by_id[r]) for r in ("a", "b")] == [1, 1]
    eng.scheduler.kv.allocator.check_invariants()
    assert eng.scheduler.kv.allocator.num_used == 0


def test_abort_from_its_own_callback_is_reported_by_the_step():
    eng = make_engine()
    calls = []

    def on_token(out):
        calls.append(out)
        if len(out.token_ids) == 2 and not out.finished:
            eng.abort_request("a")
    eng.add_request("a", [1, 2, 3], greedy(8), callback=on_token)
    eng.add_request("b", [4, 5], greedy(4))
    final = eng.run_to_completion()  # sees only what step() returns
    assert final["a"].finish_reason == "abort" and len(final["a"].token_ids) == 2
    assert sum(o.finished for o in calls) == 1
    assert final["b"].token_ids == toy_greedy_generate([4, 5], 4, VOCAB)


def test_abort_from_a_callback_returns_none_and_its_step_reports_it_once():
    eng = make_engine()
    returned = []

    def on_token(out):
        if len(out.token_ids) == 2 and not out.finished and not returned:
            returned.append(eng.abort_request("a"))
    eng.add_request("a", [1, 2, 3], greedy(8), callback=on_token)
    finals = []
    while eng.has_unfinished_requests():
        finals += [o for o in eng.step() if o.finished]
    assert returned == [None]  # the step's result is the one report of the abort
    assert [(o.request_id, o.finish_reason) for o in finals] == [("a", "abort")]


def test_abort_during_chunked_prefill_frees_its_blocks():
    eng = make_engine(long_prefill_token_threshold=4)
    long_prompt = [i % VOCAB for i in range(20)]
    eng.add_request("long", long_prompt, greedy(3))
    eng.add_request("short", [1, 2], greedy(5))
    eng.step()
    seq = eng.requests["long"]
    assert 0 < seq.num_computed_tokens < len(long_prompt)  # mid-prefill
    out = eng.abort_request("long")
    assert out.finished and out.finish_reason == "abort" and out.token_ids == []
    assert eng.abort_request("long") is None  # only once
    final = eng.run_to_completion()
    assert set(final) == {"short"} and final["short"].token_ids == toy_greedy_generate([1, 2], 5, VOCAB)
    assert eng.scheduler.kv.allocator.num_used == 0


def test_abort_of_a_preempted_request():
    eng = make_engine(num_blocks=6, block_size=2, max_model_len=12)
    for i in range(3):
        eng.add_request(f"r{i}", [i + 1, i + 2], greedy(9))
    victim = None
    while eng.has_unfinished_requests() and victim is None:
        eng.step()
        victim = next((s for s in eng.scheduler.waiting if s.metrics.num_preemptions), None)
    assert victim is not None, "the pool should have forced a preemption"
    out = eng.abort_request(victim.request_id)
    assert out.finish_reason == "abort" and victim not in eng.scheduler.waiting
    final = eng.run_to_completion()
    assert victim.request_id not in final
    for rid, o in final.items():
        i = int(rid[1:])
        assert o.token_ids == toy_greedy_generate([i + 1, i + 2], 9, VOCAB)
    assert eng.scheduler.kv.allocator.num_used == 0 and eng.requests == {}


requests_st = st.lists(st.tuples(st.lists(st.integers(0, 3), min_size=1, max_size=12),
                                 st.integers(1, 8)), min_size=1, max_size=8)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reqs=requests_st, seed=st.integers(0, 10_000), num_blocks=st.sampled_from([8, 16, 64]),
       chunk=st.sampled_from([2, None]), prefix=st.booleans())
def test_every_request_finishes_exactly_once_and_invariants_hold_after_every_step(
        reqs, seed, num_blocks, chunk, prefix):
    rng = random.Random(seed)
    eng = make_engine(num_blocks=num_blocks, block_size=2, max_num_seqs=3,
                      long_prefill_token_threshold=chunk, enable_prefix_caching=prefix)
    f = Finishes(eng)
    plans = record_plans(eng)
    callback_finishes = {}

    def make_cb(rid):
        def cb(out):
            if out.finished:
                callback_finishes[out.request_id] = callback_finishes.get(out.request_id, 0) + 1
            elif rng.random() < 0.15:  # abort someone (maybe itself) from inside the step
                live = sorted(eng.requests)
                if live:
                    f.abort(rng.choice(live))
        return cb

    for i, (prompt, n) in enumerate(reqs):
        eng.add_request(str(i), prompt, greedy(n), callback=make_cb(str(i)))
    steps = 0
    while eng.has_unfinished_requests():
        f.step()
        check_step_invariants(eng, plans[-1])
        if rng.random() < 0.1 and eng.requests:  # abort from outside
            f.abort(rng.choice(sorted(eng.requests)))
        steps += 1
        assert steps < 2000
    assert {rid: len(v) for rid, v in f.by_id.items()} == {str(i): 1 for i in range(len(reqs))}
    assert callback_finishes == {str(i): 1 for i in range(len(reqs))}
    assert eng.scheduler.kv.allocator.num_used == 0 and eng.requests == {}


# --------------------------------------------------------------------------- prefix cache

def test_prefix_hit_statistics_count_once_per_admission():
    eng = make_engine(num_blocks=8, block_size=4, max_model_len=32)
    shared = [1, 2, 3, 4, 5, 6, 7, 8]
    eng.add_request("first", shared + [9], greedy(1))
    eng.run_to_completion()
    pc = eng.scheduler.kv.prefix_cache
    q0, h0 = pc.queries, pc.hits
    eng.add_request("busy", [20] * 21, greedy(3))            # 6 of the 8 blocks, for 3 steps
    eng.add_request("second", shared + [10], greedy(1))      # looked up every step while it waits
    steps = 0
    while "second" in eng.requests and eng.requests["second"].metrics.first_scheduled_time is None:
        eng.step()
        steps += 1
    assert steps >= 2, "second should have waited for memory"
    eng.run_to_completion()
    assert pc.hits - h0 == 2          # its two cached blocks, counted once
    assert pc.queries - q0 == 5 + 2   # cacheable blocks: 5 of busy's prompt, 2 of second's


def test_one_chain_of_block_keys_kept_across_preemption():
    eng = make_engine(num_blocks=6, block_size=2, max_model_len=12)
    for i in range(3):
        eng.add_request(f"r{i}", [i + 1, i + 2, i + 3], greedy(8))
    seqs = dict(eng.requests)
    while eng.has_unfinished_requests():
        eng.step()
        for seq in seqs.values():
            assert not hasattr(seq, "prefix_keys")
            keys = seq.block_table.keys
            assert keys == block_keys(seq.token_ids, 2)[:len(keys)]
    assert any(s.metrics.num_preemptions for s in seqs.values())


def test_block_table_counts_filled_slots_under_that_name():
    t = BlockTable(4)
    assert t.num_filled_slots == 0 and "num_filled_slots" in BlockTable.__dataclass_fields__


# --------------------------------------------------------------------------- roll-back hook

def test_truncate_rolls_back_tokens_and_blocks_and_unregisters_rolled_back_blocks():
    eng = make_engine(num_blocks=32, block_size=2)
    eng.add_request("r", [1, 2, 3], greedy(8))
    for _ in range(6):
        eng.step()
    seq = eng.requests["r"]
    sched, kv = eng.scheduler, eng.scheduler.kv
    n_before = seq.num_tokens
    registered_before = {b for b in seq.block_table.block_ids if b in kv.prefix_cache}
    sched.truncate(seq, 4)
    assert seq.num_tokens == 4 and n_before > 4
    assert seq.num_computed_tokens == 3 and len(seq.block_table.block_ids) == 2  # the 4th runs again
    assert kv.allocator.num_used == 2
    dropped = registered_before - set(seq.block_table.block_ids)
    assert dropped and not any(b in kv.prefix_cache for b in dropped)
    assert len(seq.block_table.keys) == 1  # only the one full block still computed
    with pytest.raises(ValueError, match="roll back"):
        sched.truncate(seq, 2)  # into the prompt
    # the sequence carries on from its rolled-back state: greedy, so the same tokens again
    assert eng.run_to_completion()["r"].token_ids == toy_greedy_generate([1, 2, 3], 8, VOCAB)


# --------------------------------------------------------------------------- outputs

def test_running_outputs_are_built_only_when_read_and_show_their_moment():
    from servelab.engine.sequence import LazyRequestOutput
    eng = make_engine()
    eng.add_request("r", [1, 2, 3], greedy(5, logprobs=1))
    per_step = []
    while eng.has_unfinished_requests():
        per_step += eng.step()
    running, final = per_step[:-1], per_step[-1]
    assert all(isinstance(o, LazyRequestOutput) and o._outputs is None for o in running)
    assert not isinstance(final, LazyRequestOutput) and final.finished
    for i, o in enumerate(running, start=1):  # read late: still what it held at its step
        assert o.token_ids == final.token_ids[:i] and len(o.outputs[0].logprobs) == i
        assert o.delta_token_ids == [final.token_ids[i - 1]] and not o.finished
    assert o == o and "LazyRequestOutput" in repr(o)
