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

import numpy as np
import pandas as pd

from app import fmt
from engine import hw, plan
from engine.store import STAGES, Store, StoreError  # noqa: F401  (StoreError: for the pages)
from engine.store import effective_status

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
# The runs columns the pages read, when the file has them (the recorded databases predate owner,
# heartbeat_at, notes and tags). Not config / ceilings: the run selector needs neither.
RUN_LIST_FIELDS = ("id", "created_at", "updated_at", "status", "model", "timing_mode",
                   "experiments_done", "recorded", "device", "owner", "heartbeat_at", "notes",
                   "tags", "error")


def _columns(store: Store, table: str) -> set[str]:
    return {r[1] for r in store.db.conn.execute(f"PRAGMA table_info({table})")}


def shown(run: dict | None, now: float | None = None) -> dict | None:
    """The run as the pages show it: ``status`` is engine.store.effective_status (a run whose
    engine is gone, or a recorded run that says running, is "stopped"); the stored value stays
    in ``stored_status``. Every page reads runs through this, so none can show a dead run live."""
    if run is None:
        return None
    out = dict(run)
    out["stored_status"] = run["status"]
    out["status"] = effective_status(run, now)
    out["tags"] = _tags(run.get("tags"))
    return out


def _tags(value) -> list[str]:
    if isinstance(value, list):
        return [str(t) for t in value]
    if isinstance(value, str) and value:
        try:
            out = json.loads(value)
            return [str(t) for t in out] if isinstance(out, list) else []
        except json.JSONDecodeError:
            return []
    return []


def list_runs(store: Store) -> list[dict]:
    """Runs, newest first, with just what the run selector and the Runs table show (not the JSON
    blobs), their status as shown (see ``shown``)."""
    have = _columns(store, "runs")
    cols = ", ".join(c for c in RUN_LIST_FIELDS if c in have)
    return [shown(r) for r in store.db.query(
        f"SELECT {cols} FROM runs ORDER BY created_at DESC, id DESC")]


def get_run(store: Store, run_id: str) -> dict | None:
    return shown(store.get_run(run_id))


def is_active(run: dict) -> bool:
    """Whether the run (as shown) is still changing: an engine is on it."""
    return run.get("status") in ACTIVE_STATUSES


def elapsed_s(run: dict, now: float | None = None) -> float:
    """Wall time of a run: up to now while an engine is on it, else up to its last sign of life
    (its last update or heartbeat): a run whose engine died stops counting where it died."""
    if is_active(run):
        end = now or time.time()
    else:
        end = max(float(run["updated_at"]), float(run.get("heartbeat_at") or 0.0))
    return max(0.0, end - run["created_at"])


def format_speedup(v: float) -> str:
    """A speedup as every page writes it (app/fmt.py: 1.316×, 0.735×, 12.3×, 0.000633×)."""
    return fmt.ratio(v)


def format_duration(seconds: float) -> str:
    return fmt.duration(seconds)


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


TARGET_FIELDS = ["id", "family", "name", "dtype", "fraction", "ref_latency_us",
                 "compile_latency_us", "sol_latency_us", "best_latency_us", "speedup", "state",
                 "experiments", "no_improve"]


def target_names(target_rows: list[dict]) -> dict[int, str]:
    """target id -> how the target reads: its label, else its family; with its contract spec
    when it has one ("rmsnorm · dims=[1], weight=False"), so one family under two contracts in
    one run reads as two targets."""
    out = {}
    for t in target_rows:
        name = t.get("label") or t["family"]
        spec = t.get("spec") or {}
        if isinstance(spec, dict) and spec:
            name += " · " + ", ".join(f"{k}={v}" for k, v in sorted(spec.items()))
        out[int(t["id"])] = name if len(name) <= 60 else name[:59] + "…"
    return out


def targets_frame(store: Store, run_id: str, target_rows: list[dict] | None = None) -> pd.DataFrame:
    """The run's targets, most model time first: one row per target id (a family may appear
    twice, under two contracts), with its display name and both baselines where measured."""
    rows = store.targets(run_id) if target_rows is None else target_rows
    names = target_names(rows)
    return pd.DataFrame([{**{c: t.get(c) for c in TARGET_FIELDS}, "name": names[int(t["id"])]}
                         for t in rows], columns=TARGET_FIELDS)


