"""servelab.engine.stop: the one stop-string rule set (engine, generate, plain streaming).

Issue 23: with ``min_tokens``, a stop string that was whole before ``min_tokens``
tokens existed must not end the sequence later (vLLM looks only at stop strings
that end in the new text), and above all must never cut text already streamed.
The holdback is the longest tail that could start a stop string, one rule for the
engine and for :func:`holdback_stream`.
"""
from servelab.engine.stop import StopChecker, StopStringStreamer, holdback_stream
from servelab.sampling import SamplingParams

from test_engine_stops import Letters, run_script


def test_a_stop_string_whole_before_min_tokens_never_cuts_streamed_text():
    # 'a b g a b ...': "ab" is whole at token 2, before min_tokens=3; the engine streamed "a"
    script = [0, 1, 6]
    out, streamed = run_script(script, Letters(), SamplingParams(temperature=0, max_tokens=8,
                                                                 stop=["ab"], min_tokens=3))
    shown = "".join(o.delta_text for o in streamed)
    assert out.text.startswith(shown), (shown, out.text)
    # the next "ab" (tokens 4-5, after min_tokens) is the one that stops it
    assert out.text == "abg" and out.outputs[0].stop_reason == "ab"


def test_the_checker_looks_only_at_stop_strings_ending_in_new_text():
    c = StopChecker(SamplingParams(max_tokens=8, stop=["ab"], min_tokens=3))
    assert c.check_text("a", 0, 1) is None and c.check_text("ab", 0, 2) is None
    assert c.check_text("abg", 1, 3) is None  # today's code found the old "ab" at 0: cut "a"
    assert c.check_text("abga", 2, 4) is None
    assert c.check_text("abgab", 3, 5) == (3, "ab")


def test_holdback_is_the_longest_tail_that_starts_a_stop_string():
    c = StopChecker(SamplingParams(max_tokens=8, stop=["\n\nUser:", "XYZ"]))
    for text, held in [("Sure", 0), ("Sure\n", 1), ("Sure\n\nUs", 4), ("Sure\n\nUsX", 1),
                       ("Sure\n\nUsXY", 2), ("Sure\n\nUsXYq", 0)]:
        assert c.check_text(text, 0, 1) is None
        assert c.holdback == held, text
    kept = StopChecker(SamplingParams(max_tokens=8, stop=["XYZ"], include_stop_str_in_output=True))
    kept.check_text("aXY", 0, 1)
    assert kept.holdback == 0  # the stop string is shown anyway


def test_a_long_stop_string_costs_time_in_the_new_text_only():
    """The holdback's matcher walks each new character once, not the whole text again
    (counted, not timed: 2,000 calls under a 100,000-character stop string)."""

    class Counted(str):  # records every slice the checker takes of the text it is given
        walked: list = []

        def __getitem__(self, key):
            part = str.__getitem__(self, key)
            if isinstance(key, slice):
                Counted.walked.append(len(part))
            return part

    stop = "ab" * 50_000
    c = StopChecker(SamplingParams(max_tokens=8, stop=[stop]))
    text = ""
    for _ in range(2_000):
        text += "ab"
        c.check_text(Counted(text), len(text) - c.holdback, 1)
    assert c.holdback == len(text)
    assert sum(Counted.walked) == len(text) and max(Counted.walked) == 2


def test_holdback_stream_is_the_checker_over_pieces():
    assert holdback_stream(["Sure", ", here", " it is.\n\nUs", "er: thanks"], ["\n\nUser:"]) == \
        ["Sure", ", here", " it is.", ""]
    st = StopStringStreamer(["XY"])
    assert st.push("aX") == "a" and st.push("b") == "Xb" and st.push("XY") == "" and st.stopped == "XY"
