"""Exercise 19: each question's classic mistakes, as mutants of the worked solution.

Every mutant is the solution notebook's code with one small edit (the mistake a
candidate makes); the hidden tests must take that question's points away and leave
the other questions' points alone. Graded in-process through the hidden module's
questions, so this file runs in about a second.
"""
import numpy as np
import pytest
import torch

from mutants_common import SolutionMutants, assert_keeps, assert_loses, solution_functions
from servelab import quant
from servelab.grading.hidden import ex19_quantization as hidden

EX = "ex19_quantization"


_mutant = SolutionMutants(EX).functions


def test_the_solution_scores_every_question():
    fns = solution_functions(EX)
    for qid, name in (("q1", "int4_roundtrip"), ("q2", "bits_per_weight"), ("q3", "step_time_ms"),
                      ("q4", "choose_formats")):
        assert_keeps(EX, qid, fns[name])


@pytest.mark.parametrize("old,new,why", [
    ("np.abs(g).max(axis=1, keepdims=True) / 7", "np.abs(g).max(axis=1, keepdims=True) / 8",
     "range off by one: scale = max/8 clips +max to 7"),
    ("np.abs(g).max(axis=1, keepdims=True) / 7", "g.max(axis=1, keepdims=True) / 7",
     "max of w instead of max of |w|"),
    ("np.abs(g).max(axis=1, keepdims=True) / 7", "np.abs(w).max() / 7 + 0 * g[:, :1]",
     "one scale for the whole list instead of per group"),
    ("np.clip(np.round(g / safe), -8, 7)", "np.clip(np.floor(g / safe), -8, 7)",
     "truncating instead of rounding"),
    ("np.clip(np.round(g / safe), -8, 7)",
     "np.clip(np.sign(g) * np.floor(np.abs(g / safe) + 0.5), -8, 7)",
     "rounding halves away from zero instead of to even"),
])
def test_q1_mutants(old, new, why):
    fns = _mutant(old, new)
    assert_loses(EX, "q1", fns["int4_roundtrip"], why)
    assert_keeps(EX, "q2", fns["bits_per_weight"])
    assert_keeps(EX, "q3", fns["step_time_ms"])


@pytest.mark.parametrize("old,new,why", [
    ("return element_bits + scale_bits / group", "return element_bits", "forgetting the scales' bits"),
    ("return element_bits + scale_bits / group", "return element_bits + scale_bits",
     "charging the whole scale to every weight"),
    ("return element_bits + scale_bits / group", "return (element_bits + scale_bits / group) / 8",
     "bytes instead of bits"),
])
def test_q2_mutants(old, new, why):
    fns = _mutant(old, new)
    assert_loses(EX, "q2", fns["bits_per_weight"], why)
    assert_keeps(EX, "q1", fns["int4_roundtrip"])


@pytest.mark.parametrize("old,new,why", [
    ("weight_bytes = params * bits_per_weight / 8", "weight_bytes = params * bits_per_weight",
     "step time using bits, not bytes"),
    ("(bandwidth_gb_s * 1e9) * 1e3 + overhead_ms", "(bandwidth_gb_s * 2**30) * 1e3 + overhead_ms",
     "GiB instead of GB"),
    ("(bandwidth_gb_s * 1e9) * 1e3 + overhead_ms", "(bandwidth_gb_s * 1e9) * 1e3",
     "dropping the overhead"),
    ("(bandwidth_gb_s * 1e9) * 1e3 + overhead_ms", "(bandwidth_gb_s * 1e9) + overhead_ms / 1e3",
     "seconds instead of milliseconds"),
])
def test_q3_mutants(old, new, why):
    fns = _mutant(old, new)
    assert_loses(EX, "q3", fns["step_time_ms"], why)
    assert_keeps(EX, "q2", fns["bits_per_weight"])



@pytest.mark.parametrize("old,new,why", [
    ("values_per_token = 2 * layers", "values_per_token = layers", "a key but no value per KV head"),
    ("return element_bits + (scale_bits / group if group else 0)", "return element_bits",
     "formats without their scales"),
    ("loss = w[3] + kv[3] ", "loss = max(w[3], kv[3]) ", "the larger loss instead of the sum"),
    ("choice = (loss, used, w_name, kv_name)", "choice = (used, loss, w_name, kv_name)",
     "the smallest footprint instead of the least loss"),
    ("if best is None or choice < best:", "if best is None or choice[0] < best[0]:",
     "a tie goes to whichever pair came first"),
    ("used = params * bits(w) / 8 + seats * context", "used = params * bits(w) / 8 + context",
     "one seat's cache instead of every seat's"),
    ("if used > card_bytes:", "if used >= card_bytes:", "a pair that fills the card to the byte does not fit"),
    ("if best is None or choice < best:", "if best is None or choice[:2] < best[:2]:",
     "a tie on loss and bytes goes to whichever pair came first, not the names"),
])
def test_q4_mutants(old, new, why):
    fns = _mutant(old, new)
    assert_loses(EX, "q4", fns["choose_formats"], why)
    assert_keeps(EX, "q2", fns["bits_per_weight"])

def test_reference_matches_the_library_when_scales_are_exact_in_bf16():
    # groups whose max |w| is 7 x a power of two: the scale is a power of two, exact in bf16
    rng = np.random.default_rng(0)
    base = 7 * 2.0 ** -np.arange(3, 7)
    w = rng.uniform(-0.9, 0.9, size=(4, 32)) * base[:, None]
    w[:, 0] = base
    lib = quant.fake_quantize(torch.tensor(w, dtype=torch.float32), "int4-g32").double().numpy()
    ref = np.array(hidden._int4_ref(w.reshape(-1).tolist(), 32)).reshape(4, 32)
    assert np.allclose(lib, ref, rtol=0, atol=1e-6)


def test_a_float32_answer_keeps_q1():
    """Quantization code runs in float32; the same algorithm must not lose the points to float64 digits."""
    fns = _mutant("w = np.asarray(weights, dtype=np.float64)", "w = np.asarray(weights, dtype=np.float32)")
    assert_keeps(EX, "q1", fns["int4_roundtrip"])


def test_hidden_bits_come_from_the_library():
    assert hidden.Q2.visible[0].expected == quant.bits_per_weight("int4-g128") == 4.125
