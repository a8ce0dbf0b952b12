"""Read-only data access for the dashboard.

Everything here reads the engine's SQLite file through ``engine.store.Store(path, readonly=True)``
and returns plain dicts or pandas DataFrames; nothing here writes, and nothing imports Streamlit,
so the pages stay thin and these functions are testable on their own. Queries the Store does not
have are written here with ``store.db.query`` (SELECT only).
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pandas as pd

from engine.store import STAGES, Store, StoreError  # noqa: F401  (StoreError: for the pages)

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DB = "data/runs.db"
# A real run recorded by the engine on a GPU, shipped in the repository: what the dashboard opens
# on a fresh machine whose database has no runs yet. Only ever opened read-only.
RECORDED_DB = "data/recorded_h200.db"
ACTIVE_STATUSES = ("running", "paused")  # runs.status values for which the page keeps refreshing

# The experiment table's columns, in display order; everything else the page needs is derived.
TABLE_COLUMNS = ["seq", "family", "state", "failed_stage", "hypothesis", "latency_us", "speedup",
                 "pct_sol"]
# Columns read into the experiments frame (never "source": it is the bulk of the table).
EXPERIMENT_FIELDS = ["id", "seq", "family", "target_id", "created_at", "state", "failed_stage",
                     "error", "hypothesis", "latency_us", "noise", "speedup", "pct_sol",
                     "timing_mode", "duration_s", "proposer", "parent_id", "tokens_in",
                     "tokens_out", "cost_usd", "worker", "gpu", "first_latency_us", "retimed_on",
                     "attempts"]
# Added to the table when the run used an LLM proposer (the search proposer has no tokens).
LLM_COLUMNS = ["proposer", "tokens_in", "tokens_out", "cost_usd"]
# Added to the table when the run evaluated on more than one worker: who evaluated each
# experiment (and whether the reference worker re-timed it) and on which device.
WORKER_COLUMNS = ["worker", "gpu"]

INTERPRETER_LABEL = "interpreter timing — not GPU performance"


def default_db_path() -> str:
    """The sidebar's initial database path: $NIGHTSHIFT_DB when set (tests, other checkouts)."""
    return os.environ.get("NIGHTSHIFT_DB") or DEFAULT_DB


def resolve_db_path(path: str) -> Path:
    """Relative paths are taken from the repository root, like the engine's default, so the
    dashboard and the engine agree on "data/runs.db" whatever directory streamlit was started in."""
    p = Path(path).expanduser()
    return p if p.is_absolute() else ROOT / p


def open_store(path: str) -> Store | None:
    """A read-only Store, or None when there is no database there yet (no run was started).

    Raises StoreError for a path that exists but cannot be read as a database."""
    p = resolve_db_path(path)
    if not p.exists():
        return None
    store = Store(p, readonly=True)
    # A file the engine created but has not migrated yet (or any other SQLite file) has no runs
    # table; treat it like a missing database rather than failing every query below.
    if "runs" not in store.db.table_names():
        store.close()
        return None
    return store


# ---- runs -------------------------------------------------------------------------------------
def list_runs(store: Store) -> list[dict]:
    """Runs, newest first, with just what the run selector shows (not the JSON blobs)."""
    return list(store.db.query(
        """SELECT id, created_at, updated_at, status, model, timing_mode, experiments_done,
                  recorded, device
           FROM runs ORDER BY created_at DESC, id DESC"""))


def get_run(store: Store, run_id: str) -> dict | None:
    return store.get_run(run_id)


def elapsed_s(run: dict, now: float | None = None) -> float:
    """Wall time of a run: up to now while it is active, else up to its last update."""
    end = (now or time.time()) if run.get("status") in ACTIVE_STATUSES else run["updated_at"]
    return max(0.0, end - run["created_at"])


def format_speedup(v: float) -> str:
    """1.084× for GPU-scale ratios; 0.000633× (not 0.001×) for interpreter ones."""
    return f"{v:.3f}×" if v >= 0.1 else f"{v:.3g}×"


