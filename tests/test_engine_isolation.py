"""Per-request error isolation in ``LLMEngine.step``: a request whose sampling
raises (NaN logits in its row, a setting the sampler cannot handle, a broken
streaming callback) ends with ``finish_reason == "error"`` and a message; every
other request of the same step keeps decoding exactly as it would have, and
every block comes back. Model-free (ToyRunner)."""
import servelab.sampling as sampling
from servelab.engine import EngineConfig, LLMEngine, ToyRunner, toy_greedy_generate
from servelab.sampling import SamplingParams

VOCAB = 26


def make_engine(num_blocks=64, block_size=4):
    cfg = EngineConfig(block_size=block_size, num_kv_blocks=num_blocks, max_model_len=128)
    return LLMEngine(ToyRunner(num_blocks, block_size, VOCAB), cfg)


def clean(engine):
    kv = engine.scheduler.kv
    kv.allocator.check_invariants()
    return kv.allocator.num_used == 0 and not engine.has_unfinished_requests() and engine.requests == {}


PROMPTS = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [2, 2]]


def test_nan_logits_in_one_row_fail_that_request_only():
    eng = make_engine()
    real_schedule, real_execute = eng.scheduler.schedule, eng.runner.execute
    plans, hit = [], []

    def schedule():
        plans.append(real_schedule())
        return plans[-1]

    def execute(step):  # from the third step on, the "bad" request's row of logits is NaN
        logits = real_execute(step)
        rows = [s.seq.request_id for s in plans[-1].scheduled if s.num_logits]
        if eng.num_steps >= 2 and "bad" in rows:
            logits = logits.clone()
            logits[rows.index("bad")] = float("nan")
            hit.append(eng.num_steps)
        return logits

    eng.scheduler.schedule, eng.runner.execute = schedule, execute
    for i, p in enumerate(PROMPTS):
        eng.add_request("bad" if i == 1 else f"r{i}", p, SamplingParams(temperature=0, max_tokens=8))
    final = eng.run_to_completion()
    assert hit == [2]  # it failed in the first step its row was NaN, and only then
    assert final["bad"].finish_reason == "error" and "NaN" in final["bad"].error
    assert len(final["bad"].token_ids) == 2
    for i, p in enumerate(PROMPTS):
        if i != 1:
            assert final[f"r{i}"].finish_reason == "length"
            assert final[f"r{i}"].token_ids == toy_greedy_generate(p, 8, VOCAB)
    assert clean(eng)


def test_a_sampler_that_raises_for_one_request_fails_it_alone_and_keeps_seeded_draws(monkeypatch):
    def run(poison):
        eng = make_engine()
        for i, p in enumerate(PROMPTS):
            eng.add_request(f"r{i}", p, SamplingParams(temperature=0.9, seed=100 + i, max_tokens=10,
                                                       logprobs=2))
        if poison:
            eng.add_request("bad", [3, 3, 3], SamplingParams(temperature=0.7, seed=13, max_tokens=10))
        return eng, eng.run_to_completion()

    ref_eng, ref = run(False)
    real = sampling.sample

    def picky(logits, params, generator=None):
        if params.seed == 13 and getattr(picky, "armed", 0) >= 2:
            raise RuntimeError("this sampler cannot handle seed 13")
        picky.armed = getattr(picky, "armed", 0) + (params.seed == 13)
        return real(logits, params, generator)

    monkeypatch.setattr(sampling, "sample", picky)
    eng, got = run(True)
    assert got["bad"].finish_reason == "error" and "seed 13" in got["bad"].error
    assert len(got["bad"].token_ids) == 2  # two tokens made it before the failure
    for i in range(len(PROMPTS)):
        a, b = got[f"r{i}"], ref[f"r{i}"]
        assert a.token_ids == b.token_ids  # the same draws as without the failing neighbour
        assert a.outputs[0].logprobs == b.outputs[0].logprobs
    assert clean(eng) and clean(ref_eng)


def test_a_broken_streaming_callback_ends_its_own_request():
    eng = make_engine()
    seen = []

    def broken(out):
        if len(out.token_ids) >= 3:
            raise ValueError("the client's callback is broken")

    eng.add_request("cb", [1, 2], SamplingParams(temperature=0, max_tokens=12), callback=broken)
    eng.add_request("ok", [5, 6], SamplingParams(temperature=0, max_tokens=12), callback=seen.append)
    final = eng.run_to_completion()
    assert final["cb"].finish_reason == "error" and "callback" in final["cb"].error
    assert final["ok"].token_ids == toy_greedy_generate([5, 6], 12, VOCAB)
    assert seen[-1].finished and seen[-1].finish_reason == "length"
    assert clean(eng)


def test_llm_style_drive_reports_each_request_once_with_an_error():
    eng = make_engine()
    real = eng.sampler

    def flaky(logits, seqs):  # every batch containing "bad" raises; single rows too for "bad"
        if any(s.request_id == "bad" for s in seqs):
            raise FloatingPointError("bad row")
        return real(logits, seqs)

    eng.sampler = flaky
    eng.add_request("bad", [1], SamplingParams(temperature=0, max_tokens=5))
    eng.add_request("good", [2], SamplingParams(temperature=0, max_tokens=5))
    finished = []
    while eng.has_unfinished_requests():
        finished += [o.request_id for o in eng.step() if o.finished]
    assert sorted(finished) == ["bad", "good"]
    assert clean(eng)
