"""Exercise 2's classic mistakes each lose their question's points."""
import pytest

from mutants_common import assert_keeps, assert_loses, solution_functions

EX = "ex02_tokens"
SOL = solution_functions(EX)


def count_pairs_non_overlapping(ids):  # skips ahead after a pair: 'aaaa' counts (a, a) twice
    counts, i = {}, 0
    while i < len(ids) - 1:
        pair = (ids[i], ids[i + 1])
        counts[pair] = counts.get(pair, 0) + 1
        i += 2 if ids[i] == ids[i + 1] else 1
    return counts


def count_pairs_as_set(ids):  # presence, not counts
    return {p: 1 for p in zip(ids, ids[1:])}


def count_pairs_off_by_one(ids):  # misses the last pair
    counts = {}
    for i in range(len(ids) - 2):
        counts[(ids[i], ids[i + 1])] = counts.get((ids[i], ids[i + 1]), 0) + 1
    return counts


def merge_overlapping(ids, pair, new_id):  # merges 'aaa' into two tokens
    out, i = [], 0
    while i < len(ids):
        if i + 1 < len(ids) and (ids[i], ids[i + 1]) == pair:
            out.append(new_id)
            if i + 2 < len(ids) and ids[i + 1] == ids[i + 2] == pair[0] == pair[1]:
                out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def merge_in_place(ids, pair, new_id):  # edits the caller's list
    i = 0
    while i < len(ids) - 1:
        if (ids[i], ids[i + 1]) == pair:
            ids[i:i + 2] = [new_id]
        i += 1
    return ids


def merge_drops_tail(ids, pair, new_id):  # forgets the last id when it is not merged
    out, i = [], 0
    while i < len(ids) - 1:
        if (ids[i], ids[i + 1]) == pair:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out




def encode_leftmost(chunk, ranks):  # merges the leftmost mergeable pair, not the lowest rank
    parts = [bytes([b]) for b in chunk]
    while True:
        for i in range(len(parts) - 1):
            if parts[i] + parts[i + 1] in ranks:
                parts[i:i + 2] = [parts[i] + parts[i + 1]]
                break
        else:
            return [ranks[p] for p in parts]


def encode_highest_rank(chunk, ranks):  # picks the latest-learned merge first
    parts = [bytes([b]) for b in chunk]
    while len(parts) > 1:
        cands = [(ranks[parts[i] + parts[i + 1]], i) for i in range(len(parts) - 1)
                 if parts[i] + parts[i + 1] in ranks]
        if not cands:
            break
        _, i = max(cands)
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
    return [ranks[p] for p in parts]


def encode_longest_match(chunk, ranks):  # greedy longest vocabulary entry from the left
    out, i = [], 0
    while i < len(chunk):
        for j in range(len(chunk), i, -1):
            if chunk[i:j] in ranks:
                out.append(ranks[chunk[i:j]])
                i = j
                break
    return out


@pytest.mark.parametrize("qid, name", [("q1", "count_pairs"), ("q2", "merge_pair"), ("q3", "encode_chunk")])
def test_the_worked_solution_keeps_its_points(qid, name):
    assert_keeps(EX, qid, SOL[name])


@pytest.mark.parametrize("qid, mutant, why", [
    ("q1", count_pairs_non_overlapping, "overlapping pairs counted once"),
    ("q1", count_pairs_as_set, "presence instead of counts"),
    ("q1", count_pairs_off_by_one, "the last pair missed"),
    ("q2", merge_overlapping, "'aaa' merged twice"),
    ("q2", merge_in_place, "the input list mutated"),
    ("q2", merge_drops_tail, "the unmerged last id dropped"),
    ("q3", encode_leftmost, "leftmost pair instead of the lowest rank"),
    ("q3", encode_highest_rank, "the latest merge first"),
    ("q3", encode_longest_match, "greedy longest match"),
])
def test_each_classic_mistake_loses_its_question(qid, mutant, why):
    assert_loses(EX, qid, mutant, why)
