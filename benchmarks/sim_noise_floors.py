"""The judge's own noise of every saved simulator check: for each commit that saved held-out
engine runs (``data/sim/calibration_runs.json`` in git), what a perfect simulator would score
against their medians (:func:`servelab.sim.check.noise_floor`).

    .venv/bin/python benchmarks/sim_noise_floors.py [--out FILE.json]

The history in ``benchmarks/results/sim.json`` carries these (``noise_floor``, matched by the
engine commit the runs were measured at); on the 120-request families they ran 8-18%.
"""
from __future__ import annotations

import argparse
import json
import subprocess
from collections import defaultdict
from pathlib import Path

from servelab.sim import calibrate as cal
from servelab.sim import check

ROOT = Path(__file__).resolve().parents[1]
RUNS = "data/sim/calibration_runs.json"


def floors(goal_worst: float = 0.15) -> dict:
    """``{engine commit: noise_floor(...) and the commit that saved the runs}``, newest first."""
    out = {}
    git = ["git", "-C", str(ROOT)]
    for c in subprocess.run(git + ["log", "--format=%h", "--", RUNS], capture_output=True, text=True).stdout.split():
        try:
            saved = json.loads(subprocess.run(git + ["show", f"{c}:{RUNS}"], capture_output=True, text=True).stdout)
        except json.JSONDecodeError:
            continue
        by_family = defaultdict(list)
        for d in saved.get("held_out") or []:
            run = cal.EngineRun.from_dict(d)
            by_family[cal.piece_of(run.label)].append(run.percentiles())
        if not by_family or min(len(v) for v in by_family.values()) < 2:
            continue
        checks = [check.SpreadCheck(k, v, v[0]) for k, v in by_family.items()]
        engine_commit = cal.EngineRun.from_dict(saved["held_out"][0]).info.get("git_commit")
        out.setdefault(engine_commit, {"saved_at": c, "runs": len(checks[0].runs),
                                       **check.noise_floor(checks, goal_worst)})
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="also write the table as JSON here")
    a = p.parse_args(argv)
    got = floors()
    for commit, f in got.items():
        print(f"{commit}: {f['runs']} runs a family, expected worst {f['expected_worst']:.1%} "
              f"(90th percentile {f['worst_p90']:.1%}), over 15% in {f['p_over_goal']:.0%}")
    if a.out:
        Path(a.out).write_text(json.dumps(got, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
