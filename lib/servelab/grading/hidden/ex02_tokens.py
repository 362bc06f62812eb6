"""Exercise 2 · Tokens: byte-pair encoding by hand. Hidden tests.

Expected values come from :mod:`servelab.bpe` (``count_pairs``, ``merge_pair``,
``bpe_encode_chunk``), so the exercise and the library can never disagree.
"""
import random

from servelab import bpe
from servelab.grading import Case, Question


def _pairs(ids):
    return bpe.count_pairs(list(ids))


_rng = random.Random(2)
_RANDOM_IDS = [_rng.randrange(4) for _ in range(300)]

Q1 = Question(
    id="q1", title="Count adjacent pairs", function="count_pairs", points=2, level="easy", minutes=5,
    visible=[Case(args=([1, 2, 3, 1, 2],), expected={(1, 2): 2, (2, 3): 1, (3, 1): 1})],
    hidden=[
        Case(args=([],), expected={}, label="an empty list"),
        Case(args=([7],), expected={}, label="one id"),
        Case(args=([1, 1, 1, 1],), expected={(1, 1): 3}, label="'aaaa': overlapping pairs all count"),
        Case(args=(list(b"hello"),), expected=_pairs(b"hello"), label="the bytes of 'hello'"),
        Case(args=((5, 6, 5, 6),), expected={(5, 6): 2, (6, 5): 1}, label="a tuple"),
        Case(args=(_RANDOM_IDS,), expected=_pairs(_RANDOM_IDS), label="300 random ids"),
    ],
)


def _merge(ids, pair, new_id):
    return bpe.merge_pair(list(ids), pair, new_id)


def _does_not_mutate(merge_pair):
    ids = [1, 2, 1, 2]
    merge_pair(ids, (1, 2), 9)
    assert ids == [1, 2, 1, 2], "merge_pair changed the list it was given; return a new list"


Q2 = Question(
    id="q2", title="Apply one merge", function="merge_pair", points=3, level="easy", minutes=8,
    visible=[Case(args=([1, 2, 3, 1, 2], (1, 2), 256), expected=[256, 3, 256])],
    hidden=[
        Case(args=([], (1, 2), 256), expected=[], label="an empty list"),
        Case(args=([1], (1, 1), 256), expected=[1], label="one id"),
        Case(args=([1, 1, 1, 1], (1, 1), 9), expected=[9, 9], label="'aaaa' -> two merges"),
        Case(args=([1, 1, 1], (1, 1), 9), expected=[9, 1], label="'aaa': left to right, no overlap"),
        Case(args=([3, 4, 5], (1, 2), 9), expected=[3, 4, 5], label="the pair is absent"),
        Case(args=([2, 1, 1, 2], (1, 2), 9), expected=[2, 1, 9], label="the pair at the end"),
        Case(args=([1, 2, 2, 1], (2, 1), 9), expected=[1, 2, 9], label="the reversed pair only"),
        Case(args=(_RANDOM_IDS, (0, 1), 99), expected=_merge(_RANDOM_IDS, (0, 1), 99), label="300 random ids"),
    ],
    test=_does_not_mutate,
)


def _byte_ranks(**extra: int) -> dict:
    ranks = {bytes([b]): b for b in range(256)}
    ranks.update({k.encode(): v for k, v in extra.items()})
    return ranks


_ABC = _byte_ranks(ab=256, bc=257, abc=258)
_AAAA = _byte_ranks(aa=256, aaaa=257)
_LATE_LEFT = _byte_ranks(xy=300, yz=256)            # the lower rank is not the leftmost pair
_TIE_FREE = _byte_ranks(aa=256, ab=257, ba=258)


def _course_ranks() -> dict:
    return bpe.load_course_tokenizer().mergeable_ranks


def _expected(chunk: bytes, ranks: dict) -> list[int]:
    return [ranks[p] for p in bpe.bpe_encode_chunk(chunk, ranks)]


def _course_cases():
    ranks = _course_ranks()
    cases = []
    for text in ["    return", " tokenizer", " the", "\n\n", "é", "世界", "1234"]:
        chunk = text.encode("utf-8")
        cases.append(Case(args=(chunk, ranks), expected=_expected(chunk, ranks),
                          label=f"{chunk!r}, the course tokenizer's ranks"))
    return cases


Q3 = Question(
    id="q3", title="Encode a chunk with given ranks", function="encode_chunk", points=5, level="medium",
    minutes=15,
    visible=[Case(args=(b"abcd", _ABC), expected=[258, 100], label="b'abcd', ranks ab=256 bc=257 abc=258")],
    hidden=[
        Case(args=(b"", _ABC), expected=[], label="an empty chunk"),
        Case(args=(b"a", _ABC), expected=[97], label="one byte"),
        Case(args=(b"aaaa", _AAAA), expected=[257], label="b'aaaa', ranks aa=256 aaaa=257"),
        Case(args=(b"aaa", _AAAA), expected=[256, 97], label="b'aaa': the leftmost 'aa' merges first"),
        Case(args=(b"xyz", _LATE_LEFT), expected=[120, 256], label="b'xyz': the lowest rank wins, not the left pair"),
        Case(args=(b"abab", _TIE_FREE), expected=[257, 257], label="b'abab', ranks aa ab ba"),
        Case(args=(b"bca", _ABC), expected=[257, 97], label="b'bca'"),
        Case(args=(b"zzz", _ABC), expected=[122, 122, 122], label="no merge applies"),
        *_course_cases(),
    ],
)

QUESTIONS = [Q1, Q2, Q3]
