"""Exercise 4's classic mistakes each lose their question's points."""
import pytest

from mutants_common import assert_keeps, assert_loses, solution_functions

EX = "ex04_embeddings"
SOL = solution_functions(EX)


def table_bits_not_bytes(config, bytes_per_value):  # multiplies by bits
    n = config["vocab_size"] * config["hidden_size"]
    return n, n * bytes_per_value * 8


def table_whole_bytes(config, bytes_per_value):  # rounds half a byte down to nothing
    n = config["vocab_size"] * config["hidden_size"]
    return n, n * int(bytes_per_value)


def table_twice_when_untied(config, bytes_per_value):  # counts the head into "the table"
    n = config["vocab_size"] * config["hidden_size"]
    if not config.get("tie_word_embeddings", False):
        n *= 2
    return n, n * bytes_per_value


def head_missing_key_means_tied(config):  # a config without the key is untied, not tied
    n = config["vocab_size"] * config["hidden_size"]
    return n if config.get("tie_word_embeddings", True) else 2 * n


def head_always_two_tables(config):
    return 2 * config["vocab_size"] * config["hidden_size"]


def head_always_one_table(config):
    return config["vocab_size"] * config["hidden_size"]


def stream_layers_copies(config, tokens, bytes_per_value):  # forgets the embedding's snapshot
    if tokens <= 0:
        raise ValueError("tokens must be positive")
    one = tokens * config["hidden_size"] * bytes_per_value
    return one, config["num_hidden_layers"] * one


def stream_no_check(config, tokens, bytes_per_value):  # zero or negative tokens accepted
    one = tokens * config["hidden_size"] * bytes_per_value
    return one, (config["num_hidden_layers"] + 1) * one


def stream_mlp_width(config, tokens, bytes_per_value):  # the MLP's width is not the stream's
    if tokens <= 0:
        raise ValueError("tokens must be positive")
    one = tokens * config["intermediate_size"] * bytes_per_value
    return one, (config["num_hidden_layers"] + 1) * one


@pytest.mark.parametrize("qid, name", [("q1", "embedding_table"), ("q2", "head_and_table_params"),
                                       ("q3", "residual_stream_bytes")])
def test_the_worked_solution_keeps_its_points(qid, name):
    assert_keeps(EX, qid, SOL[name])


@pytest.mark.parametrize("qid, mutant, why", [
    ("q1", table_bits_not_bytes, "bits instead of bytes"),
    ("q1", table_whole_bytes, "half a byte truncated"),
    ("q1", table_twice_when_untied, "the untied head counted into the table"),
    ("q2", head_missing_key_means_tied, "a missing tie key read as tied"),
    ("q2", head_always_two_tables, "tying ignored (always two tables)"),
    ("q2", head_always_one_table, "tying assumed (always one table)"),
    ("q3", stream_layers_copies, "layers copies instead of layers + 1"),
    ("q3", stream_no_check, "zero tokens accepted"),
    ("q3", stream_mlp_width, "the MLP width used"),
])
def test_each_classic_mistake_loses_its_question(qid, mutant, why):
    assert_loses(EX, qid, mutant, why)
