"""The loop: profile -> plan -> propose -> verify -> benchmark -> keep or revert -> log -> next.

``execute`` runs one run to its end in the calling thread (the CLI); ``Engine`` runs it in a
background thread for the dashboard and exposes a small thread-safe handle (start, stop, pause,
resume, status). Either way the only channel to the outside is the SQLite store: each experiment is
committed whole, so a run killed at any point resumes from the database with nothing committed lost.
"""
from __future__ import annotations

import threading
import time
import traceback
from collections import Counter
from dataclasses import asdict, dataclass, field, fields

import kernels
from engine import plan, proposers, verify
from engine.store import Store, StoreError
from engine.worker import Worker, WorkerDied

DTYPES = ("auto", "float32", "float16", "bfloat16")
MIN_MARGIN = 0.01   # never keep a change smaller than 1%, however quiet the measurement
MAX_TARGET_SHAPES = 4


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

    def validate(self) -> None:
        from engine import sources
        try:   # built-in name, hf:NAME or path/to/file.py[:Name]; files are parsed, not run
            sources.validate(self.model, self.input_shape)
        except sources.SourceError as e:
            raise ConfigError(str(e)) from None
        if self.dtype not in DTYPES:
            raise ConfigError(f"unknown dtype {self.dtype!r}; choose one of {', '.join(DTYPES)}")
        for f in self.families or []:
            if f not in kernels.FAMILY_NAMES:
                raise ConfigError(f"unknown family {f!r}; known families: "
                                  f"{', '.join(kernels.FAMILY_NAMES)}")
        if self.families is not None and not self.families:
            raise ConfigError("choose at least one family")
        if self.budget_experiments is not None and self.budget_experiments < 1:
            raise ConfigError("--budget-experiments must be a positive number of experiments")
        if self.budget_minutes is not None and self.budget_minutes <= 0:
            raise ConfigError("--budget-minutes must be positive")
        if self.patience < 1:
            raise ConfigError("patience must be at least 1")
        if self.worker_timeout_s <= 0:
            raise ConfigError("worker timeout must be positive")
        if self.proposer not in proposers.NAMES:
            raise ConfigError(f"unknown proposer {self.proposer!r}; known: "
                              f"{', '.join(proposers.NAMES)}")
        if self.proposer in ("llm", "hybrid"):
            _validate_llm(self)

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


def _log_line(exp: dict, timing_mode: str) -> str:
    lat = f"{exp['latency_us']:10.1f} us" if exp.get("latency_us") else " " * 13
    spd = f"{exp['speedup']:7.3g}x" if exp.get("speedup") else " " * 8
    sol = f"{exp['pct_sol']:4.0f}% SOL" if exp.get("pct_sol") else " " * 8
    state = exp["state"] + (f"@{exp['failed_stage']}" if exp.get("failed_stage") else "")
    tag = " [interpreter timing]" if timing_mode == "interpreter" and exp.get("latency_us") else ""
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
            log=print, proposer=None, api_key: str | None = None) -> str:
    """Run (or resume) one optimization run to its end. Returns the run id.

    ``proposer`` replaces the one ``cfg.proposer`` names (any object with ``propose``).
    ``api_key``: the LLM proposer's key (e.g. from the dashboard's secrets); held in memory only."""
    control = control or Control()
    store = Store(cfg.db)
    try:
        return _execute(cfg, control, store, resume_run_id, log, proposer, api_key)
    finally:
        store.close()