def baselines(t: dict) -> dict:
    """A target's best kernel against its two baselines: eager (ref_latency_us) and torch.compile
    of the same op (compile_latency_us, None until the engine timed it). All latencies per
    forward pass (each shape's time times its calls). The baseline that counts is the faster of
    the two that were measured.

    Keys: eager_us, compile_us, best_us, base ("eager" | "torch.compile"), base_us, vs_eager,
    vs_compile, vs_base (baseline / best: above 1 is faster), slower (the best is slower than the
    baseline that counts), verdict (one phrase for tables and captions)."""
    eager, comp, best = (t.get("ref_latency_us"), t.get("compile_latency_us"),
                         t.get("best_latency_us"))
    eager = float(eager) if eager and eager > 0 else None
    comp = float(comp) if comp and comp > 0 else None
    best = float(best) if best and best > 0 else None
    base, base_us = ("torch.compile", comp) if comp and (eager is None or comp < eager) \
        else ("eager", eager)
    vs = {k: (v / best if v and best else None)
          for k, v in (("vs_eager", eager), ("vs_compile", comp), ("vs_base", base_us))}
    if best is None:
        verdict, slower = "no kernel kept", False
    elif vs["vs_base"] is None:
        verdict, slower = "no baseline timed", False
    elif vs["vs_base"] >= 1.0:
        slower = False
        verdict = ("faster than eager and torch.compile" if comp else
                   "faster than eager (torch.compile not timed)")
    else:
        slower = True
        both = eager and comp and vs["vs_eager"] < 1.0 and vs["vs_compile"] < 1.0
        verdict = f"slower than {'eager and torch.compile' if both else base} " \
                  f"({fmt.ratio(vs['vs_base'])})"
    return dict(eager_us=eager, compile_us=comp, best_us=best, base=base, base_us=base_us,
                slower=slower, verdict=verdict, **vs)


def stage_outcomes_frame(store: Store, run_id: str, since_id: int = 0) -> pd.DataFrame:
    """Store.stage_outcomes as a frame: one row per (stage, status) with count n; with since_id,
    only over the experiments after that id (what a refresh adds)."""
    if not since_id:
        return pd.DataFrame(store.stage_outcomes(run_id), columns=["stage", "status", "n"])
    return pd.DataFrame(list(store.db.query(
        """SELECT v.stage, v.status, COUNT(*) AS n FROM experiments e
           JOIN verifications v ON v.experiment_id = e.id
           WHERE e.run_id = ? AND e.id > ? GROUP BY v.stage, v.status""", [run_id, since_id])),
        columns=["stage", "status", "n"])


def add_stage_outcomes(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """Two stage_outcomes_frame counts added (stage, status -> n), in a's order then b's."""
    if b.empty:
        return a
    both = pd.concat([a, b], ignore_index=True)
    return both.groupby(["stage", "status"], as_index=False, sort=False)["n"].sum()


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
                       text: str | None = None, targets=None) -> pd.DataFrame:
    """The experiments the table's filters keep: any of ``targets`` (ids), any of ``families``,
    any of ``states`` (empty or None: all), and ``text`` found (case-insensitive) in the
    hypothesis, error or failed stage."""
    keep = pd.Series(True, index=exps.index)
    if targets:
        keep &= pd.to_numeric(exps["target_id"], errors="coerce").isin([int(t) for t in targets])
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


def roofline_frame(family: str, dtype: str, points: list[tuple[str, list, float]],
                   spec: dict | None = None) -> pd.DataFrame:
    """Points for a roofline plot: for each (label, shape, microseconds), the target's cost at that
    shape (kernels.get(family, spec).cost: minimum bytes moved and flops; the spec is the
    target's contract, e.g. a region's ops or a norm's dims) turned into arithmetic intensity
    (flop/byte), achieved FLOP/s and achieved bytes/s.

    Imports kernels (torch, not triton). Empty when the family is unknown to this checkout."""
    cols = ["label", "shape", "bytes", "flops", "intensity", "flops_per_s", "bytes_per_s", "us"]
    try:
        import kernels
        fam = kernels.get(family, spec or None)
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
               "vs_compile", "eager_us", "optimized_us", "compile_us", "compile_optimized_us",
               "timing_mode", "in_model", "left_out", "elsewhere", "label"]
E2E_GOOD = ("passed", "partial")  # checks whose outputs matched: their timings can be claimed
# Why a kept kernel was not in the model a check timed (family_flags' values)
LEFT_OUT = {"responsible": "its outputs did not match the original model's",
            "slower": "the model ran slower with it",
            "slower_eager": "the eager model ran slower with it (in the compiled one, which ships)",
            "unused": "the model never called it at a shape and dtype it was verified for",
            "unknown": "the integration failed"}


