"""Benchmark speculative decoding on the course's trained pair, greedy: one request at a time, then the engine's fade with concurrency.

    .venv/bin/python benchmarks/bench_speculative.py            # a few minutes, one thread
    .venv/bin/python benchmarks/bench_speculative.py --quick --out /tmp/x   # smoke run, seconds

Two workloads from the corpus's held-out ("val") code documents:
  * edit: a window of code, a comment saying it is copied, then the window's first line:
    the answer repeats the prompt, which is what prompt lookup (n-gram proposer) feeds on;
  * code: the first part of a window, to be continued: the draft model's workload.
For each: plain greedy decoding (``servelab.generation.generate``) and speculative decoding
(``servelab.speculative.speculative_generate``) on the same prompts, timed interleaved, tokens
checked identical. Reported: acceptance by position, tokens per target pass, the draft cost c
(a draft decode step in target decode steps, measured), the verify cost v (a target pass over
k + 1 rows in target decode steps, measured), the measured speed-up and the formula's
prediction E(a, k) / (k c + v) beside it, and a sweep of k from 1 to 8.
Results: benchmarks/results/speculative.md and .json, with the machine and the load.
"""
from __future__ import annotations

import os
import statistics
import time

import torch

from servelab.bpe import load_course_tokenizer
from servelab.generation import generate
from servelab.machine import describe
from servelab.model import load_course_model
from servelab.sampling import SamplingParams
from servelab.speculative import (DraftModelProposer, NgramProposer, code_windows, edit_prompt,
                                  expected_tokens_per_pass, speculative_generate)

from _common import RESULTS, parser, write_results


def step_costs(target, draft, k: int, context: int = 64, repeats: int = 30) -> dict:
    """Median seconds of one decode step of each model and of a target pass over k + 1 rows."""
    def timed(model, n_new):
        times = []
        for _ in range(repeats):
            cache = model.new_cache(1, context + n_new + 1)
            model(torch.arange(context)[None] % 200 + 300, cache=cache)
            ids = torch.arange(n_new)[None] + 400
            t0 = time.perf_counter()
            model(ids, cache=cache)
            times.append(time.perf_counter() - t0)
        return statistics.median(times)
    with torch.inference_mode():
        t1, tv, td = timed(target, 1), timed(target, k + 1), timed(draft, 1)
    return {"target_step_s": t1, "verify_pass_s": tv, "draft_step_s": td,
            "c": td / t1, "v": tv / t1}


def prefill_seconds(model, ids) -> float:
    """One prefill of the prompt, as generate does it (fresh cache)."""
    cache = model.new_cache(1, len(ids) + 1)
    with torch.inference_mode():
        t0 = time.perf_counter()
        model(torch.tensor([ids]), cache=cache)
        return time.perf_counter() - t0


