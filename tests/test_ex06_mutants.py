"""Exercise 6's classic mistakes each lose their question's points."""
import pytest

from mutants_common import assert_keeps, assert_loses, solution_functions

EX = "ex06_params"
SOL = solution_functions(EX)


def _count(c, kv_full=False, ignore_tie=False, derive_head_dim=False, missing_tie="untied", norms=True):
    d, layers = c["hidden_size"], c["num_hidden_layers"]
    heads = c["num_attention_heads"]
    kv = heads if kv_full else c.get("num_key_value_heads") or heads
    hd = d // heads if derive_head_dim else c.get("head_dim") or d // heads
    attn = 2 * d * heads * hd + 2 * d * kv * hd
    mlp = 3 * d * c["intermediate_size"]
    per_layer = attn + mlp + (2 * d if norms else 0)
    tied = c.get("tie_word_embeddings", missing_tie == "tied")
    table = c["vocab_size"] * d
    head = table if (ignore_tie or not tied) else 0
    return layers * per_layer + table + head + (d if norms else 0)


def _ops(parts, embedding=False, tied_rule=True, norms=False):
    total = parts["attention"] + parts["mlp"]
    if tied_rule:
        total += parts["lm_head"] or parts["embedding"]
    else:
        total += parts["lm_head"]
    if embedding:
        total += parts["embedding"]
    if norms:
        total += parts["norms"]
    return 2 * total


@pytest.mark.parametrize("qid, name", [("q1", "count_llama_params"), ("q2", "matmul_ops_per_token")])
def test_the_worked_solution_keeps_its_points(qid, name):
    assert_keeps(EX, qid, SOL[name])


def test_the_reference_counter_here_is_right():
    # the mutants below are this function with one thing changed
    assert_keeps(EX, "q1", _count)
    assert_keeps(EX, "q2", _ops)


@pytest.mark.parametrize("qid, mutant, why", [
    ("q1", lambda c: _count(c, kv_full=True), "K and V given the full width"),
    ("q1", lambda c: _count(c, ignore_tie=True), "a tied head counted twice"),
    ("q1", lambda c: _count(c, derive_head_dim=True), "head_dim always hidden / heads"),
    ("q1", lambda c: _count(c, missing_tie="tied"), "a missing tie key read as tied"),
    ("q1", lambda c: _count(c, norms=False), "norms left out"),
    ("q2", lambda p: _ops(p, embedding=True), "the embedding lookup priced"),
    ("q2", lambda p: _ops(p, tied_rule=False), "a tied head given no cost"),
    ("q2", lambda p: _ops(p, norms=True), "norms priced"),
])
def test_each_classic_mistake_loses_its_question(qid, mutant, why):
    assert_loses(EX, qid, mutant, why)