def e2e_checks_frame(store: Store, run_id: str) -> pd.DataFrame:
    """Every end-to-end check of a run, oldest first, with what it measured: one row per check
    with its status, the families whose kernel was in the optimized model (``in_model``: flag
    "ok") and those left out with why (``left_out``: family -> reason), and its timings per
    forward pass: eager, optimized, compile, compile_optimized (µs; None where not timed);
    ``elsewhere``: a check timed on another GPU than the run's, which (hw.timed_elsewhere), or "".

    Empty for a database without the e2e tables (an older schema) or a run without checks."""
    cols = ["check_id", "created_at", "status", "detail", "in_model", "left_out", "eager",
            "optimized", "compile", "compile_optimized", "timing_mode", "elsewhere"]
    try:
        if not {"e2e_checks", "e2e_timings"} <= set(store.db.table_names()):
            return pd.DataFrame(columns=cols)
        # e2e_checks.device since schema 0008: an older file's checks were timed where the run was
        has_device = "device" in store.db["e2e_checks"].columns_dict
        checks = list(store.db.query(
            "SELECT id, created_at, status, detail, family_flags"
            + (", device" if has_device else "") + " FROM e2e_checks "
            "WHERE run_id = ? AND kind = 'check' ORDER BY id", [run_id]))
        run = store.get_run(run_id) or {}
        timings = list(store.db.query(
            "SELECT check_id, variant, latency_us, timing_mode FROM e2e_timings "
            "WHERE run_id = ? ORDER BY id", [run_id]))
    except Exception:  # a layout this page does not know: no measured figures rather than a crash
        return pd.DataFrame(columns=cols)
    by_check: dict[int, dict] = {}
    for t in timings:
        c = by_check.setdefault(t["check_id"], {})
        if t["latency_us"]:
            c[t["variant"]] = float(t["latency_us"])
        c.setdefault("timing_mode", t["timing_mode"])
    rows = []
    for c in checks:
        flags = as_dict(c["family_flags"])
        lat = by_check.get(c["id"], {})
        rows.append(dict(
            check_id=c["id"], created_at=c["created_at"], status=c["status"], detail=c["detail"],
            in_model=[f for f, v in flags.items() if v == "ok"],
            left_out={f: LEFT_OUT.get(v, v) for f, v in flags.items() if v != "ok"},
            timing_mode=lat.get("timing_mode"),
            elsewhere=hw.timed_elsewhere(as_dict(run.get("device")), as_dict(c.get("device"))),
            **{v: lat.get(v) for v in ("eager", "optimized", "compile", "compile_optimized")}))
    return pd.DataFrame(rows, columns=cols)


def e2e_frame(store: Store, run_id: str, checks: pd.DataFrame | None = None) -> pd.DataFrame:
    """Measured end-to-end speedups of a run, oldest first: one row per end-to-end check whose
    outputs matched the original model's (status passed or partial), that had at least one kept
    kernel in the model (a check whose every kernel was left out timed the original model twice:
    its ratio is noise, not a result) and that timed both the eager and the optimized model.

    speedup = eager / optimized; compile_speedup = compile / compile_optimized (torch.compile on
    both sides); vs_compile = compile / the faster optimized form (what a user gets against the
    one-line alternative), each when timed. seq places the check after the last experiment
    before it, for the charts.

    Empty when the database has no e2e tables yet (older schema) or the run has no such check,
    so the pages fall back to the Amdahl projection and say so."""
    checks = e2e_checks_frame(store, run_id) if checks is None else checks
    empty = pd.DataFrame(columns=E2E_COLUMNS)
    out = []
    for c in checks.to_dict("records"):
        if c["status"] not in E2E_GOOD or not c["in_model"] or not c["eager"] \
                or not c["optimized"]:
            continue
        comp = c["compile"] / c["compile_optimized"] \
            if c["compile"] and c["compile_optimized"] else None
        fastest = min(v for v in (c["optimized"], c["compile_optimized"]) if v)
        vs_compile = c["compile"] / fastest if c["compile"] else None
        label = (f"check {c['status']}, kernels in the model: {', '.join(c['in_model'])}"
                 + (f"; with torch.compile on both sides {fmt.ratio(comp)}" if comp else "")
                 + (f"; {c['elsewhere']}" if c.get("elsewhere") else ""))
        out.append(dict(check_id=c["check_id"], created_at=c["created_at"], status=c["status"],
                        speedup=c["eager"] / c["optimized"], compile_speedup=comp,
                        vs_compile=vs_compile, eager_us=c["eager"], optimized_us=c["optimized"],
                        compile_us=c["compile"], compile_optimized_us=c["compile_optimized"],
                        timing_mode=c["timing_mode"], in_model=c["in_model"],
                        left_out=c["left_out"], elsewhere=c.get("elsewhere") or "", label=label))
    if not out:
        return empty
    df = pd.DataFrame(out, columns=[c for c in E2E_COLUMNS if c != "seq"])
    times = pd.Series([r["created_at"] for r in store.db.query(
        "SELECT created_at FROM experiments WHERE run_id = ? ORDER BY id", [run_id])], dtype=float)
    df.insert(1, "seq", [int(times.searchsorted(t, side="right")) for t in df["created_at"]])
    return df.reset_index(drop=True)


