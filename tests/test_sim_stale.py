"""The committed calibration belongs to this engine: an engine change comes with a refit (issue 26, item 2).

Instant: it reads source files and one JSON file; nothing runs.
"""
import json

from servelab.sim import calibrate as cal
from servelab.sim import fingerprint


def test_committed_calibration_is_of_this_engine():
    """data/sim/step_model.json records the engine code it timed. When this fails, the engine's
    step path changed since the fit: refit and commit it with the change."""
    meta = json.loads(cal.DEFAULT_STEP_MODEL.read_text()).get("meta", {})
    now = fingerprint.engine_fingerprint()
    assert meta.get("engine_fingerprint") == now, (
        f"the committed step model was fitted to engine code {meta.get('engine_fingerprint')!r}, the engine's "
        f"step path is now {now!r} ({', '.join(fingerprint.step_path_files())}): refit with "
        f"`python -m servelab.sim calibrate --quick --out data/sim/step_model.json` (about 3 minutes) "
        f"or `python benchmarks/bench_sim.py --calibration-only`")
