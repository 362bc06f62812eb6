"""servelab.workload: one module for lengths, arrivals, traces and percentiles, and the old
paths (servelab.sim.workload, servelab.engine.workload, servelab.loadgen) still lead to it."""
import random

import numpy as np
import pytest

from servelab import loadgen, workload
from servelab.engine import workload as engine_workload
from servelab.sim import metrics, replay
from servelab.sim import workload as sim_workload


def test_one_definition_behind_every_old_path():
    assert sim_workload.Trace is workload.Trace and sim_workload.load_trace is workload.load_trace
    assert engine_workload.percentile is workload.percentile
    assert engine_workload.mixed_workload is workload.mixed_workload
    assert loadgen.percentiles is workload.percentiles and loadgen.arrival_times is workload.arrival_times
    assert replay.trace_prompts is workload.trace_prompts
    assert metrics.PERCENTILES is workload.PERCENTILES


@pytest.mark.parametrize("spec", ["fixed:7", "uniform:3:9", "lognormal:100:0.5", "exponential:50"])
def test_draw_and_sample_agree_in_distribution(spec):
    d = workload.parse_length(spec)
    one = [d.draw(random.Random(1)) for _ in range(1)] + [d.draw(r) for r in [random.Random(2)] for _ in range(3000)]
    many = d.sample(np.random.default_rng(0), 3000)
    assert min(one) >= 1 and many.min() >= 1
    assert np.median(one) == pytest.approx(np.median(many), rel=0.1)


def test_percentile_is_numpys_linear_on_lists_and_arrays():
    xs = np.random.default_rng(0).random(41)
    for q in (0, 5, 50, 95, 99, 100):
        assert workload.percentile(xs, q) == pytest.approx(np.percentile(xs, q), rel=1e-12)
        assert workload.percentile(xs.tolist(), q) == workload.percentile(xs, q)
    p = workload.percentiles([3.0, None, 1.0, 2.0])
    assert p["n"] == 3 and p["p50"] == 2.0 and p["mean"] == 2.0
    with pytest.raises(ValueError, match="empty"):
        workload.percentile([], 50)
    with pytest.raises(ValueError, match="0, 100"):
        workload.percentile([1.0], 101)


def test_trace_keeps_its_prompts_through_sorting_and_subsets(tmp_path):
    tr = workload.Trace([0.3, 0.1], [3, 2], [1, 1], prompts=[[1, 2, 3], [4, 5]])
    assert tr.prompts == [[4, 5], [1, 2, 3]]
    assert tr.subset(slice(1, 2)).prompts == [[1, 2, 3]]
    back = workload.load_trace(workload.save_trace(tr, tmp_path / "t.jsonl"))
    assert back.prompts == tr.prompts and workload.trace_prompts(back, 50) == tr.prompts
