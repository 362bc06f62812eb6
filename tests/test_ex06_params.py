"""Exercise 6 (parameters): the hidden tests' expected values are right, and the classic
mistake costs exactly its question."""
from pathlib import Path

import nbformat
import pytest

from servelab.grade import grade_notebook
from servelab.grading.hidden import ex06_params as hidden

ROOT = Path(__file__).resolve().parents[1]
SOLUTION = ROOT / "solutions" / "ex06_params.ipynb"


def _variant(tmp_path, old: str, new: str) -> Path:
    nb = nbformat.read(SOLUTION, as_version=4)
    hits = 0
    for cell in nb.cells:
        if cell.cell_type == "code":
            hits += cell.source.count(old)
            cell.source = cell.source.replace(old, new)
            cell.outputs, cell.execution_count = [], None
    assert hits == 1, f"the solution no longer contains {old!r} exactly once"
    out = tmp_path / SOLUTION.name  # the file name selects the hidden tests
    nbformat.write(nb, out)
    return out


def test_full_width_keys_and_values_lose_exactly_q1(tmp_path):
    path = _variant(tmp_path, "kv_width = kv_heads * head_dim", "kv_width = d")
    results = {r.question: r for r in grade_notebook(path)}
    assert not results["q1"].passed and "expected 8030261248" in results["q1"].reason
    assert results["q2"].passed


def test_counting_the_embedding_as_a_product_loses_exactly_q2(tmp_path):
    path = _variant(tmp_path, 'parts["lm_head"] or parts["embedding"]', 'parts["lm_head"] + parts["embedding"]')
    results = {r.question: r for r in grade_notebook(path)}
    assert results["q1"].passed and not results["q2"].passed


def test_transformers_golden_number_still_holds():
    transformers = pytest.importorskip("transformers")
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**hidden.TRANSFORMERS_GOLDEN_CONFIG))
    assert sum(p.numel() for p in model.parameters()) == hidden.TRANSFORMERS_GOLDEN_PARAMS


def test_expected_counts_match_real_tensors():
    torch = pytest.importorskip("torch")
    from servelab.model import LlamaConfig, LlamaModel
    for config in (hidden.TRANSFORMERS_GOLDEN_CONFIG, hidden.SERVELAB_MAIN,
                   {**hidden.WIDE_HEADS, "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
                    "num_hidden_layers": 2, "head_dim": 16}):
        model = LlamaModel(LlamaConfig.from_hf_dict(config))
        assert model.num_parameters() == hidden.expected_params(config), config
    assert torch is not None


def test_hidden_cases_cover_the_awkward_configs():
    configs = [case.args[0] for case in hidden.Q1.hidden]
    assert any(c.get("tie_word_embeddings") for c in configs)
    assert any("num_key_value_heads" not in c for c in configs)
    assert any("head_dim" in c and c["head_dim"] * c["num_attention_heads"] != c["hidden_size"] for c in configs)
    assert any("tie_word_embeddings" not in c for c in configs)
