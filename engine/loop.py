"""The loop: profile -> plan -> propose -> verify -> benchmark -> keep or revert -> log -> next.

``execute`` runs one run to its end in the calling thread (the CLI); ``Engine`` runs it in a
background thread for the dashboard and exposes a small thread-safe handle (start, stop, pause,
resume, status). Either way the only channel to the outside is the SQLite store: each experiment is
committed whole, so a run killed at any point resumes from the database with nothing committed lost.
"""
from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
import threading
import time
import traceback
from collections import Counter, deque
from dataclasses import asdict, dataclass, field, fields, replace

import kernels
from engine import backends, plan, proposers, verify
from engine.store import DEFAULT_DB, HEARTBEAT_S, RunBusy, Store, StoreError, check_writable
from engine.worker import WorkerDied

DTYPES = ("auto", "float32", "float16", "bfloat16")
MIN_MARGIN = 0.01   # never keep a change smaller than 1%, however quiet the measurement
MAX_TARGET_SHAPES = 4
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
GPU_COMPILE_MODES = ["default", "max-autotune-no-cudagraphs"]
# Under --budget-minutes a target's reference timings (eager and the compile modes after the
# first) take at most this share of the time the run has left when it is timed.
REF_SHARE = 0.4


class ConfigError(ValueError):
    """A run configuration that cannot start; the message says what to fix."""


@dataclass
class RunConfig:
    model: str = "llama-tiny"
    dtype: str = "auto"                      # auto: bfloat16 on a GPU, float32 under the interpreter
    input_shape: str | None = None           # "BATCHxSEQ", e.g. "2x32"; None: the model's default
    families: list[str] | None = None        # None: every family the profile finds
    proposer: str = "search"
    budget_experiments: int | None = 40
    budget_minutes: float | None = None
    seed: int = 0
    db: str | None = None                    # None: data/runs.db
    patience: int = 5                        # experiments without improvement before a target rests
    worker_timeout_s: float = 300.0
    model_overrides: dict = field(default_factory=dict)   # e.g. {"n_layer": 2}
    # After the loop: the kept kernels in the whole model, checked against the original on fresh
    # inputs and timed side by side (engine/integrate.py); stored in e2e_checks / e2e_timings.
    e2e_check: bool = True
    # Proposers "llm" and "hybrid" (engine/llm.py). Never an API key here: RunConfig is stored
    # with the run; keys come from litellm's environment variables or execute(api_key=...).
    llm_model: str | None = None             # litellm model: openai/gpt-4o, ollama_chat/NAME, ...
    api_base: str | None = None              # a local / self-hosted OpenAI-compatible server
    max_in_flight: int = 1                   # model requests outstanding (1: wait for each reply)
    max_tokens_total: int | None = None      # stop proposing once the run spent this many tokens
    max_cost_usd: float | None = None        # ... or this many US dollars
    price_in_per_mtok: float | None = None   # USD per million prompt tokens (else litellm's table;
    price_out_per_mtok: float | None = None  # local models cost 0); and per million reply tokens
    llm_timeout_s: float = 180.0             # per request
    llm_retries: int = 3                     # retries after a timeout, 429, 5xx or lost connection
    # Where candidates are evaluated (engine/backends.py): None/None is the single local worker;
    # workers=N a local pool of N (one per GPU); ray_address a Ray cluster ("local" starts one
    # here), with workers=N actors (None: one per GPU in the cluster).
    workers: int | None = None
    ray_address: str | None = None
    # When the four costly stages run (engine/worker.py): "full" verifies every candidate before
    # timing it; "bench-first" times a candidate after its smoke test and verifies it further only
    # if it beats the target's best (only those can be kept); "auto" is bench-first on a GPU,
    # where those four stages were 86% of the recorded experiments' time, and full under the
    # interpreter (whose timings decide nothing worth skipping verification for).
    verify_order: str = "auto"
    # Re-time every would-be best in a fresh worker process (engine/judge.py): None is on a GPU
    # only (interpreter timings decide nothing worth a second process).
    fresh_retime: bool | None = None
    # torch.compile modes the reference is also timed in, per target (the faster of eager and
    # the fastest mode is the baseline); None: default and max-autotune-no-cudagraphs on a GPU.
    compile_modes: list[str] | None = None

    def validate(self) -> None:
        from engine import sources
        try:   # built-in name, hf:NAME or path/to/file.py[:Name]; files are parsed, not run
            sources.validate(self.model, self.input_shape)
        except sources.SourceError as e:
            raise ConfigError(str(e)) from None
        if self.dtype not in DTYPES:
            raise ConfigError(f"unknown dtype {self.dtype!r}; choose one of {', '.join(DTYPES)}")
        for f in self.families or []:
            if f not in kernels.FAMILY_NAMES + kernels.GENERATED_NAMES:
                raise ConfigError(f"unknown family {f!r}; known families: "
                                  f"{', '.join(kernels.FAMILY_NAMES + kernels.GENERATED_NAMES)}")
        if self.families is not None and not self.families:
            raise ConfigError("choose at least one family")
        if self.budget_experiments is not None and self.budget_experiments < 1:
            raise ConfigError("--budget-experiments must be a positive number of experiments")
        if self.budget_minutes is not None and not (math.isfinite(self.budget_minutes)
                                                    and self.budget_minutes > 0):
            raise ConfigError("--budget-minutes must be a positive number of minutes")
        if self.budget_experiments is not None and self.budget_experiments > 10_000_000:
            raise ConfigError("--budget-experiments must be at most 10,000,000")
        if self.patience < 1:
            raise ConfigError("patience must be at least 1")
        if not (math.isfinite(self.worker_timeout_s) and self.worker_timeout_s > 0):
            raise ConfigError("worker timeout must be a positive number of seconds")
        for m in self.compile_modes or ():
            if m not in COMPILE_MODES:
                raise ConfigError(f"unknown torch.compile mode {m!r}; choose from "
                                  f"{', '.join(COMPILE_MODES)}")
        if self.proposer not in proposers.NAMES:
            raise ConfigError(f"unknown proposer {self.proposer!r}; known: "
                              f"{', '.join(proposers.NAMES)}")
        if self.proposer in ("llm", "hybrid"):
            _validate_llm(self)
        if self.verify_order not in verify.VERIFY_ORDERS:
            raise ConfigError(f"unknown verify order {self.verify_order!r}; choose one of "
                              f"{', '.join(verify.VERIFY_ORDERS)}")
        if self.workers is not None and not 1 <= self.workers <= backends.MAX_WORKERS:
            raise ConfigError(f"--workers must be between 1 and {backends.MAX_WORKERS}")
        if self.ray_address is not None:
            why = backends.check_ray(self.ray_address)
            if why:
                raise ConfigError(why)
        elif self.workers:
            import torch
            n = torch.cuda.device_count() if torch.cuda.is_available() else 0
            if n and self.workers > n:
                raise ConfigError(f"--workers {self.workers}: this machine has {n} GPU(s); a "
                                  f"local pool runs one worker per GPU (use --ray for more)")

    @classmethod
    def from_dict(cls, d: dict) -> "RunConfig":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def _validate_llm(c: RunConfig) -> None:
    if not c.llm_model or "/" not in c.llm_model or any(ch.isspace() for ch in c.llm_model):
        raise ConfigError("--proposer llm needs --llm-model as provider/name, e.g. openai/gpt-4o, "
                          "anthropic/claude-sonnet-4-5, ollama_chat/qwen2.5-coder, hosted_vllm/NAME")
    if c.api_base and not c.api_base.startswith(("http://", "https://")):
        raise ConfigError(f"--api-base must be an http(s) URL, e.g. http://127.0.0.1:8000/v1; "
                          f"got {c.api_base!r}")
    if not 1 <= c.max_in_flight <= 32:
        raise ConfigError("--in-flight must be between 1 and 32 requests")
    if c.max_tokens_total is not None and c.max_tokens_total < 1:
        raise ConfigError("--max-tokens must be a positive number of tokens")
    if c.max_cost_usd is not None and c.max_cost_usd <= 0:
        raise ConfigError("--max-cost must be a positive amount of US dollars")
    for name in ("price_in_per_mtok", "price_out_per_mtok"):
        if getattr(c, name) is not None and getattr(c, name) < 0:
            raise ConfigError(f"{name} must not be negative")
    if c.llm_timeout_s <= 0:
        raise ConfigError("--llm-timeout must be positive")
    if not 0 <= c.llm_retries <= 10:
        raise ConfigError("--llm-retries must be between 0 and 10")