def _prepare(cfg: RunConfig, store: Store, control: Control, log) -> str:
    """Build the model, profile it, and create the run with its profile and targets."""
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
    model, inputs = loaded.model, loaded.inputs
    del loaded
    run_id = store.create_run(cfg.model, asdict(cfg), device, device["timing_mode"], None)
    control.set(run_id=run_id)
    store.update_run(run_id, current_reason="profiling the model")
    log(f"profiling {cfg.model} ({dtype}) on {device['name']} ...")
    try:
        prof = profiler.profile_model(model, inputs)
        del model, inputs
    except Exception as e:
        store.update_run(run_id, status="failed", current_reason=None,
                         error=f"profiling failed: {type(e).__name__}: {e}")
        control.set(state="failed", error=f"profiling failed: {type(e).__name__}: {e}")
        raise
    if gpu:
        torch.cuda.empty_cache()
    rows = [asdict(f) for f in prof.families]
    store.save_profile(run_id, rows, prof.total_us)
    wanted = set(cfg.families or kernels.FAMILY_NAMES)
    for r in rows:
        if r["has_kernel"] and r["family"] in wanted and r["shapes"]:
            tdtype, shapes = _target_shapes(r)
            store.add_target(run_id, r["family"], tdtype, shapes, r["fraction"])
    found = ", ".join(f"{r['family']} {r['fraction']:.1%}" for r in rows)
    store.event(run_id, f"profiled {cfg.model}: {prof.total_us:.0f} us per forward; {found}")
    log(f"run {run_id}: {found}")
    for r in rows:
        if r["family"] == "other" and r["top_ops"]:
            log("  other: " + ", ".join(f"{o['name']} {o['time_us']:.0f} us"
                                        for o in r["top_ops"][:5]))
    return run_id


