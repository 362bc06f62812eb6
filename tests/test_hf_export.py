"""servelab.hf_export: the course checkpoint as a Hugging Face folder gives servelab's ids.

Read with the ``tokenizers`` library (what ``transformers`` and vLLM load) and
the chat template rendered by Jinja in a sandbox, as ``transformers`` renders
it. vLLM serving the exported folder is checked in ``tests/test_vs_vllm.py``.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from servelab import bpe, corpus, hf_export

ROOT = Path(__file__).resolve().parents[1]
MAIN = ROOT / "data" / "models" / "servelab-main"


@pytest.fixture(scope="module")
def course():
    return bpe.load_course_tokenizer()


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return hf_export.export_model_folder(MAIN, tmp_path_factory.mktemp("hf") / "servelab-main")


@pytest.fixture(scope="module")
def hf(folder):
    from tokenizers import Tokenizer
    return Tokenizer.from_file(str(folder / "tokenizer.json"))


def _texts():
    """Corpus documents cut at random places (so pieces start mid-word and mid-line), plus
    the awkward cases: whitespace runs, digits, contractions, non-ASCII, special-token text."""
    rng = random.Random(7)
    docs = corpus.load_text("val")
    out = []
    for _ in range(40):
        i = rng.randrange(len(docs) - 2000)
        out.append(docs[i:i + rng.randint(1, 1500)])
    out += ["", " ", "\n\n\n", "   x", "x   \n", "1234567890", "we'll they're I'M", "héllo wörld 🐍 日本",
            "a<|endoftext|>b", "<|user|>\nhi<|end|>\n<|assistant|>\n", "\t\tdef f():\r\n  pass"]
    return out


def test_folder_layout(folder):
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                     "tokenizer_config.json"]
    w = folder / "model.safetensors"
    assert w.is_symlink() and w.resolve() == (MAIN / "model.safetensors").resolve()
    assert json.loads((folder / "config.json").read_text()) == json.loads((MAIN / "config.json").read_text())
    gen = json.loads((folder / "generation_config.json").read_text())
    assert gen["eos_token_id"] == 4091
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    assert cfg["tokenizer_class"] == "PreTrainedTokenizerFast" and cfg["eos_token"] == "<|endoftext|>"
    assert cfg["model_max_length"] == 1024 and cfg["chat_template"] == hf_export.CHAT_TEMPLATE
    assert {int(k): v["content"] for k, v in cfg["added_tokens_decoder"].items()} == {
        tid: t for t, tid in bpe.load_course_tokenizer().special_tokens.items()}


def test_same_ids_as_servelab(hf, course):
    """Special-token text is special on both sides here (servelab with allowed_special='all',
    as its server encodes a completions prompt)."""
    for text in _texts():
        want = course.encode(text, allowed_special="all")
        assert hf.encode(text, add_special_tokens=False).ids == want, text[:80]
        assert hf.encode(text).ids == want  # no begin/end token is added
        assert hf.decode(want, skip_special_tokens=False) == course.decode(want), text[:80]


def _render(template: str, messages, add_generation_prompt=True) -> str:
    """The chat template rendered as ``transformers`` renders it (sandboxed Jinja,
    ``trim_blocks``/``lstrip_blocks``, ``raise_exception``)."""
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(msg):
        raise TemplateError(msg)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(messages=messages, add_generation_prompt=add_generation_prompt)


CHATS = [
    [{"role": "user", "content": "Write a haiku about lists."}],
    [{"role": "system", "content": "Answer in Python."}, {"role": "user", "content": "sum 1..10\n"},
     {"role": "assistant", "content": "sum(range(1, 11))"}, {"role": "user", "content": "  and squares?"}],
    [{"role": "user", "content": ""}],
    [{"role": "user", "content": "héllo\n\n\tworld 🐍"}],
]


@pytest.mark.parametrize("k", range(len(CHATS)))
def test_chat_template_is_render_chat(k, hf, course):
    msgs = CHATS[k]
    for gen in (True, False):
        text = _render(hf_export.CHAT_TEMPLATE, msgs, gen)
        assert text == bpe.render_chat(msgs, add_generation_prompt=gen)
    ids = hf.encode(text, add_special_tokens=False).ids
    assert ids == course.encode(text, allowed_special="all")


def test_chat_ids_match_the_server(hf, course):
    """The ids vLLM builds from a chat (template, then encode) are those servelab's server
    builds; the server splits at the special tokens, which is what Hugging Face does."""
    from servelab.server.protocol import encode_chat
    for msgs in CHATS:
        text = _render(hf_export.CHAT_TEMPLATE, msgs)
        assert hf.encode(text, add_special_tokens=False).ids == encode_chat(course, msgs)


def test_unknown_role_raises():
    from jinja2.exceptions import TemplateError
    with pytest.raises(TemplateError, match="role must be"):
        _render(hf_export.CHAT_TEMPLATE, [{"role": "tool", "content": "x"}])


def test_refuses_bad_folders(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        hf_export.export_model_folder(tmp_path, tmp_path / "out")
    with pytest.raises(ValueError, match="folder of its own"):
        hf_export.export_model_folder(MAIN, MAIN)


def test_copy_and_rerun(tmp_path, folder):
    out = hf_export.export_model_folder(MAIN, tmp_path / "m", link=False)
    assert not (out / "model.safetensors").is_symlink()
    assert (out / "model.safetensors").read_bytes() == (MAIN / "model.safetensors").read_bytes()
    again = hf_export.export_model_folder(MAIN, tmp_path / "m")  # over an existing export
    assert (again / "model.safetensors").is_symlink()
    assert (again / "tokenizer.json").read_bytes() == (folder / "tokenizer.json").read_bytes()
