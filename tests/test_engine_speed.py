"""The engine's speed devices keep its outputs: column-major weights, the reused
gather buffer, a lone sequence's blocks read as a view, and a rotary table that
compiles without a graph break."""
import torch

from servelab.engine import LLMEngine
from servelab.engine.model_runner import ModelRunner, PagedStepContext, StepInput
from servelab.model import LlamaConfig, LlamaModel, is_column_major, store_column_major
from servelab.sampling import SamplingParams

CFG = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True)


def _model(seed=0):
    torch.manual_seed(seed)
    return LlamaModel(LlamaConfig(**CFG)).init_weights(seed=seed).eval()


def test_column_major_keeps_values_state_dict_and_logits():
    model, ref = _model(), _model()
    ids = torch.tensor([[3, 9, 27, 81, 5]])
    with torch.inference_mode():
        before = ref(ids)
    state = {k: v.clone() for k, v in ref.state_dict().items()}
    model.fuse_projections(column_major=True)
    layer = model.layers[0]
    for w in (layer.self_attn.fused_qkv.weight, layer.self_attn.o_proj.weight,
              layer.mlp.fused_gate_up.weight, layer.mlp.down_proj.weight, model.lm_head.weight):
        assert is_column_major(w)
    assert model.lm_head.weight is model.embed_tokens.weight  # still tied
    for k, v in model.state_dict().items():
        assert torch.equal(v, state[k]), k
    with torch.inference_mode():
        torch.testing.assert_close(model(ids), before, rtol=1e-5, atol=1e-5)
    # a weight swap rebuilds the fusion in the same layout
    layer.self_attn.k_proj.weight = torch.nn.Parameter(torch.randn_like(layer.self_attn.k_proj.weight))
    with torch.inference_mode():
        model(ids)
    assert layer.self_attn.fused_qkv.column_major and is_column_major(layer.self_attn.fused_qkv.weight)


def test_store_column_major_trains():
    lin = store_column_major(torch.nn.Linear(6, 4))
    assert is_column_major(lin.weight) and lin.weight.requires_grad
    lin(torch.randn(3, 6)).sum().backward()
    assert lin.weight.grad.shape == (4, 6)


def _step(tables, ctx):
    """A decode step of single rows (row i: context ctx[i], blocks tables[i])."""
    bs = 4
    slots = [tables[i][(c - 1) // bs] * bs + (c - 1) % bs for i, c in enumerate(ctx)]
    return StepInput(input_ids=[1] * len(ctx), positions=[c - 1 for c in ctx], slot_mapping=slots,
                     query_lens=[1] * len(ctx), context_lens=list(ctx), block_tables=tables,
                     sample_rows=list(range(len(ctx))), num_decode_rows=len(ctx))


def test_lone_sequence_view_and_scratch_gather_agree():
    torch.manual_seed(0)
    pools = [torch.randn(12, 4, 2, 2, 8)]
    q, kv = torch.randn(1, 4, 8), torch.randn(1, 2, 2, 8)
    viewed = PagedStepContext([p.clone() for p in pools], _step([[3, 4, 5]], [10]), 4)
    assert isinstance(viewed.decode_groups[0][2], slice)           # consecutive: read as a view
    gathered = PagedStepContext([p.clone() for p in pools], _step([[3, 4, 5]], [10]), 4)
    gathered.decode_groups[0] = (0, 1, torch.tensor([3, 4, 5]), 3, 10, None)   # force the gather
    torch.testing.assert_close(viewed.attend(0, q, kv, 0.3), gathered.attend(0, q, kv, 0.3))
    scattered = PagedStepContext([p.clone() for p in pools], _step([[7, 2, 9]], [10]), 4)
    assert not isinstance(scattered.decode_groups[0][2], slice)


def test_scratch_buffer_is_reused_across_steps():
    model = _model()
    eng = LLMEngine.from_model(model, block_size=4, num_kv_blocks=64, max_num_seqs=4)
    ref = _model()
    for i in range(3):
        eng.add_request(str(i), [5 + i, 7, 11, 13, 17, 19][: 3 + i], SamplingParams(temperature=0, max_tokens=6))
    outs = eng.run_to_completion()
    scratch = eng.runner._scratch
    assert list(scratch) == [torch.float32]
    buf = scratch[torch.float32]
    eng.add_request("again", [5, 7, 11], SamplingParams(temperature=0, max_tokens=3))
    eng.run_to_completion()
    assert eng.runner._scratch[torch.float32] is buf   # no new buffer for steps that fit
    # greedy tokens equal the plain model's greedy decode
    for i in range(3):
        ids = [5 + i, 7, 11, 13, 17, 19][: 3 + i]
        with torch.inference_mode():
            for _ in range(6):
                ids.append(int(ref(torch.tensor([ids]))[0, -1].argmax()))
        assert list(outs[str(i)].outputs[0].token_ids) == ids[-6:]


def test_rotary_compiles_without_graph_break():
    model = _model()
    explain = torch._dynamo.explain(lambda p: model.rotary(p))(torch.tensor([0, 5, 9]))
    assert explain.graph_break_count == 0
    cos, sin = model.rotary(torch.tensor([0, 5, 9]))
    torch._dynamo.reset()
    compiled = torch.compile(model.rotary, fullgraph=True, backend="eager")
    c2, s2 = compiled(torch.tensor([0, 5, 9]))
    torch.testing.assert_close(c2, cos)
    torch.testing.assert_close(s2, sin)