def not_measured_why(checks: pd.DataFrame) -> str | None:
    """Why a run that was checked end to end has no measured speedup, from its latest check;
    None when it has one or was never checked."""
    if checks.empty:
        return None
    last = checks.iloc[-1]
    if last["status"] not in E2E_GOOD:
        return f"the end-to-end check {last['status']}" + (
            f": {str(last['detail']).split(';')[0][:160]}" if last["detail"] else "")
    if not last["in_model"]:
        out = "; ".join(f"{f}: {why}" for f, why in last["left_out"].items())
        return ("no kept kernel was in the model it timed (" + (out or "none kept") + ")")
    return "the check did not time both the eager and the optimized model"


# ---- run summaries (Compare and Report) --------------------------------------------------------
SUMMARY_FIELDS = ["target_id", "family", "name", "dtype", "fraction", "experiments", "kept",
                  "failed", "eager_us", "compile_us", "best_us", "speedup", "vs_compile",
                  "vs_base", "base", "slower", "verdict", "pct_sol", "best_seq"]


def target_summary(target_rows: list[dict], exps: pd.DataFrame) -> pd.DataFrame:
    """One row per target: share of model time, experiments, kept, both baselines and the best
    time (per forward pass), speedup over eager (``speedup``) and over torch.compile, whether the
    best is slower than the faster baseline (``slower``, ``verdict``), % of speed of light and
    the experiment (seq) that found the best kernel."""
    names = target_names(target_rows)
    rows = []
    for t in target_rows:
        mine = exps[exps["target_id"] == t["id"]] if not exps.empty else exps
        best = mine[mine["id"] == t.get("best_experiment_id")] if not mine.empty else mine
        b = baselines(t)
        rows.append(dict(
            target_id=int(t["id"]), family=t["family"], name=names[int(t["id"])],
            dtype=t["dtype"], fraction=t["fraction"], experiments=len(mine),
            kept=int((mine["state"] == "kept").sum()) if not mine.empty else 0,
            failed=int((mine["state"] == "failed").sum()) if not mine.empty else 0,
            eager_us=b["eager_us"], compile_us=b["compile_us"], best_us=b["best_us"],
            speedup=b["vs_eager"], vs_compile=b["vs_compile"], vs_base=b["vs_base"],
            base=b["base"], slower=b["slower"], verdict=b["verdict"],
            pct_sol=(100 * t["sol_latency_us"] / t["best_latency_us"])
            if t.get("sol_latency_us") and t.get("best_latency_us") else None,
            best_seq=int(best["seq"].iloc[0]) if not best.empty else None))
    return pd.DataFrame(rows, columns=SUMMARY_FIELDS)


def _latencies(t) -> dict:
    """A target's eager and compile latencies (a dict or a targets_frame row), None where not
    timed (a frame holds NaN there)."""
    row = t if hasattr(t, "get") else t._asdict()
    return {k: (None if row.get(k) is None or pd.isna(row.get(k)) or row.get(k) <= 0
                else float(row.get(k))) for k in ("ref_latency_us", "compile_latency_us")}


def to_baseline(t) -> float:
    """baseline / eager of a target (a dict or a targets_frame row): 1 until torch.compile of its
    op is timed, below 1 where compile is the faster. A speedup over eager times this is the
    speedup over the baseline, a share of eager time times this the share of the model's time
    under the baseline (the engine's rule: engine/plan.py baseline_us, base_fraction)."""
    lat = _latencies(t)
    ref, base = lat["ref_latency_us"], plan.baseline_us(lat)
    return base / ref if ref and base else 1.0


def compile_speedups(targets) -> dict[int, float]:
    """Target id -> torch.compile's speedup over eager of its op (eager / compile), where both
    were timed (targets: a targets_frame or target rows): the per-kernel chart draws it, the
    line a kernel must also clear."""
    rows = targets.to_dict("records") if isinstance(targets, pd.DataFrame) else targets
    lats = {int(t["id"]): _latencies(t) for t in rows}
    return {tid: v["ref_latency_us"] / v["compile_latency_us"] for tid, v in lats.items()
            if v["ref_latency_us"] and v["compile_latency_us"]}


def projected_final(target_rows: list[dict]) -> float:
    """Amdahl-projected end-to-end speedup over the baseline (the faster of eager and
    torch.compile per target, as the engine's planner) with every target at its best kept
    kernel; a kernel slower than its baseline counts as not placed."""
    return amdahl({t["id"]: float(t["fraction"]) * to_baseline(t) for t in target_rows
                   if t.get("fraction") is not None},
                  {t["id"]: (t.get("speedup") or 0.0) * to_baseline(t) for t in target_rows})


