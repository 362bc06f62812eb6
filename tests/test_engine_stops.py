"""One stop checker for generate and the engine; min_tokens, include_stop_str_in_output,
max_tokens < 1, and streaming with multi-character tokens of the course tokenizer."""
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from servelab import bpe
from servelab.engine import EngineConfig, LLMEngine
from servelab.engine.stop import StopChecker
from servelab.generation import generate
from servelab.model import LlamaConfig, LlamaModel
from servelab.sampling import SamplingParams


class ScriptRunner:
    """Emits a fixed script of token ids (one request): row logits one-hot on the next one."""

    def __init__(self, script, prompt_len, vocab, block_size=4):
        self.script, self.prompt_len, self.vocab_size, self.block_size = script, prompt_len, vocab, block_size

    def execute(self, step):
        rows = []
        if step.sample_rows:
            n_out = step.context_lens[-1] - self.prompt_len
            row = torch.full((self.vocab_size,), -1e9)
            row[self.script[n_out % len(self.script)]] = 0.0
            rows.append(row)
        return torch.stack(rows) if rows else torch.empty(0, self.vocab_size)


def run_script(script, tokenizer, params, prompt=(1, 2, 3), eos=()):
    cfg = EngineConfig(block_size=4, num_kv_blocks=64, max_model_len=256)
    eng = LLMEngine(ScriptRunner(script, len(prompt), tokenizer.n_vocab if hasattr(tokenizer, "n_vocab")
                                 else 26), cfg, tokenizer=tokenizer, eos_token_ids=eos)
    streamed = []
    eng.add_request("r", list(prompt), params, callback=streamed.append)
    final = eng.run_to_completion()["r"]
    return final, streamed


class Letters:
    n_vocab = 26

    def encode(self, text):
        return [ord(c) - 97 for c in text]

    def decode(self, ids):
        return "".join(chr(97 + i) for i in ids)


COURSE = bpe.load_course_tokenizer()


# ---------------------------------------------------------------- max_tokens < 1 everywhere

def test_max_tokens_below_one_is_a_value_error_everywhere():
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=0)
    sp = SamplingParams(max_tokens=4)
    sp.max_tokens = 0  # changed after construction: the engine validates again
    eng = LLMEngine(ScriptRunner([1], 3, 26), EngineConfig(block_size=4, num_kv_blocks=8, max_model_len=32))
    with pytest.raises(ValueError, match="max_tokens"):
        eng.add_request("r", [1, 2, 3], sp)
    assert not eng.has_unfinished_requests()
    model = LlamaModel(LlamaConfig(vocab_size=26, hidden_size=16, intermediate_size=32,
                                   num_hidden_layers=1, num_attention_heads=2)).init_weights(seed=0)
    with pytest.raises(ValueError, match="max_tokens"):
        generate(model, Letters(), [1, 2], max_new_tokens=0)
    with pytest.raises(ValueError, match="max_tokens"):
        generate(model, Letters(), [1, 2], sampling=sp)
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(max_tokens=2, min_tokens=3)


# ---------------------------------------------------------------- the same reasons in both

def test_end_token_gives_the_same_reason_in_generate_and_the_engine():
    torch.manual_seed(0)
    model = LlamaModel(LlamaConfig(vocab_size=26, hidden_size=16, intermediate_size=32,
                                   num_hidden_layers=1, num_attention_heads=2)).init_weights(std=0.5, seed=1)
    free = generate(model, Letters(), [3, 4], max_new_tokens=12).token_ids
    eos = free[4]
    ref = generate(model, Letters(), [3, 4], max_new_tokens=12, eos_token_id=eos)
    eng = LLMEngine.from_model(model, Letters(), block_size=4, num_kv_blocks=16, max_model_len=64)
    eng.eos_token_ids = frozenset([eos])
    eng.add_request("r", [3, 4], SamplingParams(temperature=0, max_tokens=12))
    out = eng.run_to_completion()["r"]
    assert out.token_ids == ref.token_ids and out.text == ref.text
    assert (out.finish_reason, out.outputs[0].stop_reason) == (ref.finish_reason, ref.stop_reason) \
        == ("stop", None)


