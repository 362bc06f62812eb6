"""servelab.generate: the one-request loop (cache, stops, seeds) and the committed tiny models."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from servelab.generation import generate
from servelab.model import LlamaConfig, LlamaModel, load_pretrained
from servelab.sampling import SamplingParams

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "data" / "models"


class LetterTokenizer:
    """Token i is the letter chr(97 + i % 26): enough to test text-level stops."""

    def encode(self, text):
        return [ord(c) - 97 for c in text]

    def decode(self, ids):
        return "".join(chr(97 + i % 26) for i in ids)


@pytest.fixture(scope="module")
def tiny():
    cfg = LlamaConfig(vocab_size=26, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, eos_token_id=None)
    torch.manual_seed(0)
    return LlamaModel(cfg).init_weights(std=0.5, seed=0).eval()


def greedy_without_cache(model, ids, n):
    ids = list(ids)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    return ids


def test_greedy_with_cache_equals_recomputing_everything(tiny):
    res = generate(tiny, LetterTokenizer(), "abc", max_new_tokens=12)
    assert res.token_ids == greedy_without_cache(tiny, [0, 1, 2], 12)[3:]
    assert res.finish_reason == "length" and res.stop_reason is None
    assert res.forward_passes == 12          # one prefill pass + 11 decode passes
    assert res.text == LetterTokenizer().decode(res.token_ids)


def test_end_token_stops_and_is_not_in_text(tiny):
    free = generate(tiny, LetterTokenizer(), [3, 4], max_new_tokens=10).token_ids
    eos = free[3]
    first = free.index(eos)
    res = generate(tiny, LetterTokenizer(), [3, 4], max_new_tokens=10, eos_token_id=eos)
    assert res.token_ids == free[:first + 1]
    assert res.finish_reason == "stop" and res.stop_reason is None  # the engine's (and vLLM's) reason
    assert res.text == LetterTokenizer().decode(free[:first])
    ignored = generate(tiny, LetterTokenizer(), [3, 4], eos_token_id=eos,
                       sampling=SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))
    assert ignored.token_ids == free


def test_stop_string_cuts_text(tiny):
    free = generate(tiny, LetterTokenizer(), "hello", max_new_tokens=10)
    stop = free.text[4:6]
    res = generate(tiny, LetterTokenizer(), "hello", max_new_tokens=10, stop=[stop])
    cut = free.text.find(stop)
    assert res.text == free.text[:cut]
    assert res.finish_reason == "stop" and res.stop_reason == stop
    assert len(res.token_ids) == cut + len(stop)


def test_seeded_sampling_repeats_and_logprobs(tiny):
    p = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=15, seed=123, logprobs=3)
    a = generate(tiny, LetterTokenizer(), "ab", sampling=p)
    b = generate(tiny, LetterTokenizer(), "ab", sampling=p)
    assert a.token_ids == b.token_ids
    assert len(a.logprobs) == len(a.top_logprobs) == 15
    assert all(lp <= 0 for lp in a.logprobs) and all(len(t) == 3 for t in a.top_logprobs)
    c = generate(tiny, LetterTokenizer(), "ab", sampling=SamplingParams(temperature=1.0, max_tokens=15, seed=124))
    assert c.token_ids != a.token_ids


def test_empty_prompt_is_refused(tiny):
    with pytest.raises(ValueError, match="empty"):
        generate(tiny, LetterTokenizer(), "", max_new_tokens=3)


def test_top_level_export():
    import servelab

    assert servelab.generate is generate
    assert servelab.SamplingParams is SamplingParams


# ------------------------------------------------------------ the committed models

@pytest.mark.parametrize("name,low,high", [("servelab-main", 4e6, 15e6), ("servelab-draft", 0.5e6, 2e6)])
def test_committed_models_load_and_write_python(name, low, high):
    folder = MODELS / name
    if not (folder / "model.safetensors").exists():
        pytest.skip(f"{folder} not trained yet")
    from servelab.bpe import load_course_tokenizer
    from servelab.train import tokenizer_sha256

    log = json.loads((folder / "train_log.json").read_text())["summary"]
    assert log["tokenizer_sha256"] == tokenizer_sha256(), "tokenizer changed since training: retrain"
    assert (folder / "model.safetensors").stat().st_size < 25e6
    model = load_pretrained(folder)
    assert low < model.num_parameters() < high
    tok = load_course_tokenizer()
    assert model.config.vocab_size == tok.n_vocab
    res = generate(model, tok, "def __init__(self", max_new_tokens=24)
    assert res.num_tokens > 0
    assert any(s in res.text for s in ("self", ")", ":", "\n")), res.text


class StepClock:
    """A fake clock that advances one second per reading: every timed pass takes exactly 1 s."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        self.now += 1.0
        return self.now


def test_time_passes_times_one_prefill_and_one_pass_per_later_token(tiny):
    from servelab.generation import time_passes

    timed = time_passes(tiny, LetterTokenizer(), "abc", 5, runs=2, clock=StepClock())
    assert timed.prompt_tokens == 3 and timed.new_tokens == 5
    assert timed.prefill_s == (1.0, 1.0)
    assert timed.decode_s == ((1.0,) * 4, (1.0,) * 4)   # 5 tokens: 1 prefill + 4 decode passes
    assert timed.prefill_median_s == 1.0 and timed.decode_median_s == 1.0
    assert timed.answer_s(10) == 1.0 + 9 * 1.0
    # max_new_tokens overrides the sampling's max_tokens: the answer has exactly that length
    sampling = SamplingParams(temperature=0.8, seed=1, max_tokens=99)
    timed = time_passes(tiny, LetterTokenizer(), "abc", 3, runs=1, sampling=sampling,
                        clock=StepClock())
    assert len(timed.decode_s[0]) == 2


def test_time_passes_refuses_what_cannot_be_timed(tiny):
    from servelab.generation import time_passes

    tok = LetterTokenizer()
    with pytest.raises(ValueError, match="max_new_tokens"):
        time_passes(tiny, tok, "abc", 1)
    with pytest.raises(ValueError, match="runs"):
        time_passes(tiny, tok, "abc", 4, runs=0)
    with pytest.raises(ValueError, match="stop"):
        time_passes(tiny, tok, "abc", 4, sampling=SamplingParams(stop=["x"]))
    timed = time_passes(tiny, tok, "abc", 2, runs=1, clock=StepClock())
    with pytest.raises(ValueError, match="new_tokens"):
        timed.answer_s(0)