def run_workload(target, tok, prompts, make_proposer, ks, params, repeats):
    """Plain and speculative decoding interleaved on the same prompts, for every k.

    Per prompt and repeat: one plain run (and one timed prefill), then one
    speculative run per k; tokens must be identical. Speed-ups are given end
    to end and for the decode part alone (prefill, which both runs do once and
    speculation cannot speed up, taken out of both).
    """
    acc = {k: dict(spec_t=0.0, spec_prefill=0.0, draft_t=0.0, target_t=0.0, tokens=0, passes=0,
                   reached=0, accepted=0, draft_steps=0, reached_at=[0] * k, accepted_at=[0] * k,
                   lengths=[]) for k in ks}
    plain_t = plain_prefill = 0.0
    plain_tokens = 0
    for prompt in prompts:
        ids = tok.encode(prompt, allowed_special="all")
        for _ in range(repeats):
            plain_prefill += prefill_seconds(target, ids)
            t0 = time.perf_counter()
            plain = generate(target, tok, ids, sampling=params)
            plain_t += time.perf_counter() - t0
            plain_tokens += len(plain.token_ids)
            for k in ks:
                a = acc[k]
                t0 = time.perf_counter()
                out = speculative_generate(target, tok, ids, make_proposer(), k, params)
                a["spec_t"] += time.perf_counter() - t0
                if out.token_ids != plain.token_ids:
                    raise AssertionError("speculative greedy tokens differ from plain decoding")
                st = out.stats
                a["spec_prefill"] += st.prefill_seconds
                a["draft_t"] += st.draft_seconds
                a["target_t"] += st.target_seconds
                a["tokens"] += len(out.token_ids)
                a["passes"] += st.target_passes
                a["reached"] += st.reached
                a["accepted"] += st.accepted
                a["draft_steps"] += st.draft_steps
                a["lengths"] += st.proposal_lengths
                for i, (r, n) in enumerate(zip(st.reached_at, st.accepted_at)):
                    a["reached_at"][i] += r
                    a["accepted_at"][i] += n
    plain_decode = plain_t - plain_prefill
    plain_step = plain_decode / plain_tokens      # one plain decode step, as generate runs it
    rows = []
    for k in ks:
        a = acc[k]
        spec_decode = a["spec_t"] - a["spec_prefill"]
        rows.append({
            "k": k, "prompts": len(prompts), "tokens": a["tokens"], "target_passes": a["passes"],
            "tokens_per_pass": a["tokens"] / a["passes"],
            "acceptance_rate": a["accepted"] / max(a["reached"], 1),
            "acceptance_by_position": [n / r if r else None for n, r in zip(a["accepted_at"], a["reached_at"])],
            "plain_s": plain_t, "spec_s": a["spec_t"], "speedup_end_to_end": plain_t / a["spec_t"],
            "plain_decode_s": plain_decode, "spec_decode_s": spec_decode,
            "speedup": plain_decode / spec_decode,
            "plain_step_s": plain_step,
            # costs as the run paid them, proposer and sampling overhead included
            "c_run": (a["draft_t"] / a["draft_steps"]) / plain_step if a["draft_steps"] else 0.0,
            "v_run": (a["target_t"] / a["passes"]) / plain_step,
            "proposer_s_per_round": a["draft_t"] / a["passes"],
            "rounds_without_proposal": a["lengths"].count(0) / len(a["lengths"]),
            "mean_proposal_length": sum(a["lengths"]) / len(a["lengths"]),
            "_lengths": a["lengths"],
        })
    return rows


def engine_fade(target, tok, prompts, batches, k, max_tokens, repeats):
    """One set of requests through the engine at several concurrencies, with and
    without prompt-lookup speculation (same engine settings otherwise), interleaved.

    Every concurrency runs the same requests, the prompts cycled to ``max(batches)``
    of them, with at most ``b`` running at once (``max_num_seqs``): only the
    concurrency changes between rows, not the text.
    """
    from servelab.engine import LLM
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    n_requests = max(batches)
    if n_requests % len(prompts):
        raise ValueError(f"{n_requests} requests do not cycle {len(prompts)} prompts evenly")
    batch = [prompts[i % len(prompts)] for i in range(n_requests)]
    rows = []
    for b in batches:
        common = dict(max_num_seqs=max(b, 1), num_kv_blocks=max(64, b * 24))
        plain = LLM(target, tok, **common)
        fast = LLM(target, tok, speculative_config={"method": "ngram", "num_speculative_tokens": k,
                                                    "prompt_lookup_max": 4, "prompt_lookup_min": 1},
                   **common)
        steps = {id(plain): 0, id(fast): 0}
        for llm in (plain, fast):  # count engine steps: a speculative step may yield several tokens
            def counted(_step=llm.engine.step, _key=id(llm)):
                steps[_key] += 1
                return _step()
            llm.engine.step = counted
        tp = ts = 0.0
        for _ in range(repeats):
            t0 = time.perf_counter()
            a = plain.generate(batch, params)
            tp += time.perf_counter() - t0
            t0 = time.perf_counter()
            c = fast.generate(batch, params)
            ts += time.perf_counter() - t0
            if [o.outputs[0].token_ids for o in a] != [o.outputs[0].token_ids for o in c]:
                raise AssertionError("speculative engine tokens differ from plain")
        st = fast.engine.spec_decoder.stats
        rows.append({"concurrency": b, "requests": n_requests, "plain_s": tp, "spec_s": ts,
                     "speedup": tp / ts, "acceptance_rate": st.acceptance_rate,
                     "plain_steps": steps[id(plain)], "spec_steps": steps[id(fast)],
                     # the speed-up is (plain steps / speculative steps) / (spec step s / plain step s)
                     "step_ratio": steps[id(plain)] / steps[id(fast)],
                     "step_cost_ratio": (ts / steps[id(fast)]) / (tp / steps[id(plain)]),
                     "drafted_rounds": len(st.proposal_lengths),
                     "tokens_per_drafted_round": (st.accepted + len(st.proposal_lengths))
                     / max(len(st.proposal_lengths), 1),
                     "tokens": sum(len(o.outputs[0].token_ids) for o in a) * repeats})
    return rows


