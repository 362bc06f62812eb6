"""fleet.shed(policy="drop_lowest") drops batch before interactive traffic.

Found by the cold read of chapter 22: the old sliding window let batch requests
in while interactive ones were turned away (interactive alone filled the
capacity, yet a third of it was dropped and a third of batch kept). Now an
allowance refilled at the capacity admits batch only above a reserve, so
interactive work within the capacity is never dropped for batch.
"""
import numpy as np
import pytest

from servelab import fleet
from servelab.sim import Fixed, synthetic


def _trace():
    return synthetic(2000, 40, prompt=Fixed(200), output=Fixed(300), seed=2)  # 20,000 tokens/s


@pytest.mark.parametrize("capacity", [10_000, 15_000])
def test_drop_lowest_keeps_interactive_within_capacity(capacity):
    tr = _trace()
    pri = (np.arange(len(tr)) % 2).astype(int)        # interactive alone: 10,000 tokens/s
    keep, out = fleet.shed(tr, capacity, priority=pri)
    assert keep[pri == 0].mean() >= 0.98               # interactive fits: (almost) all kept
    assert keep[pri == 1].mean() < keep[pri == 0].mean()
    assert np.array_equal(out, tr.output_tokens)       # dropping never edits answers
    work = (tr.prompt_tokens + tr.output_tokens)[keep].sum()
    assert work <= capacity * (tr.duration_s + 10.0) + 1   # the capacity plus one bucket


def test_batch_takes_what_interactive_leaves():
    tr = _trace()
    pri = (np.arange(len(tr)) % 2).astype(int)
    keep, _ = fleet.shed(tr, 15_000, priority=pri)      # 5,000 tokens/s left for batch
    kept_batch = (tr.prompt_tokens + tr.output_tokens)[keep & (pri == 1)].sum() / tr.duration_s
    assert 3_000 < kept_batch < 8_000


def test_cap_output_fits_the_capacity_and_keeps_everyone():
    tr = _trace()
    keep, out = fleet.shed(tr, 10_000, policy="cap_output", min_output=16)
    assert keep.all() and out.min() >= 16 and out.max() <= 300
    served = (tr.prompt_tokens + out).sum()
    assert served <= 10_000 * (tr.duration_s + 10.0) + 16 * len(tr)


def test_shed_rejects_bad_settings():
    tr = _trace()
    with pytest.raises(ValueError, match="batch_reserve"):
        fleet.shed(tr, 10_000, batch_reserve=1.0)
    with pytest.raises(ValueError, match="capacity"):
        fleet.shed(tr, 0)


def test_output_weight_counts_decode_tokens_as_dearer_work():
    """A decode token costs several prompt tokens of chip time (chapter 24's ratio)."""
    tr = _trace()
    pri = (np.arange(len(tr)) % 2).astype(int)
    alike, _ = fleet.shed(tr, 10_000, priority=pri)
    dear, _ = fleet.shed(tr, 10_000, priority=pri, output_weight=4.0)
    assert dear.sum() < alike.sum()                    # the same capacity holds fewer requests
    keep, out = fleet.shed(tr, 10_000, policy="cap_output", output_weight=4.0, min_output=16)
    work = (tr.prompt_tokens + 4.0 * out).sum()
    assert keep.all() and work <= 10_000 * (tr.duration_s + 10.0) + 4.0 * 16 * len(tr)
    with pytest.raises(ValueError, match="output_weight"):
        fleet.shed(tr, 10_000, output_weight=0)