def _execute(cfg, control, store, resume_run_id, log, proposer=None, api_key=None) -> str:
    control.stop_event.clear()
    control.set(state="starting", error=None)
    if resume_run_id:
        run = store.get_run(resume_run_id)
        if run is None:
            raise ConfigError(f"no run {resume_run_id!r} in {store.path}")
        saved = RunConfig.from_dict(run["config"])
        # a resumed run keeps its model, shapes and seed; budgets may be extended by the caller
        for k in ("budget_experiments", "budget_minutes", "worker_timeout_s", "patience"):
            if getattr(cfg, k) is not None and getattr(cfg, k) != getattr(RunConfig(), k):
                setattr(saved, k, getattr(cfg, k))
        saved.db = cfg.db
        cfg = saved
        run_id = resume_run_id
        control.set(run_id=run_id)
        store.update_run(run_id, status="running", error=None)
        store.event(run_id, f"resumed with {run['experiments_done']} experiment(s) on record")
        log(f"resuming run {run_id} at experiment {run['experiments_done']}")
    else:
        run_id = _prepare(cfg, store, control, log)
    run = store.get_run(run_id)
    timing_mode = run["timing_mode"]
    interpret = timing_mode == "interpreter"
    worker = Worker(interpret=interpret)
    status = "done"
    try:
        control.set(state="running")
        hello = worker.start()
        ceilings = hello.get("ceilings") or {}
        store.update_run(run_id, ceilings=ceilings)
        if ceilings:
            log(f"measured ceilings: copy {ceilings['copy_gbps']:.0f} GB/s, "
                f"bf16 matmul {ceilings['matmul_tflops']:.0f} TFLOP/s")
        for t in store.targets(run_id):
            if t["ref_latency_us"] is None:
                r = worker.request({"op": "time_reference", "family": t["family"],
                                    "dtype": t["dtype"], "shapes": t["shapes"], "seed": cfg.seed},
                                   timeout_s=cfg.worker_timeout_s)
                if "error" in r:
                    raise RuntimeError(f"timing the {t['family']} reference failed: {r['error']}")
                store.update_target(t["id"], ref_latency_us=r["latency_us"], ref_noise=r["noise"],
                                    sol_latency_us=r["sol_us"], ref_shape_times=r["shape_times"])
                log(f"{t['family']}: eager reference {r['latency_us']:.1f} us"
                    + (f", speed of light {r['sol_us']:.1f} us" if r["sol_us"] else "")
                    + (" [interpreter timing]" if interpret else ""))
        if not store.targets(run_id):
            store.event(run_id, "the profile found no family with a kernel: nothing to optimize",
                        "warn")
            log("nothing to optimize: no profiled family has a kernel")
        proposer = proposer or proposers.make(cfg.proposer, cfg.seed, cfg=cfg, api_key=api_key)
        started = time.monotonic()
        previous = run["current_target"]
        while True:
            if control.stop_event.is_set():
                status = "stopped"
                break
            if not control.resume_event.is_set():
                store.update_run(run_id, status="paused")
                control.set(state="paused")
                while not control.resume_event.wait(0.2):
                    if control.stop_event.is_set():
                        break
                if control.stop_event.is_set():
                    status = "stopped"
                    break
                store.update_run(run_id, status="running")
                control.set(state="running")
            done = store.get_run(run_id)["experiments_done"]
            if cfg.budget_experiments is not None and done >= cfg.budget_experiments:
                break
            if cfg.budget_minutes is not None and time.monotonic() - started >= cfg.budget_minutes * 60:
                break
            targets = store.targets(run_id)
            target, why, new_round = plan.choose_next(targets, cfg.patience)
            if target is None:
                store.event(run_id, f"finished: {why}")
                break
            if new_round:
                for t in targets:
                    store.update_target(t["id"], no_improve=0)
                target["no_improve"] = 0
            if target["family"] != previous:
                store.event(run_id, f"target -> {why}")
                previous = target["family"]
            store.update_run(run_id, current_target=target["family"], current_reason=why)
            control.set(current_target=target["family"])
            try:
                exp = _one_experiment(cfg, store, worker, proposer, run_id, target, timing_mode,
                                      control.stop_event)
            except proposers.ProposerStopped as e:
                if control.stop_event.is_set():   # Stop pressed while it waited on a model
                    status = "stopped"
                    break
                store.event(run_id, f"finished: the proposer stopped: {e}", "warn")
                log(f"proposer stopped: {e}")
                break
            if exp is None:
                continue
            control.set(experiments=exp["seq"])
            log(_log_line(exp, timing_mode))
    except BaseException as e:
        status = "stopped" if isinstance(e, KeyboardInterrupt) else "failed"
        if status == "failed":
            store.update_run(run_id, status="failed", error=f"{type(e).__name__}: {e}")
            store.event(run_id, f"engine error: {type(e).__name__}: {e}\n"
                        f"{traceback.format_exc()[-1500:]}", "error")
            control.set(state="failed", error=f"{type(e).__name__}: {e}")
        raise
    finally:
        if hasattr(proposer, "close"):
            proposer.close()
        worker.close()
        if status != "failed":
            store.update_run(run_id, status=status, current_target=None)
            control.set(state=status, current_target=None)
        _summary(store, run_id, log)
    if status == "done" and cfg.e2e_check:
        from engine import integrate    # never raises: a failure is recorded and logged
        integrate.finish_run(store, run_id, log)
    return run_id


