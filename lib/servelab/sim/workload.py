"""Request streams for the simulator: now :mod:`servelab.workload` (one module for lengths,
arrivals, traces and percentiles, shared with the load generator and the engine benchmark).
This path re-exports it."""
from servelab.workload import (Exponential, Fixed, LogNormal, Mixture, Trace, Uniform, _as_dist,  # noqa: F401
                               gamma_arrivals, load_trace, parse_length, poisson_arrivals, save_trace, synthetic,
                               trace_prompts)

__all__ = ["Trace", "Fixed", "LogNormal", "Exponential", "Uniform", "Mixture", "synthetic",
           "poisson_arrivals", "gamma_arrivals", "load_trace", "save_trace", "parse_length", "trace_prompts"]
