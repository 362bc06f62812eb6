"""Exercise 1: each question's classic mistakes lose that question's points."""
import pytest

from servelab.grading import grade_question
from servelab.grading.hidden import ex01_request as ex
from mutants_common import lost


# ----------------------------------------------------------------- Q1 variants
def make_timing(*, tpot="right", itl_from_send=False, one_token_zero=False, check=True):
    def token_timing(sent_at, token_times):
        times = list(token_times)
        if check:
            if not times:
                raise ValueError("no tokens")
            if times[0] < sent_at or any(b < a for a, b in zip(times, times[1:])):
                raise ValueError("out of order")
        n = len(times)
        gaps = [b - a for a, b in zip(times, times[1:])]
        if itl_from_send:                      # the wait for the first token counted as a gap
            gaps = [times[0] - sent_at] + gaps
        if n == 1:
            pace = 0.0 if one_token_zero else None
        elif tpot == "right":
            pace = (times[-1] - times[0]) / (n - 1)
        elif tpot == "median_gap":             # the typical gap, not the average pace
            pace = sorted(gaps)[len(gaps) // 2] if len(gaps) % 2 else \
                (sorted(gaps)[len(gaps) // 2 - 1] + sorted(gaps)[len(gaps) // 2]) / 2
        elif tpot == "over_n":                 # n - 1 gaps, divided by n
            pace = (times[-1] - times[0]) / n
        else:                                  # "with_ttft": the queue and prefill folded in
            pace = (times[-1] - sent_at) / n
        return {"ttft": times[0] - sent_at, "tpot": pace, "itl": gaps}
    return token_timing


# ----------------------------------------------------------------- Q2 variants
def _held(text, stops):
    best = 0
    for s in stops:
        for k in range(len(s) - 1, best, -1):
            if text.endswith(s[:k]):
                best = k
                break
    return best


def make_streamer(*, holdback=True, search="all", flush=True, hold_all=False):
    def stream_with_stops(pieces, stops):
        text, shown, out = "", 0, []
        for piece in pieces:
            if shown is None:
                out.append("")
                continue
            before = len(text)
            text += piece
            if search == "all":
                hits = [i for s in stops if (i := text.find(s)) != -1]
            elif search == "list_order":       # the first stop in the list that matches
                hits = next(([text.find(s)] for s in stops if s in text), [])
            else:                              # only looks inside the new piece
                hits = [before + i for s in stops if (i := piece.find(s)) != -1]
            if hits:
                cut = max(min(hits), shown)
                out.append(text[shown:cut])
                shown = None
                continue
            if hold_all:
                safe = shown
            elif holdback == "piece":          # looks for a stop's start in the new piece only
                safe = max(len(text) - _held(piece, stops), shown)
            elif holdback:
                safe = max(len(text) - _held(text, stops), shown)
            else:
                safe = len(text)
            out.append(text[shown:safe])
            shown = safe
        if out and shown is not None and flush:
            out[-1] += text[shown:]
        return out
    return stream_with_stops


# ----------------------------------------------------------------- Q3 variants
def make_bill(*, mistake=None):
    def bill_conversation(usages, p_in, p_cached, p_out):
        if min(p_in, p_cached, p_out) < 0:
            raise ValueError("negative price")
        w = wo = 0.0
        previous = 0
        for u in usages:
            prompt, out = u["prompt_tokens"], u["completion_tokens"]
            if mistake == "keyerror":
                cached = u["prompt_tokens_details"]["cached_tokens"]
            else:
                cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
            if prompt < 0 or out < 0 or not 0 <= cached <= prompt:
                raise ValueError("bad usage")
            if mistake == "new_tokens_only":   # as if the server remembered the history
                prompt, cached, previous = prompt - previous, 0, prompt
            out_price = p_in if mistake == "output_at_input_price" else p_out
            if mistake == "double_count":      # cached tokens billed twice
                w += (prompt * p_in + cached * p_cached + out * out_price) / 1e6
            else:
                w += ((prompt - cached) * p_in + cached * p_cached + out * out_price) / 1e6
            wo += (prompt * p_in + out * out_price) / 1e6
        return (w, wo)
    return bill_conversation


def test_right_answers_pass():
    assert grade_question(ex.Q1, make_timing()).passed
    assert grade_question(ex.Q2, make_streamer()).passed
    assert grade_question(ex.Q3, make_bill()).passed


@pytest.mark.parametrize("kw", [dict(tpot="over_n"), dict(tpot="median_gap"), dict(tpot="with_ttft"), dict(itl_from_send=True),
                                dict(one_token_zero=True), dict(check=False)])
def test_q1_mistakes_lose_q1(kw):
    r = grade_question(ex.Q1, make_timing(**kw))
    assert lost(r), kw


@pytest.mark.parametrize("kw", [dict(holdback=False), dict(holdback="piece"),
                                dict(search="piece"), dict(search="list_order"), dict(flush=False),
                                dict(hold_all=True)])
def test_q2_mistakes_lose_q2(kw):
    r = grade_question(ex.Q2, make_streamer(**kw))
    assert lost(r), (kw, r.reason)


@pytest.mark.parametrize("mistake", ["double_count", "output_at_input_price", "new_tokens_only", "keyerror"])
def test_q3_mistakes_lose_q3(mistake):
    r = grade_question(ex.Q3, make_bill(mistake=mistake))
    assert lost(r), mistake


def test_the_engines_fixed_holdback_is_safe_but_not_the_asked_rule():
    """Holding max(len(stop)) - 1 characters never leaks a stop string (the property
    test passes) but is not what Q2 asks, so the exact cases catch it."""
    def fixed(pieces, stops):
        hold = max(len(s) for s in stops) - 1
        text, shown, out = "", 0, []
        for piece in pieces:
            if shown is None:
                out.append("")
                continue
            text += piece
            hits = [i for s in stops if (i := text.find(s)) != -1]
            if hits:
                out.append(text[shown:min(hits)])
                shown = None
                continue
            safe = max(len(text) - hold, shown)
            out.append(text[shown:safe])
            shown = safe
        if out and shown is not None:
            out[-1] += text[shown:]
        return out
    ex._stream_property_test(fixed)
    assert not grade_question(ex.Q2, fixed).passed
