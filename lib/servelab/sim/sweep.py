"""A calibration that covers the shapes serving produces, not a few workload families.

:func:`sweep_traces` builds traces whose pieces put the engine, one at a time,
into chosen states: decode batches of every size up to the seat limit at short,
medium and long contexts (their prompts go through chunked prefill steps on the
way), streams joined by a prompt (mixed steps), groups sharing a prefix
(prefix-cache hits), lone prompts on an idle engine (with and without a cached
prefix: what starts each busy period of a served trace), and three random
streams (Poisson, bursty, and one fast enough to fill every seat) cut into
pieces, for the mixtures a queue makes; then long prompts cut into chunks while
streams decode, and a pool too small for its requests (preemption and
recomputation), each on its own replica. Pieces are spaced far apart on the
trace's clock, so each starts on an idle engine (the engine check's virtual
clock jumps over the gaps), and laid out in a seeded random order: this
machine's speed wanders by a fifth over a few seconds, and a fixed order would
fit that wander as a cost of whatever shapes ran during it.

:func:`residuals_by_feature` says where a fitted model misses: the median of
measured over predicted step time in bins of each feature (decode rows, context
per row, prompt tokens, prompt chunks, prefix hits, prompt-only steps by size,
decode groups).

Pure Python + numpy (the engine runs in :mod:`servelab.sim.calibrate`).
"""
from __future__ import annotations

import numpy as np

from servelab.sim.core import ReplicaConfig
from servelab.sim.step_model import StepShape, aftermath_position, step_kind
from servelab.workload import Exponential, LogNormal, Trace, synthetic

__all__ = ["SWEEP_CONFIGS", "sweep_traces", "random_streams", "residuals_by_feature", "FEATURE_BINS", "GAP_S"]

#: Seconds between pieces on the trace's clock: far longer than any piece runs.
GAP_S = 1000.0

#: The replicas the sweep runs on: the check's default, a chunk cap, and a pool that forces preemption.
SWEEP_CONFIGS = {
    "base": ReplicaConfig(max_num_seqs=32, max_num_batched_tokens=512, num_kv_blocks=1024),
    "chunk128": ReplicaConfig(max_num_seqs=32, max_num_batched_tokens=512, num_kv_blocks=1024,
                              long_prefill_token_threshold=128),
    "tight": ReplicaConfig(max_num_seqs=32, max_num_batched_tokens=512, num_kv_blocks=160),
}


class _Builder:
    """Pieces of a calibration trace, laid out ``GAP_S`` apart in a seeded random order: a drift
    of the machine's speed over seconds then falls on every shape alike, instead of on whichever
    pieces a fixed order ran during it."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.pieces: list[list[tuple]] = []  # each: (offset s, prompt, output, group, prefix)
        self.groups = 0

    def piece(self, requests) -> None:
        """``requests``: (offset s, prompt tokens, output tokens, group or -1, prefix tokens)."""
        self.pieces.append([tuple(r) for r in requests])

    def trace(self) -> Trace:
        rows = []
        for k, i in enumerate(self.rng.permutation(len(self.pieces))):
            rows += [(k * GAP_S + off, p, o, g, pre) for off, p, o, g, pre in self.pieces[int(i)]]
        rows.sort(key=lambda r: r[0])
        a, p, o, g, pre = zip(*rows)
        return Trace(a, p, o, g, pre)

    def stream(self, trace: Trace, segment: int) -> None:
        """A random stream cut into pieces of ``segment`` requests (in arrival order), each
        starting on an idle engine; its prefix groups renumbered after this builder's own."""
        groups = {}
        for lo in range(0, len(trace), segment):
            t0 = float(trace.arrival_s[lo])
            reqs = []
            for i in range(lo, min(lo + segment, len(trace))):
                g = int(trace.prefix_group[i])
                if g >= 0 and g not in groups:
                    groups[g] = self.groups
                    self.groups += 1
                reqs.append((float(trace.arrival_s[i]) - t0, int(trace.prompt_tokens[i]),
                             int(trace.output_tokens[i]), groups.get(g, -1), int(trace.prefix_tokens[i])))
            self.piece(reqs)