# ---- derived series ---------------------------------------------------------------------------
def best_so_far(exps: pd.DataFrame) -> pd.DataFrame:
    """Per target, the best kept speedup up to and including each of that target's experiments.

    Only kept experiments define the best: a reverted one was not better, a failed one has no
    valid timing. NaN until the target's first keep. Columns: target_id, family, seq, best."""
    if exps.empty:
        return pd.DataFrame(columns=["target_id", "family", "seq", "best"])
    df = exps.sort_values("seq")[["target_id", "family", "seq", "state", "speedup"]].copy()
    kept = pd.to_numeric(df["speedup"], errors="coerce").where(df["state"] == "kept")
    # cummax leaves NaN on the rows that are not kept; carry the best forward over them.
    df["best"] = kept.groupby(df["target_id"]).cummax().groupby(df["target_id"]).ffill()
    return df[["target_id", "family", "seq", "best"]].reset_index(drop=True)


def amdahl(fractions: dict, speedups: dict) -> float:
    """End-to-end speedup when each target t (share f of model time) runs s times faster.

    projected = 1 / ((1 - Σf) + Σ f/s), with s = max(1, s): a kernel slower than the reference
    is never used, so it cannot slow the model down. Targets without a speedup count s = 1.
    Keyed by target id (one family may be two targets)."""
    total = min(1.0, sum(fractions.values()))
    rest = sum(f / max(1.0, speedups.get(key) or 1.0) for key, f in fractions.items())
    return 1.0 / ((1.0 - total) + rest)


def amdahl_limit(targets: pd.DataFrame) -> float:
    """The ceiling 1 / (1 - Σf): the projection if every targeted kernel took no time at all
    (f: each target's share under its baseline, see to_baseline)."""
    total = (sum(float(r.fraction) * to_baseline(r) for r in targets.itertuples()
                 if pd.notna(r.fraction)) if not targets.empty else 0.0)
    return float("inf") if total >= 1.0 else 1.0 / (1.0 - total)


def amdahl_projection(exps: pd.DataFrame, targets: pd.DataFrame) -> pd.DataFrame:
    """The projected end-to-end speedup over the baseline after each experiment (seq 0 = before
    any: 1x): each target's share and best kept speedup taken against the faster of eager and
    torch.compile of its op (to_baseline), as the engine's planner does; a kernel slower than
    its baseline counts as 1x.

    Columns: seq, created_at, projected, family (the family that experiment worked on).
    Vectorised (a running best per target, then Amdahl row-wise): a live page recomputes it for
    10,000 experiments every refresh. targets: targets_frame (id, fraction, and the baselines'
    latencies where timed)."""
    cols = ["seq", "created_at", "projected", "family"]
    scale = {int(r.id): to_baseline(r) for r in targets.itertuples()}
    fractions = {int(r.id): float(r.fraction) * scale[int(r.id)] for r in targets.itertuples()
                 if pd.notna(r.fraction)}
    start = pd.DataFrame([dict(seq=0, created_at=None, projected=amdahl(fractions, {}),
                               family=None)], columns=cols)
    if exps.empty:
        return start
    df = exps.sort_values("seq")
    kept = pd.to_numeric(df["speedup"], errors="coerce").where(df["state"] == "kept")
    total = min(1.0, sum(fractions.values()))
    denom = pd.Series(1.0 - total, index=df.index)
    tid = pd.to_numeric(df["target_id"], errors="coerce")
    for key, f in fractions.items():
        # this target's best kept speedup so far; 1 before its first keep, never below 1
        best = (kept.where(tid == key).cummax().ffill() * scale[key]).fillna(1.0).clip(lower=1.0)
        denom = denom + f / best
    out = pd.DataFrame({"seq": df["seq"].astype(int), "created_at": df["created_at"],
                        "projected": 1.0 / denom, "family": df["family"]})
    return pd.concat([start, out], ignore_index=True)[cols]


def stage_order(outcomes: pd.DataFrame) -> list[str]:
    """The verifier's five stages in pipeline order, then any other recorded stage (static, ...)."""
    extra = sorted(set(outcomes["stage"]) - set(STAGES)) if not outcomes.empty else []
    return list(STAGES) + extra



# ---- one run's report (Report page and its HTML export) ----------------------------------------
def run_dtype(run: dict, target_rows: list[dict]) -> str:
    """The dtype the run ran in: its targets' (what the engine resolved "auto" to), else the
    configured one. "auto" only for a run with no target yet."""
    dtypes = sorted({t["dtype"] for t in target_rows if t.get("dtype")})
    if dtypes:
        return ", ".join(dtypes)
    return (run.get("config") or {}).get("dtype") or "auto"


