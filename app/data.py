"""Read-only data access for the dashboard.

Everything here reads the engine's SQLite file through ``engine.store.Store(path, readonly=True)``
and returns plain dicts or pandas DataFrames; nothing here writes, and nothing imports Streamlit,
so the pages stay thin and these functions are testable on their own. Queries the Store does not
have are written here with ``store.db.query`` (SELECT only).
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import pandas as pd

from engine.store import STAGES, Store, StoreError  # noqa: F401  (StoreError: for the pages)

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DB = "data/runs.db"
ACTIVE_STATUSES = ("running", "paused")  # runs.status values for which the page keeps refreshing

# The experiment table's columns, in display order; everything else the page needs is derived.
TABLE_COLUMNS = ["seq", "family", "state", "failed_stage", "hypothesis", "latency_us", "speedup",
                 "pct_sol"]
# Columns read into the experiments frame (never "source": it is the bulk of the table).
EXPERIMENT_FIELDS = ["id", "seq", "family", "target_id", "created_at", "state", "failed_stage",
                     "error", "hypothesis", "latency_us", "noise", "speedup", "pct_sol",
                     "timing_mode", "duration_s"]

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
        """SELECT id, created_at, updated_at, status, model, timing_mode, experiments_done
           FROM runs ORDER BY created_at DESC, id DESC"""))


def get_run(store: Store, run_id: str) -> dict | None:
    return store.get_run(run_id)


def elapsed_s(run: dict, now: float | None = None) -> float:
    """Wall time of a run: up to now while it is active, else up to its last update."""
    end = (now or time.time()) if run.get("status") in ACTIVE_STATUSES else run["updated_at"]
    return max(0.0, end - run["created_at"])


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
    rows: list[dict] = []
    since = 0
    if cache is not None and cache.get("key") == key:
        rows, since = cache["rows"], cache["last_id"]
    new = list(store.db.query(
        f"SELECT {', '.join(EXPERIMENT_FIELDS)} FROM experiments "
        "WHERE run_id = ? AND id > ? ORDER BY id", [run_id, since]))
    rows = rows + new
    if cache is not None:
        cache.update(key=key, rows=rows, last_id=rows[-1]["id"] if rows else 0)
    return pd.DataFrame(rows, columns=EXPERIMENT_FIELDS)


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


def experiment_table(exps: pd.DataFrame) -> pd.DataFrame:
    """The page's experiment table: newest first, so a live run's latest result is on top."""
    return exps[TABLE_COLUMNS].sort_values("seq", ascending=False).reset_index(drop=True)


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

    Columns: seq, created_at, projected, family (the family that experiment worked on)."""
    fractions = {r.family: float(r.fraction) for r in targets.itertuples()
                 if pd.notna(r.fraction)}
    rows = [dict(seq=0, created_at=None, projected=amdahl(fractions, {}), family=None)]
    best: dict[str, float] = {}
    for r in exps.sort_values("seq").itertuples():
        if r.state == "kept" and pd.notna(r.speedup):
            best[r.family] = max(best.get(r.family, 0.0), float(r.speedup))
        rows.append(dict(seq=int(r.seq), created_at=r.created_at,
                         projected=amdahl(fractions, best), family=r.family))
    return pd.DataFrame(rows, columns=["seq", "created_at", "projected", "family"])


def stage_order(outcomes: pd.DataFrame) -> list[str]:
    """The verifier's five stages in pipeline order, then any other recorded stage (static, ...)."""
    extra = sorted(set(outcomes["stage"]) - set(STAGES)) if not outcomes.empty else []
    return list(STAGES) + extra

