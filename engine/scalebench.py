"""``python -m engine scaling``: experiments per hour with 1..N workers, and where it stops scaling.

Two parts, one Markdown file:

1. Throughput. One real run per configuration (``--workers 1,2`` locally; with ``--ray ADDRESS``
   the same counts on Ray too), same model, families, seed and budget, patience high enough that
   no target rests, and the same candidates in every run (``FixedCandidates``: the starter, then
   seeded points of the family's search space), so the runs differ only in where they ran.
   Experiments per hour is counted over the loop itself, from the first experiment's start (its
   commit time minus its duration) to the last commit, so profiling and eager reference timing,
   which do not scale with workers, are left out. Speedup is against the first configuration.

2. The loop's serial costs, measured in this process: what the one engine thread spends per
   experiment however many workers there are (the search proposing one candidate with a long
   history, the static check, reading the run's experiments as each proposal does, committing an
   experiment with its five verification rows in SQLite). With t_eval the time one worker takes per
   experiment, N workers give at most min(N x 3600 / t_eval, 3600 / t_serial) experiments per
   hour; an LLM proposer adds its own cap, requests in flight x 3600 / reply latency.

Without a GPU every worker runs the Triton interpreter on this machine's CPU cores: the throughput
table is then a test of the machinery, bounded by cores, not GPU figures, and is labelled so.
"""
from __future__ import annotations

import os
import statistics
import tempfile
import time


def add_arguments(p) -> None:
    p.add_argument("--model", default="llama-tiny")
    p.add_argument("--families", default="rmsnorm", help="comma-separated families")
    p.add_argument("--budget", type=int, default=16, help="experiments per run")
    p.add_argument("--workers", default="1,2", help="comma-separated worker counts")
    p.add_argument("--ray", default=None, metavar="ADDRESS", dest="ray_address",
                   help="also run each worker count on this Ray cluster (local: start one here)")
    p.add_argument("--seed", type=int, default=0)
    from engine.verify import VERIFY_ORDERS
    p.add_argument("--verify-order", default="auto", choices=VERIFY_ORDERS,
                   help="the runs' verify order (engine/loop.py RunConfig.verify_order)")
    p.add_argument("--db", default=None, help="SQLite file for the runs (default: a temporary one)")
    p.add_argument("--out", default=None, help="also write the Markdown to this file")
    p.add_argument("--skip-runs", action="store_true", help="only the loop's serial costs")


class ScalingError(ValueError):
    pass


class FixedCandidates:
    """The same candidates for every configuration, whatever the results: each family's starter,
    then points of its search space in a seeded order. The search proper follows what it keeps,
    and under the interpreter a kernel's speed sets its evaluation time, so two runs of the search
    would compare different work; these compare only the backends."""

    name = "fixed"

    def __init__(self, seed: int = 0):
        self.seed = seed

    def propose(self, family, history, best):
        import random
        from engine.proposers import Proposal
        from engine.verify import source_hash
        tried = {h["source_hash"] for h in history}
        start = family.starter()
        if source_hash(start) not in tried:
            return Proposal(start, "starter kernel for " + family.name,
                            params=dict(family.default), proposer="fixed")
        rng = random.Random(f"{self.seed}:{family.name}")
        for i in range(2000):
            point = {k: rng.choice(v) for k, v in family.space.items()}
            src = family.render(point)
            if source_hash(src) not in tried:
                return Proposal(src, f"fixed point {i}", params=point, proposer="fixed",
                                parent_id=best["id"] if best else None)
        from engine.proposers import SpaceExhausted
        raise SpaceExhausted(family.name)


def loop_rate(exps: list[dict]) -> tuple[float, float]:
    """(experiments per hour over the loop, seconds that took) from a run's experiments."""
    timed = [e for e in exps if e.get("created_at")]
    if len(timed) < 2:
        return 0.0, 0.0
    start = min(e["created_at"] - (e.get("duration_s") or 0.0) for e in timed)
    wall = max(e["created_at"] for e in timed) - start
    return (3600.0 * len(timed) / wall if wall > 0 else 0.0), wall


def serial_costs(history_len: int = 400, repeats: int = 50) -> dict:
    """Seconds per experiment the engine thread spends, whatever the number of workers."""
    import kernels
    from engine import verify
    from engine.proposers import SearchProposer
    from engine.store import Store
    fam = kernels.get("rmsnorm")
    prop = SearchProposer(0)
    history, best = [], None
    for i in range(history_len):   # a long-running target: the search must skip all of these
        p = prop.propose(fam, history, best)
        history.append({"source_hash": verify.source_hash(p.source), "params": p.params,
                        "state": "reverted", "seq": i + 1})
    t = time.perf_counter()
    for _ in range(repeats):
        p = prop.propose(fam, history, best)
    t_propose = (time.perf_counter() - t) / repeats
    t = time.perf_counter()
    for _ in range(repeats):
        verify.static_check(p.source, fam.arg_names)
    t_static = (time.perf_counter() - t) / repeats

    with tempfile.TemporaryDirectory() as d:
        s = Store(os.path.join(d, "bench.db"))
        run_id = s.create_run("bench", {}, {}, "interpreter", None)
        s.add_target(run_id, "rmsnorm", "float32", [{"shape": [8, 64], "count": 1}], 0.5)
        target = s.targets(run_id)[0]
        stages = [dict(stage=st, status="passed", detail="") for st in verify.STAGES]
        writes = []
        for i in range(history_len):
            exp = dict(run_id=run_id, target_id=target["id"], family="rmsnorm",
                       proposer="search", hypothesis="bench", source=p.source,
                       source_hash=f"{i:064x}", timing_mode="interpreter", state="reverted",
                       latency_us=100.0 + i, noise=0.01, duration_s=1.0)
            t = time.perf_counter()
            s.record_experiment(exp, stages, {"experiments": i + 1})
            writes.append(time.perf_counter() - t)
        # what the loop reads per proposal (engine/loop.py _Dispatch._experiments): the rows
        # committed since its last read, the targets, and its copy of the target's history
        cache = s.experiments(run_id)
        history = list(cache)
        t = time.perf_counter()
        for _ in range(repeats):
            cache += s.experiments(run_id, since_id=cache[-1]["id"])
            s.targets(run_id)
            list(history)
        t_read = (time.perf_counter() - t) / repeats
        s.close()
    t_write = statistics.median(writes)
    return {"history": history_len, "propose_s": t_propose, "static_s": t_static,
            "read_s": t_read, "write_s": t_write,
            "serial_s": t_propose + t_static + t_read + t_write}