def report_data(store: Store, run_id: str) -> dict | None:
    """Everything the report shows of one run, read once: the run row, its targets (raw and as a
    per-target summary), experiments, verifier outcomes, end-to-end checks and the measured
    results among them, and the Amdahl projection (over experiments and final). None when the
    run is not there."""
    run = get_run(store, run_id)
    if run is None:
        return None
    target_rows = store.targets(run_id)
    tframe = targets_frame(store, run_id, target_rows)
    exps = experiments_frame(store, run_id)
    checks = e2e_checks_frame(store, run_id)
    return dict(
        run=run, targets=target_rows, target_frame=tframe, exps=exps,
        outcomes=stage_outcomes_frame(store, run_id), checks=checks,
        measured=e2e_frame(store, run_id, checks), dtype=run_dtype(run, target_rows),
        summary=target_summary(target_rows, exps), projection=amdahl_projection(exps, tframe),
        projected=projected_final(target_rows), limit=amdahl_limit(tframe),
        interpreter=run["timing_mode"] == "interpreter"
        or bool((exps["timing_mode"] == "interpreter").any()))


def headline(rep: dict) -> dict:
    """The one number a stakeholder reads first, saying exactly what it is.

    kind "measured": the latest check with a kernel in the model (data.e2e_frame), eager over
    optimized, per forward pass; "not_measured": the run was checked end to end but nothing was
    measured with a kernel in the model (the note says why), the projection beside it;
    "projected": never checked, the Amdahl projection, labelled as projected.
    Keys: kind, value (float or None), text (the value as shown), label, note."""
    tag = " (interpreter timing — not GPU performance)" if rep["interpreter"] else ""
    proj = fmt.ratio(rep["projected"])
    if not rep["measured"].empty:
        last = rep["measured"].iloc[-1]
        comp = (f"; against torch.compile of the original {fmt.ratio(last['vs_compile'])}"
                if pd.notna(last["vs_compile"]) else "; torch.compile not timed")
        return dict(kind="measured", value=float(last["speedup"]),
                    text=fmt.ratio(last["speedup"]),
                    label="Measured end-to-end speedup over eager" + tag,
                    note=f"the whole model with {', '.join(last['in_model'])} swapped in: "
                         f"{fmt.us(last['eager_us'])} → {fmt.us(last['optimized_us'])} per "
                         f"forward pass{comp}; Amdahl projected {proj}"
                         + (f" ({last['elsewhere']})" if last.get("elsewhere") else ""))
    why = not_measured_why(rep.get("checks", pd.DataFrame()))
    if why:
        return dict(kind="not_measured", value=None, text="not measured",
                    label="End-to-end speedup" + tag,
                    note=f"not measured: {why}. Amdahl would project {proj} from the kept "
                         "kernels' speedups (a kernel slower than eager counts as 1×)")
    return dict(kind="projected", value=rep["projected"], text=proj,
                label="Projected end-to-end speedup (Amdahl, not measured)" + tag,
                note="projected from each target's share of model time and its best kernel's "
                     "speedup over eager: 1 / ((1 - Σf) + Σ f/s); no end-to-end measurement yet")


# ---- every run of several databases (the Runs page) -------------------------------------------
RUNS_COLUMNS = ["key", "db", "db_path", "id", "model", "device", "timing", "proposer", "dtype",
                "status", "created", "duration_s", "experiments", "kept", "e2e_vs_eager",
                "e2e_vs_compile", "e2e_note", "notes", "tags", "recorded", "writable"]


def run_key(db: str, run_id: str) -> str:
    """One run among several databases: "database|run id" (the URL's form, too)."""
    return f"{db}|{run_id}"


def split_run_key(key: str) -> tuple[str, str]:
    db, _, run_id = str(key).rpartition("|")
    return db, run_id


def _runs_of(store: Store, db: str, now: float) -> list[dict]:
    """One Runs-table row per run of one database: three queries whatever the number of runs."""
    have = _columns(store, "runs")
    cols = ", ".join(c for c in RUN_LIST_FIELDS + ("config",) if c in have)
    runs = [shown(r, now) for r in store.db.query(
        f"SELECT {cols} FROM runs ORDER BY created_at DESC, id DESC")]
    dtypes: dict[str, set] = {}
    kept: dict[str, int] = {}
    for r in store.db.query("SELECT run_id, dtype FROM targets GROUP BY run_id, dtype"):
        dtypes.setdefault(r["run_id"], set()).add(r["dtype"])
    for r in store.db.query("SELECT run_id, COUNT(*) AS n FROM experiments WHERE state = 'kept' "
                            "GROUP BY run_id"):
        kept[r["run_id"]] = int(r["n"])
    best = _best_e2e(store)
    out = []
    for run in runs:
        cfg = as_dict(run.get("config"))
        e2e = best.get(run["id"], {})
        out.append(dict(
            key=run_key(db, run["id"]), db=Path(db).name, db_path=db, id=run["id"],
            model=run["model"], device=as_dict(run.get("device")).get("name") or "?",
            timing="interpreter" if run["timing_mode"] == "interpreter" else "GPU",
            proposer=cfg.get("proposer", "search"),
            dtype=", ".join(sorted(dtypes.get(run["id"], ()))) or cfg.get("dtype") or "auto",
            status=run["status"],
            created=pd.Timestamp(run["created_at"], unit="s", tz="UTC").tz_convert(None),
            duration_s=elapsed_s(run, now), experiments=int(run["experiments_done"] or 0),
            kept=kept.get(run["id"], 0), e2e_vs_eager=e2e.get("speedup"),
            e2e_vs_compile=e2e.get("vs_compile"), e2e_note=e2e.get("note", "never checked"),
            notes=run.get("notes") or "", tags=", ".join(run.get("tags") or []),
            recorded=bool(run.get("recorded")), writable=False))
    return out


