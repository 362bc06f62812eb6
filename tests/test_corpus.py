"""The course corpus: present, loadable, split by the documented rule, licensed."""

import gzip
import hashlib
import json

import pytest

from servelab import corpus


def test_corpus_file_is_small_and_licensed():
    assert corpus.CORPUS_PATH.exists()
    assert corpus.CORPUS_PATH.stat().st_size < 8_000_000
    license_text = (corpus.CORPUS_DIR / "LICENSE.md").read_text()
    assert "PYTHON SOFTWARE FOUNDATION LICENSE VERSION 2" in license_text


def test_documents_have_names_kinds_and_text():
    docs = corpus.load_documents("all")
    assert len(docs) > 500
    names = [d[0] for d in docs]
    assert len(set(names)) == len(names)
    assert {d[1] for d in docs} == {"code", "prose"}
    assert all(d[2].endswith("\n") and corpus.DOCUMENT_SEPARATOR not in d[2] for d in docs)


def test_split_rule_is_the_documented_hash_rule():
    train = corpus.load_documents("train")
    val = corpus.load_documents("val")
    assert len(train) + len(val) == len(corpus.load_documents("all"))
    assert not {d[0] for d in train} & {d[0] for d in val}
    for name, _, _ in val:
        assert hashlib.sha256(name.encode()).digest()[0] < corpus.VALIDATION_THRESHOLD
    assert 0.02 < len(val) / (len(train) + len(val)) < 0.10


def test_load_text_sizes():
    train = corpus.load_text("train")
    val = corpus.load_text("val")
    assert len(train) > 10_000_000  # the tokenizer benchmark needs 10 MB
    assert 200_000 < len(val) < len(train) / 10
    assert corpus.load_text("train", max_chars=1000) == train[:1000]
    assert train.count(corpus.DOCUMENT_SEPARATOR) == len(corpus.load_documents("train")) - 1
    assert "prose" in {d[1] for d in corpus.load_documents("train")}


def test_bad_arguments_and_corrupt_files(tmp_path):
    with pytest.raises(ValueError, match="split"):
        corpus.load_documents("test")
    with pytest.raises(ValueError, match="kind"):
        corpus.load_documents("train", kind="poetry")
    bad = tmp_path / "bad.jsonl.gz"
    with gzip.open(bad, "wt") as f:
        f.write(json.dumps({"name": "x", "kind": "code", "text": "ok\n"}) + "\n{oops\n")
    with pytest.raises(ValueError, match="line 2"):
        corpus.load_documents("all", path=str(bad))
    with pytest.raises(FileNotFoundError, match="rebuild"):
        corpus.load_documents("all", path=str(tmp_path / "missing.jsonl.gz"))


def test_rebuild_reproduces_the_committed_file(tmp_path):
    import sys
    if sys.version_info[:3] != (3, 11, 7):
        pytest.skip("the committed corpus is built from CPython 3.11.7")
    out = tmp_path / "corpus.jsonl.gz"
    summary = corpus.build_corpus(out)
    assert out.read_bytes() == corpus.CORPUS_PATH.read_bytes(), summary
