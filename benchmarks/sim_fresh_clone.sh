#!/bin/bash
# Issue 26's "done when", literally: a fresh clone of this repository, `python -m servelab.sim
# calibrate --quick` (a calibration cache of its own), then `python -m servelab.sim check` on each
# committed held-out family (data/sim/traces, 5 engine runs each). About 18 minutes on 2 vCPUs.
# Usage: benchmarks/sim_fresh_clone.sh [OUT_DIR]   (run it on a quiet machine; it prints the summary
# and leaves each family's check as OUT_DIR/<family>.json, the summary as OUT_DIR/summary.json)
set -e
REPO=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:-/tmp/servelab-fresh-clone}
PY=${PY:-$REPO/.venv/bin/python}
rm -rf "$OUT/clone" "$OUT/cache"; mkdir -p "$OUT"
git clone -q "$REPO" "$OUT/clone"
cd "$OUT/clone"
export PYTHONPATH=$OUT/clone/lib SERVELAB_CACHE=$OUT/cache OMP_NUM_THREADS=1
git log --oneline -1
uptime
$PY -m servelab.sim calibrate --quick > "$OUT/calibrate.log" 2>&1
FAMILIES="bursts long_prompts shared_prefixes overload long_answers bursty_mix"
for f in $FAMILIES; do
  uptime
  $PY -m servelab.sim check --trace "data/sim/traces/$f.jsonl" --save-run "$OUT/$f.json" > "$OUT/$f.log" 2>&1
done
uptime
$PY - "$OUT" $FAMILIES <<'PYEOF'
import json, sys
from pathlib import Path
out, families = Path(sys.argv[1]), sys.argv[2:]
errs = []
for f in families:
    d = json.loads((out / f"{f}.json").read_text())
    e, sp = d["errors"], d["spread"]
    errs += [abs(v) for v in e.values()]
    print(f"{f:16s} " + "  ".join(f"{k} {e[k]:+.1%} (±{sp[k]:.1%})" for k in e))
errs.sort()
n = len(errs)
worst, median = errs[-1], (errs[(n - 1) // 2] + errs[n // 2]) / 2
print(f"worst {worst:.1%}, median {median:.1%} over {n} percentiles (goal: worst <= 15%, median <= 7%)")
rows = {f: {k: json.loads((out / f"{f}.json").read_text())[k] for k in ("errors", "spread")} for f in families}
(out / "summary.json").write_text(json.dumps({"worst": worst, "median": median, "families": rows}, indent=1) + "\n")
PYEOF