def _best_e2e(store: Store) -> dict[str, dict]:
    """Per run, its best measured end-to-end result (data.e2e_frame's rules: a check whose
    outputs matched, with a kernel in the model, eager and optimized timed): speedup over eager,
    over torch.compile, and a note; for a run checked without such a result, only the note."""
    if not {"e2e_checks", "e2e_timings"} <= set(store.db.table_names()):
        return {}
    lat: dict[int, dict] = {}
    for t in store.db.query("SELECT check_id, variant, latency_us FROM e2e_timings "
                            "WHERE latency_us IS NOT NULL"):
        lat.setdefault(t["check_id"], {})[t["variant"]] = float(t["latency_us"])
    out: dict[str, dict] = {}
    for c in store.db.query("SELECT id, run_id, status, family_flags FROM e2e_checks "
                            "WHERE kind = 'check' ORDER BY id"):
        row = out.setdefault(c["run_id"], {"note": "checked: nothing measured with a kernel in"})
        flags = as_dict(c["family_flags"])
        t = lat.get(c["id"], {})
        if c["status"] not in E2E_GOOD or "ok" not in flags.values() or not t.get("eager") \
                or not t.get("optimized"):
            continue
        speedup = t["eager"] / t["optimized"]
        fastest = min(v for v in (t.get("optimized"), t.get("compile_optimized")) if v)
        vs_compile = t["compile"] / fastest if t.get("compile") else None
        if row.get("speedup") is None or speedup > row["speedup"]:
            row.update(speedup=speedup, vs_compile=vs_compile, note="measured")
    return out


def runs_table(dbs: list[str], writable: set[str] = frozenset(),
               now: float | None = None) -> tuple[pd.DataFrame, list[str]]:
    """Every run of the databases ``dbs`` (paths as the sidebar takes them), newest first, as
    RUNS_COLUMNS; and one message per database that could not be read. ``writable``: the
    databases whose notes and tags the page may edit (never a recorded one)."""
    now = time.time() if now is None else now
    rows, problems = [], []
    for db in dict.fromkeys(dbs):
        try:
            store = open_store(db)
        except StoreError as e:
            problems.append(str(e))
            continue
        if store is None:
            continue
        try:
            mine = _runs_of(store, db, now)
        except Exception as e:  # a file with a runs table this code does not know
            problems.append(f"{db}: cannot read its runs ({type(e).__name__}: {e})")
            continue
        finally:
            store.close()
        for r in mine:
            r["writable"] = db in writable and not r["recorded"]
        rows += mine
    df = pd.DataFrame(rows, columns=RUNS_COLUMNS)
    if not df.empty:
        df = df.sort_values(["created", "id"], ascending=False).reset_index(drop=True)
    return df, problems


def filter_runs(runs: pd.DataFrame, text: str = "", statuses=(), devices=(), models=(),
                since=None, until=None) -> pd.DataFrame:
    """The Runs table's filters: ``text`` (case-insensitive) in the id, model, device, status,
    proposer, dtype, notes or tags; any of the statuses / devices / models (empty: all); created
    between two dates (inclusive, days)."""
    keep = pd.Series(True, index=runs.index)
    if text and text.strip():
        hay = runs[["id", "model", "device", "status", "proposer", "dtype", "notes", "tags",
                    "db"]].astype(str).agg(" ".join, axis=1).str.lower()
        for word in text.lower().split():
            keep &= hay.str.contains(word, regex=False)
    for col, wanted in (("status", statuses), ("device", devices), ("model", models)):
        if wanted:
            keep &= runs[col].isin(list(wanted))
    if since is not None:
        keep &= runs["created"] >= pd.Timestamp(since)
    if until is not None:
        keep &= runs["created"] < pd.Timestamp(until) + pd.Timedelta(days=1)
    return runs[keep]


def recorded_db_paths() -> list[str]:
    """Every database of recorded runs shipped in data/ (recorded_*.db), the first one first,
    as paths relative to the repository root."""
    first = ROOT / RECORDED_DB
    found = sorted(ROOT.glob("data/recorded_*.db"))
    ordered = ([first] if first.exists() else []) + [p for p in found if p != first]
    return [str(p.relative_to(ROOT)) for p in ordered]


