"""The one module that writes SQL.

Contract:
- One SQLite file (default ``data/runs.db``), WAL journal, written by one writer: the engine. Readers
  (the dashboard) open it read-only through ``Store(path, readonly=True)`` and never write.
- The schema is created and changed only by the ordered ``MIGRATIONS`` below; ``schema_version``
  records which ran. Opening a database runs the missing ones in one transaction each.
- Every experiment is committed together with its verification rows in one transaction, so a kill
  at any moment loses at most the experiment that was in flight, never half of one.
- Tables: runs, profile_ops, targets, experiments, verifications, events, workers, and e2e_checks /
  e2e_timings (the kept kernels in the real model, engine/integrate.py). The family name is the
  join key between profile_ops, targets and experiments.
"""
from __future__ import annotations

import json
import os
import sqlite3
import time
import uuid
from pathlib import Path

import sqlite_utils

DEFAULT_DB = Path(__file__).resolve().parent.parent / "data" / "runs.db"


class StoreError(RuntimeError):
    """The database cannot be opened or written (bad path, permissions, not a database)."""


class RunBusy(StoreError):
    """Another live engine holds the run."""


# A run's engine writes heartbeat_at about every HEARTBEAT_S; a holder silent for LEASE_S is gone
# (its machine may be another one, whose processes this one cannot see).
HEARTBEAT_S = 5.0
LEASE_S = 60.0
ACTIVE = ("running", "paused")     # statuses that claim a live engine


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def this_owner() -> dict:
    """Who this process is, as a run's owner."""
    import socket
    return {"host": socket.gethostname(), "pid": os.getpid(), "boot_id": _boot_id(),
            "started_at": _now()}


def _json_or_none(v):
    if not v:
        return None
    try:
        return json.loads(v) if isinstance(v, str) else v
    except json.JSONDecodeError:
        return None


def _same_owner(a: dict, b: dict) -> bool:
    return (a.get("host"), a.get("pid"), a.get("boot_id")) == (b.get("host"), b.get("pid"),
                                                              b.get("boot_id"))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError, ValueError, TypeError):
        return True
    return True


def owner_gone(owner: dict | None, heartbeat_at: float | None, now: float | None = None) -> bool:
    """True when the engine that claimed a run can no longer be running it: on this machine
    (same host and boot) its process is gone; anywhere, it has been silent for LEASE_S."""
    if not owner:
        return True
    now = _now() if now is None else now
    if heartbeat_at is None or now - float(heartbeat_at) > LEASE_S:
        return True
    import socket
    if owner.get("host") == socket.gethostname() and owner.get("boot_id") == _boot_id():
        return not _pid_alive(owner.get("pid"))
    return False


def is_stale(run: dict, now: float | None = None) -> bool:
    """A run whose status says an engine is on it (running, paused) but none is: its engine
    was killed or its machine went down. Shown as stopped; resumable."""
    if run.get("status") not in ACTIVE or run.get("recorded"):
        return False
    if "owner" not in run:            # a database from before ownership: trust the status
        return False
    return owner_gone(_json_or_none(run.get("owner")), run.get("heartbeat_at"), now)


def effective_status(run: dict, now: float | None = None) -> str:
    """The status to show: "stopped" for a stale run, else the stored one. A recorded run
    (shipped from another machine) is never live, whatever its stored status."""
    if run.get("recorded") and run.get("status") in ACTIVE:
        return "stopped"
    return "stopped" if is_stale(run, now) else run["status"]


def _now() -> float:
    return time.time()


