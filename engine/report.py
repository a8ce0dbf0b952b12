"""A run as Markdown: what the loop found, per target and per shape, with the machine and versions.

Used by ``python -m engine report RUN`` (and for docs/benchmarks.md). Reads the store only.
"""
from __future__ import annotations

import datetime as _dt
import json
from collections import Counter

from engine import hw, plan, verify
from engine.store import Store


def run_markdown(store: Store, run_id: str) -> str:
    run = store.get_run(run_id)
    if run is None:
        raise KeyError(run_id)
    dev, ceil = run["device"] or {}, run["ceilings"] or {}
    interp = run["timing_mode"] == "interpreter"
    when = _dt.datetime.fromtimestamp(run["created_at"], _dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    out = [f"### Run `{run_id}`: {run['model']}",
           "",
           f"- machine: {dev.get('name', '?')} ({dev.get('vendor', '?')}), torch {dev.get('torch')}, "
           f"triton {dev.get('triton')}, {when}",
           f"- config: `{_cfg(run['config'])}`",
           f"- status: {run['status']}, {run['experiments_done']} experiments"]
    if ceil:
        by = ceil.get("matmul_tflops_by") or {}
        rates = (", ".join(f"{k} {v:.0f}" for k, v in by.items()) + " TFLOP/s matmul" if by
                 else f"bf16 matmul {ceil['matmul_tflops']:.0f} TFLOP/s")
        out.append(f"- measured ceilings: copy {ceil['copy_gbps']:.0f} GB/s (read + write), {rates}")
    if interp:
        out.append("- **interpreter timings** (Triton's CPU interpreter): not GPU performance")
    out += ["", "The baseline of a target is the faster of eager and torch.compile of its op (best "
            "mode); only a best kernel faster than it is placed in the model.", "",
            "| target | share of model | experiments | new bests | eager (us) | torch.compile (us) | "
            "best (us) | vs eager | vs baseline | % of speed of light | found at experiment |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    exps = store.experiments(run_id)
    for t in store.targets(run_id):
        mine = [e for e in exps if e["target_id"] == t["id"]]
        kept = sum(e["state"] == "kept" for e in mine)
        best = next((e for e in mine if e["id"] == t["best_experiment_id"]), None)
        pct = (f"{100 * t['sol_latency_us'] / t['best_latency_us']:.0f}%"
               if t["sol_latency_us"] and t["best_latency_us"] else "n/a")
        vb = plan.speedup_vs_baseline(t)
        ok, _ = plan.beats_baseline(t)
        vs_base = "-" if not vb else f"{vb:.3g}x" + ("" if ok or interp else " (slower than the baseline: not placed)")
        name = t["family"] + (f" `{json.dumps(t['spec'], sort_keys=True)}`" if t.get("spec") else "")
        comp = _us(t.get("compile_latency_us")) + (f" ({t['compile_mode']})" if t.get("compile_mode") else "")
        out.append(f"| {name} | {t['fraction']:.1%} | {len(mine)} | {kept} | "
                   f"{_us(t['ref_latency_us'])} | {comp} | {_us(t['best_latency_us'])} | "
                   f"{(t['speedup'] or 0):.3g}x | {vs_base} | {pct} | "
                   f"{'#%d (%d of its target)' % (best['seq'], mine.index(best) + 1) if best else '-'} |")
    out += ["", "Per shape, best kernel of each target (shape of the main input, dtype, calls per "
            "forward):", "", "| family | shape | dtype | calls | eager (us) | best (us) | speedup | "
            "% of speed of light |", "|---|---|---|---|---|---|---|---|"]
    for t in store.targets(run_id):
        if not t["best_experiment_id"]:
            continue
        best = store.experiment(t["best_experiment_id"])
        eager = {tuple(r["shape"]): r["us"] for r in (t.get("ref_shape_times") or [])}
        for row in best["shape_times"] or []:
            pct = f"{row['pct_sol']:.1f}%" if row.get("pct_sol") else "n/a"
            ref = eager.get(tuple(row["shape"]))
            speedup = f"{ref / row['us']:.3g}x" if ref else "-"
            out.append(f"| {t['family']} | {'x'.join(map(str, row['shape']))} | {t['dtype']} | "
                       f"{row['count']} | {_us(ref)} | {row['us']:.1f} | {speedup} | {pct} |")
    asked = [e for e in exps if e.get("tokens_in") is not None or e.get("proposal_latency_s")]
    if asked:   # the LLM proposer's bill
        tin = sum(e["tokens_in"] or 0 for e in asked)
        tout = sum(e["tokens_out"] or 0 for e in asked)
        cost = [e["cost_usd"] for e in asked if e["cost_usd"] is not None]
        out += ["", f"Model: {len(asked)} proposals, {tin} tokens in, {tout} tokens out, "
                + (f"${sum(cost):.4f}" if cost else "cost unknown") + "."]
    workers = store.workers(run_id)
    if len(workers) > 1:   # a pool or Ray run: who measured what
        out += ["", f"Workers ({workers[0]['backend']}; every new best re-timed on the reference):",
                "", "| worker | host | device | experiments | re-timings | died | restarts |",
                "|---|---|---|---|---|---|---|"]
        for w in workers:
            n = sum(1 for e in exps if e.get("worker") == w["name"])
            rt = sum(1 for e in exps if e.get("retimed_on") == w["name"])
            out.append(f"| {w['name']}{' (reference)' if w['reference'] else ''} | {w['host']} | "
                       f"{w['device']} {w['gpu_name'] or ''} | {n} | {rt} | {w['died']} | "
                       f"{w['restarts']} |")
    states = Counter(e["state"] for e in exps)
    fails = Counter(e["failed_stage"] for e in exps if e["state"] == "failed")
    slower = sum(r["n"] for r in store.stage_outcomes(run_id)      # bench-first: timed only
                 if r["stage"] == verify.STAGES[-1] and r["status"] == "slower")
    out += ["", f"Outcomes: {states['kept']} kept as their target's best, {states['reverted']} reverted"
            + (f" ({slower} timed after the smoke test only, bench-first)" if slower else "")
            + f", {states['failed']} failed" + (" (" + ", ".join(f"{k}: {v}" for k, v in
                                                            fails.most_common()) + ")" if fails else "")
            + f". Amdahl-projected end-to-end speedup over the baseline: "
              f"{plan.projected(store.targets(run_id)):.3f}x."]
    out += _end_to_end(store, run_id, plan.projected(store.targets(run_id)), interp,
                       run.get("device"))
    return "\n".join(out) + "\n"


def _us(v) -> str:
    return f"{v:.1f}" if v else "-"


def _cfg(cfg: dict) -> str:
    keys = ("model", "dtype", "input_shape", "families", "budget_experiments", "budget_minutes",
            "seed", "patience", "model_overrides", "workers", "ray_address", "verify_order")
    if cfg.get("proposer", "search") != "search":
        keys += ("proposer", "llm_model", "api_base", "max_in_flight")
    return ", ".join(f"{k}={cfg[k]}" for k in keys if cfg.get(k) not in (None, {}, []))


def end_to_end_markdown(store: Store, run_id: str) -> str:
    """The run's latest end-to-end check and timings beside its Amdahl projection (the tail of
    run_markdown), for the e2e command."""
    run = store.get_run(run_id)
    lines = _end_to_end(store, run_id, plan.projected(store.targets(run_id)),
                        run["timing_mode"] == "interpreter", run.get("device"))
    return "\n".join(lines).lstrip("\n") + "\n"


def _end_to_end(store: Store, run_id: str, projected: float, interp: bool,
                run_device: dict | None) -> list[str]:
    """The latest end-to-end check and its timings (engine/integrate.py), beside the projection."""
    checks = store.e2e_checks(run_id)
    if not checks:
        return []
    c = checks[0]
    err = (f", max error {c['max_error']:.3g} (tolerance {c['tolerance']:g})"
           if c["max_error"] is not None and c["tolerance"] is not None else "")
    out = ["", f"End to end ({c['kind']}): **{c['status']}**{err}. {c['detail']}"]
    elsewhere = hw.timed_elsewhere(run_device, c.get("device"))
    if elsewhere:
        out.append(f"This check was {elsewhere}.")
    flagged = [f for f, v in (c["family_flags"] or {}).items() if v == "responsible"]
    if flagged:
        out.append(f"Left out of the optimized model (responsible for a mismatch): {', '.join(flagged)}.")
    slower = [f for f, v in (c["family_flags"] or {}).items() if v == "slower"]
    if slower:
        out.append(f"Left out of the optimized model (it ran slower with them): {', '.join(slower)}.")
    eager_only = [f for f, v in (c["family_flags"] or {}).items() if v == "slower_eager"]
    if eager_only:
        out.append(f"Left out of the eager optimized model (it ran slower there), in the compiled "
                   f"one that ships: {', '.join(eager_only)}.")
    base = [f for f, v in (c["family_flags"] or {}).items() if v == "slower_than_baseline"]
    if base:
        out.append(f"Never placed (slower than their baseline, the faster of eager and "
                   f"torch.compile): {', '.join(base)}.")
    timings = store.e2e_timings(c["id"])
    if timings:
        eager = next((t["latency_us"] for t in timings if t["variant"] == "eager"), None)
        opt = next((t["latency_us"] for t in timings if t["variant"] == "optimized"), None)
        measured = f"{eager / opt:.3g}x" if eager and opt else "n/a"
        out += ["", f"Measured end to end: optimized {measured} eager, against the Amdahl projection "
                f"of {projected:.3f}x" + (" (**interpreter timings**: not GPU performance)" if interp else "")
                + (" (the projection is from the run's GPU)" if elsewhere else "")
                + ".", "", "| variant | time per forward (us) | vs eager | note |", "|---|---|---|---|"]
        for t in timings:
            vs = f"{eager / t['latency_us']:.3g}x" if eager and t["latency_us"] else "-"
            out.append(f"| {t['variant']} | {_us(t['latency_us'])} | {vs} | {t['note'] or ''} |")
        by = {t["variant"]: t["latency_us"] for t in timings if t["latency_us"]}
        if not interp and by.get("compile") and by.get("compile_optimized"):
            ratio = by["compile"] / by["compile_optimized"]
            # the compiled ops' times are the run's GPU's: no projection for a check timed elsewhere
            proj = None if elsewhere else plan.projected_compiled(store.targets(run_id), by["compile"])
            out += ["", f"Under torch.compile the kernels give {ratio:.3g}x" + (
                "" if ratio >= 1 else ": for this input, compile the original model")
                + (f" (Amdahl over compile's forward, from the compiled ops' times: {proj:.3g}x)"
                   if proj else "") + "."]
    return out
