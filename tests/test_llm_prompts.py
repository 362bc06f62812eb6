"""``LLM.generate`` takes vLLM's prompt forms, refuses anything else, and runs vLLM's script.

vLLM's ``LLM.generate`` takes a string, a list of token ids, ``{"prompt": ...}``
(``TextPrompt``), ``{"prompt_token_ids": ...}`` (``TokensPrompt``), or a list of
these. servelab takes the same and answers every form alike; anything else is a
``ValueError`` at the call that names the prompt and the fix (it once returned
empty outputs for ``{"prompt_token_ids": [...]}``). The parity tests' driver,
written for ``vllm.LLM``, runs here unchanged (its vLLM half is in
``test_vs_vllm.py`` and needs ``make vllm``).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from servelab.engine import LLM
from servelab.engine.llm import normalize_prompts
from servelab.model import LlamaConfig, LlamaModel
from servelab.sampling import SamplingParams

ROOT = Path(__file__).resolve().parents[1]
VOCAB = 64
GREEDY = SamplingParams(temperature=0.0, max_tokens=4)


class CharTokenizer:
    def encode(self, text):
        return [ord(c) % VOCAB for c in text]

    def decode(self, ids):
        return "".join(chr(48 + i) for i in ids)


@pytest.fixture(scope="module")
def llm():
    torch.manual_seed(0)
    model = LlamaModel(LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=128)).init_weights(std=0.3, seed=0).double().eval()
    return LLM(model, CharTokenizer(), block_size=4, num_kv_blocks=64, max_num_seqs=4)


def _ids(outs):
    return [o.token_ids for o in outs]


def test_every_vllm_form_gives_the_same_tokens(llm):
    ids = CharTokenizer().encode("hello")
    want = llm.generate([ids], GREEDY)[0].token_ids
    assert len(want) == 4
    for form in ("hello", ids, tuple(ids), {"prompt": "hello"}, {"prompt_token_ids": ids},
                 {"prompt_token_ids": ids, "prompt": "a label only"}, np.array(ids).tolist()):
        outs = llm.generate(form, GREEDY)
        assert _ids(outs) == [want], form
    mixed = ["hello", ids, {"prompt": "hello"}, {"prompt_token_ids": ids}, [np.int64(t) for t in ids]]
    assert _ids(llm.generate(mixed, GREEDY)) == [want] * 5
    assert llm.generate([], GREEDY) == []


def test_token_dict_was_silently_empty_and_now_runs(llm):
    out = llm.generate({"prompt_token_ids": [1, 2, 3]}, GREEDY)
    assert len(out) == 1 and out[0].prompt_token_ids == [1, 2, 3] and len(out[0].token_ids) == 4
    outs = llm.generate([{"prompt_token_ids": [1, 2, 3]}, {"prompt_token_ids": [4, 5]}], GREEDY)
    assert [o.finish_reason for o in outs] == ["length", "length"]


@pytest.mark.parametrize("bad, words", [
    (5, ["got int"]),
    (None, ["got NoneType"]),
    ({"prompt_ids": [1, 2]}, ["prompt_ids", "takes only"]),
    ({"prompt_token_ids": [1], "multi_modal_data": {}}, ["multi_modal_data", "no multimodal"]),
    ({}, ["neither 'prompt' nor 'prompt_token_ids'"]),
    ({"prompt": [1, 2]}, ["must be a string", "prompt_token_ids"]),
    ({"prompt_token_ids": "abc"}, ["list of token ids"]),
    ({"prompt": "x", "cache_salt": 3}, ["cache_salt"]),
    ([1, 2.5], ["prompt[1] is 2.5", "not a token id"]),
    ([1, True], ["prompt[1] is True"]),
    ([[1, 2], [3, "x"]], ["prompts[1][1]", "flat list of ints"]),
    (["ok", 7], ["prompts[1]", "got int"]),
    ((p for p in ["a"]), ["generator", "list(...)"]),
    (np.array([1, 2]), ["ndarray"]),
])
def test_anything_else_is_refused_at_the_call(llm, bad, words):
    before = llm.engine.has_unfinished_requests()
    with pytest.raises(ValueError) as info:
        llm.generate(bad, GREEDY)
    msg = str(info.value)
    assert all(w in msg for w in words), msg
    assert llm.engine.has_unfinished_requests() == before  # nothing was queued


def test_content_errors_stay_per_request(llm):
    outs = llm.generate(["hi", {"prompt_token_ids": []}, [VOCAB + 5]], GREEDY)
    assert [o.finish_reason for o in outs] == ["length", "error", "error"]


def test_cache_salt_per_prompt_dict():
    items = normalize_prompts([{"prompt_token_ids": [1], "cache_salt": "a"}, "x", [2, 3]])
    assert items == [([1], "a"), ("x", None), ([2, 3], None)]


def test_sampling_params_count_must_match(llm):
    with pytest.raises(ValueError, match="one per prompt"):
        llm.generate(["a", "b"], [GREEDY])


def test_detokenize_false_gives_ids_only(llm):
    sp = SamplingParams(temperature=0.0, max_tokens=4, detokenize=False)
    out = llm.generate("hello", sp)[0]
    assert out.text == "" and out.token_ids == llm.generate("hello", GREEDY)[0].token_ids
    with pytest.raises(ValueError, match="stop_token_ids"):
        SamplingParams(stop=["x"], detokenize=False)


def test_vllm_constructor_names(tmp_path):
    llm = LLM(str(ROOT / "data" / "models" / "servelab-draft"), skip_tokenizer_init=True,
              num_gpu_blocks_override=20, block_size=32, max_model_len=256)
    assert llm.tokenizer is None and llm.config.num_kv_blocks == 20
    out = llm.generate("text needs a tokenizer", GREEDY)[0]
    assert out.finish_reason == "error" and "token ids" in out.error
    with pytest.raises(ValueError, match="disagree"):
        LLM(str(ROOT / "data" / "models" / "servelab-draft"), num_kv_blocks=8, num_gpu_blocks_override=9)


def test_the_vllm_driver_runs_unchanged_on_servelab(tmp_path):
    """tests/vllm_driver.py, written for vllm.LLM, on servelab.LLM: a small spec with every
    prompt form, a list of seeded params, n > 1, stop tokens and logprobs."""
    p1, p2 = list(range(10, 50)), list(range(100, 107))
    spec = {"engine_args": dict(enforce_eager=True, block_size=32, num_gpu_blocks_override=8,
                                max_num_seqs=4, max_num_batched_tokens=32, enable_prefix_caching=True,
                                enable_chunked_prefill=True, max_model_len=256, seed=0),
            "models": [{"name": "draft", "path": str(ROOT / "data" / "models" / "servelab-draft")}],
            "calls": [
                {"name": "mixed", "form": "mixed", "prompts": [p1, p2, p1],
                 "params": dict(temperature=0.0, max_tokens=6, ignore_eos=True)},
                {"name": "stop_n_logprobs", "form": "dict", "prompts": [p2],
                 "params": dict(temperature=1.0, top_k=1, n=2, max_tokens=6, ignore_eos=True,
                                stop_token_ids=[4091], logprobs=3), "logprobs_k": 3},
                {"name": "seeded", "form": "tokens", "prompts": [p2, p2],
                 "params": [dict(temperature=1.0, seed=s, max_tokens=2) for s in (0, 1)]}]}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    subprocess.run([sys.executable, str(ROOT / "tests" / "vllm_driver.py"), "servelab", "spec.json",
                    "out.json"], cwd=tmp_path, check=True, timeout=300)
    res = json.loads((tmp_path / "out.json").read_text())["models"]["draft"]
    mixed = [o[0]["token_ids"] for o in res["mixed"]["outputs"]]
    assert mixed[0] == mixed[2] and all(len(t) == 6 for t in mixed)
    (a, b), = res["stop_n_logprobs"]["outputs"]
    assert a["token_ids"] == b["token_ids"] == mixed[1]  # top-k 1 is greedy
    assert len(a["top_logprobs"]) == 6 and all(len(r) == 3 for r in a["top_logprobs"])
    assert [r[0][0] for r in a["top_logprobs"]] == a["token_ids"]
    assert all(len(o[0]["token_ids"]) == 2 for o in res["seeded"]["outputs"])
    assert res["preemptions"] >= 0