def predict(row: dict, costs: dict, deterministic: bool) -> dict:
    """The formula beside the measurement, from the measured acceptance rate a.

    Two predictions: with the bare forward costs (c and v of ``step_costs``: what
    a kernel-level view sees), and with the costs the run paid (``c_run``,
    ``v_run``: proposer, sampling and Python included). A prompt-lookup round
    costs no model step, but its scan is charged to the verify side of a round.
    """
    a, k = row["acceptance_rate"], row["k"]
    lengths = row.pop("_lengths")
    e = sum(expected_tokens_per_pass(a, n) for n in lengths) / len(lengths)
    rounds = e  # tokens per round the formula expects, rounds as offered
    c_bare = 0.0 if deterministic else costs["c"]
    v_run = row["v_run"] + (row["proposer_s_per_round"] / row["plain_step_s"] if deterministic else 0.0)
    c_run = 0.0 if deterministic else row["c_run"]
    return {"predicted_tokens_per_pass": e,
            "predicted_speedup_bare": rounds / (row["mean_proposal_length"] * c_bare + costs["v"]),
            "predicted_speedup": rounds / (row["mean_proposal_length"] * c_run + v_run),
            "c_bare": c_bare, "v_bare": costs["v"], "c_used": c_run, "v_used": v_run}


