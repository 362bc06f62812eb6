"""What a simulated run measured: latency percentiles, goodput, utilisation.

* TTFT - arrival to first token (queueing included).
* TPOT - per request, (finish - first token) / (output tokens - 1): the mean
  gap between its tokens after the first.
* ITL - the inter-token gaps themselves (every decode step's duration, once per
  row it served), so a long prefill that stalls everyone shows in its tail.
* E2E - arrival to last token.
Percentiles are :func:`servelab.workload.percentile`'s (linear interpolation, numpy's
default): the load generator's and the engine benchmark's too.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from servelab.workload import PERCENTILES, percentile

__all__ = ["SimResult", "PERCENTILES", "weighted_percentile"]


def weighted_percentile(values, weights, q: float) -> float:
    """The q-th percentile of ``values`` repeated ``weights`` times (linear interpolation)."""
    v = np.asarray(values, dtype=float)
    w = np.asarray(weights, dtype=float)
    if v.size == 0 or w.sum() <= 0:
        return float("nan")
    order = np.argsort(v, kind="stable")
    v, w = v[order], w[order]
    cum = np.cumsum(w)
    total = cum[-1]
    # position of the q-th percentile among total items, 0-based, as numpy's 'linear'
    pos = (total - 1) * q / 100.0
    lo = np.searchsorted(cum, np.floor(pos) + 1)
    hi = np.searchsorted(cum, np.ceil(pos) + 1)
    frac = pos - np.floor(pos)
    return float(v[min(lo, len(v) - 1)] * (1 - frac) + v[min(hi, len(v) - 1)] * frac)


@dataclass
class SimResult:
    arrival_s: np.ndarray
    first_token_s: np.ndarray
    finish_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    preemptions: np.ndarray
    cached_tokens: np.ndarray
    gap_first: np.ndarray
    gap_last: np.ndarray
    gap_steps: np.ndarray
    gap_rows: np.ndarray
    busy_s: float
    num_steps: int
    num_preemptions: int
    timeline_t: np.ndarray
    timeline_waiting: np.ndarray
    timeline_running: np.ndarray
    timeline_blocks: np.ndarray
    max_blocks: int
    num_kv_blocks: int
    prefilled: np.ndarray = field(default=None)

    def __len__(self) -> int:
        return len(self.arrival_s)

    # -- per request ------------------------------------------------------
    @property
    def ttft(self) -> np.ndarray:
        """Seconds from arrival to first token (NaN for prefilled requests)."""
        return self.first_token_s - self.arrival_s

    @property
    def e2e(self) -> np.ndarray:
        return self.finish_s - self.arrival_s

    @property
    def tpot(self) -> np.ndarray:
        """Mean seconds per output token after the first (requests with > 1 token)."""
        many = self.output_tokens > 1
        first = self.first_token_s
        if self.prefilled is not None and self.prefilled.any():
            raise ValueError("prefilled requests have no first-token time here; use decode_tpot")
        return (self.finish_s[many] - first[many]) / (self.output_tokens[many] - 1)

    @property
    def makespan_s(self) -> float:
        return float(np.nanmax(self.finish_s) - self.arrival_s[0])

    def itl_samples(self, points_per_run: int = 8) -> tuple[np.ndarray, np.ndarray]:
        """Inter-token gaps as (values, weights): each decode run spread over a few points."""
        k = self.gap_steps
        m = np.minimum(k, points_per_run)
        reps = np.repeat(np.arange(len(k)), m)
        idx = np.arange(len(reps)) - np.repeat(np.cumsum(m) - m, m)
        frac = np.where(np.repeat(m, m) > 1, idx / np.maximum(np.repeat(m, m) - 1, 1), 0.0)
        vals = self.gap_first[reps] + (self.gap_last[reps] - self.gap_first[reps]) * frac
        w = (self.gap_rows[reps] * self.gap_steps[reps]) / np.repeat(m, m)
        return vals, w

    def itl_percentile(self, q: float) -> float:
        v, w = self.itl_samples()
        return weighted_percentile(v, w, q)

    # -- summaries ------------------------------------------------------------
    def percentiles(self, metric: str, qs=PERCENTILES) -> dict[int, float]:
        if metric == "itl":
            return {q: self.itl_percentile(q) for q in qs}
        values = {"ttft": self.ttft, "tpot": self.tpot, "e2e": self.e2e}.get(metric)
        if values is None:
            raise ValueError(f"unknown metric {metric!r}; choose ttft, tpot, itl or e2e")
        values = values[np.isfinite(values)]
        if values.size == 0:
            return {q: float("nan") for q in qs}
        values = np.sort(values)
        return {q: percentile(values, q) for q in qs}

    def summary(self, qs=PERCENTILES) -> dict:
        out = {f"{m}_p{q}": v for m in ("ttft", "tpot", "itl", "e2e") for q, v in self.percentiles(m, qs).items()}
        out.update(requests=len(self), throughput_rps=self.throughput_rps,
                   output_tokens_per_s=self.output_tokens_per_s, utilisation=self.utilisation,
                   preemptions=self.num_preemptions, steps=self.num_steps,
                   max_kv_share=self.max_blocks / self.num_kv_blocks,
                   mean_waiting=float(self.timeline_waiting.mean()) if len(self.timeline_waiting) else 0.0)
        return out

    @property
    def throughput_rps(self) -> float:
        return len(self) / self.makespan_s if self.makespan_s > 0 else float("inf")

    @property
    def output_tokens_per_s(self) -> float:
        return float(self.output_tokens.sum()) / self.makespan_s if self.makespan_s > 0 else float("inf")

    @property
    def utilisation(self) -> float:
        """Share of the run's wall time the replica was computing a step."""
        return self.busy_s / self.makespan_s if self.makespan_s > 0 else 1.0

    def goodput(self, ttft_slo_s: float, tpot_slo_s: float | None = None) -> float:
        """Requests per second that met the SLO (TTFT, and TPOT if given)."""
        ok = self.ttft <= ttft_slo_s
        if tpot_slo_s is not None:
            many = self.output_tokens > 1
            tp = np.zeros(len(self))
            tp[many] = (self.finish_s[many] - self.first_token_s[many]) / (self.output_tokens[many] - 1)
            ok &= tp <= tpot_slo_s
        return float(ok.sum()) / self.makespan_s if self.makespan_s > 0 else float("inf")

    def slo_attainment(self, ttft_slo_s: float, tpot_slo_s: float | None = None) -> float:
        """Share of requests meeting the SLO."""
        return self.goodput(ttft_slo_s, tpot_slo_s) * self.makespan_s / len(self)
