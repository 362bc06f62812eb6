"""servelab.sim: a discrete-event simulator of serving replicas, checked against the engine.

* :mod:`~servelab.sim.workload` - request streams (now :mod:`servelab.workload`, re-exported).
* :mod:`~servelab.sim.step_model` - step time: fitted to the engine, or a roofline on registry chips.
* :mod:`~servelab.sim.core` - one replica: admission, policies, chunked prefill, preemption, prefix cache.
* :mod:`~servelab.sim.pools` - many replicas, disaggregated prefill and decode pools.
* :mod:`~servelab.sim.metrics` - TTFT, TPOT, inter-token gaps, goodput, utilisation.
* :mod:`~servelab.sim.calibrate` - run the real engine on a trace, fit, compare (imports torch lazily).
* :mod:`~servelab.sim.sweep` - the calibration's pieces (the shapes serving produces), residuals by feature.
* :mod:`~servelab.sim.check` - this machine's cached calibration; the check beside the engine's spread.
* :mod:`~servelab.sim.fingerprint` - which engine code and which machine a calibration belongs to.

Command line: ``python -m servelab.sim check --trace FILE.jsonl`` and
``python -m servelab.sim calibrate [--quick]``.
"""
from servelab.sim.core import POLICIES, ReplicaConfig, simulate
from servelab.sim.pools import ROUTERS, DisaggregatedResult, simulate_disaggregated, simulate_pool
from servelab.sim.metrics import PERCENTILES, SimResult, weighted_percentile
from servelab.sim.profiled import ProfiledStepModel
from servelab.sim.fit import fit_by_kind, fit_linear
from servelab.sim.step_model import (FEATURES, KindStepModel, LinearStepModel, RooflineStepModel, StepModel, StepShape,
                                     step_model_from_dict)
from servelab.sim.workload import (Exponential, Fixed, LogNormal, Mixture, Trace, Uniform, load_trace,
                                   save_trace, synthetic)

__all__ = ["ROUTERS", "DisaggregatedResult", "simulate_disaggregated", "simulate_pool", "POLICIES", "ReplicaConfig", "simulate", "PERCENTILES", "SimResult", "weighted_percentile",
           "FEATURES", "KindStepModel", "ProfiledStepModel", "fit_by_kind", "LinearStepModel", "RooflineStepModel", "StepModel", "StepShape", "fit_linear",
           "step_model_from_dict", "Exponential", "Fixed", "LogNormal", "Mixture", "Trace", "Uniform",
           "load_trace", "save_trace", "synthetic"]