class Control:
    """Thread-safe stop / pause flags and the status the UI polls."""

    def __init__(self):
        self.stop_event = threading.Event()
        self.resume_event = threading.Event()
        self.resume_event.set()
        self._lock = threading.Lock()
        self._status = dict(state="idle", run_id=None, error=None, experiments=0,
                            current_target=None)

    def set(self, **kw) -> None:
        with self._lock:
            self._status.update(kw)

    def status(self) -> dict:
        with self._lock:
            return dict(self._status)


def _log_line(exp: dict, timing_mode: str, show_worker: bool = False) -> str:
    lat = f"{exp['latency_us']:10.1f} us" if exp.get("latency_us") else " " * 13
    spd = f"{exp['speedup']:7.3g}x" if exp.get("speedup") else " " * 8
    sol = f"{exp['pct_sol']:4.0f}% SOL" if exp.get("pct_sol") else " " * 8
    state = exp["state"] + (f"@{exp['failed_stage']}" if exp.get("failed_stage") else "")
    tag = " [interpreter timing]" if timing_mode == "interpreter" and exp.get("latency_us") else ""
    if show_worker and exp.get("worker"):
        tag += (f" [{exp['worker']}" + (f", re-timed on {exp['retimed_on']}" if exp.get("retimed_on")
                                       else "") + (", retried" if exp.get("attempts") == 2 else "")
                + "]")
    # the family, or a region's label (its ops: "mul+add+leaky_relu")
    return (f"exp {exp['seq']:4d} {exp['family']:<13} {state:<22} {lat} {spd} {sol}  "
            f"{exp['hypothesis'][:70]}{tag}")


def _target_shapes(row: dict) -> tuple[str, list[dict]]:
    """The dtype the family mostly runs in and its real shapes in that dtype, most called first.

    A profiled call's record becomes the family's shape through ``Family.profile_shape`` (a GEMM's
    "batch", attention's "kv_heads", the MLP's "ffn_dim" join the shape tuple); records that map
    to the same shape add up their calls."""
    fam = kernels.get(row["family"])
    by_dtype = Counter()
    for s in row["shapes"]:
        by_dtype[s["dtype"]] += s["count"]
    dtype = by_dtype.most_common(1)[0][0]
    counts = Counter()
    for s in row["shapes"]:
        if s["dtype"] == dtype:
            counts[fam.profile_shape(s)] += s["count"]
    shapes = sorted(counts.items(), key=lambda kv: -kv[1])
    return dtype, [{"shape": list(shape), "count": n} for shape, n in shapes[:MAX_TARGET_SHAPES]]


def execute(cfg: RunConfig, control: Control | None = None, resume_run_id: str | None = None,
            log=print, proposer=None, api_key: str | None = None, isolate: bool = False) -> str:
    """Run (or resume) one optimization run to its end. Returns the run id.

    ``proposer`` replaces the one ``cfg.proposer`` names (any object with ``propose``).
    ``api_key``: the LLM proposer's key (e.g. from the dashboard's secrets); held in memory only.
    ``isolate``: build, profile and check the model in a child process (engine/isolate.py), never
    in this one (the dashboard's)."""
    control = control or Control()
    created = _new_paths(Path(cfg.db) if cfg.db else DEFAULT_DB)
    store = Store(cfg.db)
    beat = _Heartbeat(store.path, control)
    try:
        return _execute(cfg, control, store, resume_run_id, log, proposer, api_key,
                        started=time.monotonic(), isolate=isolate)
    except ConfigError:
        # a usage error found before any run existed: leave no database behind that this call
        # created (nothing was written to it but its schema)
        if created and not store.list_runs():
            beat.stop()
            store.close()
            _remove_created(created)
        raise
    finally:
        beat.stop()
        store.close()


def _new_paths(db: Path) -> list[Path]:
    """The database file and the folders above it that do not exist yet (to remove again)."""
    out, p = [], db.resolve()
    if p.exists():
        return []
    out.append(p)
    for parent in p.parents:
        if parent.exists():
            break
        out.append(parent)
    return out