def _fits(cfg: ReplicaConfig, rows: int, tokens_each: int, max_len: int) -> bool:
    blocks = rows * -(-tokens_each // cfg.block_size)
    return tokens_each <= max_len and blocks <= cfg.num_kv_blocks


def sweep_traces(quick: bool = False, max_len: int = 1024, seed: int = 0, rate: float | None = None) -> dict:
    """``{name: (trace, config)}``: the calibration's pieces (see the module doc).

    ``max_len``: the model's context (prompt + output of one request); ``rate``: the
    random streams' arrival rate (requests/s; default 6, for the course's small model on
    a CPU core: set it from a first fit to load another machine alike).
    """
    base = SWEEP_CONFIGS["base"]
    rng_out = np.random.default_rng([seed, 1])
    out = {}

    b = _Builder(seed)
    rows = (1, 2, 4, 8, 16, 24, 32) if quick else (1, 2, 3, 4, 6, 8, 12, 16, 20, 24, 28, 32)
    # 100: a full replica of short conversations (32 rows of 33-166 tokens, 1,000-5,000 in all: the
    # queue's decode steps, which the quick grid skipped between 500 and 9,000; priced 10% high)
    lengths = (16, 100, 300, 900) if quick else (16, 120, 300, 600, 900)
    # the grid once per sweep: the quick calibration runs the sweep in rounds (check.QUICK_ROUNDS,
    # each with its own seed), so a many-row batch, whose steps set a full replica's pace, is
    # measured at several moments and the machine's wander during one does not set its price
    for r in rows:
        for length in lengths:
            # contexts spread around the level (a third to five thirds of it), as a real batch's
            # are: the engine gathers decode rows in groups of similar length, one pass per group
            lens = np.maximum(rng_out.integers(length // 3, 5 * length // 3 + 1, r), 1)
            # many-row batches decode longer: their steps set a full replica's pace (and so its queue)
            outs = rng_out.integers(6, 16 if quick else 20, r) if r < 16 else rng_out.integers(16, 40, r)
            if not _fits(base, r, int(lens.max()) + int(outs.max()), max_len):
                lens = np.full(r, length)
                if not _fits(base, r, length + int(outs.max()), max_len):
                    continue
            b.piece([(0.0, int(n), int(o), -1, 0) for n, o in zip(lens, outs)])
    # mixed steps: streams of varied contexts decoding, then a prompt joins them (a short prompt
    # joining one or two streams is the commonest mixed step of a lightly loaded replica: priced
    # 15% low while the sweep had none)
    for r in ((1, 2, 4, 16, 31) if quick else (1, 2, 4, 8, 16, 24, 31)):
        for p in ((24, 64, 480) if quick else (16, 32, 64, 128, 256, 480)):
            lens = rng_out.integers(8, 500, r)
            b.piece([(0.0, int(n), 24, -1, 0) for n in lens] + [(0.02 + 0.0005 * r, p, 4, -1, 0)])
    # bursts of short prompts: several arrive at once and share a step, on an idle engine and
    # joining running streams (a burst's first steps: priced 5-13% low on held-out bursts while
    # the sweep's steps of three or more chunks were all full 512-token budgets; the runs in
    # data/sim/calibration_runs.json at commit e001ebc)
    for k in ((3, 5, 8) if quick else (2, 3, 4, 5, 6, 8)):
        for streams in ((0, 4) if quick else (0, 2, 8)):
            lens = rng_out.integers(8, 400, streams)
            b.piece([(0.0, int(n), 24, -1, 0) for n in lens] +
                    [(0.02, int(q), 4, -1, 0) for q in rng_out.integers(16, 97, k)])
    # prefix hits: a group sharing a long prefix, the first one alone, the rest together
    for r in ((4, 16) if quick else (2, 4, 8, 16, 24)):
        for pre in ((256,) if quick else (128, 512)):
            g = b.groups
            b.groups += 1
            b.piece([(0.0, pre + 16, 4, g, pre)] + [(0.5, pre + int(k), 8, g, pre) for k in
                                                    rng_out.integers(8, 64, r)])
    # lone prompts, each on an idle engine (what starts every busy period of a served trace): one
    # prompt per step, so the line through the batched prompts above does not price them alone
    lone = ((8, 24, 48, 96, 160, 256, 400, 512) if quick else
            (8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 320, 400, 512))
    for _ in range(2 if quick else 3):
        for p in lone:
            b.piece([(0.0, p, 4, -1, 0)])
    # ... and after a cached prefix: the first request alone, a second one later hits its prefix
    # (a shared system prompt's every later request: priced 10% low with three of these)
    for pre, new in (((128, 24), (128, 80), (256, 16), (256, 48), (384, 32), (384, 96), (512, 24), (512, 64))
                     if quick else ((128, 16), (128, 48), (128, 96), (256, 16), (256, 32), (256, 96), (256, 160),
                                    (384, 24), (384, 48), (384, 128), (512, 32), (512, 96))):
        g = b.groups
        b.groups += 1
        b.piece([(0.0, pre + 8, 2, g, pre), (0.5, pre + new, 4, g, pre)])
    # a queue for seats: many short requests at once, so every seat stays full and each finish
    # lets a prompt in beside 24-31 decoding rows (the shape an overloaded replica runs on; the
    # sweep had 41 such mixed steps and priced a held-out overload's 5% high: commit 9fc8bb3)
    for n_req, top in (((96, 16), (96, 32)) if quick else ((96, 12), (96, 24), (128, 40))):
        b.piece([(0.0005 * k, int(p), int(o), -1, 0) for k, (p, o) in
                 enumerate(zip(rng_out.integers(16, 161, n_req), rng_out.integers(2, top + 1, n_req)))])
    # three random streams (Poisson, bursty, and one fast enough to fill every seat) for the
    # mixtures a queue makes, cut into pieces so they interleave with the designed ones
    for trace, segment in random_streams(quick, seed, rate).values():
        b.stream(trace, segment)
    out["sweep"] = (b.trace(), base)

    c = _Builder(seed + 1)  # long prompts cut into chunks while streams decode (long contexts)
    for r in ((4, 16) if quick else (2, 4, 8, 16, 24)):
        for p in ((400, 900) if quick else (300, 600, 900)):
            lens = rng_out.integers(100, 500, r)
            c.piece([(0.0, int(n), 30, -1, 0) for n in lens] + [(0.05 + 0.002 * r, p, 4, -1, 0)])
    out["chunked"] = (c.trace(), SWEEP_CONFIGS["chunk128"])

    t = _Builder(seed + 2)  # preemption: the pool holds about two thirds of what the requests need
    for n, p in (((12, 120),) if quick else ((12, 120), (24, 60), (6, 300))):
        t.piece([(0.0, p, p, -1, 0)] * n)
    out["preemption"] = (t.trace(), SWEEP_CONFIGS["tight"])
    return out


def random_streams(quick: bool = False, seed: int = 0, rate: float | None = None) -> dict:
    """``{name: (trace, segment)}``: the sweep's random streams (Poisson, bursty with shared
    prefixes, and one fast enough to fill every seat), each with the piece size the sweep cuts it
    into. ``rate``: see :func:`sweep_traces`."""
    n = 60 if quick else 200
    rate = 6.0 if rate is None else rate
    mix = dict(prompt=LogNormal(100, 1.0, 8, 600), output=Exponential(40, 300))
    full = 150 if quick else 400
    return {
        "poisson mix": (synthetic(n, rate, seed=seed + 3, **mix), 20),
        "bursty": (synthetic(n, rate, seed=seed + 4, arrival="gamma", cv=3.0, prefix_groups=2, prefix_tokens=200,
                             prefix_share=0.3, **mix), 20),
        "full seats": (synthetic(full, 8 * rate, seed=seed + 5, prompt=LogNormal(40, 0.6, 8, 300),
                                 output=Exponential(48, 240)), 50),
    }


#: Bin edges per feature for :func:`residuals_by_feature` (a bin holds edge <= x < next edge).
FEATURE_BINS = {
    "decode rows": (1, 2, 4, 8, 16, 24),
    "context per decode row": (0, 64, 256, 512, 768),
    "prompt tokens": (1, 32, 128, 256, 512),
    "prompt chunks": (1, 2, 3),
    "chunk offset (cached or earlier tokens)": (0, 1, 128, 512),
    "prompt tokens, prompt-only steps": (1, 64, 128, 256),
    "prompt tokens of the step before (decode steps)": (0, 1, 64, 256),
    "steps since a prompt step (decode steps)": (1, 2, 3, 4, 5, 7),
}


def _feature(name: str, s: StepShape):
    if name == "decode rows":
        return s.decode_rows or None
    if name == "context per decode row":
        return s.decode_context / s.decode_rows if s.decode_rows else None
    if name == "prompt tokens":
        return s.prefill_tokens or None
    if name == "prompt chunks":
        return s.prefill_seqs or None
    if name == "prompt tokens, prompt-only steps":
        return s.prefill_tokens if s.prefill_tokens and not s.decode_rows else None
    if name == "prompt tokens of the step before (decode steps)":
        return None if s.prefill_tokens else (s.after_prompt_tokens if aftermath_position(s) == 1 else 0)
    if name == "steps since a prompt step (decode steps)":
        return aftermath_position(s) or None
    if name == "chunk offset (cached or earlier tokens)":
        if not s.prefill_tokens:
            return None
        return max(s.prefill_context - s.prefill_tokens, 0) / max(s.prefill_seqs, 1)
    raise ValueError(name)


#: Bins of the decode groups a step's decode rows were gathered in (recorded by the engine runs).
GROUP_BINS = (1, 2, 3, 4, 6, 9)


def residuals_by_feature(model, shapes, durations, bins: dict | None = None, min_steps: int = 5,
                         decode_groups=None) -> dict:
    """Where ``model`` misses: per feature and bin (and per step kind), the number of steps,
    the median of measured over predicted time and the ratio of their total times.
    ``decode_groups`` (one count per step, as :func:`~servelab.sim.calibrate.run_engine`
    records them in ``info["decode_groups"]``) adds the feature "decode groups" for pure
    decode steps: the engine attends each group of similar contexts in its own pass, a
    cost the step model has no term for."""
    bins = dict(FEATURE_BINS if bins is None else bins)
    shapes = list(shapes)
    y = np.asarray(durations, dtype=float)
    pred = np.array([model.step_s(s) for s in shapes])
    ratio = y / pred
    groups = None
    if decode_groups is not None and len(decode_groups) == len(shapes):
        groups = np.array([g if not s.prefill_tokens and s.decode_rows else np.nan
                           for g, s in zip(decode_groups, shapes)], dtype=float)
        bins["decode groups (decode steps)"] = GROUP_BINS
    out = {}
    for name, edges in bins.items():
        if name == "decode groups (decode steps)":
            vals = groups
        else:
            vals = np.array([np.nan if (v := _feature(name, s)) is None else v for s in shapes], dtype=float)
        rows = []
        for lo, hi in zip(edges, (*edges[1:], np.inf)):
            m = (vals >= lo) & (vals < hi)
            if m.sum() < min_steps:
                continue
            label = f"{lo:g}+" if hi == np.inf else (f"{lo:g}" if hi - lo == 1 else f"{lo:g}-{hi - 1:g}")
            rows.append({"bin": label, "steps": int(m.sum()), "median_measured_over_predicted":
                         round(float(np.median(ratio[m])), 3),
                         "total_measured_over_predicted": round(float(y[m].sum() / pred[m].sum()), 3)})
        out[name] = rows
    kinds = np.array([step_kind(s) for s in shapes])
    out["step kind"] = [{"bin": k, "steps": int((kinds == k).sum()),
                         "median_measured_over_predicted": round(float(np.median(ratio[kinds == k])), 3),
                         "total_measured_over_predicted": round(float(y[kinds == k].sum() / pred[kinds == k].sum()), 3)}
                        for k in ("decode", "prefill", "mixed") if (kinds == k).sum() >= min_steps]
    return out