# ---------------------------------------------------------------- min_tokens, include_stop_str

def test_min_tokens_masks_end_and_stop_tokens_and_delays_stop_strings():
    script = [5, 0, 6, 1, 7]  # 'f a g b h'
    out, _ = run_script(script, Letters(), SamplingParams(temperature=0, max_tokens=8), eos=(0,))
    assert out.token_ids == [5, 0] and out.finish_reason == "stop"
    # before min_tokens the end token is never drawn: the runner's second choice wins
    out, _ = run_script(script, Letters(), SamplingParams(temperature=0, max_tokens=8, min_tokens=3),
                        eos=(0,))
    assert 0 not in out.token_ids[:3] and len(out.token_ids) >= 3
    out, _ = run_script(script, Letters(), SamplingParams(temperature=0, max_tokens=8, stop=["f"],
                                                          min_tokens=2))
    assert out.text == "fagbh" and out.outputs[0].stop_reason == "f"  # the first 'f' came too early
    checker = StopChecker(SamplingParams(max_tokens=8, min_tokens=2, stop_token_ids=[9]), eos_token_ids=[0])
    assert checker.suppressed_token_ids(1) == {0, 9} and checker.suppressed_token_ids(2) == frozenset()
    assert checker.check_token(0, 1) is None and checker.check_token(0, 2) == ("stop", None)
    assert checker.check_token(9, 3) == ("stop", 9)


def test_include_stop_str_in_output_keeps_the_stop_string():
    script = [5, 0, 6, 1, 7]
    cut, _ = run_script(script, Letters(), SamplingParams(temperature=0, max_tokens=8, stop=["ag"]))
    kept, streamed = run_script(script, Letters(), SamplingParams(temperature=0, max_tokens=8, stop=["ag"],
                                                                  include_stop_str_in_output=True))
    assert cut.text == "f" and kept.text == "fag"
    assert kept.outputs[0].stop_reason == "ag" and "".join(o.delta_text for o in streamed) == "fag"


# ---------------------------------------------------------------- multi-character tokens

def test_a_stop_string_completed_by_the_final_flush_still_cuts_the_text():
    """Token 128 is half a UTF-8 character: held back while streaming, shown as U+FFFD at the end."""
    out, streamed = run_script([128], COURSE, SamplingParams(temperature=0, max_tokens=1, stop=["\ufffd"]))
    assert out.text == "" and out.finish_reason == "stop" and out.outputs[0].stop_reason == "\ufffd"
    assert "".join(o.delta_text for o in streamed) == ""


def test_stop_string_spanning_multi_character_tokens_is_cut_and_never_streamed():
    ids = COURSE.encode("hello world, hello there")
    out, streamed = run_script(ids, COURSE, SamplingParams(temperature=0, max_tokens=len(ids),
                                                           stop=["o wor", "lo th"]))
    assert out.text == "hell" and out.outputs[0].stop_reason == "o wor"
    assert "".join(o.delta_text for o in streamed) == "hell"


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ids=st.lists(st.integers(0, COURSE.n_vocab - 1), min_size=1, max_size=24),
       stops=st.lists(st.text(alphabet="abe lo\u00e9\u20ac\ufffd", min_size=1, max_size=4), max_size=2),
       include=st.booleans())
def test_streamed_deltas_join_to_the_final_text_and_never_show_a_stop_string(ids, stops, include):
    ids = [i for i in ids if i != COURSE.eot_token] or [32]
    params = SamplingParams(temperature=0, max_tokens=len(ids), stop=stops,
                            include_stop_str_in_output=include)
    out, streamed = run_script(ids, COURSE, params)
    pieces, shown = [], ""
    for o in streamed:
        shown += o.delta_text
        assert out.text.startswith(shown)  # nothing streamed is ever taken back
        pieces.append(o.delta_text)
    assert "".join(pieces) == out.text
    assert sum(1 for o in streamed if o.finished) == 1 and streamed[-1].finished
    if out.outputs[0].stop_reason is None:
        assert out.text == COURSE.decode(out.token_ids)
        assert not any(s in out.text for s in stops)
    elif not include:
        assert not any(s in out.text for s in stops)