def format_duration(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h {m:02d}m {s:02d}s" if h else (f"{m}m {s:02d}s" if m else f"{s}s")


# ---- experiments ------------------------------------------------------------------------------
def experiments_frame(store: Store, run_id: str, cache: dict | None = None) -> pd.DataFrame:
    """All experiments of a run (ordered by id = seq order), without the source column.

    Experiments are insert-only, so with a ``cache`` dict (kept in the session between refreshes)
    only rows newer than the last one seen are read: a refresh of a long run reads a few rows,
    not the whole table."""
    key = (str(store.path), run_id)
    frame, since = None, 0
    if cache is not None and cache.get("key") == key:
        frame, since = cache["frame"], cache["last_id"]
    # Only the columns the file has: a database written before scale-out (the recorded one)
    # has no gpu / retimed_on / ... columns; they come back empty rather than failing the read.
    have = {r[1] for r in store.db.conn.execute("PRAGMA table_info(experiments)")}
    cols = [c for c in EXPERIMENT_FIELDS if c in have]
    new = list(store.db.query(
        f"SELECT {', '.join(cols)} FROM experiments "
        "WHERE run_id = ? AND id > ? ORDER BY id", [run_id, since]))
    if frame is None or new:
        # The cached frame is never changed in place (callers only filter it): a refresh with
        # new rows makes a new frame, and one without returns the same object, so the page can
        # tell "nothing new" by identity and keep its figures.
        add = pd.DataFrame(new, columns=cols).reindex(columns=EXPERIMENT_FIELDS)
        frame = add if frame is None or frame.empty else pd.concat([frame, add], ignore_index=True)
    if cache is not None:
        cache.update(key=key, frame=frame,
                     last_id=int(frame["id"].iloc[-1]) if len(frame) else 0)
    return frame


def targets_frame(store: Store, run_id: str) -> pd.DataFrame:
    cols = ["id", "family", "dtype", "fraction", "ref_latency_us", "sol_latency_us",
            "best_latency_us", "speedup", "state", "experiments", "no_improve"]
    return pd.DataFrame([{c: t.get(c) for c in cols} for t in store.targets(run_id)], columns=cols)


def stage_outcomes_frame(store: Store, run_id: str) -> pd.DataFrame:
    """Store.stage_outcomes as a frame: one row per (stage, status) with count n."""
    return pd.DataFrame(store.stage_outcomes(run_id), columns=["stage", "status", "n"])


def events_frame(store: Store, run_id: str, limit: int = 200) -> pd.DataFrame:
    cols = ["ts", "level", "message"]
    df = pd.DataFrame(store.events(run_id, limit=limit), columns=["id", "run_id"] + cols)[cols]
    df["ts"] = pd.to_datetime(df["ts"], unit="s", utc=True).dt.tz_convert(None)
    return df


def experiment_table(exps: pd.DataFrame, llm: bool = False, workers: bool = False) -> pd.DataFrame:
    """The page's experiment table: newest first, so a live run's latest result is on top.

    llm: add the proposer, tokens and cost columns (only meaningful for an LLM proposer);
    workers: add the worker (see worker_labels) and device columns (for a run on several)."""
    cols = TABLE_COLUMNS + (LLM_COLUMNS if llm else []) + (WORKER_COLUMNS if workers else [])
    table = exps[cols].copy() if workers else exps[cols]
    if workers:
        table["worker"] = worker_labels(exps)
    return table.sort_values("seq", ascending=False).reset_index(drop=True)


def worker_labels(exps: pd.DataFrame) -> pd.Series:
    """Per experiment, the worker that evaluated it, e.g. "w2", with "re-timed on w0" when the
    reference worker's timing replaced that worker's (its latency and speedup are then the
    reference's), and "retried" when its first worker died under it. Whole columns at once:
    the live page makes this for every experiment of a long run."""
    out = exps["worker"].fillna("").astype(str)
    retimed = exps["retimed_on"]
    out = out.where(retimed.isna(), out + " · re-timed on " + retimed.fillna("").astype(str))
    retried = pd.to_numeric(exps["attempts"], errors="coerce") > 1
    return out.where(~retried, out + " · retried")


def worker_note(exp: dict) -> str | None:
    """Where one experiment was evaluated, for its detail: "evaluated on w2 (cuda:2 NVIDIA H200);
    re-timed on the reference worker w0 (w2 measured 12.3 µs)"; None for an experiment recorded
    before the engine said (no worker or device)."""
    if not exp.get("worker") or not (exp.get("gpu") or exp.get("retimed_on")):
        return None
    parts = [f"evaluated on {exp['worker']}" + (f" ({exp['gpu']})" if exp.get("gpu") else "")]
    if exp.get("retimed_on"):
        first = exp.get("first_latency_us")
        parts.append(f"re-timed on the reference worker {exp['retimed_on']}"
                     + (f" ({exp['worker']} measured {first:,.1f} µs)" if first else "")
                     + ": its time is the reference's, so it compares with the other kept ones")
    if (exp.get("attempts") or 1) > 1:
        parts.append("its first worker died under it, so it was run again on another")
    return "; ".join(parts)


def filter_experiments(exps: pd.DataFrame, families=None, states=None,
                       text: str | None = None) -> pd.DataFrame:
    """The experiments the table's filters keep: any of ``families``, any of ``states`` (empty or
    None: all), and ``text`` found (case-insensitive) in the hypothesis, error or failed stage."""
    keep = pd.Series(True, index=exps.index)
    if families:
        keep &= exps["family"].isin(list(families))
    if states:
        keep &= exps["state"].isin(list(states))
    if text and text.strip():
        needle = text.strip().lower()
        hay = (exps["hypothesis"].fillna("") + " " + exps["error"].fillna("") + " "
               + exps["failed_stage"].fillna("")).str.lower()
        keep &= hay.str.contains(needle, regex=False)
    return exps[keep]


def uses_llm(exps: pd.DataFrame) -> bool:
    """Whether any experiment came from an LLM proposer (it is the one that records tokens)."""
    if exps.empty:
        return False
    return bool(exps["tokens_in"].notna().any() or exps["tokens_out"].notna().any()
                or exps["cost_usd"].notna().any() or (exps["proposer"].fillna("search") != "search").any())


def llm_usage(exps: pd.DataFrame) -> dict:
    """Tokens in / out and cost summed over a run's experiments (0 where nothing was recorded)."""
    return {k: float(pd.to_numeric(exps[k], errors="coerce").fillna(0).sum()) if not exps.empty
            else 0.0 for k in ("tokens_in", "tokens_out", "cost_usd")}


# ---- evaluation workers (engine/backends.py; absent in older databases) -------------------------
WORKER_FIELDS = ["name", "backend", "reference", "host", "device", "gpu_name", "pid", "state",
                 "family", "since", "jobs", "died", "restarts", "busy_s", "started_at",
                 "updated_at"]
WORKER_SUMMARY = ["name", "label", "host", "device", "state", "family", "jobs", "died",
                  "restarts", "busy_share", "experiments", "per_hour"]
GONE_STATES = ("dead", "closed")   # a worker in these does no more work: its clock stopped
MIN_RATE_WALL_S = 60.0             # a rate over less than a minute of work says little


def workers_frame(store: Store, run_id: str) -> pd.DataFrame:
    """The run's evaluation workers as the engine last wrote them (about once a second while the
    run goes), reference first. Empty for a run from before the engine had workers."""
    return pd.DataFrame(store.workers(run_id), columns=WORKER_FIELDS)


def worker_summary(workers: pd.DataFrame, exps: pd.DataFrame, run: dict,
                   now: float | None = None) -> pd.DataFrame:
    """One row per worker, for the Live run page: label (the reference marked), host, device,
    state with how long it has been in it, current family, jobs, died, restarts, busy share,
    experiments (the run's experiments it evaluated) and experiments per hour.

    The clock: up to now while the run is active, else up to the worker's last update; a dead or
    closed worker's stops when it entered that state. It starts when the pool started (the
    earliest started_at of the run's workers): a worker's own started_at moves on when it is
    restarted, while its jobs and busy seconds keep counting, so measured from there a
    restarted worker would look busier than it was. The rate counts the experiments since that
    start, so a resumed run (a new pool, counters from zero) is not credited with the old ones."""
    if workers.empty:
        return pd.DataFrame(columns=WORKER_SUMMARY)
    active = run.get("status") in ACTIVE_STATUSES
    now = time.time() if now is None else now
    started = pd.to_numeric(workers["started_at"], errors="coerce")
    pool_start = float(started.min()) if started.notna().any() else None
    if exps.empty or "worker" not in exps:
        mine = pd.DataFrame(columns=["worker", "created_at"])
    else:
        mine = exps[["worker", "created_at"]]
    total = mine["worker"].value_counts()
    recent = (mine[pd.to_numeric(mine["created_at"], errors="coerce") >= pool_start]["worker"]
              .value_counts() if pool_start is not None else pd.Series(dtype=int))
    rows = []
    for w in workers.to_dict("records"):
        end = now if active else float(w["updated_at"])
        if w["state"] in GONE_STATES and pd.notna(w["since"]):
            end = min(end, float(w["since"]))
        wall = end - pool_start if pool_start is not None else 0.0
        in_state = end - float(w["since"]) if pd.notna(w["since"]) else None
        # how long in the state, while that still changes; a finished run's "closed" needs none
        state = w["state"] + (f" {format_duration(in_state)}" if active and in_state is not None
                              and w["state"] not in GONE_STATES else "")
        device = w["device"] or "?"
        if w["gpu_name"] and w["gpu_name"] != device:
            device = f"{device} {w['gpu_name']}"
        rows.append(dict(
            name=w["name"], label=w["name"] + (" · reference" if w["reference"] else ""),
            host=w["host"], device=device, state=state,
            family=w["family"] if w["state"] == "busy" else None,
            jobs=int(w["jobs"]), died=int(w["died"]), restarts=int(w["restarts"]),
            # busy seconds can exceed the wall by the overlap of a restart: at most all of it
            busy_share=min(1.0, float(w["busy_s"]) / wall) if wall > 0 else None,
            experiments=int(total.get(w["name"], 0)),
            per_hour=(int(recent.get(w["name"], 0)) * 3600.0 / wall
                      if wall >= MIN_RATE_WALL_S else None)))
    return pd.DataFrame(rows, columns=WORKER_SUMMARY)


def workers_caption(workers: pd.DataFrame) -> str:
    """One line over the workers table: how many, which backend, how many busy, the reference."""
    n = len(workers)
    backend = {"single": "one local worker", "local": "local pool", "ray": "Ray cluster"}.get(
        str(workers["backend"].iloc[0]), str(workers["backend"].iloc[0]))
    busy = int((workers["state"] == "busy").sum())
    dead = int((workers["state"] == "dead").sum())
    ref = workers.loc[workers["reference"].astype(bool), "name"]
    hosts = workers["host"].dropna().unique()
    where = f", {len(hosts)} hosts" if len(hosts) > 1 else (f" on {hosts[0]}" if len(hosts) else "")
    parts = [f"{n} workers ({backend}{where})", f"{busy} busy"] + ([f"{dead} dead"] if dead else [])
    if len(ref):
        parts.append(f"reference {ref.iloc[0]}: a would-be new best from another worker is "
                     "re-timed there, so every kept timing comes from one device")
    return " · ".join(parts)


# ---- the recorded run and labels ----------------------------------------------------------------
def recorded_db_path() -> Path | None:
    p = ROOT / RECORDED_DB
    return p if p.exists() else None


def count_runs(path: str) -> int:
    """Number of runs in the database at ``path``; 0 when there is none (or no runs table)."""
    try:
        store = open_store(path)
    except StoreError:
        return 0
    if store is None:
        return 0
    try:
        return int(next(iter(store.db.query("SELECT COUNT(*) AS n FROM runs")))["n"])
    finally:
        store.close()


def _major_minor(version) -> str:
    parts = str(version or "?").split("+")[0].split(".")
    return ".".join(parts[:2])


def recorded_label(run: dict) -> str | None:
    """The badge of a run recorded elsewhere (runs.recorded = 1), e.g. "Recorded on NVIDIA H200,
    torch 2.11, Triton 3.6, 2026-11-30"; None for a run made here."""
    if not run or not run.get("recorded"):
        return None
    dev = as_dict(run.get("device"))
    day = pd.Timestamp(run["created_at"], unit="s", tz="UTC").strftime("%Y-%m-%d")
    return (f"Recorded on {dev.get('name') or 'an unknown device'}, torch "
            f"{_major_minor(dev.get('torch'))}, Triton {_major_minor(dev.get('triton'))}, {day}")


def device_label(run: dict) -> str:
    """Where a run ran and how it was timed, e.g. "NVIDIA H200 · GPU timing"."""
    dev = as_dict(run.get("device"))
    mode = "interpreter timing" if run.get("timing_mode") == "interpreter" else "GPU timing"
    return f"{dev.get('name') or '?'} · {mode}"


def as_dict(value) -> dict:
    if isinstance(value, dict):
        return value
    if isinstance(value, str):
        try:
            out = json.loads(value)
            return out if isinstance(out, dict) else {}
        except json.JSONDecodeError:
            return {}
    return {}


# ---- one target: kernels, shapes, roofline, verifier details -----------------------------------
def targets(store: Store, run_id: str) -> list[dict]:
    """The run's targets with their JSON decoded (shapes, ref_shape_times), most time first."""
    return store.targets(run_id)


def experiment(store: Store, exp_id: int) -> dict | None:
    """One experiment with its source and decoded params / shape_times."""
    return store.experiment(int(exp_id))


def verifications_frame(store: Store, exp_id: int) -> pd.DataFrame:
    cols = ["stage", "status", "worst_error", "failed_case", "detail", "duration_s"]
    return pd.DataFrame(store.verifications(int(exp_id)), columns=["id", "experiment_id"] + cols)[cols]


def _shape_key(shape) -> str:
    return "x".join(str(int(d)) for d in shape)


def shape_frame(target: dict, chosen: dict[str, dict]) -> pd.DataFrame:
    """Per shape of a target: calls, eager time, speed of light, and for each chosen experiment
    (label -> experiment with shape_times) its time, speedup over eager and % of speed of light.

    Columns: shape, calls, eager_us, sol_us, then "<label> us", "<label> speedup",
    "<label> % SOL" per label. A failed experiment has no timings: its columns stay empty."""
    ref = {_shape_key(r["shape"]): r for r in (target.get("ref_shape_times") or [])}
    shapes = [(_shape_key(s["shape"]), s.get("count")) for s in (target.get("shapes") or [])]
    rows = []
    for key, count in shapes:
        r = ref.get(key, {})
        row = {"shape": key, "calls": count, "eager_us": r.get("us"), "sol_us": r.get("sol_us")}
        for label, exp in chosen.items():
            mine = {_shape_key(x["shape"]): x for x in ((exp or {}).get("shape_times") or [])}
            us = mine.get(key, {}).get("us")
            row[f"{label} us"] = us
            row[f"{label} speedup"] = (r["us"] / us) if us and r.get("us") else None
            row[f"{label} % SOL"] = mine.get(key, {}).get("pct_sol")
        rows.append(row)
    return pd.DataFrame(rows)


def roofline_frame(family: str, dtype: str, points: list[tuple[str, list, float]]) -> pd.DataFrame:
    """Points for a roofline plot: for each (label, shape, microseconds), the family's cost at that
    shape (kernels.get(family).cost: minimum bytes moved and flops) turned into arithmetic
    intensity (flop/byte), achieved FLOP/s and achieved bytes/s.

    Imports kernels (torch, not triton). Empty when the family is unknown to this checkout."""
    cols = ["label", "shape", "bytes", "flops", "intensity", "flops_per_s", "bytes_per_s", "us"]
    try:
        import kernels
        fam = kernels.get(family)
    except Exception:  # a family recorded elsewhere that this checkout has no file for
        return pd.DataFrame(columns=cols)
    rows = []
    for label, shape, us in points:
        if not us or us <= 0:
            continue
        nbytes, flops = fam.cost(tuple(shape), dtype)
        sec = us * 1e-6
        rows.append(dict(label=label, shape=_shape_key(shape), bytes=nbytes, flops=flops,
                         intensity=flops / nbytes if nbytes else None, flops_per_s=flops / sec,
                         bytes_per_s=nbytes / sec, us=us))
    return pd.DataFrame(rows, columns=cols)


# ---- end-to-end checks (engine/integrate.py; absent in older databases) -------------------------
E2E_COLUMNS = ["check_id", "seq", "created_at", "status", "speedup", "compile_speedup",
               "eager_us", "optimized_us", "timing_mode", "label"]
E2E_GOOD = ("passed", "partial")  # checks whose outputs matched: their timings can be claimed


def e2e_frame(store: Store, run_id: str) -> pd.DataFrame:
    """Measured end-to-end speedups of a run, oldest first: one row per end-to-end check whose
    outputs matched the original model's (status passed or partial) and that timed both the eager
    and the optimized model. speedup = eager / optimized; compile_speedup = torch.compile /
    torch.compile with the kernels, when both were timed. seq places the check after the last
    experiment before it, for the charts.

    Empty when the database has no e2e tables yet (older schema) or the run has no such check,
    so the pages fall back to the Amdahl projection and say so."""
    empty = pd.DataFrame(columns=E2E_COLUMNS)
    try:
        if not {"e2e_checks", "e2e_timings"} <= set(store.db.table_names()):
            return empty
        rows = list(store.db.query(
            """SELECT c.id AS check_id, c.created_at, c.status, t.variant, t.latency_us,
                      t.timing_mode
               FROM e2e_checks c JOIN e2e_timings t ON t.check_id = c.id
               WHERE c.run_id = ? ORDER BY c.id, t.id""", [run_id]))
    except Exception:  # a layout this page does not know: no measured figures rather than a crash
        return empty
    checks: dict[int, dict] = {}
    for r in rows:
        c = checks.setdefault(r["check_id"], dict(check_id=r["check_id"], created_at=r["created_at"],
                                                  status=r["status"], lat={},
                                                  timing_mode=r["timing_mode"]))
        if r["latency_us"]:
            c["lat"][r["variant"]] = float(r["latency_us"])
    out = []
    for c in checks.values():
        lat = c.pop("lat")
        if c["status"] not in E2E_GOOD or not lat.get("eager") or not lat.get("optimized"):
            continue
        comp = (lat["compile"] / lat["compile_optimized"]
                if lat.get("compile") and lat.get("compile_optimized") else None)
        label = f"check {c['status']}" + (f"; with torch.compile {comp:.3f}×" if comp else "")
        out.append(dict(c, speedup=lat["eager"] / lat["optimized"], compile_speedup=comp,
                        eager_us=lat["eager"], optimized_us=lat["optimized"], label=label))
    if not out:
        return empty
    df = pd.DataFrame(out, columns=[c for c in E2E_COLUMNS if c != "seq"])
    times = pd.Series([r["created_at"] for r in store.db.query(
        "SELECT created_at FROM experiments WHERE run_id = ? ORDER BY id", [run_id])], dtype=float)
    df.insert(1, "seq", [int(times.searchsorted(t, side="right")) for t in df["created_at"]])
    return df.reset_index(drop=True)


# ---- run summaries (Compare and Report) --------------------------------------------------------
def target_summary(target_rows: list[dict], exps: pd.DataFrame) -> pd.DataFrame:
    """One row per target: share of model time, experiments, kept, eager and best time, speedup
    over eager, % of speed of light and the experiment (seq) that found the best kernel."""
    cols = ["family", "dtype", "fraction", "experiments", "kept", "failed", "eager_us", "best_us",
            "speedup", "pct_sol", "best_seq"]
    rows = []
    for t in target_rows:
        mine = exps[exps["target_id"] == t["id"]] if not exps.empty else exps
        best = mine[mine["id"] == t.get("best_experiment_id")] if not mine.empty else mine
        rows.append(dict(
            family=t["family"], dtype=t["dtype"], fraction=t["fraction"], experiments=len(mine),
            kept=int((mine["state"] == "kept").sum()) if not mine.empty else 0,
            failed=int((mine["state"] == "failed").sum()) if not mine.empty else 0,
            eager_us=t.get("ref_latency_us"), best_us=t.get("best_latency_us"),
            speedup=t.get("speedup"),
            pct_sol=(100 * t["sol_latency_us"] / t["best_latency_us"])
            if t.get("sol_latency_us") and t.get("best_latency_us") else None,
            best_seq=int(best["seq"].iloc[0]) if not best.empty else None))
    return pd.DataFrame(rows, columns=cols)


def projected_final(target_rows: list[dict]) -> float:
    """Amdahl-projected end-to-end speedup with every target at its best kept kernel."""
    return amdahl({t["family"]: float(t["fraction"]) for t in target_rows
                   if t.get("fraction") is not None},
                  {t["family"]: t.get("speedup") for t in target_rows})


# ---- derived series ---------------------------------------------------------------------------
def best_so_far(exps: pd.DataFrame) -> pd.DataFrame:
    """Per family, the best kept speedup up to and including each of that family's experiments.

    Only kept experiments define the best: a reverted one was not better, a failed one has no
    valid timing. NaN until the family's first keep. Columns: family, seq, best."""
    if exps.empty:
        return pd.DataFrame(columns=["family", "seq", "best"])
    df = exps.sort_values("seq")[["family", "seq", "state", "speedup"]].copy()
    kept = df["speedup"].where(df["state"] == "kept")
    # cummax leaves NaN on the rows that are not kept; carry the best forward over them.
    df["best"] = kept.groupby(df["family"]).cummax().groupby(df["family"]).ffill()
    return df[["family", "seq", "best"]].reset_index(drop=True)


def amdahl(fractions: dict[str, float], speedups: dict[str, float]) -> float:
    """End-to-end speedup when each family f (share of model time) runs s times faster.

    projected = 1 / ((1 - Σf) + Σ f/s), with s = max(1, s): a kernel slower than the reference
    is never used, so it cannot slow the model down. Families without a speedup count s = 1."""
    total = min(1.0, sum(fractions.values()))
    rest = sum(f / max(1.0, speedups.get(fam) or 1.0) for fam, f in fractions.items())
    return 1.0 / ((1.0 - total) + rest)


def amdahl_limit(targets: pd.DataFrame) -> float:
    """The ceiling 1 / (1 - Σf): the projection if every targeted kernel took no time at all."""
    total = float(targets["fraction"].dropna().sum()) if not targets.empty else 0.0
    return float("inf") if total >= 1.0 else 1.0 / (1.0 - total)


def amdahl_projection(exps: pd.DataFrame, targets: pd.DataFrame) -> pd.DataFrame:
    """The projected end-to-end speedup after each experiment (seq 0 = before any: 1x).

    Columns: seq, created_at, projected, family (the family that experiment worked on).
    Vectorised (a running best per family, then Amdahl row-wise): a live page recomputes it for
    10,000 experiments every refresh."""
    cols = ["seq", "created_at", "projected", "family"]
    fractions = {r.family: float(r.fraction) for r in targets.itertuples()
                 if pd.notna(r.fraction)}
    start = pd.DataFrame([dict(seq=0, created_at=None, projected=amdahl(fractions, {}),
                               family=None)], columns=cols)
    if exps.empty:
        return start
    df = exps.sort_values("seq")
    kept = pd.to_numeric(df["speedup"], errors="coerce").where(df["state"] == "kept")
    total = min(1.0, sum(fractions.values()))
    denom = pd.Series(1.0 - total, index=df.index)
    for fam, f in fractions.items():
        # this family's best kept speedup so far; 1 before its first keep, never below 1
        best = kept.where(df["family"] == fam).cummax().ffill().fillna(1.0).clip(lower=1.0)
        denom = denom + f / best
    out = pd.DataFrame({"seq": df["seq"].astype(int), "created_at": df["created_at"],
                        "projected": 1.0 / denom, "family": df["family"]})
    return pd.concat([start, out], ignore_index=True)[cols]


def stage_order(outcomes: pd.DataFrame) -> list[str]:
    """The verifier's five stages in pipeline order, then any other recorded stage (static, ...)."""
    extra = sorted(set(outcomes["stage"]) - set(STAGES)) if not outcomes.empty else []
    return list(STAGES) + extra



# ---- one run's report (Report page and its HTML export) ----------------------------------------
def report_data(store: Store, run_id: str) -> dict | None:
    """Everything the report shows of one run, read once: the run row, its targets (raw and as a
    per-family summary), experiments, verifier outcomes, measured end-to-end checks, and the
    Amdahl projection (over experiments and final). None when the run is not there."""
    run = get_run(store, run_id)
    if run is None:
        return None
    target_rows = store.targets(run_id)
    tframe = targets_frame(store, run_id)
    exps = experiments_frame(store, run_id)
    return dict(
        run=run, targets=target_rows, target_frame=tframe, exps=exps,
        outcomes=stage_outcomes_frame(store, run_id), measured=e2e_frame(store, run_id),
        summary=target_summary(target_rows, exps), projection=amdahl_projection(exps, tframe),
        projected=projected_final(target_rows), limit=amdahl_limit(tframe),
        interpreter=run["timing_mode"] == "interpreter"
        or bool((exps["timing_mode"] == "interpreter").any()))


def headline(rep: dict) -> dict:
    """The one number a stakeholder reads first: the measured end-to-end speedup when the run
    has one, else the Amdahl projection, labelled as projected. Keys: kind, value, label, note."""
    tag = " (interpreter timing — not GPU performance)" if rep["interpreter"] else ""
    if not rep["measured"].empty:
        last = rep["measured"].iloc[-1]
        comp = (f"; with torch.compile on both sides {last['compile_speedup']:.3f}×"
                if pd.notna(last["compile_speedup"]) else "")
        return dict(kind="measured", value=float(last["speedup"]),
                    label="Measured end-to-end speedup" + tag,
                    note=f"the whole model with the kept kernels swapped in, against eager: "
                         f"{last['eager_us']:,.0f} µs → {last['optimized_us']:,.0f} µs per forward "
                         f"pass{comp}; Amdahl projected {rep['projected']:.3f}×")
    return dict(kind="projected", value=rep["projected"],
                label="Projected end-to-end speedup (Amdahl, not measured)" + tag,
                note="projected from each family's share of model time and its best kernel's "
                     "speedup: 1 / ((1 - Σf) + Σ f/s); no end-to-end measurement yet")