def main(argv=None) -> int:
    ap = parser(__doc__.split("\n")[0], quick_help="smoke run: 2 prompts, 16 tokens, k in {1, 4}",
                out_default=RESULTS)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    if args.quick:
        args.prompts, args.max_tokens, args.repeats = 2, 16, 1
    ks = [1, 4] if args.quick else list(range(1, 9))
    k_main = 4
    tok = load_course_tokenizer()
    target, draft = load_course_model("main").eval(), load_course_model("draft").eval()
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    win = code_windows(2 * args.prompts, 360)
    edit = [edit_prompt(w) for w in win[:args.prompts]]
    code = [w[: len(w) // 2] for w in win[args.prompts:]]
    load_before = os.getloadavg()
    t_start = time.time()

    results = {"machine": describe(packages=("torch", "numpy"), threads=1),
               "load_before": load_before, "k_main": k_main, "max_tokens": args.max_tokens,
               "repeats": args.repeats, "quick": args.quick, "workloads": {}}
    costs = {k: step_costs(target, draft, k, repeats=5 if args.quick else 30) for k in ks}
    results["step_costs"] = {str(k): v for k, v in costs.items()}
    for name, prompts, make, deterministic in [
        ("edit_ngram", edit, lambda: NgramProposer(1, 4), True),
        ("code_ngram", code, lambda: NgramProposer(1, 4), True),
        ("code_draft", code, lambda: DraftModelProposer(draft), False),
        ("edit_draft", edit, lambda: DraftModelProposer(draft), False),
    ]:
        sweep = run_workload(target, tok, prompts, make, ks, params, args.repeats)
        for row in sweep:
            row.update(predict(row, costs[row["k"]], deterministic))
        results["workloads"][name] = sweep
        print(f"{name} done ({time.time() - t_start:.0f} s)", flush=True)
    batches = [1, 4] if args.quick else [1, 4, 16, 64]
    results["engine_fade"] = engine_fade(target, tok, edit, batches, k_main, args.max_tokens,
                                         args.repeats)
    print(f"engine fade done ({time.time() - t_start:.0f} s)", flush=True)
    results["load_after"] = os.getloadavg()
    results["seconds"] = time.time() - t_start
    text = report(results)
    write_results(args.out, "speculative", results, text)
    print(text)
    return 0


def report(r: dict) -> str:
    m = r["machine"]
    lines = ["# Speculative decoding, greedy: one request at a time, then the fade through the engine (benchmarks/bench_speculative.py)", "",
             f"Machine: {m.get('cpu', m)}; one thread; load {r['load_before'][0]:.1f} before, "
             f"{r['load_after'][0]:.1f} after; {r['seconds']:.0f} s"
             + (" (QUICK smoke run)" if r["quick"] else ""), "",
             "Target: servelab-main; draft: servelab-draft; tokens identical to plain decoding in "
             f"every run; {r['max_tokens']} new tokens per prompt, {r['repeats']} interleaved repeats.",
             "c = a draft step in plain target decode steps; v = a target verify pass over k + 1 "
             "rows (with the acceptance rule) in plain decode steps. 'predicted' uses c and v as the "
             "run paid them (sampling and Python included; a prompt-lookup scan counted in v); "
             "Speed-ups are for the decode part (each run's one prefill timed and taken out of both; "
             "end-to-end in the JSON). "
             "'bare' uses bare forward passes only (medians of single steps). E(a, k_r) averages "
             "the formula over the rounds as offered (prompt lookup offers fewer than k drafts, or "
             "none, when the text does not repeat).", "",
             "| workload | k | tokens/pass | E(a, k_r) | acceptance a | speed-up measured | predicted "
             "E/(kc+v) | error | bare prediction | c | v |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, sweep in r["workloads"].items():
        for row in sweep:
            err = row["predicted_speedup"] / row["speedup"] - 1
            lines.append(f"| {name} | {row['k']} | {row['tokens_per_pass']:.2f} | "
                         f"{row['predicted_tokens_per_pass']:.2f} | {row['acceptance_rate']:.2f} | "
                         f"{row['speedup']:.2f}x | {row['predicted_speedup']:.2f}x | {err:+.0%} | "
                         f"{row['predicted_speedup_bare']:.2f}x | {row['c_used']:.2f} | {row['v_used']:.2f} |")
    fade = r.get("engine_fade", [])
    n_req = fade[0].get("requests", "?") if fade else "?"
    lines += ["", f"Through the engine (prompt lookup, k = {r['k_main']}; the same {n_req} requests, "
              "the copy prompts cycled, at every concurrency, at most that many running at once; "
              "continuous batching, same settings with and without speculation; "
              "whole-run wall time, prefill included; plain and speculative runs interleaved):", "",
              "| at most at once | speed-up | acceptance | tokens per drafted round | plain steps / "
              "speculative steps | speculative step / plain step (time) | plain s | speculative s |",
              "|---|---|---|---|---|---|---|---|"]
    for row in fade:
        lines.append(f"| {row['concurrency']} | {row['speedup']:.2f}x | {row['acceptance_rate']:.2f} | "
                     f"{row['tokens_per_drafted_round']:.2f} | {row['step_ratio']:.2f} | "
                     f"{row['step_cost_ratio']:.2f} | {row['plain_s']:.1f} | {row['spec_s']:.1f} |")
    lines += ["", "The speed-up is the first ratio over the second: speculation takes fewer engine "
              "steps, each dearer."]
    lines += ["", "Acceptance by position (k = %d):" % r["k_main"], ""]
    for name, sweep in r["workloads"].items():
        row = next((x for x in sweep if x["k"] == r["k_main"]), sweep[-1])
        pos = ", ".join("-" if a is None else f"{a:.2f}" for a in row["acceptance_by_position"])
        lines.append(f"- {name}: {pos}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