def main(a, log=print) -> int:
    from engine import backends, hw
    from engine.loop import ConfigError, RunConfig, execute
    from engine.store import Store
    try:
        counts = [int(x) for x in a.workers.split(",") if x.strip()]
    except ValueError:
        raise ScalingError(f"--workers takes comma-separated counts, e.g. 1,2; got {a.workers!r}")
    if not counts or any(n < 1 for n in counts):
        raise ScalingError("--workers counts must be positive")
    families = [f.strip() for f in a.families.split(",") if f.strip()]
    device = hw.detect()
    gpu = device["timing_mode"] == "gpu"
    lines = ["# Scaling: experiments per hour", "",
             f"Machine: {device['name']}" + ("" if gpu else " (no GPU: every worker runs Triton's "
             "interpreter on the CPU; interpreter timings, not GPU figures)"), ""]
    db_dir = None
    if a.db:
        db = a.db
    else:
        db_dir = tempfile.mkdtemp(prefix="nightshift-scaling-")
        db = os.path.join(db_dir, "scaling.db")
    configs = [(n, None) for n in counts] + ([(n, a.ray_address) for n in counts]
                                             if a.ray_address else [])
    rows = []
    if not a.skip_runs:
        for n, address in configs:
            cfg = RunConfig(model=a.model, families=families, budget_experiments=a.budget,
                            seed=a.seed, db=db, patience=10_000, e2e_check=False,
                            workers=n, ray_address=address, verify_order=a.verify_order)
            try:
                cfg.validate()
            except ConfigError as e:
                raise ScalingError(str(e)) from None
            label = f"{backends.kind(n, address)} x{n}"
            log(f"== {label}: {a.budget} experiments on {a.model} ({', '.join(families)})")
            t0 = time.monotonic()
            run_id = execute(cfg, log=lambda s: None, proposer=FixedCandidates(a.seed))
            total = time.monotonic() - t0
            s = Store(db, readonly=True)
            exps = s.experiments(run_id)
            workers = s.workers(run_id)
            s.close()
            rate, wall = loop_rate(exps)
            evals = [e["duration_s"] for e in exps
                     if e.get("worker") and e.get("duration_s") and not e.get("retimed_on")]
            retimes = [e["retime_s"] for e in exps if e.get("retime_s")]
            rows.append(dict(label=label, run_id=run_id, n=len(exps), wall=wall, total=total,
                             rate=rate, t_eval=statistics.median(evals) if evals else None,
                             retimed=len(retimes),
                             t_retime=statistics.median(retimes) if retimes else None,
                             kept=sum(1 for e in exps if e["state"] == "kept"),
                             jobs=" / ".join(f"{w['name']} {w['jobs']}" for w in workers)))
            log(f"   {rate:.0f} experiments/hour over {wall:.0f} s of loop ({total:.0f} s in all)")
        base = rows[0]["rate"] if rows and rows[0]["rate"] else None
        lines += ["## Throughput", "",
                  f"`python -m engine scaling --model {a.model} --families {','.join(families)} "
                  f"--budget {a.budget} --workers {a.workers}"
                  + (f" --ray {a.ray_address}" if a.ray_address else "")
                  + (f" --verify-order {a.verify_order}" if a.verify_order != "auto" else "") + "`",
                  "",
                  "| backend | experiments | loop wall (s) | experiments / hour | vs first | "
                  "median s per experiment | re-timed on reference (median s) | kept | "
                  "jobs per worker |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
        for r in rows:
            rel = f"{r['rate'] / base:.2f}x" if base else "-"
            te = f"{r['t_eval']:.1f}" if r["t_eval"] else "-"
            rt = f"{r['retimed']} ({r['t_retime']:.1f})" if r["t_retime"] else "0"
            lines.append(f"| {r['label']} | {r['n']} | {r['wall']:.0f} | {r['rate']:.0f} | {rel} | "
                         f"{te} | {rt} | {r['kept']} | {r['jobs']} |")
        lines.append("")
    c = serial_costs()
    lines += ["## The loop's serial costs", "",
              f"Per experiment, in the one engine thread, with a target {c['history']} experiments "
              f"deep (measured in this process):", "",
              "| step | ms |", "|---|---:|",
              f"| search proposes one candidate | {1e3 * c['propose_s']:.2f} |",
              f"| static check of the candidate | {1e3 * c['static_s']:.2f} |",
              f"| read the experiments committed since the last proposal, and the targets | "
              f"{1e3 * c['read_s']:.2f} |",
              f"| commit the experiment and its 5 verification rows (SQLite, WAL) | "
              f"{1e3 * c['write_s']:.2f} |",
              f"| **total** | **{1e3 * c['serial_s']:.2f}** |", "",
              f"The engine thread alone could therefore sustain about "
              f"{3600 / c['serial_s']:,.0f} experiments per hour.", ""]
    text = "\n".join(lines) + "\n"
    log(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    return 0