# ---- one target's parameters (Kernels page: parameter analysis) ---------------------------------
PARAM_RESERVED = {"id", "seq", "state", "speedup", "failed_stage", "created_at", "best"}


def params_frame(store: Store, run_id: str, target_id: int) -> tuple[pd.DataFrame, list[str], dict]:
    """A target's experiments with the search-space point each one tried (experiments.params,
    JSON): one row per experiment (id, seq, state, speedup over eager, failed_stage, created_at,
    best = the best kept speedup so far) and one column per parameter.

    Returns (frame, the parameters that took two or more values, {parameter: value} of those
    that never changed). A parameter whose name clashes with a column is prefixed "param ";
    a list or dict value is compared as its text."""
    rows = list(store.db.query(
        "SELECT id, seq, state, speedup, failed_stage, created_at, params FROM experiments "
        "WHERE run_id = ? AND target_id = ? ORDER BY seq", [run_id, int(target_id)]))
    points = [as_dict(r.pop("params")) for r in rows]
    names: list[str] = []
    for pt in points:
        names += [k for k in pt if k not in names]
    col = {k: (f"param {k}" if k in PARAM_RESERVED else k) for k in names}
    for r, pt in zip(rows, points):
        for k in names:
            v = pt.get(k)
            r[col[k]] = json.dumps(v, sort_keys=True) if isinstance(v, (list, dict)) else v
    df = pd.DataFrame(rows, columns=["id", "seq", "state", "speedup", "failed_stage",
                                     "created_at"] + [col[k] for k in names])
    kept = pd.to_numeric(df["speedup"], errors="coerce").where(df["state"] == "kept")
    df["best"] = kept.cummax().ffill()
    varying = [col[k] for k in names
               if param_values(df[col[k]])[0].astype(str).nunique(dropna=False) > 1]
    fixed = {col[k]: df[col[k]].iloc[0] for k in names if col[k] not in varying and len(df)}
    return df, varying, fixed


def param_values(col: pd.Series) -> tuple[pd.Series, bool]:
    """A parameter column as (values, numeric): numbers when every experiment has a number
    there (not a bool), else text, a missing value written "—" (an experiment that did not
    set it, e.g. one from an LLM proposer)."""
    missing = col.isna()
    num = pd.to_numeric(col, errors="coerce")
    if not missing.any() and num.notna().all() and \
            not col.map(lambda v: isinstance(v, bool)).any():
        return num.astype(float), True
    text = col.map(lambda v: f"{v:g}" if isinstance(v, (int, float)) and not isinstance(v, bool)
                   else str(v))
    return text.where(~missing, "—").astype(object), False


def param_importance(pf: pd.DataFrame, params: list[str], min_timed: int = 4) -> pd.DataFrame:
    """A simple importance ranking: for each parameter, the share of the spread of log(speedup)
    over the timed experiments that its value explains (the correlation ratio η² = between-group
    over total sum of squares, groups = the parameter's values). Descriptive, not causal: a
    search that moves one parameter at a time from the best confounds them. Columns: parameter,
    importance (0..1), values (distinct), timed (experiments used). Empty below min_timed timed
    experiments or when every timed one has the same speedup."""
    cols = ["parameter", "importance", "values", "timed"]
    spd = pd.to_numeric(pf["speedup"], errors="coerce") if not pf.empty else pd.Series(dtype=float)
    timed = pf[(spd > 0) & (pf["state"] != "failed")] if not pf.empty else pf
    if len(timed) < min_timed or not params:
        return pd.DataFrame(columns=cols)
    y = np.log(pd.to_numeric(timed["speedup"]))
    total = float(((y - y.mean()) ** 2).sum())
    if total <= 0:
        return pd.DataFrame(columns=cols)
    out = []
    for p in params:
        groups = param_values(timed[p])[0].astype(str)
        means = y.groupby(groups).transform("mean")
        between = float(((means - y.mean()) ** 2).sum())
        out.append(dict(parameter=p, importance=min(1.0, between / total),
                        values=int(groups.nunique()), timed=len(timed)))
    return pd.DataFrame(out, columns=cols).sort_values("importance", ascending=False) \
        .reset_index(drop=True)


def throughput_bucket_s(created: pd.Series) -> float:
    """A bucket for experiments per hour: about 30 over the run, rounded to 1, 2, 5, 10, 15 or 30
    minutes, 1, 2, 3, 6 or 12 hours."""
    t = pd.to_numeric(created, errors="coerce").dropna()
    span = float(t.max() - t.min()) if len(t) > 1 else 60.0
    for minutes in (1, 2, 5, 10, 15, 30, 60, 120, 180, 360, 720):
        if span / (minutes * 60) <= 30:
            return minutes * 60.0
    return 1440 * 60.0
