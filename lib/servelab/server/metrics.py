"""Server metrics in the Prometheus text format (``GET /metrics``).

Counters and histograms are updated by the engine thread and read by HTTP
handlers, under one lock. Names follow vLLM's (``vllm:`` becomes
``servelab:``): running and waiting requests, KV blocks in use, the
prefix-cache hit rate, time-to-first-token and inter-token histograms, and
tokens in and out.

Every request is counted once, by how it ended: ``request_success_total``
(finished: ``stop`` or ``length``), ``request_aborted_total`` (its client
left), ``request_failed_total`` (admitted, then ended by an error: the engine
failed, the server shut down, a bug) or ``request_rejected_total`` (refused
before it was admitted: a bad field, 429, 503).
"""
from __future__ import annotations

import bisect
import threading

__all__ = ["Histogram", "ServerMetrics", "TTFT_BUCKETS", "ITL_BUCKETS", "E2E_BUCKETS"]

#: Histogram bucket upper bounds in seconds (vLLM's TTFT and inter-token buckets).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
               120.0)
PREFIX = "servelab:"


class Histogram:
    """Cumulative buckets, a sum and a count (Prometheus semantics)."""

    def __init__(self, buckets):
        self.bounds = tuple(sorted(buckets))
        self.counts = [0] * (len(self.bounds) + 1)  # last = +Inf only
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str, help_text: str) -> list[str]:
        out = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
        cum = 0
        for bound, c in zip(self.bounds, self.counts):
            cum += c
            out.append(f'{name}_bucket{{le="{bound:g}"}} {cum}')
        out.append(f'{name}_bucket{{le="+Inf"}} {self.count}')
        out.append(f"{name}_sum {self.sum:.6f}")
        out.append(f"{name}_count {self.count}")
        return out


class ServerMetrics:
    """Everything ``/metrics`` reports. ``update_*`` calls come from the engine thread."""

    def __init__(self, kv_blocks_total: int):
        self.lock = threading.Lock()
        self.kv_blocks_total = kv_blocks_total
        self.num_running = 0
        self.num_waiting = 0
        self.kv_blocks_used = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.cached_prompt_tokens = 0       # prompt tokens served from the prefix cache
        self.scheduled_prompt_tokens = 0    # prompt tokens of admitted requests
        self.requests_finished: dict[str, int] = {}
        self.requests_rejected: dict[int, int] = {}  # HTTP status -> refused before admission
        self.requests_failed: dict[str, int] = {}    # error code -> admitted, then failed
        self.requests_aborted = 0                    # the client went away
        self.num_steps = 0
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)

    def update_engine(self, running: int, waiting: int, blocks_used: int, steps: int) -> None:
        with self.lock:
            self.num_running, self.num_waiting = running, waiting
            self.kv_blocks_used, self.num_steps = blocks_used, steps

    def record_tokens(self, n_new: int, itls=()) -> None:
        with self.lock:
            self.generation_tokens += n_new
            for gap in itls:
                self.itl.observe(gap)

    def record_first_token(self, ttft: float, prompt_tokens: int, cached_tokens: int) -> None:
        with self.lock:
            self.ttft.observe(ttft)
            self.scheduled_prompt_tokens += prompt_tokens
            self.cached_prompt_tokens += cached_tokens

    def record_finished(self, reason: str, prompt_tokens: int, e2e: float | None) -> None:
        if reason == "abort":  # an aborted request did not succeed
            self.record_aborted()
            return
        with self.lock:
            self.requests_finished[reason] = self.requests_finished.get(reason, 0) + 1
            self.prompt_tokens += prompt_tokens
            if e2e is not None:
                self.e2e.observe(e2e)

    def record_rejected(self, status: int) -> None:
        """A request refused before the engine admitted it."""
        with self.lock:
            self.requests_rejected[status] = self.requests_rejected.get(status, 0) + 1

    def record_failed(self, code: str | None) -> None:
        """An admitted request that ended with an error instead of its output."""
        code = code or "unknown"
        with self.lock:
            self.requests_failed[code] = self.requests_failed.get(code, 0) + 1

    def record_aborted(self) -> None:
        """A request whose client went away (its engine work was aborted)."""
        with self.lock:
            self.requests_aborted += 1

    @property
    def prefix_cache_hit_rate(self) -> float:
        s = self.scheduled_prompt_tokens
        return self.cached_prompt_tokens / s if s else 0.0

    def render(self) -> str:
        """The Prometheus text exposition."""
        p = PREFIX
        with self.lock:
            lines = []

            def gauge(name, value, help_text, kind="gauge"):
                lines.extend([f"# HELP {p}{name} {help_text}", f"# TYPE {p}{name} {kind}",
                              f"{p}{name} {value}"])

            gauge("num_requests_running", self.num_running, "Requests in the engine's running batch.")
            gauge("num_requests_waiting", self.num_waiting, "Requests queued for admission.")
            gauge("kv_cache_blocks_used", self.kv_blocks_used, "KV cache blocks held by requests.")
            gauge("kv_cache_blocks_total", self.kv_blocks_total, "KV cache blocks in the pool.")
            gauge("kv_cache_usage_perc", f"{self.kv_blocks_used / self.kv_blocks_total:.6f}",
                  "Share of KV cache blocks in use (0-1).")
            gauge("prefix_cache_hit_rate", f"{self.prefix_cache_hit_rate:.6f}",
                  "Share of admitted prompt tokens served from the prefix cache.")
            gauge("prompt_tokens_total", self.prompt_tokens, "Prompt tokens of finished requests.",
                  "counter")
            gauge("prompt_tokens_cached_total", self.cached_prompt_tokens,
                  "Prompt tokens served from the prefix cache.", "counter")
            gauge("generation_tokens_total", self.generation_tokens, "Tokens generated.", "counter")
            gauge("engine_steps_total", self.num_steps, "Engine steps run.", "counter")
            lines += [f"# HELP {p}request_success_total Finished requests by finish reason.",
                      f"# TYPE {p}request_success_total counter"]
            for reason, c in sorted(self.requests_finished.items()):
                lines.append(f'{p}request_success_total{{finished_reason="{reason}"}} {c}')
            gauge("request_aborted_total", self.requests_aborted,
                  "Requests aborted because their client went away.", "counter")
            lines += [f"# HELP {p}request_failed_total Admitted requests ended by an error, by error code.",
                      f"# TYPE {p}request_failed_total counter"]
            for code, c in sorted(self.requests_failed.items()):
                lines.append(f'{p}request_failed_total{{code="{code}"}} {c}')
            lines += [f"# HELP {p}request_rejected_total Requests refused before admission, by HTTP status.",
                      f"# TYPE {p}request_rejected_total counter"]
            for status, c in sorted(self.requests_rejected.items()):
                lines.append(f'{p}request_rejected_total{{status="{status}"}} {c}')
            lines += self.ttft.lines(f"{p}time_to_first_token_seconds",
                                     "Time to first token (server arrival to first token).")
            lines += self.itl.lines(f"{p}inter_token_latency_seconds",
                                    "Time between consecutive output tokens.")
            lines += self.e2e.lines(f"{p}e2e_request_latency_seconds",
                                    "Arrival to last token.")
        return "\n".join(lines) + "\n"
