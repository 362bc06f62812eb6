"""servelab.timing: the library's one timer (warm-up, repeats, median or minimum, device sync)."""
import subprocess
import sys

import pytest

from servelab import timing


def test_calls_are_warmed_up_then_timed_and_before_runs_untimed_ahead_of_each():
    events = []
    times = timing.call_seconds(lambda: events.append("call"), 3, warmup=2, before=lambda: events.append("before"))
    assert len(times) == 3 and all(t >= 0 for t in times)
    assert events == ["call", "call"] + ["before", "call"] * 3


def test_median_and_minimum_of_the_same_times(monkeypatch):
    def fake_clock(ticks):  # perf_counter read at the start and the end of each call
        samples = iter(ticks)
        return lambda: next(samples)
    ticks = [0.0, 3.0, 3.0, 4.0, 4.0, 9.0, 9.0, 10.0]
    monkeypatch.setattr(timing.time, "perf_counter", fake_clock(ticks))
    assert timing.call_seconds(lambda: None, 4, warmup=0) == [3.0, 1.0, 5.0, 1.0]
    monkeypatch.setattr(timing.time, "perf_counter", fake_clock(ticks))
    assert timing.time_call(lambda: None, 4, warmup=0) == 2.0
    monkeypatch.setattr(timing.time, "perf_counter", fake_clock(ticks))
    assert timing.time_call(lambda: None, 4, warmup=0, statistic="min") == 1.0


@pytest.mark.parametrize("kwargs,match", [
    ({"statistic": "mean"}, "statistic"), ({"clock": "gpu"}, "clock"), ({"repeats": 0}, "repeats"),
    ({"device": "mps"}, "'cpu' or 'cuda'"),
])
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        timing.time_call(lambda: None, **{"repeats": 1, **kwargs})


def test_timing_on_the_cpu_loads_no_torch():
    code = ("import sys; from servelab.timing import time_call; "
            "time_call(lambda: None, 2, statistic='min', clock='cpu'); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