MIGRATIONS: list[tuple[str, str]] = [
    ("0001_initial", """
    CREATE TABLE runs (
        id TEXT PRIMARY KEY,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        status TEXT NOT NULL,            -- running | paused | stopped | done | failed | interrupted
        model TEXT NOT NULL,
        config TEXT NOT NULL,            -- JSON of RunConfig
        device TEXT,                     -- JSON: name, vendor, capability, versions
        timing_mode TEXT NOT NULL,       -- gpu | interpreter
        ceilings TEXT,                   -- JSON: copy_gbps, matmul_tflops measured at run start
        model_time_us REAL,              -- profiled time of one forward pass
        experiments_done INTEGER NOT NULL DEFAULT 0,
        current_target TEXT,             -- family being worked on now
        current_reason TEXT,             -- why the planner chose it
        recorded INTEGER NOT NULL DEFAULT 0,  -- 1 for a shipped run recorded elsewhere
        error TEXT
    );
    CREATE TABLE profile_ops (
        id INTEGER PRIMARY KEY,
        run_id TEXT NOT NULL REFERENCES runs(id),
        family TEXT NOT NULL,            -- a kernel family name, or "other"
        time_us REAL NOT NULL,           -- device (or CPU) time per forward pass
        fraction REAL NOT NULL,          -- share of the model's time
        calls INTEGER NOT NULL,
        shapes TEXT NOT NULL,            -- JSON list of {"shape": [...], "dtype": str, "count": int}
        top_ops TEXT NOT NULL,           -- JSON list of {"name": str, "time_us": float}
        has_kernel INTEGER NOT NULL      -- 1 when the family has a kernel file, so can be targeted
    );
    CREATE INDEX profile_ops_run ON profile_ops(run_id);
    CREATE TABLE targets (
        id INTEGER PRIMARY KEY,
        run_id TEXT NOT NULL REFERENCES runs(id),
        family TEXT NOT NULL,
        dtype TEXT NOT NULL,
        shapes TEXT NOT NULL,            -- JSON list of {"shape": [...], "count": int}
        fraction REAL NOT NULL,          -- share of model time (Amdahl's f)
        ref_latency_us REAL,             -- eager reference, summed over shapes weighted by count
        ref_noise REAL,
        sol_latency_us REAL,             -- speed of light: bytes / measured copy rate
        best_experiment_id INTEGER,
        best_latency_us REAL,
        best_noise REAL,
        speedup REAL,                    -- ref_latency_us / best_latency_us
        state TEXT NOT NULL,             -- pending | active | resting | done
        experiments INTEGER NOT NULL DEFAULT 0,
        no_improve INTEGER NOT NULL DEFAULT 0,
        UNIQUE(run_id, family)
    );
    CREATE TABLE experiments (
        id INTEGER PRIMARY KEY,
        run_id TEXT NOT NULL REFERENCES runs(id),
        target_id INTEGER NOT NULL REFERENCES targets(id),
        family TEXT NOT NULL,
        seq INTEGER NOT NULL,            -- 1, 2, ... within the run
        created_at REAL NOT NULL,
        parent_id INTEGER,
        proposer TEXT NOT NULL,
        hypothesis TEXT NOT NULL,
        params TEXT,                     -- JSON point of the search space, when the search made it
        source TEXT NOT NULL,            -- the whole candidate
        source_hash TEXT NOT NULL,
        state TEXT NOT NULL,             -- kept | reverted | failed
        failed_stage TEXT,               -- static | smoke | shape_sweep | stability | determinism |
                                         -- edge_cases | benchmark | recheck | worker | proposal
        error TEXT,
        latency_us REAL,                 -- summed over target shapes, weighted by count
        noise REAL,                      -- relative spread of repeated timings
        shape_times TEXT,                -- JSON list of {"shape", "count", "us", "pct_sol"}
        speedup REAL,                    -- target ref_latency_us / latency_us
        pct_sol REAL,                    -- speed of light latency / latency_us * 100
        timing_mode TEXT NOT NULL,       -- gpu | interpreter
        worker TEXT,
        duration_s REAL,
        tokens_in INTEGER,
        tokens_out INTEGER,
        cost_usd REAL,
        UNIQUE(run_id, seq)
    );
    CREATE INDEX experiments_run ON experiments(run_id, id);
    CREATE TABLE verifications (
        id INTEGER PRIMARY KEY,
        experiment_id INTEGER NOT NULL REFERENCES experiments(id),
        stage TEXT NOT NULL,
        status TEXT NOT NULL,            -- passed | failed | skipped
        worst_error REAL,
        failed_case TEXT,
        detail TEXT,
        duration_s REAL
    );
    CREATE INDEX verifications_exp ON verifications(experiment_id);
    CREATE TABLE events (
        id INTEGER PRIMARY KEY,
        run_id TEXT NOT NULL,
        ts REAL NOT NULL,
        level TEXT NOT NULL,             -- info | warn | error
        message TEXT NOT NULL
    );
    CREATE INDEX events_run ON events(run_id, id);
    """),
    # targets.ref_shape_times: the eager reference per shape, JSON like experiments.shape_times
    ("0002_reference_per_shape", """
    ALTER TABLE targets ADD COLUMN ref_shape_times TEXT
    """),
    # experiments.proposal_latency_s: seconds the model took to answer (LLM proposers), retries
    # included; NULL for the search
    ("0003_proposal_latency", """
    ALTER TABLE experiments ADD COLUMN proposal_latency_s REAL
    """),
    # The run's kept kernels in the whole model (engine/integrate.py). e2e_checks: the optimized
    # model's outputs against the original's on fresh inputs; family_flags names a kernel found
    # responsible for a mismatch, or (flag "slower", since 2026-12) one the model ran slower with
    # on a GPU; either is left out of the optimized model and of exports ("slower_eager": the
    # eager model ran slower with it, the compiled one that ships has it: placed).
    # e2e_timings: the model timed side by side, eager / optimized / torch.compile / both.
    ("0004_end_to_end", """
    CREATE TABLE e2e_checks (
        id INTEGER PRIMARY KEY,
        run_id TEXT NOT NULL REFERENCES runs(id),
        created_at REAL NOT NULL,
        kind TEXT NOT NULL,              -- check | kernelbench
        status TEXT NOT NULL,            -- passed | partial | failed | error | skipped
        max_error REAL,                  -- max |optimized - original| / max |original|
        tolerance REAL,                  -- the bound max_error was held to
        detail TEXT,
        kernels_used TEXT NOT NULL,      -- JSON list of {family, experiment_id, calls, fallthrough, swapped}
        family_flags TEXT NOT NULL       -- JSON {family: ok | responsible | unused}
    );
    CREATE INDEX e2e_checks_run ON e2e_checks(run_id, id);
    CREATE TABLE e2e_timings (
        id INTEGER PRIMARY KEY,
        run_id TEXT NOT NULL REFERENCES runs(id),
        check_id INTEGER REFERENCES e2e_checks(id),
        created_at REAL NOT NULL,
        variant TEXT NOT NULL,           -- eager | optimized | compile | compile_optimized
        latency_us REAL,                 -- median per forward pass, NULL when skipped
        noise REAL,                      -- relative spread of the repetitions
        timing_mode TEXT NOT NULL,       -- gpu | interpreter
        note TEXT
    );
    CREATE INDEX e2e_timings_run ON e2e_timings(run_id, id)
    """),
    # Scale-out (engine/backends.py). experiments: which device verified and first timed it, that
    # worker's latency when a re-time on the reference worker replaced it, the reference worker
    # that re-timed it and the seconds that took, and 2 attempts when its first worker died under
    # it. workers: each
    # evaluation worker's state and counters, rewritten by the engine about once a second.
    ("0005_workers", """
    ALTER TABLE experiments ADD COLUMN gpu TEXT;
    ALTER TABLE experiments ADD COLUMN first_latency_us REAL;
    ALTER TABLE experiments ADD COLUMN retimed_on TEXT;
    ALTER TABLE experiments ADD COLUMN attempts INTEGER;
    ALTER TABLE experiments ADD COLUMN retime_s REAL;
    CREATE TABLE workers (
        run_id TEXT NOT NULL REFERENCES runs(id),
        name TEXT NOT NULL,              -- w0, w1, ... (the join key with experiments.worker)
        backend TEXT NOT NULL,           -- single | local | ray
        reference INTEGER NOT NULL,      -- 1: the worker every new best is re-timed on
        host TEXT,
        device TEXT,                     -- cuda:0 (index on its host) | cpu
        gpu_name TEXT,
        pid INTEGER,                     -- the worker process (the one candidate code runs in)
        state TEXT NOT NULL,             -- starting | idle | busy | restarting | dead | closed
        family TEXT,                     -- what it is evaluating now
        since REAL,                      -- when it entered this state
        jobs INTEGER NOT NULL,           -- evaluations and re-timings answered
        died INTEGER NOT NULL,           -- of those, how many its process died or hung in
        restarts INTEGER NOT NULL,
        busy_s REAL NOT NULL,            -- seconds spent on jobs
        started_at REAL,
        updated_at REAL NOT NULL,
        PRIMARY KEY (run_id, name)
    )
    """),
    # Run ownership (one engine per run): owner is JSON {host, pid, boot_id, started_at} of the
    # engine process that holds the run, heartbeat_at the last time it said it is alive (about
    # every 5 s). A run whose status says running/paused but whose owner is gone (its process
    # died, or no heartbeat for LEASE_S) is stale: shown as stopped and resumable. notes and tags
    # (JSON list of strings) are the user's words about a run.
    ("0006_run_ownership", """
    ALTER TABLE runs ADD COLUMN owner TEXT;
    ALTER TABLE runs ADD COLUMN heartbeat_at REAL;
    ALTER TABLE runs ADD COLUMN notes TEXT;
    ALTER TABLE runs ADD COLUMN tags TEXT
    """),
    # Targets keyed by (run, family, spec): spec is the JSON of the contract a match fixed (e.g.
    # an RMSNorm over dims [1] without weight) or a generated region's description; '{}' is the
    # family's plain contract. A model may hold the same family under two specs. The second
    # baseline: torch.compile of the same op or region, timed apart (best of its modes).
    ("0007_target_spec", """
    CREATE TABLE targets_v7 (
        id INTEGER PRIMARY KEY,
        run_id TEXT NOT NULL REFERENCES runs(id),
        family TEXT NOT NULL,
        dtype TEXT NOT NULL,
        shapes TEXT NOT NULL,
        fraction REAL NOT NULL,
        ref_latency_us REAL,
        ref_noise REAL,
        sol_latency_us REAL,
        best_experiment_id INTEGER,
        best_latency_us REAL,
        best_noise REAL,
        speedup REAL,
        state TEXT NOT NULL,
        experiments INTEGER NOT NULL DEFAULT 0,
        no_improve INTEGER NOT NULL DEFAULT 0,
        ref_shape_times TEXT,
        spec TEXT NOT NULL DEFAULT '{}',  -- JSON: the contract a match fixed, or a region
        label TEXT,                      -- how the target reads to a person (None: the family)
        compile_latency_us REAL,         -- torch.compile of the same op/region, best of its modes
        compile_noise REAL,
        compile_mode TEXT,               -- the mode that was fastest
        compile_shape_times TEXT,        -- JSON like ref_shape_times
        UNIQUE(run_id, family, spec)
    );
    INSERT INTO targets_v7 (id, run_id, family, dtype, shapes, fraction, ref_latency_us,
        ref_noise, sol_latency_us, best_experiment_id, best_latency_us, best_noise, speedup,
        state, experiments, no_improve, ref_shape_times)
        SELECT id, run_id, family, dtype, shapes, fraction, ref_latency_us, ref_noise,
        sol_latency_us, best_experiment_id, best_latency_us, best_noise, speedup, state,
        experiments, no_improve, ref_shape_times FROM targets;
    DROP TABLE targets;
    ALTER TABLE targets_v7 RENAME TO targets
    """),
    # e2e_checks.device: the machine that timed the check (JSON like runs.device: name, torch,
    # triton, ...). `engine e2e` may time a run again on another GPU than the one its kernels were
    # found on; its figures belong to that GPU. NULL: the run's own machine (older rows).
    ("0008_e2e_device", """
    ALTER TABLE e2e_checks ADD COLUMN device TEXT
    """),
]
KNOWN_MIGRATIONS = {name for name, _ in MIGRATIONS}