def _one_experiment(cfg, store, worker, proposer, run_id, target, timing_mode,
                    stop=None) -> dict | None:
    fam = kernels.get(target["family"])
    run_exps = store.experiments(run_id)
    history = [e for e in run_exps if e["target_id"] == target["id"]]
    best = store.experiment(target["best_experiment_id"]) if target["best_experiment_id"] else None
    try:
        if getattr(proposer, "takes_context", False):
            ctx = proposers.ProposalContext(run=store.get_run(run_id), target=target,
                                            experiments=run_exps, stop=stop)
            prop = proposer.propose(fam, history, best, ctx)
        else:
            prop = proposer.propose(fam, history, best)
    except proposers.SpaceExhausted as e:
        store.update_target(target["id"], state="done")
        store.event(run_id, f"{fam.name}: search space exhausted ({e})")
        return None
    t0 = time.monotonic()
    exp = dict(run_id=run_id, target_id=target["id"], family=fam.name, parent_id=prop.parent_id,
               proposer=prop.proposer, hypothesis=prop.hypothesis, params=prop.params,
               source=prop.source, source_hash=verify.source_hash(prop.source),
               timing_mode=timing_mode, worker=worker.name, tokens_in=prop.tokens_in,
               tokens_out=prop.tokens_out, cost_usd=prop.cost_usd,
               proposal_latency_s=prop.latency_s)
    stages: list[dict] = []
    reason = None if prop.error else verify.static_check(prop.source, fam.arg_names)
    if prop.error:
        exp.update(state="failed", failed_stage="proposal", error=prop.error)
        stages = [dict(stage=s, status="skipped", detail="no candidate: " + prop.error[:300])
                  for s in verify.STAGES]
    elif reason:
        exp.update(state="failed", failed_stage="static", error=reason)
        stages = [dict(stage=s, status="skipped", detail="static check failed: " + reason)
                  for s in verify.STAGES]
    else:
        req = {"op": "evaluate", "family": fam.name, "source": prop.source,
               "dtype": target["dtype"], "shapes": target["shapes"],
               "seed": cfg.seed * 1_000_003 + len(history) + 1}
        try:
            r = worker.request(req, timeout_s=cfg.worker_timeout_s)
        except WorkerDied as e:
            r = _died(e)
            worker.restart()
        else:
            if r.get("restart"):
                worker.restart()
        if "error" in r and "stages" not in r:
            raise RuntimeError(f"worker rejected the request: {r['error']}")
        stages = r["stages"]
        if r["failed_stage"]:
            exp.update(state="failed", failed_stage=r["failed_stage"], error=r["error"])
        timing = r.get("timing")
        if timing:
            lat = timing["latency_us"]
            exp.update(latency_us=lat, noise=timing["noise"], shape_times=timing["shape_times"],
                       speedup=(target["ref_latency_us"] / lat) if target["ref_latency_us"] else None,
                       pct_sol=(100 * timing["sol_us"] / lat) if timing.get("sol_us") else None)
    exp["duration_s"] = time.monotonic() - t0
    update = {"experiments": target["experiments"] + 1, "state": "active"}
    if exp.get("state") != "failed":
        lat = exp["latency_us"]
        best_lat = target["best_latency_us"]
        margin = max(MIN_MARGIN, exp["noise"] or 0, target["best_noise"] or 0)
        if best_lat is None or lat < best_lat * (1 - margin):
            exp["state"] = "kept"
            update.update(best_is_this=True, best_latency_us=lat, best_noise=exp["noise"],
                          speedup=exp["speedup"], no_improve=0)
        else:
            exp["state"] = "reverted"
            exp["error"] = (f"{lat:.1f} us is not faster than the best {best_lat:.1f} us by more "
                            f"than the noise ({margin:.1%})")
            update["no_improve"] = target["no_improve"] + 1
    else:
        update["no_improve"] = target["no_improve"] + 1
    exp_id = store.record_experiment(exp, stages, update)
    return store.experiment(exp_id)


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
        f"({n['kept']} kept, {n['reverted']} reverted, {n['failed']} failed)")
    for t in targets:
        line = f"  {t['family']:<13} {t['experiments']:3d} exp"
        if t["best_latency_us"]:
            line += f"  best {t['best_latency_us']:.1f} us"
            if t["speedup"]:
                line += f"  {t['speedup']:.3g}x eager"
            if t["sol_latency_us"]:
                line += f"  {100 * t['sol_latency_us'] / t['best_latency_us']:.0f}% of speed of light"
        else:
            line += "  no verified kernel"
        log(line)
    proj = plan.projected(targets)
    tag = " (interpreter timings: not GPU performance)" if run["timing_mode"] == "interpreter" else ""
    log(f"  Amdahl-projected end-to-end speedup: {proj:.3f}x{tag}")


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
            Store(cfg.db).close()   # fail here, with a clear message, if the db can't be opened
            self.control = Control()
            ready = threading.Event()

            def target():
                try:
                    execute(cfg, self.control, resume_run_id, log=self._log, api_key=api_key)
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
