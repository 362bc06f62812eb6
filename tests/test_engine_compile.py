"""``LLM(..., enforce_eager=False)``: the model's own forward compiled with
``torch.compile``, attention left out of the graph as one opaque operator.
Same tokens as the eager engine; what a graph cannot check (stale fusions,
positions beyond the RoPE table) is still checked."""
import pytest
import torch

from servelab.engine import LLMEngine
from servelab.engine.model_runner import can_compile
from servelab.model import LlamaConfig, LlamaModel, _STEP_CONTEXTS
from servelab.sampling import SamplingParams

pytestmark = pytest.mark.skipif(not can_compile(), reason="torch.compile needs a C++ compiler (none here)")

CFG = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True)
PROMPTS = [[3, 9, 27, 81, 5, 7, 11], [13, 17], list(range(20, 45)), [2, 4, 6, 8]]


def _model(seed=0):
    torch.manual_seed(seed)
    return LlamaModel(LlamaConfig(**CFG)).init_weights(seed=seed).eval()


def _run(model, enforce_eager, prompts=PROMPTS, **kw):
    eng = LLMEngine.from_model(model, block_size=4, num_kv_blocks=96, max_num_seqs=3,
                               max_num_batched_tokens=16, enforce_eager=enforce_eager, **kw)
    for i, p in enumerate(prompts):  # 4 requests, 3 seats, a 16-token budget: chunks and decodes mix
        eng.add_request(str(i), p, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    outs = {rid: o.outputs[0].token_ids for rid, o in eng.run_to_completion().items()}
    return outs, eng


@pytest.fixture(scope="module")
def compiled_run():
    return _run(_model(), enforce_eager=False)


def test_compiled_engine_gives_the_eager_engines_tokens(compiled_run):
    outs, eng = compiled_run
    assert eng.runner.compiled and not _STEP_CONTEXTS  # the step context is gone after each step
    assert outs == _run(_model(), enforce_eager=True)[0]


def test_compiled_logits_match_eager_logits(compiled_run):
    _, eng = compiled_run
    eager = LLMEngine.from_model(eng.runner.model, block_size=4, num_kv_blocks=96).runner
    from servelab.engine.model_runner import StepInput
    step = StepInput(input_ids=[5, 6, 7], positions=[0, 1, 2], slot_mapping=[0, 1, 2], query_lens=[3],
                     context_lens=[3], block_tables=[[0]], sample_rows=[2])
    torch.testing.assert_close(eng.runner.execute(step), eager.execute(step), rtol=1e-4, atol=1e-5)


def test_a_weight_swap_reaches_the_compiled_step(compiled_run):
    _, eng = compiled_run
    model = eng.runner.model
    attn = model.layers[0].self_attn
    torch.manual_seed(1)
    attn.k_proj.weight = torch.nn.Parameter(torch.randn_like(attn.k_proj.weight))  # fusion now stale
    ref = LlamaModel(LlamaConfig(**CFG)).eval()
    ref.load_state_dict(model.state_dict())
    got = _run(model, enforce_eager=False, prompts=PROMPTS[:2])[0]
    assert got == _run(ref, enforce_eager=True, prompts=PROMPTS[:2])[0]
    assert attn.fused_qkv.is_current((attn.q_proj, attn.k_proj, attn.v_proj))


def test_positions_beyond_the_rope_table_run_eagerly(compiled_run, monkeypatch):
    _, eng = compiled_run
    model = eng.runner.model
    ref = LlamaModel(LlamaConfig(**CFG)).eval()
    ref.load_state_dict(model.state_dict())
    compiled = LLMEngine.from_model(model, block_size=4, num_kv_blocks=96, enforce_eager=False)
    monkeypatch.setattr(model.rotary, "max_positions", 8)  # the table now covers positions 0-7 only
    import servelab.engine.model_runner as mr
    monkeypatch.setattr(mr, "_compiled_model_step", lambda: pytest.fail("a compiled step past the table"))
    compiled.add_request("r", list(range(30, 42)), SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    got = compiled.run_to_completion()["r"].outputs[0].token_ids
    assert got == _run(ref, enforce_eager=True, prompts=[list(range(30, 42))])[0]["0"][:3]


def test_a_second_model_runs_its_own_weights(compiled_run):
    other = _model(seed=7)
    ref = LlamaModel(LlamaConfig(**CFG)).eval()
    ref.load_state_dict(other.state_dict())
    assert _run(other, enforce_eager=False)[0] == _run(ref, enforce_eager=True)[0]


def test_a_bf16_pool_under_a_compiled_fp32_model(compiled_run):
    model = compiled_run[1].runner.model
    ref = LlamaModel(LlamaConfig(**CFG)).eval()
    ref.load_state_dict(model.state_dict())
    got = _run(model, enforce_eager=False, kv_dtype=torch.bfloat16)[0]
    assert got == _run(ref, enforce_eager=True, kv_dtype=torch.bfloat16)[0]


def test_a_step_that_falls_back_to_eager_still_attends(monkeypatch):
    """Past torch._dynamo's recompile limit a compiled step's frame runs eagerly, with the
    compiled step's cache (a long-lived server meets this: one process compiling two
    models hit it): it must still attend, and give the eager engine's tokens."""
    from servelab.engine import model_runner
    monkeypatch.setattr(model_runner, "_compiled_model_step", lambda: model_runner._model_step)
    fallback, _ = _run(_model(), enforce_eager=False)
    eager, _ = _run(_model(), enforce_eager=True)
    assert fallback == eager