STAGES = ("smoke", "shape_sweep", "stability", "determinism", "edge_cases")


def check_writable(path: str | os.PathLike | None) -> None:
    """Raise StoreError unless a run could be written to ``path``, creating nothing: an existing
    file must be a database of a schema this version knows, open for writing; a new one must
    have a folder it can be created in."""
    p = Path(path) if path else DEFAULT_DB
    if p.exists():
        Store(p).close()
        return
    parent = p.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise StoreError(f"cannot open database {p}: {parent} is not a writable folder")


class Store:
    """SQLite storage for runs. ``readonly=True`` opens the file with mode=ro (dashboard)."""

    def __init__(self, path: str | os.PathLike | None = None, readonly: bool = False):
        self.path = Path(path) if path else DEFAULT_DB
        self.readonly = readonly
        try:
            if readonly:
                if not self.path.exists():
                    raise StoreError(f"no database at {self.path}")
                conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True,
                                       check_same_thread=False, timeout=10)
            else:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                conn = sqlite3.connect(str(self.path), check_same_thread=False, timeout=30)
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
                # a read-only file (or folder) fails now, with the open, not at the first write
                conn.execute("BEGIN IMMEDIATE")
                conn.execute("ROLLBACK")
            conn.execute("PRAGMA foreign_keys=ON")
            self.db = sqlite_utils.Database(conn)
            if readonly:
                self._check_version()
            else:
                self._migrate()
        except (sqlite3.Error, OSError) as e:
            raise StoreError(f"cannot open database {self.path}: {e}") from e

    # ---- schema -------------------------------------------------------------------------------
    def _check_version(self) -> set:
        """The migrations this file has had; refuses a file written by a newer Nightshift (its
        schema has migrations this code does not know: writing to it could corrupt it)."""
        c = self.db.conn
        if not c.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND "
                         "name = 'schema_version'").fetchone():
            return set()
        done = {r[0] for r in c.execute("SELECT name FROM schema_version")}
        newer = sorted(done - KNOWN_MIGRATIONS)
        if newer:
            raise StoreError(f"database {self.path} has a newer schema ({newer[-1]}) than this "
                             f"version of Nightshift knows; upgrade Nightshift to open it")
        return done

    def _migrate(self) -> None:
        c = self.db.conn
        done = self._check_version()
        c.execute("CREATE TABLE IF NOT EXISTS schema_version (name TEXT PRIMARY KEY, applied_at REAL)")
        todo = [(n, sql) for n, sql in MIGRATIONS if n not in done]
        if not todo:
            return
        # a migration that rebuilds a table drops the old one: foreign keys are checked after
        c.execute("PRAGMA foreign_keys=OFF")
        try:
            for name, sql in todo:
                with c:  # one transaction per migration
                    for stmt in [s for s in sql.split(";") if s.strip()]:
                        c.execute(stmt)
                    c.execute("INSERT INTO schema_version VALUES (?, ?)", (name, _now()))
        finally:
            c.execute("PRAGMA foreign_keys=ON")

    def close(self) -> None:
        self.db.conn.close()

    # ---- runs ---------------------------------------------------------------------------------
    def create_run(self, model: str, config: dict, device: dict, timing_mode: str,
                   ceilings: dict | None) -> str:
        run_id = time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]
        with self.db.conn:
            self.db["runs"].insert(dict(
                id=run_id, created_at=_now(), updated_at=_now(), status="running", model=model,
                config=json.dumps(config), device=json.dumps(device), timing_mode=timing_mode,
                ceilings=json.dumps(ceilings or {}), experiments_done=0,
                owner=json.dumps(this_owner()), heartbeat_at=_now()))
        return run_id

    def update_run(self, run_id: str, **fields) -> None:
        for k in ("config", "device", "ceilings"):
            if k in fields and not isinstance(fields[k], str):
                fields[k] = json.dumps(fields[k])
        fields["updated_at"] = _now()
        with self.db.conn:
            self.db["runs"].update(run_id, fields)

    # ---- ownership: one engine per run ----------------------------------------------------------
    def claim_run(self, run_id: str, owner: dict | None = None) -> dict:
        """Make this process the run's one engine, atomically; raises RunBusy when another
        live engine holds it. A holder that is gone (see ``is_stale``) is taken over."""
        owner = owner or this_owner()
        with self.db.conn:
            self.db.conn.execute("BEGIN IMMEDIATE")   # no other writer between the read and write
            row = self.db.conn.execute("SELECT owner, heartbeat_at FROM runs WHERE id = ?",
                                       [run_id]).fetchone()
            if row is None:
                raise StoreError(f"no run {run_id!r} in {self.path}")
            held = _json_or_none(row[0])
            if held and not _same_owner(held, owner) and not owner_gone(held, row[1]):
                raise RunBusy(f"run {run_id} is being run by another engine (pid {held.get('pid')} "
                              f"on {held.get('host')}); stop it first, or wait for it to end")
            self.db.conn.execute("UPDATE runs SET owner = ?, heartbeat_at = ? WHERE id = ?",
                                 [json.dumps(owner), _now(), run_id])
        return owner

    def heartbeat(self, run_id: str) -> None:
        with self.db.conn:
            self.db.conn.execute("UPDATE runs SET heartbeat_at = ? WHERE id = ?", [_now(), run_id])

    def release_run(self, run_id: str) -> None:
        with self.db.conn:
            self.db.conn.execute("UPDATE runs SET owner = NULL WHERE id = ?", [run_id])

    def set_run_notes(self, run_id: str, notes: str | None = None,
                      tags: list[str] | None = None) -> None:
        """The user's notes and tags on a run (the dashboard's one write: it never touches a
        run's results)."""
        fields = {}
        if notes is not None:
            fields["notes"] = notes
        if tags is not None:
            fields["tags"] = json.dumps(sorted({t.strip() for t in tags if t.strip()}))
        if fields:
            with self.db.conn:
                self.db["runs"].update(run_id, fields)

    def get_run(self, run_id: str) -> dict | None:
        rows = list(self.db.query("SELECT * FROM runs WHERE id = ?", [run_id]))
        return _decode(rows[0], ("config", "device", "ceilings", "tags")) if rows else None

    def list_runs(self) -> list[dict]:
        return [_decode(r, ("config", "device", "ceilings", "tags"))
                for r in self.db.query("SELECT * FROM runs ORDER BY created_at DESC")]

    # ---- profile and targets ------------------------------------------------------------------
    def save_profile(self, run_id: str, rows: list[dict], model_time_us: float) -> None:
        with self.db.conn:
            self.db.conn.execute("DELETE FROM profile_ops WHERE run_id = ?", [run_id])
            for r in rows:
                self.db["profile_ops"].insert(dict(
                    run_id=run_id, family=r["family"], time_us=r["time_us"], fraction=r["fraction"],
                    calls=r["calls"], shapes=json.dumps(r["shapes"]), top_ops=json.dumps(r["top_ops"]),
                    has_kernel=int(r["has_kernel"])))
            self.db["runs"].update(run_id, dict(model_time_us=model_time_us, updated_at=_now()))

    def profile(self, run_id: str) -> list[dict]:
        return [_decode(r, ("shapes", "top_ops")) for r in self.db.query(
            "SELECT * FROM profile_ops WHERE run_id = ? ORDER BY time_us DESC", [run_id])]

    def add_target(self, run_id: str, family: str, dtype: str, shapes: list[dict],
                   fraction: float, spec: dict | None = None, label: str | None = None) -> int:
        """One target: a family (or generated region) under one contract ``spec`` ({}: the
        family's plain contract), with its real shapes and Amdahl share ``fraction``."""
        with self.db.conn:
            return self.db["targets"].insert(dict(
                run_id=run_id, family=family, dtype=dtype, shapes=json.dumps(shapes),
                fraction=fraction, state="pending", experiments=0, no_improve=0,
                spec=json.dumps(spec or {}, sort_keys=True), label=label)).last_pk

    def update_target(self, target_id: int, **fields) -> None:
        for k in _TARGET_JSON:
            if k in fields and fields[k] is not None and not isinstance(fields[k], str):
                fields[k] = json.dumps(fields[k], sort_keys=(k == "spec"))
        with self.db.conn:
            self.db["targets"].update(target_id, fields)

    def targets(self, run_id: str) -> list[dict]:
        rows = [_decode(r, _TARGET_JSON) for r in self.db.query(
            "SELECT * FROM targets WHERE run_id = ? ORDER BY fraction DESC, id", [run_id])]
        for r in rows:   # a read-only reader may open a database of an older schema
            r.setdefault("spec", {})
            r["spec"] = r["spec"] or {}
        return rows

    # ---- experiments --------------------------------------------------------------------------
    def record_experiment(self, exp: dict, verifications: list[dict],
                          target_update: dict | None = None) -> int:
        """Insert one experiment with its per-stage rows (and the target's new state) atomically."""
        exp = dict(exp)
        for k in ("params", "shape_times"):
            if k in exp and exp[k] is not None and not isinstance(exp[k], str):
                exp[k] = json.dumps(exp[k])
        exp.setdefault("created_at", _now())
        with self.db.conn:
            seq = self.db.conn.execute(
                "SELECT COALESCE(MAX(seq), 0) + 1 FROM experiments WHERE run_id = ?",
                [exp["run_id"]]).fetchone()[0]
            exp["seq"] = seq
            exp_id = self.db["experiments"].insert(exp).last_pk
            for v in verifications:
                self.db["verifications"].insert(dict(v, experiment_id=exp_id))
            if target_update:
                tu = dict(target_update)
                if tu.pop("best_is_this", False):
                    tu["best_experiment_id"] = exp_id
                self.db["targets"].update(exp["target_id"], tu)
            self.db.conn.execute(
                "UPDATE runs SET experiments_done = ?, updated_at = ? WHERE id = ?",
                [seq, _now(), exp["run_id"]])
        return exp_id

    def experiments(self, run_id: str, since_id: int = 0, with_source: bool = False) -> list[dict]:
        # only columns the file has: a read-only reader may open a database of an older schema
        have = {r[1] for r in self.db.conn.execute("PRAGMA table_info(experiments)")}
        cols = "*" if with_source else ", ".join(
            c for c in EXPERIMENT_COLUMNS if c != "source" and c in have)
        return [_decode(r, ("params", "shape_times")) for r in self.db.query(
            f"SELECT {cols} FROM experiments WHERE run_id = ? AND id > ? ORDER BY id",
            [run_id, since_id])]

    def experiment(self, exp_id: int) -> dict | None:
        rows = list(self.db.query("SELECT * FROM experiments WHERE id = ?", [exp_id]))
        return _decode(rows[0], ("params", "shape_times")) if rows else None

    def verifications(self, experiment_id: int) -> list[dict]:
        return list(self.db.query(
            "SELECT * FROM verifications WHERE experiment_id = ? ORDER BY id", [experiment_id]))

    def stage_outcomes(self, run_id: str) -> list[dict]:
        """Count of passed / failed / skipped per verifier stage over a run's experiments."""
        return list(self.db.query(
            """SELECT v.stage, v.status, COUNT(*) AS n FROM verifications v
               JOIN experiments e ON e.id = v.experiment_id
               WHERE e.run_id = ? GROUP BY v.stage, v.status""", [run_id]))

    # ---- workers ------------------------------------------------------------------------------
    def save_workers(self, run_id: str, rows: list[dict]) -> None:
        """Replace the run's worker rows (the engine's snapshot of its evaluation workers)."""
        with self.db.conn:
            for r in rows:
                self.db["workers"].upsert(dict(r, run_id=run_id, updated_at=_now()),
                                          pk=("run_id", "name"))

    def workers(self, run_id: str) -> list[dict]:
        if not self._has_table("workers"):
            return []
        return list(self.db.query(
            "SELECT * FROM workers WHERE run_id = ? ORDER BY reference DESC, name", [run_id]))

    # ---- events -------------------------------------------------------------------------------
    def event(self, run_id: str, message: str, level: str = "info") -> None:
        with self.db.conn:
            self.db["events"].insert(dict(run_id=run_id, ts=_now(), level=level, message=message))

    def events(self, run_id: str, limit: int = 200) -> list[dict]:
        return list(self.db.query(
            "SELECT * FROM events WHERE run_id = ? ORDER BY id DESC LIMIT ?", [run_id, limit]))

    # ---- end to end -----------------------------------------------------------------------------
    def add_e2e_check(self, run_id: str, kind: str, status: str, max_error: float | None,
                      tolerance: float | None, detail: str, kernels_used: list,
                      family_flags: dict, timings: list[dict] = (),
                      device: dict | None = None) -> int:
        """One end-to-end check with its timings (dicts: variant, latency_us, noise, timing_mode,
        note), in one transaction. ``device``: the machine that timed it (hw.detect())."""
        with self.db.conn:
            check_id = self.db["e2e_checks"].insert(dict(
                run_id=run_id, created_at=_now(), kind=kind, status=status, max_error=max_error,
                tolerance=tolerance, detail=detail, kernels_used=json.dumps(kernels_used),
                family_flags=json.dumps(family_flags),
                device=json.dumps(device) if device else None)).last_pk
            for t in timings:
                self.db["e2e_timings"].insert(dict(
                    run_id=run_id, check_id=check_id, created_at=_now(), variant=t["variant"],
                    latency_us=t.get("latency_us"), noise=t.get("noise"),
                    timing_mode=t["timing_mode"], note=t.get("note")))
        return check_id

    def _has_table(self, name: str) -> bool:
        # a read-only reader may open a database of an older schema
        return bool(self.db.conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", [name]).fetchone())

    def e2e_checks(self, run_id: str) -> list[dict]:
        """The run's end-to-end checks, newest first."""
        if not self._has_table("e2e_checks"):
            return []
        return [_decode(r, ("kernels_used", "family_flags", "device")) for r in self.db.query(
            "SELECT * FROM e2e_checks WHERE run_id = ? ORDER BY id DESC", [run_id])]

    def e2e_timings(self, check_id: int) -> list[dict]:
        if not self._has_table("e2e_timings"):
            return []
        return list(self.db.query(
            "SELECT * FROM e2e_timings WHERE check_id = ? ORDER BY id", [check_id]))


_TARGET_JSON = ("shapes", "ref_shape_times", "spec", "compile_shape_times")

EXPERIMENT_COLUMNS = (
    "id", "run_id", "target_id", "family", "seq", "created_at", "parent_id", "proposer",
    "hypothesis", "params", "source", "source_hash", "state", "failed_stage", "error", "latency_us",
    "noise", "shape_times", "speedup", "pct_sol", "timing_mode", "worker", "duration_s",
    "tokens_in", "tokens_out", "cost_usd", "proposal_latency_s", "gpu", "first_latency_us",
    "retimed_on", "attempts", "retime_s")


def _decode(row: dict, json_cols: tuple) -> dict:
    row = dict(row)
    for k in json_cols:
        if k in row and isinstance(row[k], str):
            try:
                row[k] = json.loads(row[k])
            except json.JSONDecodeError:
                pass
    return row