def _remove_created(paths: list[Path]) -> None:
    db = paths[0]
    for f in (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")):
        try:
            f.unlink()
        except OSError:
            pass
    for d in paths[1:]:
        try:
            d.rmdir()
        except OSError:
            break


# The end-to-end stage (engine/integrate.py: the kept kernels placed, checked, timed against
# eager and torch.compile) runs inside --budget-minutes: the loop stops early enough to leave it
# what it is estimated to take with every compile mode (integrate.stage_estimate_s, from the
# graph's GEMM shapes: max-autotune tunes each, ~20 s on the H200), at least E2E_MIN_S and at most
# E2E_MAX_SHARE of the budget (the loop is what the run is for; past that the stage skips the
# modes its time left cannot hold, and says so). Without the graph's figures (a model profiled
# by interception, a run recorded before them) or without a compile (the interpreter) it keeps
# the flat E2E_SHARE of the budget (E2E_MIN_S to E2E_MAX_S).
E2E_SHARE, E2E_MIN_S, E2E_MAX_S = 0.25, 15.0, 600.0
E2E_MAX_SHARE = 0.5
# fewer seconds than this left to the loop after the setup and the end-to-end stage's reserve:
# the console says so (a large model's first verified experiment alone takes 30-60 s on a GPU;
# a Gemma-7B-shaped model at 1.5 minutes ran its starter and nothing else)
LOOP_FEW_S = 90.0


def _deadline(cfg: RunConfig, started: float) -> float | None:
    return started + cfg.budget_minutes * 60 if cfg.budget_minutes else None


def _e2e_reserve_s(cfg: RunConfig, stage_s: float | None = None) -> float:
    """Seconds of the budget kept for the end-to-end stage (see E2E_SHARE): ``stage_s`` its
    estimate, None when there is none."""
    if not cfg.e2e_check or not cfg.budget_minutes:
        return 0.0
    budget_s = cfg.budget_minutes * 60
    if stage_s is None:
        return min(E2E_MAX_S, max(E2E_MIN_S, E2E_SHARE * budget_s))
    return min(E2E_MAX_SHARE * budget_s, max(E2E_MIN_S, stage_s))


def _few_loop_seconds(cfg: RunConfig, started: float, deadline: float | None,
                      stage_s: float | None) -> str | None:
    """What the console says when the whole-run budget leaves the loop fewer than LOOP_FEW_S
    seconds after the setup (capture, profile, baselines) and the end-to-end stage's reserve;
    None when it leaves more, or has no deadline."""
    if deadline is None:
        return None
    now = time.monotonic()
    reserve = _e2e_reserve_s(cfg, stage_s)
    left = deadline - now - reserve
    if left >= LOOP_FEW_S:
        return None
    return (f"the budget leaves the loop {max(0.0, left):.0f} s after the setup "
            f"({now - started:.0f} s) and the end-to-end stage's reserve ({reserve:.0f} s): a "
            f"few experiments at most; a larger --budget-minutes gives the search room")


def _loop_cfg(cfg: RunConfig, deadline: float | None, stage_s: float | None = None) -> RunConfig:
    """The configuration the loop runs under: its minutes are what the whole-run budget has left,
    less the end-to-end stage's reserve (``stage_s``: the stage's estimate, see E2E_SHARE)."""
    if deadline is None:
        return cfg
    left = deadline - time.monotonic()
    reserve = _e2e_reserve_s(cfg, stage_s)
    return replace(cfg, budget_minutes=max(left - reserve, 0.0) / 60 or 1e-6)


def _reference_modes(target: dict, modes: list, share_s: float | None) -> tuple[list, list]:
    """(modes, [why skipped]) a target's compile baselines are timed in under a budget whose
    share for them is ``share_s``: the first mode always (a target always has a compile
    baseline), a later one while the estimates (integrate.compile_estimate_s: the reference
    compiled once a shape, max-autotune tuning its distinct GEMMs) fit in the share. The worker
    still skips a mode its measured time so far leaves no room for (engine/judge.py)."""
    if share_s is None or len(modes) < 2:
        return list(modes), []
    from engine import integrate
    shapes = [s["shape"] for s in target["shapes"]]
    try:
        fam = kernels.get(target["family"], target["spec"])
        gemms = integrate.reference_gemm_shapes(fam, shapes, target["dtype"])
    except Exception:
        gemms = None
    n = None if gemms is None else len(gemms)
    base = len(shapes) * integrate.COMPILE_BASE_S        # one compile a shape (dynamic=False)
    kept, skipped, spent, tuned = [], [], 0.0, False
    for mode in modes:
        need = integrate.compile_estimate_s(mode, n, base, tuned=tuned,
                                            fp32_shapes=n if target["dtype"] == "float32" and n else 0)
        if kept and spent + need > share_s:
            tunes = mode.startswith("max-autotune") and not tuned and n
            skipped.append(f"{mode} (estimated at {need:.0f} s"
                           + (f": {n} GEMM shape(s) to autotune" if tunes else "")
                           + f", {max(share_s - spent, 0):.0f} s of the share left)")
            continue
        kept.append(mode)
        spent += need
        tuned = tuned or (mode.startswith("max-autotune") and n is not None)
    return kept, skipped


def _prepare(cfg: RunConfig, store: Store, control: Control, log) -> str:
    """Build the model, capture it, match the families, profile it by node, and create the run
    with its profile and targets: one per (family, contract spec) the graph's matches fix. A
    model whose forward cannot be captured is profiled by interception instead, and the run's
    events say so."""
    import torch
    from engine import hw, sources
    from engine import profile as profiler
    device = hw.detect()
    gpu = device["timing_mode"] == "gpu"
    dtype = cfg.dtype if cfg.dtype != "auto" else sources.default_dtype(cfg.model, gpu)
    # Build the model and run it once before the run exists: a model file whose constructor,
    # inputs or forward fail is a usage error (one message, nothing written), not a failed run.
    try:
        loaded = sources.load(cfg.model, dtype=getattr(torch, dtype), device="cuda" if gpu else "cpu",
                              input_shape=cfg.input_shape, seed=cfg.seed, **cfg.model_overrides)
    except sources.SourceError as e:
        raise ConfigError(str(e)) from None
    except (MemoryError, RuntimeError) as e:
        if not _out_of_memory(e):
            raise
        raise ConfigError(f"{cfg.model} does not fit in memory at input shape "
                          f"{cfg.input_shape or 'its default'}: {_first_line(e)}") from None
    model, inputs = loaded.model, loaded.inputs
    del loaded
    if gpu:
        device["tf32"] = hw.tf32_allowed()       # which fp32 matmul rate this run's SOL uses
    run_id = store.create_run(cfg.model, asdict(cfg), device, device["timing_mode"], None)
    control.set(run_id=run_id)
    store.update_run(run_id, current_reason="capturing the model's graph")
    log(f"capturing {cfg.model} ({dtype}) on {device['name']} ...")
    # regions (kernels/region.py) are targets when asked for (--families all, or ...,region):
    # placed like the families (one site a region), but their generated kernels have no GPU
    # figures yet, so a default run keeps its budget for the nine
    wanted = set(cfg.families or kernels.FAMILY_NAMES)
    try:
        plans = _profile_graph(cfg, store, run_id, model, inputs, log)
        if plans is None:                       # not captured: the interception road
            prof = profiler.profile_model(model, inputs)
            rows = [asdict(f) for f in prof.families]
            store.save_profile(run_id, rows, prof.total_us)
            plans = []
            for r in rows:
                if r["has_kernel"] and r["shapes"]:
                    tdtype, shapes = _target_shapes(r)
                    plans.append(profiler.TargetPlan(r["family"], {}, tdtype, shapes, r["fraction"],
                                                     r["time_us"], r["calls"]))
            total_us = prof.total_us
        else:
            rows, total_us = plans[1], plans[2]
            plans = plans[0]
        del model, inputs
    except KeyboardInterrupt:             # Ctrl-C or SIGTERM while profiling: a stopped run
        _stopped_while_profiling(store, run_id, control)
        raise
    except Exception as e:
        if _interrupted(e):               # the stop unwound through an exit that failed
            _stopped_while_profiling(store, run_id, control)
            raise KeyboardInterrupt from e
        store.update_run(run_id, status="failed", current_reason=None,
                         error=f"profiling failed: {type(e).__name__}: {e}")
        control.set(state="failed", error=f"profiling failed: {type(e).__name__}: {e}")
        raise
    if gpu:
        torch.cuda.empty_cache()
    for tp in plans:
        if tp.family in wanted and tp.shapes:
            label = tp.label or (f"{tp.family} {json.dumps(tp.spec, sort_keys=True)}"
                                 if tp.spec else None)
            store.add_target(run_id, tp.family, tp.dtype, tp.shapes, tp.fraction, spec=tp.spec,
                             label=label)
    found = ", ".join(f"{r['family']} {r['fraction']:.1%}" for r in rows)
    store.event(run_id, f"profiled {cfg.model}: {total_us:.0f} us per forward; {found}")
    log(f"run {run_id}: {found}")
    for r in rows:
        if r["family"] == "other" and r["top_ops"]:
            log("  other: " + ", ".join(f"{o['name']} {o['time_us']:.0f} us"
                                        for o in r["top_ops"][:5]))
    return run_id


def _out_of_memory(e: BaseException) -> bool:
    import torch
    return isinstance(e, (MemoryError, torch.OutOfMemoryError)) or any(
        s in str(e).lower() for s in ("can't allocate memory", "out of memory",
                                      "cannot allocate memory"))


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    text = [t for t in text if t.strip()]
    line = text[-1] if text else type(e).__name__
    # PyTorch's allocator message: "... you tried to allocate N bytes. Error code 12 (...)"
    return line[line.find("you tried"):] if "you tried" in line else line[:300]


def _prepare_isolated(cfg: RunConfig, store: Store, control: Control, log) -> str:
    """``_prepare`` in a child process: the model's code never runs in this one."""
    from engine import isolate
    try:
        return isolate.run_stage({"stage": "prepare", "cfg": asdict(cfg)}, log, control)["run_id"]
    except isolate.StageStopped:
        _stopped_while_profiling(store, control.status()["run_id"], control)
        raise


def _interrupted(e: BaseException | None) -> bool:
    """A Ctrl-C or SIGTERM (KeyboardInterrupt), or an error raised while one unwound: a context
    manager's exit that fails on the way out (torch's dispatch-mode stack under profiling: "Trying
    to pop empty mode stack", seen when SIGTERM landed mid-profile) is still a stop, not a failure."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return True
        seen.add(id(e))
        e = e.__context__ or e.__cause__
    return False


def _stopped_while_profiling(store: Store, run_id: str | None, control: Control) -> None:
    if run_id:
        store.update_run(run_id, status="stopped", current_reason=None)
        store.event(run_id, "stopped while the model was being profiled", "warn")
    control.set(state="stopped")


def _finish_isolated(store: Store, run_id: str, log, deadline: float | None, control) -> None:
    """The end-to-end stage in a child process; a crash or a stop there is an event, as every
    failure of the stage is."""
    from engine import isolate
    req = {"stage": "finish", "db": str(store.path), "run_id": run_id,
           "seconds_left": None if deadline is None else deadline - time.monotonic()}
    try:
        isolate.run_stage(req, log, control)
    except isolate.StageStopped:
        store.event(run_id, "end-to-end check stopped before it finished", "warn")
        log("end-to-end check stopped")
    except (RuntimeError, ConfigError) as e:
        store.event(run_id, f"end-to-end check failed: {e}", "error")
        log(f"end-to-end check failed: {e}")


def _profile_graph(cfg, store, run_id, model, inputs, log):
    """Capture, match, profile by node: (target plans, profile rows, total us), or None when the
    forward could not be captured (the caller profiles by interception; an event says why)."""
    from engine import capture, match
    from engine import profile as profiler
    cap = capture.capture(model, inputs)
    if not cap.ok:
        store.event(run_id, f"graph capture failed, profiled by interception instead: {cap.note}",
                    "warn")
        log(f"graph capture failed ({cap.note}); profiling by interception")
        return None
    from engine import integrate
    # what torch.compile of this graph will cost (integrate.compile_estimate_s: its aten ops, its
    # distinct GEMM/convolution shapes to autotune), kept with the run's device: the budget's
    # end-to-end reserve is sized from it, also when this ran in a child process
    figures = integrate.graph_figures(cap.graphs, cap.seconds)
    store.update_run(run_id, device=dict(store.get_run(run_id)["device"] or {}, graph=figures))
    store.event(run_id, f"captured by {cap.method}: {len(cap.graphs)} graph(s), "
                        f"{figures['aten_ops']} aten ops, {figures['gemm_shapes']} distinct "
                        f"GEMM/convolution shape(s) in {cap.seconds:.1f} s"
                        + (f" ({cap.note})" if cap.method != "export" else ""),
                "warn" if cap.method != "export" else "info")
    store.update_run(run_id, current_reason="matching the families in the graph")
    matches = {g.index: match.find(g, families=cfg.families) for g in cap.graphs}
    found = Counter(m.family for ms in matches.values() for m in ms)
    store.event(run_id, "matched " + (", ".join(f"{f} x{n}" for f, n in found.most_common())
                                      or "no family"))
    regs = _find_regions(cfg, store, run_id, cap, matches)
    store.update_run(run_id, current_reason="profiling the model")
    gp = profiler.profile_graph(cap, matches, regions=regs)
    for u in gp.unplaced:
        why = (f"{u['family']}: {u['count']} match(es), {u['time_us']:.0f} us per forward, "
               f"no target: {u['why']}")
        store.event(run_id, why, "warn")
        if not gp.targets:      # the run ends here: the console says why, not only the store
            log(why)
    rows = [asdict(f) for f in gp.result.families]
    store.save_profile(run_id, rows, gp.result.total_us)
    del cap, matches
    return gp.targets, rows, gp.result.total_us


def _find_regions(cfg, store, run_id, cap, matches) -> dict:
    """The fusible regions beside the matches (engine/regions.py), {graph index: [Region]};
    none unless the run's families name "region". An event names them."""
    from engine import regions
    if "region" not in (cfg.families or ()):
        return {}
    store.update_run(run_id, current_reason="finding the fusible regions of the graph")
    regs = {g.index: regions.find(g, matches[g.index]).regions for g in cap.graphs}
    names = Counter(r.name for rs in regs.values() for r in rs)
    if names:
        store.event(run_id, "regions " + ", ".join(f"{n} x{k}" if k > 1 else n
                                                   for n, k in names.most_common(12))
                    + (f" and {len(names) - 12} more" if len(names) > 12 else ""))
    return regs


def _execute(cfg, control, store, resume_run_id, log, proposer=None, api_key=None,
             started: float | None = None, isolate: bool = False) -> str:
    started = started or time.monotonic()
    control.stop_event.clear()
    control.set(state="starting", error=None)
    if resume_run_id:
        run = store.get_run(resume_run_id)
        if run is None:
            raise ConfigError(f"no run {resume_run_id!r} in {store.path}")
        saved = RunConfig.from_dict(run["config"])
        # a resumed run keeps its model, shapes and seed; budgets may be extended by the caller
        for k in ("budget_experiments", "budget_minutes", "worker_timeout_s", "patience",
                  "workers", "ray_address"):
            if getattr(cfg, k) is not None and getattr(cfg, k) != getattr(RunConfig(), k):
                setattr(saved, k, getattr(cfg, k))
        saved.db = cfg.db
        cfg = saved
        run_id = resume_run_id
        try:
            store.claim_run(run_id)       # one engine per run: a second one refuses here
        except RunBusy as e:
            raise ConfigError(str(e)) from None
        control.set(run_id=run_id)
        store.update_run(run_id, status="running", error=None)
        store.event(run_id, f"resumed with {run['experiments_done']} experiment(s) on record")
        log(f"resuming run {run_id} at experiment {run['experiments_done']}")
    else:
        # Reach the Ray cluster before the run exists: a wrong or unreachable address is a usage
        # error (one message, nothing written), not a failed run.
        if cfg.ray_address:
            try:
                backends.ray_connect(cfg.ray_address, cfg.workers)
            except Exception as e:
                raise ConfigError(f"cannot connect to the Ray cluster at {cfg.ray_address}: "
                                  f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
        try:
            run_id = (_prepare_isolated if isolate else _prepare)(cfg, store, control, log)
        except BaseException:
            backends.ray_disconnect()
            raise
    run = store.get_run(run_id)
    timing_mode = run["timing_mode"]
    interpret = timing_mode == "interpreter"
    deadline = _deadline(cfg, started)
    if not store.targets(run_id):
        # nothing to optimize: no worker, no loop, no end-to-end stage; done within seconds of
        # the profile
        store.event(run_id, "the profile found no family with a kernel: nothing to optimize", "warn")
        log("nothing to optimize: no profiled family has a kernel")
        store.update_run(run_id, status="done", current_target=None, current_reason=None)
        control.set(state="done", current_target=None)
        _summary(store, run_id, log)
        backends.ray_disconnect()
        return run_id
    status = "done"
    pool = None
    try:
        control.set(state="running")
        pool = backends.make(cfg.workers, cfg.ray_address, interpret, db_path=str(store.path),
                             fresh_retime=cfg.fresh_retime)
        hello = pool.start()
        store.save_workers(run_id, pool.snapshot())
        box = hello.get("sandbox") or {}
        if box.get("mode") in ("root", "user"):
            store.event(run_id, f"sandbox: candidates run as uid {box.get('uid')} in their own "
                                f"mount, PID and network namespaces ({box.get('mode')} mode); "
                                f"hidden: {', '.join(box.get('hidden', []))}")
        else:
            store.event(run_id, f"sandbox unavailable ({box.get('why', 'unknown')}): candidate "
                                f"code runs as this user, behind the allow list and the runtime "
                                f"guard only", "warn")
            log(f"warning: no OS sandbox for candidates ({box.get('why', 'unknown')})")
        for name, err in pool.start_errors.items():
            store.event(run_id, f"worker {name} did not start and is left out: {err}", "warn")
        if pool.backend != "single":
            desc = ", ".join(f"{w['name']} {w['device']} on {w['host']}" for w in pool.snapshot()
                             if w["state"] == "idle")
            store.event(run_id, f"{len(pool.live())} workers ({pool.backend}): {desc}; "
                                f"reference {pool.reference}")
            log(f"{len(pool.live())} workers ({pool.backend}), reference {pool.reference}: {desc}")
        ceilings = hello.get("ceilings") or {}
        store.update_run(run_id, ceilings=ceilings)
        if ceilings:
            rates = ", ".join(f"{k} {v:.0f}" for k, v in (ceilings.get("matmul_tflops_by") or
                                                          {"bfloat16": ceilings.get("matmul_tflops", 0)}).items())
            log(f"measured ceilings: copy {ceilings['copy_gbps']:.0f} GB/s, matmul TFLOP/s {rates}")
        modes = cfg.compile_modes if cfg.compile_modes is not None else (
            [] if interpret else GPU_COMPILE_MODES)
        tf32 = _run_tf32(store, run_id)
        for t in store.targets(run_id):
            if t["ref_latency_us"] is None:
                # the target's contract travels with it: the worker rebuilds the same Family
                # (kernels.get(family, spec)) and times its reference, eager and compiled
                # under a budget the baselines take at most REF_SHARE of the time left (the
                # first compile mode always runs: a target always has a compile baseline)
                share = (None if deadline is None
                         else REF_SHARE * max(deadline - time.monotonic(), 0.0))
                t_modes, t_skipped = _reference_modes(t, modes, share)
                if t_skipped:
                    store.event(run_id, f"{t.get('label') or t['family']}: torch.compile baseline "
                                        f"without {', '.join(t_skipped)}: longer than the "
                                        f"budget's share for baselines ({share:.0f} s)", "warn")
                r = pool.call(pool.reference,
                              {"op": "time_reference", "family": t["family"], "spec": t["spec"],
                               "dtype": t["dtype"], "shapes": t["shapes"], "seed": cfg.seed,
                               "tf32": tf32,
                               "compile_modes": t_modes, "budget_s": share},
                              timeout_s=cfg.worker_timeout_s * (1 + len(t_modes)))
                if "error" in r:
                    raise RuntimeError(f"timing the {t['family']} reference failed: {r['error']}")
                comp = r.get("compile") or {}
                store.update_target(t["id"], ref_latency_us=r["latency_us"], ref_noise=r["noise"],
                                    sol_latency_us=r["sol_us"], ref_shape_times=r["shape_times"],
                                    compile_latency_us=comp.get("latency_us"),
                                    compile_noise=comp.get("noise"), compile_mode=comp.get("mode"),
                                    compile_shape_times=comp.get("shape_times"))
                log(f"{t.get('label') or t['family']}: eager reference {r['latency_us']:.1f} us"
                    + (f", torch.compile {comp['latency_us']:.1f} us ({comp['mode']})"
                       if comp.get("latency_us") else "")
                    + (f", speed of light {r['sol_us']:.1f} us" if r["sol_us"] else "")
                    + (" [interpreter timing]" if interpret else ""))
                if comp.get("skipped"):
                    store.event(run_id, f"{t.get('label') or t['family']}: torch.compile baseline "
                                        f"without {', '.join(comp['skipped'])}: the budget's share "
                                        f"for baselines was spent", "warn")
                if comp.get("error"):
                    store.event(run_id, f"{t['family']}: torch.compile baseline not timed: "
                                        f"{comp['error']}", "warn")
        proposer = proposer or proposers.make(cfg.proposer, cfg.seed, cfg=cfg, api_key=api_key)
        stage_s = _stage_estimate(cfg, store, run_id, timing_mode, deadline)
        few = _few_loop_seconds(cfg, started, deadline, stage_s)
        if few:
            store.event(run_id, few, "warn")
            log(few)
        status = _Dispatch(_loop_cfg(cfg, deadline, stage_s), store, pool, proposer, run_id,
                           timing_mode, control, log).run(run["current_target"])
    except BaseException as e:
        status = "stopped" if _interrupted(e) else "failed"
        if status == "failed":
            store.update_run(run_id, status="failed", error=f"{type(e).__name__}: {e}")
            store.event(run_id, f"engine error: {type(e).__name__}: {e}\n"
                        f"{traceback.format_exc()[-1500:]}", "error")
            control.set(state="failed", error=f"{type(e).__name__}: {e}")
        elif not isinstance(e, KeyboardInterrupt):
            raise KeyboardInterrupt from e     # a stop, as the callers know one
        raise
    finally:
        if hasattr(proposer, "close"):
            proposer.close()
        if pool is not None:
            pool.close()
            store.save_workers(run_id, pool.snapshot())
        if status != "failed":
            store.update_run(run_id, status=status, current_target=None)
            control.set(state=status, current_target=None)
        store.release_run(run_id)
        _summary(store, run_id, log)
    if status == "done" and cfg.e2e_check:
        from engine import integrate    # never raises: a failure is recorded and logged
        if isolate:
            _finish_isolated(store, run_id, log, deadline, control)
        else:
            integrate.finish_run(store, run_id, log, deadline=deadline)
    if deadline is not None and time.monotonic() > deadline + 5:
        store.event(run_id, f"the run took {(time.monotonic() - started) / 60:.1f} min of its "
                            f"{cfg.budget_minutes:g} min budget", "warn")
    return run_id


def _stage_estimate(cfg: RunConfig, store, run_id: str, timing_mode: str,
                    deadline: float | None) -> float | None:
    """The end-to-end stage's estimate (integrate.stage_estimate_s, from the graph's figures the
    capture kept with the run); an event says what the loop leaves it. None: no estimate."""
    if deadline is None or not cfg.e2e_check:
        return None
    from engine import integrate
    figures = ((store.get_run(run_id) or {}).get("device") or {}).get("graph")
    full_modes, full_s = integrate.stage_modes_s(figures, timing_mode)
    if full_s is None:
        return None
    # what the stage can be given at most; the modes that do not fit in it are skipped by the
    # stage anyway, so the loop keeps their time
    modes, stage_s = integrate.stage_modes_s(figures, timing_mode,
                                             E2E_MAX_SHARE * cfg.budget_minutes * 60)
    reserve = _e2e_reserve_s(cfg, stage_s)
    skipped = [m for m in full_modes if m not in modes]
    store.event(run_id, f"end-to-end stage estimated at {full_s:.0f} s (torch.compile in every "
                        f"mode, {figures.get('gemm_shapes')} GEMM/convolution shape(s) to "
                        f"autotune): the loop stops {reserve:.0f} s before the budget's end"
                        + (f"; the stage skips what does not fit ({', '.join(skipped)}, "
                           f"estimated at {full_s - stage_s:.0f} s more)" if skipped else ""),
                "warn" if skipped else "info")
    return stage_s


def _run_tf32(store, run_id) -> bool:
    """Which fp32 matmul rate the run's speed of light uses: the model's own TF32 setting, as
    its process recorded it with the run's device."""
    return bool(((store.get_run(run_id) or {}).get("device") or {}).get("tf32"))


class _Heartbeat:
    """Tells the database every HEARTBEAT_S that this engine still holds the run (its own
    connection, on its own thread), so a reader can tell a live run from a dead engine's."""

    def __init__(self, path, control: Control):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, args=(path, control), daemon=True,
                                        name="nightshift-heartbeat")
        self._thread.start()

    def _beat(self, path, control: Control) -> None:
        store = None
        try:
            while not self._stop.wait(HEARTBEAT_S):
                run_id = control.status()["run_id"]      # known once the run row exists
                if run_id is None:
                    continue
                try:
                    store = store or Store(path)
                    store.heartbeat(run_id)
                except Exception:
                    pass        # a busy database: the next beat tries again
        finally:
            if store is not None:
                store.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


class _Dispatch:
    """Keeps every worker busy: proposes while a worker is free, decides as results come in.

    Results may arrive in any order: each is judged against the target's best at the moment it
    arrives (read fresh from the store), so a slow candidate proposed from an older best is still
    kept only if it beats the current one. A candidate measured on a worker other than the
    reference that would become the new best (or one from a different GPU model, whose time
    compares with nothing) is re-timed on the reference worker first, and that time decides: the
    best is never the product of a faster card or a quieter neighbour. A target's first experiment
    (the starter) runs alone: there is no best to judge or mutate before it. With one worker this
    is exactly the sequential loop: propose, evaluate, decide."""

    def __init__(self, cfg, store, pool, proposer, run_id, timing_mode, control, log):
        self.cfg, self.store, self.pool, self.proposer = cfg, store, pool, proposer
        self.run_id, self.timing_mode, self.control, self.log = run_id, timing_mode, control, log
        self.inflight: dict[int, dict] = {}    # job key -> {"exp", "t0", "first", "req", ...}
        self.exps: list[dict] = []             # the run's committed experiments, oldest first
        self.took: deque = deque(maxlen=8)     # seconds the last committed experiments took
        self.short_noted = False               # the event "the time left holds no experiment"
        self.late_noted = False                # the event "the budget was spent before the loop"
        self.by_target: dict[int, list[dict]] = {}
        self.keys = itertools.count(1)
        self.previous = None
        self.finished = False                  # nothing more to propose: drain, then end
        self.bench_first = cfg.verify_order == "bench-first" or (
            cfg.verify_order == "auto" and timing_mode == "gpu")
        self.tf32 = _run_tf32(store, run_id)

    def run(self, previous) -> str:
        store, control = self.store, self.control
        self.previous = previous
        started = time.monotonic()
        paused = False
        flushed = 0.0
        while True:
            now = time.monotonic()
            if now - flushed >= 1.0:
                store.save_workers(self.run_id, self.pool.snapshot())
                flushed = now
            if control.stop_event.is_set():
                return "stopped"   # what is in flight is dropped: nothing of it was committed
            if control.resume_event.is_set() == paused:    # pause / resume pressed
                paused = not paused
                store.update_run(self.run_id, status="paused" if paused else "running")
                control.set(state="paused" if paused else "running")
            if not self.pool.live():
                raise RuntimeError("every worker died and none could be restarted")
            if not self.pool.reference_alive():
                # every kept time was measured on the reference: another card cannot take over
                # its comparisons mid-run. Committed experiments stay; --resume starts a fresh pool.
                raise RuntimeError(f"the reference worker {self.pool.reference} died and could not "
                                   f"be restarted; resume the run (--resume) to go on")
            while not (paused or self.finished or self._over(started)) and self.pool.free() > 0:
                try:
                    outcome = self._next()
                except proposers.ProposerStopped as e:
                    if control.stop_event.is_set():   # Stop pressed while it waited on a model
                        return "stopped"
                    store.event(self.run_id, f"finished: the proposer stopped: {e}", "warn")
                    self.log(f"proposer stopped: {e}")
                    self.finished = True
                    break
                if outcome == "wait":
                    break
                if outcome == "recorded":     # failed without a worker: counts against the budget
                    break
            if not self.inflight and (self.finished or self._over(started)):
                return "done"
            for d in self.pool.results(timeout=0.2 if self.inflight or paused else 0.02):
                self._handle(d)

    def _over(self, started: float) -> bool:
        """The budget is spent; what is in flight counts against it already. Under a time
        budget no experiment starts that the time left would not hold, as long as the run's
        recent ones took (their median): one started with 5 s left at KernelBench's 6.4 GB
        shapes ran 35 s past the budget on the H200."""
        cfg = self.cfg
        done = self.store.get_run(self.run_id)["experiments_done"]
        if cfg.budget_experiments is not None and done + len(self.inflight) >= cfg.budget_experiments:
            return True
        if cfg.budget_minutes is None:
            return False
        left = cfg.budget_minutes * 60 - (time.monotonic() - started)
        if done == 0 and not self.inflight and not self.took:
            # the top target's starter runs even when capture, workers and baselines took the
            # budget: a run that measured nothing tells nothing (KernelBench level 2's 80 and 92
            # spent their 24 s before the loop; the starter is seconds)
            if left <= 0 and not self.late_noted:
                self.late_noted = True
                self.store.event(self.run_id, f"the budget was spent before the loop "
                                              f"({-left:.0f} s over): one experiment, the top "
                                              f"target's starter, runs anyway", "warn")
            return False
        took = sorted(self.took)
        need = took[len(took) // 2] if took else 0.0
        if left < need and left > 0 and not self.short_noted:
            self.short_noted = True
            self.store.event(self.run_id, f"no experiment started in the last {left:.0f} s of the "
                                          f"budget: the recent ones took {need:.0f} s (median)")
        return left <= 0 or left < need

    # -- proposing --------------------------------------------------------------------------------
    def _next(self) -> str:
        """Propose one candidate and submit it: "submitted", "recorded" (failed before a worker),
        "again" (a target's space ran out: choose again), "wait" (nothing to do until a result
        comes in) or "finished"."""
        store = self.store
        targets = store.targets(self.run_id)
        starting = {x["exp"]["target_id"] for x in self.inflight.values() if x["first"]}
        eligible = [t for t in targets if t["id"] not in starting]
        target, why, new_round = plan.choose_next(eligible, self.cfg.patience)
        if target is None:
            if starting:
                return "wait"     # a starter in flight may open its target again
            store.event(self.run_id, f"finished: {why}")
            self.finished = True
            return "finished"
        if new_round:
            for t in eligible:
                store.update_target(t["id"], no_improve=0)
            target["no_improve"] = 0
        if target["family"] != self.previous:
            store.event(self.run_id, f"target -> {why}")
            self.previous = target["family"]
        store.update_run(self.run_id, current_target=target["family"], current_reason=why)
        self.control.set(current_target=target["family"])

        fam = kernels.get(target["family"], target.get("spec") or None)
        fam = fam.for_target(target["shapes"][0]["shape"] if target["shapes"] else None,
                             target["dtype"])
        run_exps = self._experiments()
        history = list(self.by_target.get(target["id"], []))
        pending = [x["pending"] for x in self.inflight.values()
                   if x["exp"]["target_id"] == target["id"]]
        seen = history + pending   # in-flight candidates count as tried: a batch never repeats
        best = store.experiment(target["best_experiment_id"]) if target["best_experiment_id"] else None
        try:
            if getattr(self.proposer, "takes_context", False):
                ctx = proposers.ProposalContext(run=store.get_run(self.run_id), target=target,
                                                experiments=run_exps, stop=self.control.stop_event)
                prop = self.proposer.propose(fam, seen, best, ctx)
            else:
                prop = self.proposer.propose(fam, seen, best)
        except proposers.SpaceExhausted as e:
            store.update_target(target["id"], state="done")
            store.event(self.run_id, f"{fam.name}: search space exhausted ({e})")
            return "again"
        except proposers.ProposerStopped:
            raise
        except Exception as e:
            # a proposer's own bug (a point it cannot render...) sets this target aside; the run
            # and its other targets go on: nobody is there overnight to restart it
            store.update_target(target["id"], state="done")
            store.event(self.run_id, f"{fam.name}: the proposer failed ({type(e).__name__}: "
                                     f"{str(e)[:300]}); the target is set aside", "warn")
            self.log(f"{fam.name}: the proposer failed ({type(e).__name__}: {e}); target set aside")
            return "again"
        exp = dict(run_id=self.run_id, target_id=target["id"], family=fam.name,
                   parent_id=prop.parent_id, proposer=prop.proposer, hypothesis=prop.hypothesis,
                   params=prop.params, source=prop.source,
                   source_hash=verify.source_hash(prop.source), timing_mode=self.timing_mode,
                   tokens_in=prop.tokens_in, tokens_out=prop.tokens_out, cost_usd=prop.cost_usd,
                   proposal_latency_s=prop.latency_s)
        t0 = time.monotonic()
        reason = None if prop.error else verify.static_check(prop.source, fam.arg_names)
        if prop.error or reason:
            stage, msg = ("proposal", prop.error) if prop.error else ("static", reason)
            what = "no candidate: " if prop.error else "static check failed: "
            exp.update(state="failed", failed_stage=stage, error=msg)
            stages = [dict(stage=s, status="skipped", detail=what + msg[:300]) for s in verify.STAGES]
            self._commit({"exp": exp, "t0": t0}, stages)
            return "recorded"
        req = {"op": "evaluate", "family": fam.name, "spec": target.get("spec") or {},
               "source": prop.source, "dtype": target["dtype"], "shapes": target["shapes"],
               "seed": self.cfg.seed * 1_000_003 + len(seen) + 1, "tf32": self.tf32,
               # verified in the dtype it is placed for (a placed kernel is guarded by it): the
               # other dtypes' sweep and stability cases, each dtype its own compile, say
               # nothing about that placement (a region starter took 33-44 s on the H200 at
               # KernelBench's fp32 shapes, 13-24 s of it in the shape sweep)
               "dtypes": [target["dtype"]]}
        # the gate compares with the best's timing, so only where every worker is the reference's
        # GPU model (else a candidate slower here may still be faster on the reference)
        if (self.bench_first and target["best_latency_us"]
                and all(self.pool.same_model(n) for n in self.pool.live())):
            req["gate"] = {"best_us": target["best_latency_us"], "best_noise": target["best_noise"],
                           "min_margin": MIN_MARGIN}
        key = next(self.keys)
        self.inflight[key] = {
            "exp": exp, "t0": t0, "first": not seen, "req": req,
            "pending": dict(id=None, seq="in flight", state="in flight", proposer=prop.proposer,
                            hypothesis=prop.hypothesis, params=prop.params,
                            source_hash=exp["source_hash"], failed_stage=None, latency_us=None,
                            error=None)}
        self.pool.submit(backends.Job(key=key, req=req, timeout_s=self.cfg.worker_timeout_s,
                                      meta={"kind": "evaluate"}))
        return "submitted"

    def _experiments(self) -> list[dict]:
        """The run's committed experiments, reading only the rows committed since the last call:
        a proposal's cost must not grow with the run (an overnight run commits tens of thousands,
        and re-reading them all cost ~7 us each per proposal)."""
        new = self.store.experiments(self.run_id, since_id=self.exps[-1]["id"] if self.exps else 0)
        self.exps += new
        for e in new:
            self.by_target.setdefault(e["target_id"], []).append(e)
        return self.exps

    # -- results ----------------------------------------------------------------------------------
    def _handle(self, d: backends.Done) -> None:
        item = self.inflight.get(d.job.key)
        if item is None:
            return
        if d.job.meta.get("kind") == "retime":
            return self._handle_retime(d, item)
        exp = item["exp"]
        if d.died is not None:
            avoid = set(d.job.avoid) | {d.slot}
            if d.job.attempt == 1 and self.pool.backend != "single" and self.pool.retry_possible(avoid):
                what = "hung" if d.died.timed_out else "died"
                self.store.event(self.run_id, f"worker {d.slot} {what} evaluating a {exp['family']} "
                                 f"candidate; retrying it once on another worker", "warn")
                self.pool.submit(replace(d.job, avoid=frozenset(avoid), attempt=2))
                return
            r = _died(d.died)
        else:
            r = d.reply
            if "error" in r and "stages" not in r:
                raise RuntimeError(f"worker rejected the request: {r['error']}")
        w = self._worker(d.slot)
        exp.update(worker=d.slot, gpu=w, attempts=d.job.attempt)
        stages = r["stages"]
        if r["failed_stage"]:
            exp.update(state="failed", failed_stage=r["failed_stage"], error=r["error"])
        timing = r.get("timing")
        if timing:
            self._set_timing(exp, timing)
            if timing.get("repeated"):
                self.store.event(self.run_id, f"{exp['family']}: {timing['repeated']}; the "
                                              f"repeat, {timing['latency_us']:.1f} us, stands")
        if r.get("gated"):
            # slower than the best when the job was sent; the best has only got faster since
            exp.update(state="reverted", error=r["gated"])
        elif timing and not r["failed_stage"] and d.slot != self.pool.reference:
            target = self._target(exp["target_id"])
            if (not self.pool.same_model(d.slot)
                    or not verify.not_faster(exp["latency_us"], exp["noise"],
                                             target["best_latency_us"], target["best_noise"],
                                             MIN_MARGIN)):
                item["stages"] = stages
                exp["first_latency_us"] = exp["latency_us"]
                self.pool.submit(backends.Job(
                    key=d.job.key, req=dict(item["req"], verify=False),
                    timeout_s=self.cfg.worker_timeout_s, only=self.pool.reference,
                    meta={"kind": "retime"}))
                return
        self._commit(item, stages)
        del self.inflight[d.job.key]

    def _handle_retime(self, d: backends.Done, item: dict) -> None:
        exp = item["exp"]
        ref = self.pool.reference
        if d.died is not None and d.job.attempt == 1:
            self.store.event(self.run_id, f"the reference worker {ref} died re-timing a "
                             f"{exp['family']} candidate; re-timing it once more", "warn")
            self.pool.submit(replace(d.job, attempt=2))
            return
        r = _died(d.died) if d.died is not None else d.reply
        if d.died is not None or r.get("failed_stage") or not r.get("timing"):
            err = r.get("error") or "no timing"
            exp.update(state="failed", failed_stage=r.get("failed_stage") or "benchmark",
                       error=f"on the reference worker {ref}: {err}")
        else:
            self._set_timing(exp, r["timing"])
            exp.update(retimed_on=ref, retime_s=d.elapsed_s)
        self._commit(item, item["stages"])
        del self.inflight[d.job.key]

    def _set_timing(self, exp: dict, timing: dict) -> None:
        ref = self._target(exp["target_id"])["ref_latency_us"]
        lat = timing["latency_us"]
        exp.update(latency_us=lat, noise=timing["noise"], shape_times=timing["shape_times"],
                   speedup=(ref / lat) if ref else None,
                   pct_sol=(100 * timing["sol_us"] / lat) if timing.get("sol_us") else None)

    def _worker(self, name: str) -> str:
        for w in self.pool.snapshot():
            if w["name"] == name:
                return f"{w['device']} {w['gpu_name']}" + (f" @{w['host']}"
                                                           if self.pool.backend == "ray" else "")
        return name

    def _target(self, target_id: int) -> dict:
        return next(t for t in self.store.targets(self.run_id) if t["id"] == target_id)

    def _commit(self, item: dict, stages: list[dict]) -> None:
        """Keep or revert against the target's best now, and record it with its stages."""
        exp = item["exp"]
        target = self._target(exp["target_id"])
        exp["duration_s"] = time.monotonic() - item["t0"]
        self.took.append(exp["duration_s"])
        update = {"experiments": target["experiments"] + 1, "state": "active"}
        if exp.get("state") == "reverted":        # timed, not verified further (bench-first)
            update["no_improve"] = target["no_improve"] + 1
        elif exp.get("state") != "failed":
            lat = exp["latency_us"]
            slower = verify.not_faster(lat, exp["noise"], target["best_latency_us"],
                                       target["best_noise"], MIN_MARGIN)
            if not slower:
                exp["state"] = "kept"
                update.update(best_is_this=True, best_latency_us=lat, best_noise=exp["noise"],
                              speedup=exp["speedup"], no_improve=0)
            else:
                exp["state"] = "reverted"
                exp["error"] = slower
                update["no_improve"] = target["no_improve"] + 1
        else:
            update["no_improve"] = target["no_improve"] + 1
        exp_id = self.store.record_experiment(exp, stages, update)
        row = self.store.experiment(exp_id)
        self.control.set(experiments=row["seq"])
        self.log(_log_line(dict(row, family=target.get("label") or row["family"]), self.timing_mode,
                           self.pool.backend != "single"))


def _died(e: WorkerDied) -> dict:
    """A reply for a worker that crashed or hung: stages before the one it died in passed."""
    stage = e.stage or "smoke"
    what = "hung" if e.timed_out else "crashed"
    msg = f"worker {what} during {stage}: {e}"
    stages = []
    reached = False
    for s in verify.STAGES:
        if s == stage:
            stages.append(dict(stage=s, status="failed", detail=msg[:2000]))
            reached = True
        elif not reached and stage in verify.STAGES:
            stages.append(dict(stage=s, status="passed", detail="completed before the worker died"))
        else:
            stages.append(dict(stage=s, status="skipped",
                               detail="passed" if not reached else "the worker died earlier"))
    if stage not in verify.STAGES:  # died while timing or re-checking: all five had passed
        stages = [dict(stage=s, status="passed", detail="completed before the worker died")
                  for s in verify.STAGES]
    return {"stages": stages, "failed_stage": stage, "error": msg[:4000]}


def _summary(store: Store, run_id: str, log) -> None:
    run = store.get_run(run_id)
    targets = store.targets(run_id)
    exps = store.experiments(run_id)
    n = Counter(e["state"] for e in exps)
    log(f"run {run_id} {run['status']}: {len(exps)} experiments "
        f"({n['kept']} kept as their target's best, {n['reverted']} reverted, {n['failed']} failed)")
    for t in targets:
        name = t.get("label") or (t["family"] + (f" {json.dumps(t['spec'], sort_keys=True)}"
                                                 if t.get("spec") else ""))
        line = f"  {name:<13} {t['experiments']:3d} exp"
        if t["best_latency_us"]:
            line += f"  best {t['best_latency_us']:.1f} us"
            if t["speedup"]:
                line += f"  {t['speedup']:.3g}x eager"
            if t.get("compile_latency_us"):
                line += f"  {t['compile_latency_us'] / t['best_latency_us']:.3g}x torch.compile"
            if t["sol_latency_us"]:
                line += f"  {100 * t['sol_latency_us'] / t['best_latency_us']:.0f}% of speed of light"
            ok, why = plan.beats_baseline(t, MIN_MARGIN)
            if not ok and run["timing_mode"] == "gpu":
                line += f"  [not placed: {why.split(':')[0]}]"
        else:
            line += "  no verified kernel"
        log(line)
    proj = plan.projected(targets)
    tag = " (interpreter timings: not GPU performance)" if run["timing_mode"] == "interpreter" else ""
    log(f"  Amdahl-projected end-to-end speedup over the baseline (faster of eager and "
        f"torch.compile per target): {proj:.3f}x{tag}")


class Engine:
    """One per process (the dashboard holds it in st.cache_resource). Runs one run at a time."""

    def __init__(self):
        self.control = Control()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.log_lines: list[str] = []

    def _log(self, line: str) -> None:
        self.log_lines.append(line)
        del self.log_lines[:-500]

    def start(self, cfg: RunConfig, resume_run_id: str | None = None,
              api_key: str | None = None) -> str:
        cfg.validate()
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                raise ConfigError("a run is already in progress in this process; stop it first")
            # fail here, with a clear message, if the db can't be written (creating nothing: a
            # run that never starts leaves no file)
            check_writable(cfg.db)
            self.control = Control()
            ready = threading.Event()

            def target():
                try:
                    # the model is built and checked in a child process: a model file uploaded
                    # to the dashboard never runs in the dashboard's own process
                    execute(cfg, self.control, resume_run_id, log=self._log, api_key=api_key,
                            isolate=True)
                except KeyboardInterrupt:
                    self.control.set(state="stopped")
                except BaseException as e:  # recorded in the store and in status by execute
                    self.control.set(state="failed", error=f"{type(e).__name__}: {e}")
                finally:
                    ready.set()

            self._thread = threading.Thread(target=target, name="nightshift-engine", daemon=True)
            self.control.set(state="starting", run_id=resume_run_id)
            self._thread.start()
        # wait until the run row exists (or the start failed), so the caller can show it
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not ready.is_set():
            if self.control.status()["run_id"]:
                break
            time.sleep(0.05)
        st = self.control.status()
        if st["state"] == "failed" and not st["run_id"]:
            raise ConfigError(st["error"] or "the run failed to start")
        return st["run_id"]

    def stop(self) -> None:
        self.control.stop_event.set()
        self.control.resume_event.set()
        if self.control.status()["state"] in ("running", "paused", "starting"):
            self.control.set(state="stopping")

    def pause(self) -> None:
        self.control.resume_event.clear()

    def resume(self) -> None:
        self.control.resume_event.set()

    def status(self) -> dict:
        return self.control.status()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)


__all__ = ["Engine", "RunConfig", "ConfigError", "Control", "execute", "StoreError"]
