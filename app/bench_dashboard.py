"""How fast the pages draw a long run and many runs: `python -m app.bench_dashboard`.

Writes a database of N experiments (default 10,000) over 9 targets through the engine's own writer
(engine.store.Store), with a verifier row per stage and a search point per experiment as the
engine writes them, and a run that is still running (held by this process, heartbeat fresh) so
the page is in live mode; and a second database of M runs (default 100) for the Runs table. Then
times the pages server-side with Streamlit's AppTest, in one process:

- Live run, first render: a new session opening the page (the process already warm, as a server
  is); refresh: the page again after one more experiment landed, as the 1 s refresh sees it (a
  whole-script rerun: an upper bound on the fragment's own rerun);
- Runs, first render with M runs (and the recorded ones in data/), and a rerun after a search;
- Kernels and Report on the 10,000-experiment run, first render (informative; not polled).

Also prints the parts (reading SQLite, building each figure) so a regression points at its cause.
Figures for this machine are in docs/dashboard.md. Not a unit test: it takes a minute or two.
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

FAMILIES = ("rmsnorm", "softmax", "layernorm", "cross_entropy", "matmul", "attention",
            "fused_mlp", "rotary", "reduce")
STAGES = ("smoke", "shape_sweep", "stability", "determinism", "edge_cases")
APP = str(Path(__file__).resolve().parent.parent / "streamlit_app.py")


def make_db(path: Path, n: int, seed: int = 0) -> str:
    """A running run with n experiments spread over 9 targets, written as the engine writes."""
    from engine.store import Store
    rng = random.Random(seed)
    s = Store(path)
    try:
        run_id = s.create_run("llama", {"model": "llama", "proposer": "search"},
                              {"name": "NVIDIA H200", "torch": "2.11.0", "triton": "3.6.0"},
                              "gpu", {"copy_gbps": 4190.0, "matmul_tflops": 806.0})
        fracs = [rng.uniform(0.02, 0.15) for _ in FAMILIES]
        tids = [s.add_target(run_id, f, "bfloat16", [{"shape": [8, 2048, 4096], "count": 3}], fr)
                for f, fr in zip(FAMILIES, fracs)]
        for tid in tids:
            s.update_target(tid, ref_latency_us=1000.0, sol_latency_us=150.0, state="active")
        best = [1000.0] * len(FAMILIES)
        for i in range(n):
            k = rng.randrange(len(FAMILIES))
            r = rng.random()
            if r < 0.2:  # failed at some stage: the stages after it are skipped
                stage = rng.choice(STAGES)
                at = STAGES.index(stage)
                ver = [dict(stage=st, status="passed" if j < at else
                            "failed" if j == at else "skipped", worst_error=1e-3)
                       for j, st in enumerate(STAGES)]
                exp = dict(state="failed", failed_stage=stage, error="max abs error 0.5 > tol")
                upd = None
            else:
                lat = best[k] * rng.uniform(0.9, 1.4)
                kept = lat < best[k] * 0.99
                if kept:
                    best[k] = lat
                ver = [dict(stage=st, status="passed", worst_error=1e-4) for st in STAGES]
                exp = dict(state="kept" if kept else "reverted", latency_us=lat, noise=0.01,
                           speedup=1000.0 / lat, pct_sol=100 * 150.0 / lat)
                upd = dict(best_is_this=True, best_latency_us=lat, speedup=1000.0 / lat) \
                    if kept else None
            s.record_experiment(dict(
                run_id=run_id, target_id=tids[k], family=FAMILIES[k], proposer="search",
                hypothesis=f"BLOCK {64 << (i % 6)}, num_warps {1 << (i % 4)} (from #{i})",
                params={"block": 64 << (i % 6), "num_warps": 1 << (i % 4),
                        "num_stages": 1 + i % 3, "grid": ("rows", "persistent")[i % 2]},
                source=f"# candidate {i}\n" + "x = 1\n" * 40, source_hash=f"h{i}",
                timing_mode="gpu", duration_s=rng.uniform(1, 20), **exp), ver, upd)
            if i % 100 == 0:
                s.event(run_id, f"experiment {i + 1}")
        s.update_run(run_id, current_target=FAMILIES[0], current_reason="benchmark")
        s.claim_run(run_id)     # this process is its engine: the page polls it
        return run_id
    finally:
        s.close()


def make_runs_db(path: Path, n: int, seed: int = 1) -> None:
    """n finished runs of 5 to 40 experiments each, a third of them checked end to end."""
    from engine.store import Store
    rng = random.Random(seed)
    s = Store(path)
    try:
        for r in range(n):
            run_id = s.create_run(rng.choice(("llama", "gpt2", "bert", "op:matmul:4096x4096x4096")),
                                  {"model": "llama", "proposer": "search", "dtype": "auto"},
                                  {"name": "NVIDIA H200"}, "gpu", {"copy_gbps": 4190.0})
            tids = [s.add_target(run_id, f, "bfloat16", [{"shape": [8, 2048], "count": 2}], 0.1)
                    for f in FAMILIES[:3]]
            for tid in tids:
                s.update_target(tid, ref_latency_us=100.0)
            for i in range(rng.randint(5, 40)):
                lat = rng.uniform(60, 140)
                s.record_experiment(dict(
                    run_id=run_id, target_id=tids[i % 3], family=FAMILIES[i % 3],
                    proposer="search", hypothesis="h", source="x", source_hash=f"{r}-{i}",
                    state="kept" if lat < 80 else "reverted", latency_us=lat,
                    speedup=100.0 / lat, timing_mode="gpu"), [])
            if r % 3 == 0:
                s.add_e2e_check(run_id, "check", "passed", 1e-3, 2e-2, "", [],
                                {FAMILIES[0]: "ok"}, timings=[
                                    dict(variant="eager", latency_us=1000.0, timing_mode="gpu"),
                                    dict(variant="optimized", latency_us=rng.uniform(850, 1050),
                                         timing_mode="gpu")])
            s.update_run(run_id, status="done")
    finally:
        s.close()


def add_one(path: Path, run_id: str) -> None:
    from engine.store import Store
    s = Store(path)
    try:
        s.heartbeat(run_id)
        tid = s.targets(run_id)[0]["id"]
        s.record_experiment(dict(run_id=run_id, target_id=tid, family=FAMILIES[0],
                                 proposer="search", hypothesis="one more", source="x",
                                 source_hash=f"more{time.time()}", state="reverted",
                                 latency_us=1100.0, speedup=0.9, timing_mode="gpu"),
                            [dict(stage=st, status="passed") for st in STAGES])
    finally:
        s.close()


def parts(path: Path, run_id: str) -> dict:
    """CPU seconds for each step the live view takes, outside Streamlit."""
    from app import charts, data
    out = {}
    t = time.process_time()
    store = data.open_store(str(path))
    exps = data.experiments_frame(store, run_id)
    out["read experiments"] = time.process_time() - t
    t = time.process_time()
    targets = data.targets_frame(store, run_id)
    outcomes = data.stage_outcomes_frame(store, run_id)
    data.events_frame(store, run_id)
    store.close()
    out["read targets, stage counts, events"] = time.process_time() - t
    t = time.process_time()
    best = data.best_so_far(exps)
    proj = data.amdahl_projection(exps, targets)
    out["derive best-so-far, projection"] = time.process_time() - t
    for name, build in (("speedup figure", lambda: charts.speedup_figure(exps, best)),
                        ("Amdahl figure", lambda: charts.amdahl_figure(proj, 2.0)),
                        ("stage figure", lambda: charts.stage_figure(outcomes))):
        t = time.process_time()
        fig = build()
        fig.to_json()  # what st.plotly_chart serializes
        out[name + " (build + JSON)"] = time.process_time() - t
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experiments", type=int, default=10_000)
    ap.add_argument("--refreshes", type=int, default=5)
    ap.add_argument("--runs", type=int, default=100, help="runs in the Runs table's database")
    ap.add_argument("--db", help="write the database here (default: a temporary file)")
    args = ap.parse_args()
    from streamlit.testing.v1 import AppTest

    tmp = tempfile.TemporaryDirectory()
    path = Path(args.db) if args.db else Path(tmp.name) / "bench.db"
    if path.exists():
        path.unlink()
    t = time.perf_counter()
    run_id = make_db(path, args.experiments)
    print(f"wrote {args.experiments} experiments over {len(FAMILIES)} targets in "
          f"{time.perf_counter() - t:.1f} s: {path} ({path.stat().st_size / 1e6:.1f} MB)")
    os.environ["NIGHTSHIFT_DB"] = str(path)

    # warm the process (imports, Streamlit's own first-run work), as a running server is
    AppTest.from_file(APP, default_timeout=120).run()
    firsts, refreshes = [], []   # (wall s, CPU s of this process)
    for _ in range(3):
        at = AppTest.from_file(APP, default_timeout=120)
        t, c = time.perf_counter(), time.process_time()
        at.run()
        firsts.append((time.perf_counter() - t, time.process_time() - c))
        assert not at.exception, at.exception
    shown = next(m.value for m in at.metric if m.label == "Experiments")
    for _ in range(args.refreshes):
        add_one(path, run_id)
        t, c = time.perf_counter(), time.process_time()
        at.run()
        refreshes.append((time.perf_counter() - t, time.process_time() - c))
        assert not at.exception, at.exception
    now = next(m.value for m in at.metric if m.label == "Experiments")
    assert int(now) == int(shown) + args.refreshes, (shown, now)

    other = {}
    for page in ("app/kernel_page.py", "app/report.py"):
        times = []
        for _ in range(3):
            at = AppTest.from_file(APP, default_timeout=120)
            at.run()
            t, c = time.perf_counter(), time.process_time()
            at.switch_page(page).run()
            times.append((time.perf_counter() - t, time.process_time() - c))
            assert not at.exception, at.exception
        other[page] = times

    runs_path = path.with_name("runs100.db")
    if runs_path.exists():
        runs_path.unlink()
    t = time.perf_counter()
    make_runs_db(runs_path, args.runs)
    print(f"wrote {args.runs} runs in {time.perf_counter() - t:.1f} s: {runs_path}")
    os.environ["NIGHTSHIFT_DB"] = str(runs_path)
    runs_first, runs_search = [], []
    for i in range(3):
        at = AppTest.from_file(APP, default_timeout=120)
        at.run()
        t, c = time.perf_counter(), time.process_time()
        at.switch_page("app/runs_page.py").run()
        runs_first.append((time.perf_counter() - t, time.process_time() - c))
        assert not at.exception, at.exception
        rows = len(at.dataframe[0].value)
        t, c = time.perf_counter(), time.process_time()
        at.text_input(key="runs_q").input(("llama", "h200", "gpt2")[i]).run()
        runs_search.append((time.perf_counter() - t, time.process_time() - c))
        assert not at.exception, at.exception
    print(f"Runs table: {rows} rows ({args.runs} here and the recorded ones in data/)")

    for what, times in (("live page, first render (new session)", firsts),
                        ("live page, refresh after a new experiment", refreshes),
                        ("Kernels page, first render", other["app/kernel_page.py"]),
                        ("Report page, first render", other["app/report.py"]),
                        (f"Runs page with {rows} runs, first render", runs_first),
                        ("Runs page, rerun after a search", runs_search)):
        wall, cpu = [w for w, _ in times], [c for _, c in times]
        print(f"{what}: wall median {statistics.median(wall):.3f} s, max "
              f"{max(wall):.3f} s; CPU median {statistics.median(cpu):.3f} s, max {max(cpu):.3f} s "
              f"(over {len(times)})")
    print(f"load average while measuring: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores "
          "(wall time stretches with other work on the machine; CPU time is this page's own)")
    print("parts (outside Streamlit, whole run read):")
    for name, sec in parts(path, run_id).items():
        print(f"  {name:<40} {sec:.3f} s")
    tmp.cleanup()


if __name__ == "__main__":
    main()
