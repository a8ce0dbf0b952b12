"""``python -m engine kernelbench DIR --level N``: optimize KernelBench problems, score fast_p.

A KernelBench problem is one file: class ``Model(nn.Module)``, ``get_inputs()`` and
``get_init_inputs()`` (https://github.com/ScalingIntelligence/KernelBench). Problems are the
``*.py`` files in DIR/level<N>/ (or in DIR itself when it has no such folder). Each one gets a
full run (capture, match, profile, loop, verified kernels; model spec = the file), then its kept
kernels that beat their baselines are placed in the model's graph and it is scored as KernelBench
scores a submission:

- correct: on ``--trials`` fresh inputs (made one at a time) the optimized model's outputs match
  the original's within KernelBench's current torch.allclose tolerance, atol = rtol = 1e-4 for
  fp32 and 1e-2 for fp16/bf16 (kernels that fail the engine's end-to-end check are left out
  first, as at the end of any run);
- fast_p: the fraction of problems that are correct AND faster than the baseline by more than
  p times (speedup > p), for p = 1.0, 1.5, 2.0, against eager PyTorch and against torch.compile
  of the original (the best of its modes), with the geometric mean of the speedups.

"optimized" is the faster of the rewritten model run eagerly and run through torch.compile (the
kernels opaque to it). A problem where no kernel is placed is correct with the original's time
(speedup against eager exactly 1.0; it never counts as faster), and its row says why nothing was
placed: no family matched, the match had no contract (its reason), or the kernel was slower than
its baseline. Under Triton's CPU interpreter the timings are interpreter timings (labelled; kernels
run in Python, far slower than eager) and torch.compile is skipped, so fast_p against it is n/a:
the command shows the pipeline, a GPU measures it.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

import kernels
from engine import hw, integrate

PS = (1.0, 1.5, 2.0)
KB_TOL = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 1e-2}


class KernelBenchError(ValueError):
    pass


@dataclass
class ProblemResult:
    problem: str
    run_id: str | None = None
    status: str = "ok"                   # ok | invalid | error
    correct: bool = False
    kernels: list = field(default_factory=list)     # kernel names placed
    targets: list = field(default_factory=list)     # "family {spec}" or "region {ops}" of its targets
    eager_us: float | None = None
    optimized_us: float | None = None    # the faster of the rewritten model eager and compiled
    compile_us: float | None = None      # torch.compile of the original, best mode
    compile_mode: str = ""
    shipped: str = ""
    seconds: float = 0.0                 # wall time of the whole problem (run, check, timings)
    timing_mode: str = ""
    why_not: str = ""                    # one line when nothing was placed
    detail: str = ""
    # the best kernel's % of its speed of light (engine/hw.py), of the target holding most of
    # the time: how far the search got, placed or not; None without a GPU's ceilings
    pct_sol: float | None = None
    sol_target: str = ""

    def speedup(self, baseline: str, handed_back: bool = False) -> float | None:
        """The optimized model's speedup over "eager", "compile" or "best" (the faster of the
        two; unknown when compile was not measured). ``handed_back``: the speedup of what the
        run ships instead, the fastest of eager, compile and the optimized model (never below
        1x against "best": where no kernel helps, the user gets the faster baseline)."""
        if baseline == "best":
            base = min(self.eager_us, self.compile_us) if self.eager_us and self.compile_us else None
        else:
            base = self.eager_us if baseline == "eager" else self.compile_us
        ours = self.optimized_us
        if handed_back and ours:
            ours = min(t for t in (self.eager_us, self.compile_us, ours) if t)
        if not self.correct or not base or not ours:
            return None
        return base / ours


def _number(name: str) -> int | None:
    """A KernelBench problem's number ("23_Softmax.py": 23), None when it has none."""
    head = name.split("_")[0]
    return int(head) if head.isdigit() else None


def _order(name: str) -> tuple:
    """Problem order: by number (2 before 10), unnumbered last."""
    n = _number(name)
    return (n if n is not None else 1 << 30, name)


def problem_files(folder: str, level: int, match: str = "*.py", every: int | None = None) -> list[Path]:
    root = Path(folder)
    if not root.is_dir():
        raise KernelBenchError(f"no such folder: {folder}")
    sub = root / f"level{level}"
    where = sub if sub.is_dir() else root
    # several globs, comma-separated ("1_*.py,23_*.py"); numbered like KernelBench
    # ("23_Softmax.py"): in problem order, 2 before 10
    picked = {p for g in match.split(",") if g.strip() for p in where.glob(g.strip())}
    files = sorted((p for p in picked if p.suffix == ".py" and not p.name.startswith("_")),
                   key=lambda p: _order(p.name))
    if every:       # a fixed sample: the problems whose number is a multiple of ``every``
        files = [p for p in files if _number(p.name) is not None and _number(p.name) % every == 0]
    if not files:
        raise KernelBenchError(f"no problem files ({match}{f', every {every}' if every else ''}) in {where}")
    return files


def kb_correct(model, make_inputs, trials: int, optimized, dtype: str) -> tuple[bool, str]:
    """KernelBench's criterion on ``optimized``: allclose(atol=rtol=tol) on every output of
    ``trials`` fresh input sets, made and compared one at a time (memory: one set of inputs and
    two of outputs at once)."""
    tol = KB_TOL.get(dtype, 1e-4)
    for i in range(trials):
        inp = make_inputs(i)
        ref = integrate._run(model, inp)
        try:
            out = integrate._run(optimized, inp)
        except Exception as e:
            return False, f"trial {i}: raised {type(e).__name__}: {e}"[:300]
        if len(out) != len(ref):
            return False, f"trial {i}: {len(out)} outputs, expected {len(ref)}"
        for o, r in zip(out, ref):
            if o.shape != r.shape:
                return False, f"trial {i}: shape {tuple(o.shape)}, expected {tuple(r.shape)}"
            if not torch.allclose(o, r, atol=tol, rtol=tol, equal_nan=True):
                return False, f"trial {i}: max |diff| {(o.double() - r.double()).abs().max().item():.3g}"
        del inp, ref, out
        integrate._free()
    return True, f"{trials} trial(s) within atol=rtol={tol:g}"


def _why_nothing(store, run_id, left_out, check, budget_note: str = "") -> str:
    """One line: why no kernel was placed in this problem's model (``budget_note``: how the
    problem's budget was split, said when no experiment ran)."""
    if left_out:
        return "; ".join(f"{n} {w.split(':')[0]}" for n, w in left_out)[:300]
    events = [e["message"] for e in store.events(run_id)] if hasattr(store, "events") else []
    nofit = [m for m in events if "no target:" in m]
    if nofit:
        return nofit[0][:300]
    targets = store.targets(run_id)
    if not targets:
        return "no family of the nine matched the model's graph"
    if not any(t["best_experiment_id"] for t in targets):
        # zero experiments and "every candidate failed" call for different fixes (a longer
        # budget vs a kernel bug): say which
        exps = store.experiments(run_id)
        if not exps:
            return ("no experiment ran: " + (budget_note or "the budget ended first"))[:300]
        failed = [e for e in exps if e.get("state") == "failed"]
        if not failed:
            return "no candidate passed the verifier within the budget"
        # what failed them: a kernel bug reads differently from memory the run did not have
        stages = sorted({(e.get("failed_stage") or "a worker").replace("_", " ") for e in failed})
        first = (failed[0].get("error") or "").split("\n")[0]
        return (f"no candidate passed the verifier: {len(failed)} failed "
                f"({', '.join(stages)}), the first: {first}")[:300]
    if check is not None and check.status not in ("passed", "partial"):
        return f"the end-to-end check failed: {check.detail[:200]}"
    return "the kept kernels served no site of the model's graph"


def _pct_sol(targets: list) -> tuple:
    """(% of speed of light, family) of the best kernel of the target with the largest share of
    the time that has both figures, or (None, "")."""
    timed = [t for t in targets if t.get("sol_latency_us") and t.get("best_latency_us")]
    if not timed:
        return None, ""
    t = max(timed, key=lambda t: t.get("fraction") or 0.0)
    return round(100.0 * t["sol_latency_us"] / t["best_latency_us"], 1), t["family"]


# The scoring after a problem's run compiles the original model in every mode (the baseline is
# the best of them, never weakened by a budget): it is estimated before the run starts
# (integrate.compile_estimate_s on the problem's graph, captured on the meta device at its
# shipped shapes) and taken out of --budget-minutes up front. Without an estimate (a problem
# that does not capture on the meta device, or no compile: the interpreter) the run gets
# RUN_SHARE of the budget. Below LITTLE_SHARE of the budget for the run, an event says so.
RUN_SHARE, LITTLE_SHARE = 0.6, 0.25
# A problem's setup outside its budget: the model built and captured, the worker started.
SETUP_S = 15.0


def _meta_figures(path: Path) -> dict | None:
    """The problem's graph figures (integrate.graph_figures) from its forward captured on the
    meta device at its shipped shapes: no memory, no compute (tenths of a second for a level 3
    problem). None when it does not build, run or export there."""
    from engine import capture, sources
    try:
        module = sources.import_file(str(path))
        with torch.device("meta"):
            init = module.get_init_inputs() if hasattr(module, "get_init_inputs") else ()
            model = module.Model(**init) if isinstance(init, dict) else module.Model(*init)
            inputs = tuple(module.get_inputs())
        cap = capture.capture(model.eval(), inputs, allow_dynamo=False)
    except Exception:
        return None
    return integrate.graph_figures(cap.graphs, cap.seconds) if cap.ok else None


def scoring_estimate(path: Path) -> tuple[float | None, dict | None]:
    """(seconds, graph figures) the scoring of a problem is expected to take: its fixed part
    (integrate.STAGE_FIXED_S: the model built, checked, the trials, eager timed), the original
    compiled in every mode (integrate.modes_estimate_s) and the optimized model in the first
    one (it runs whatever the time left); (None, figures) when there is
    no estimate (no figures, or torch.compile not wanted: the interpreter)."""
    gpu = torch.cuda.is_available()
    if not integrate.compile_wanted("gpu" if gpu else "interpreter")[0]:
        return None, None
    figures = _meta_figures(path)
    if figures is None:
        return None, None
    modes = integrate.compile_modes(torch.device("cuda" if gpu else "cpu"))
    # the optimized model's first mode runs whatever the time left (time_variants with
    # baseline_always): one default compile more, the GEMMs tuned by then
    return (integrate.STAGE_FIXED_S + integrate.modes_estimate_s(
        list(modes) + list(modes[:1]), figures["gemm_shapes"], aten_ops=figures["aten_ops"],
        fp32_shapes=figures.get("gemm_shapes_fp32", 0),
        small_convs=figures.get("small_convs", 0)), figures)


def _run_budget_s(budget_s: float, spent_s: float, estimate_s: float | None) -> float:
    """Seconds of a problem's budget its run (capture, references, loop) gets: what the
    scoring's estimate leaves after ``spent_s`` (the estimate's own capture), else RUN_SHARE."""
    if estimate_s is None:
        return RUN_SHARE * budget_s
    return max(budget_s - spent_s - estimate_s, 0.0)


def problem_budget_minutes(budget_minutes: float | None, estimate_s: float | None,
                           min_run_minutes: float | None) -> float | None:
    """A problem's --budget-minutes, raised where the scoring's estimate would leave its run less
    than ``min_run_minutes`` (a level-3 network whose baseline alone, torch.compile max-autotune
    tuning every convolution and GEMM shape, takes minutes: without a floor its loop gets 0 s)."""
    if not budget_minutes or not min_run_minutes or estimate_s is None:
        return budget_minutes
    return max(budget_minutes, (estimate_s + SETUP_S) / 60 + min_run_minutes)


def need_s(budget_minutes: float | None, estimate_s: float | None) -> float:
    """Seconds a problem is expected to take, for --stop-after-minutes: its setup and its
    budget, or its setup and the scoring's estimate where that is longer (every compile mode
    runs whatever the budget)."""
    return SETUP_S + max((budget_minutes or 0.0) * 60, estimate_s or 0.0) if (
        budget_minutes or estimate_s) else 0.0


def score_problem(path: Path, cfg_kw: dict, trials: int, log,
                  estimate: tuple | None = None) -> ProblemResult:
    """One problem's run and scoring. ``estimate``: scoring_estimate(path) when the caller has
    it already."""
    from engine.loop import ConfigError, RunConfig, execute
    from engine.store import Store
    t0 = time.monotonic()
    res = ProblemResult(problem=path.name)
    cfg_kw = dict(cfg_kw)
    budget = cfg_kw.pop("budget_minutes", None)
    # --budget-minutes bounds the whole problem: the run gets what the scoring's estimate leaves
    # (see RUN_SHARE), the scoring the rest (every mode of the baseline; the optimized model's
    # modes as many as fit)
    est_s = figures = run_s = None
    if budget:
        est_s, figures = estimate if estimate is not None else scoring_estimate(path)
        run_s = _run_budget_s(budget * 60, time.monotonic() - t0, est_s)
        if est_s is not None:
            log(f"  [{path.name}] scoring estimated at {est_s:.0f} s ({figures['gemm_shapes']} "
                f"GEMM/convolution shape(s) to autotune): the run gets {run_s:.0f} s of "
                f"{budget * 60:.0f} s")
    cfg = RunConfig(model=str(path), e2e_check=False,
                    budget_minutes=(run_s / 60 or 1e-6) if budget else None, **cfg_kw)
    try:
        cfg.validate()
    except ConfigError as e:
        res.status, res.detail = "invalid", str(e)
        return res
    t_run = time.monotonic()
    try:
        res.run_id = execute(cfg, log=lambda s: log(f"  [{path.name}] {s}"))
        run_took = time.monotonic() - t_run
        integrate._free()                  # the run's graphs and inputs, before the scoring
    except ConfigError as e:                       # the model failed to build or run
        res.status, res.detail = "invalid", str(e)
        return res
    except Exception as e:
        res.status, res.detail = "error", f"{type(e).__name__}: {e}"[:500]
        return res
    store = Store(cfg.db)
    try:
        if est_s is not None:
            little = run_s < LITTLE_SHARE * budget * 60
            store.event(res.run_id, f"kernelbench: the run had {run_s:.0f} s of the problem's "
                                    f"{budget * 60:.0f} s budget; the scoring after it, torch.compile of "
                                    f"the original in every mode ({figures['gemm_shapes']} GEMM/convolution "
                                    f"shape(s) to autotune), is estimated at {est_s:.0f} s"
                                    + ("; that left the loop little: a longer --budget-minutes gives "
                                       "it more" if little else ""), "warn" if little else "info")
        run = store.get_run(res.run_id)
        res.timing_mode = run["timing_mode"]
        interp = run["timing_mode"] == "interpreter"
        # a region reads as its ops ("region gemm+mul+leaky_relu"), a family by its contract
        targets = store.targets(res.run_id)
        res.targets = [t["family"] + (f" {t['label']}" if t.get("label") and t["family"] == "region"
                                      else f" {t['spec']}" if t["spec"] else "")
                       for t in targets]
        res.pct_sol, res.sol_target = _pct_sol(targets)
        loaded = integrate.run_source(run)
        records, left_out = integrate.placeable(store, res.run_id, skip_flagged=False)
        ks = integrate.load(records)
        dtype = str(loaded.dtype).removeprefix("torch.")
        # the graph again only where a kernel is to be placed (a capture is seconds at 6 GB)
        road = (integrate.graph_road(loaded.model, loaded.inputs, run["config"].get("families"))
                if ks else None)
        seed = cfg.seed
        check = usable = None
        if ks:
            check = integrate.check(loaded.model, [loaded.new_inputs(seed + 2000)], ks, dtype, road=road)
            usable = [k for k in check.usable
                      if any(u["kernel"] == k.name and u["calls"] for u in check.kernels_used)]
        usable = usable or []
        res.kernels = [k.name for k in usable]
        if usable:
            applied = road.apply(usable)
            res.correct, why = kb_correct(loaded.model, lambda i: loaded.new_inputs(seed + 2000 + i),
                                          trials, applied.module, dtype)
        else:
            res.correct, why = True, "nothing placed: the optimized model is the original"
            # a run that got time but no experiment spent it before its loop (49's 40 s went
            # to capture, starting the workers and timing the baselines)
            note = (f"the scoring was estimated at {est_s:.0f} s of the {budget * 60:.0f} s budget, "
                    f"the run got {run_s:.0f} s"
                    + (f" and took {run_took:.0f} s to capture, start its workers and time the "
                       f"baselines" if run_s > 0 and run_took >= run_s else "")) if est_s is not None else ""
            res.why_not = _why_nothing(store, res.run_id, left_out, check, note)
        integrate._free()
        mem = integrate.gpu_memory_line()
        log(f"  [{path.name}] scored: correct={res.correct} ({time.monotonic() - t0:.0f} s in)"
            + (f"; {mem}" if mem else ""))
        inputs = loaded.new_inputs(seed + 2000)
        ref = integrate._run(loaded.model, inputs)
        deadline = (t0 + budget * 60) if budget else None
        timings = integrate.time_variants(loaded.model, inputs, usable, run["timing_mode"],
                                          reps=3 if interp else 50, reference_out=ref, road=road,
                                          deadline=deadline, baseline_always=True)
        del ref, inputs
        for t in timings:
            log(f"  [{path.name}] {t['variant']}: {_us(t['latency_us'])} us {t.get('note') or ''}")
        log(f"  [{path.name}] timed ({time.monotonic() - t0:.0f} s in)")
        by = {t["variant"]: t for t in timings}
        res.eager_us = by["eager"]["latency_us"]
        opts = [by[v]["latency_us"] for v in ("optimized", "compile_optimized") if by[v]["latency_us"]]
        res.optimized_us = min(opts) if opts else None
        res.compile_us = by["compile"]["latency_us"]
        note = by["compile"].get("note") or ""
        res.compile_mode = note.split("best mode ")[1].split(";")[0] if "best mode " in note else ""
        res.shipped = integrate.shipped(timings) or ""
        res.detail = why + ("" if check is None else f"; end-to-end check: {check.line()}")
        status = "passed" if res.correct else "failed"
        store.add_e2e_check(res.run_id, "kernelbench", status,
                            check.max_error if check else 0.0, KB_TOL.get(dtype, 1e-4), res.detail,
                            check.kernels_used if check else [], check.family_flags if check else {},
                            timings, device=hw.detect())
    except Exception as e:
        res.status, res.detail = "error", f"scoring failed: {type(e).__name__}: {e}"[:500]
    finally:
        store.close()
        integrate._free()
        res.seconds = time.monotonic() - t0
    return res


def fast_p(results: list[ProblemResult], baseline: str, p: float,
           handed_back: bool = False) -> float | None:
    """Fraction of all problems that are correct and faster than ``baseline`` by more than p;
    None when the baseline was not measured for any problem (torch.compile skipped)."""
    if not results:
        return None
    if baseline in ("compile", "best") and not any(r.compile_us for r in results):
        return None
    wins = sum(1 for r in results
               if (s := r.speedup(baseline, handed_back)) is not None and s > p)
    return wins / len(results)


def geomean(results: list[ProblemResult], baseline: str, handed_back: bool = False) -> float | None:
    """Geometric mean speedup over the problems that are correct and timed (a problem that is not
    correct counts nowhere here; fast_p counts it as not faster)."""
    vals = [s for r in results if (s := r.speedup(baseline, handed_back))]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else None


def markdown(results: list[ProblemResult], level: int, interp: bool) -> str:
    out = [f"## KernelBench level {level}: {len(results)} problem(s)", ""]
    if interp:
        out += ["**Interpreter timings** (Triton's CPU interpreter): kernels run in Python, far "
                "slower than eager; torch.compile skipped. These figures show the pipeline, not "
                "GPU performance.", ""]
    out += ["| problem | targets | correct | kernels placed | eager (us) | torch.compile (us, mode) | "
            "optimized (us) | vs eager | vs compile | vs the faster | ships | kernel % of SOL | "
            "time (s) |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        se, sc, sb = r.speedup("eager"), r.speedup("compile"), r.speedup("best")
        placed = ", ".join(r.kernels) or ("none: " + r.why_not if r.why_not else "none")
        comp = _us(r.compile_us) + (f" ({r.compile_mode})" if r.compile_mode else "")
        out.append(f"| {r.problem} | {', '.join(r.targets) or '-'} | "
                   f"{'yes' if r.correct else 'no' if r.status == 'ok' else r.status} | "
                   f"{placed} | {_us(r.eager_us)} | {comp} | {_us(r.optimized_us)} | {_x(se)} | "
                   f"{_x(sc)} | {_x(sb)} | {r.shipped or '-'} | "
                   f"{f'{r.pct_sol:g}% ({r.sol_target})' if r.pct_sol is not None else '-'} | "
                   f"{r.seconds:.0f} |")
    out += ["", "| | " + " | ".join(f"fast_{p:g}" for p in PS) + " | geomean |",
            "|---|" + "---|" * (len(PS) + 1)]
    # the last row: what the run hands back (its "ships" column), which a user gets
    for base, label, back in (("eager", "vs eager", False),
                              ("compile", "vs torch.compile (best mode)", False),
                              ("best", "vs the faster of the two", False),
                              ("best", "shipped model vs the faster of the two", True)):
        vals = [fast_p(results, base, p, back) for p in PS]
        g = geomean(results, base, back)
        out.append(f"| {label} | " + " | ".join("n/a" if v is None else f"{v:.2f}" for v in vals)
                   + f" | {'n/a' if g is None else f'{g:.3g}x'} |")
    notes = [r for r in results if r.status != "ok" or not r.correct]
    if notes:
        out += [""] + [f"- {r.problem}: {r.status}, {r.detail}" for r in notes]
    return "\n".join(out) + "\n"


def _us(v) -> str:
    return "-" if v is None else f"{v:,.1f}"


def _x(v) -> str:
    return "-" if v is None or math.isnan(v) else f"{v:.3g}x"


def cmd_kernelbench(a, log=print) -> int:
    from engine.store import Store, StoreError
    every = getattr(a, "every", None)
    if every is not None and every < 1:
        raise KernelBenchError(f"--every takes a positive number, not {every}")
    files = problem_files(a.dir, a.level, getattr(a, "match", "*.py"), every)
    table = Path(a.out).with_suffix(".jsonl") if a.out else None
    if getattr(a, "resume", False):
        if table is None:
            raise KernelBenchError("--resume needs --out (its .jsonl holds the problems done)")
        done = set(_read_table(table))
        files = [p for p in files if p.name not in done]
        log(f"resuming: {len(done)} problem(s) in {table.name} already, {len(files)} to run")
    try:
        Store(a.db).close()
    except StoreError as e:
        raise KernelBenchError(str(e)) from None
    families = kernels.parse_families(a.families)
    cfg_kw = dict(budget_experiments=a.budget_experiments, families=families, db=a.db,
                  seed=a.seed, patience=a.patience, worker_timeout_s=a.worker_timeout,
                  dtype=a.dtype, budget_minutes=getattr(a, "budget_minutes", None))
    results = []
    stop = getattr(a, "stop_after_minutes", None)
    min_run = getattr(a, "min_run_minutes", None)
    t_start = time.monotonic()
    budget = getattr(a, "budget_minutes", None)
    over_s, skipped = 0.0, []
    for path in files:
        # a problem takes its budget plus its setup (capture, the worker's start: ~15 s), its
        # scoring's estimate where that is longer (need_s), plus the most any problem so far ran
        # past its own need (a starter verified at a 7.5 GB shape ran 85 s over). One that does
        # not fit is left for --resume and the smaller ones after it still run (a level-3 sample
        # mixes LeNet-5 with DenseNet-201).
        est = scoring_estimate(path) if budget or stop is not None else (None, None)
        p_budget = problem_budget_minutes(budget, est[0], min_run)
        need = need_s(p_budget, est[0])
        if stop is not None and time.monotonic() - t_start + need + over_s > stop * 60:
            skipped.append(path.name)
            log(f"skipping {path.name}: it needs ~{need + over_s:.0f} s, more than "
                f"--stop-after-minutes {stop:g} leaves (--resume goes on with it)")
            continue
        log(f"problem {path.name} ..." + (f" (budget raised to {p_budget:.1f} min: the scoring's "
                                          f"estimate is {est[0]:.0f} s)" if p_budget != budget else ""))
        r = score_problem(path, dict(cfg_kw, budget_minutes=p_budget), a.trials, log, estimate=est)
        over_s = max(over_s, r.seconds - need) if need else over_s
        log(f"problem {path.name}: {r.status}, correct={r.correct}, kernels={r.kernels or 'none'}"
            + (f", {r.speedup('eager'):.3g}x eager" if r.speedup("eager") else "")
            + (f", {r.speedup('compile'):.3g}x compile" if r.speedup("compile") else "")
            + (f" ({r.why_not})" if r.why_not else "") + f", {r.seconds:.0f} s")
        results.append(r)
        if table is not None:
            # several invocations (one device command each, on several days) build one table:
            # every result is kept in <out>.jsonl as soon as it is in (a command stopped at its
            # limit keeps the problems it finished), a problem run again replaces its row, and
            # <out> is rewritten from all of them
            _write(a.out, _accumulate(table, [r]), a.level)
    if skipped:
        log(f"stopping: {len(skipped)} problem(s) left would not end within --stop-after-minutes "
            f"{stop:g} (--resume goes on with them): {', '.join(skipped)}")
    if table is not None:
        results = sorted(_read_table(table).values(), key=lambda r: _order(r.problem))
    text = _write(a.out, results, a.level)
    print(text, end="")
    return 0


def _write(out: str | None, results: list, level: int) -> str:
    # rows say how they were timed (a table measured on a GPU is rewritten anywhere as it was)
    modes = {r.timing_mode for r in results if r.timing_mode}
    interp = "interpreter" in modes if modes else not torch.cuda.is_available()
    text = markdown(results, level, interp)
    if out:
        Path(out).write_text(text)
    return text


def _read_table(path: Path) -> dict:
    """{problem: ProblemResult} of a table's .jsonl ({} when there is none yet)."""
    import json
    rows = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                d = json.loads(line)
                rows[d["problem"]] = ProblemResult(**d)
    return rows


def _accumulate(path: Path, new: list[ProblemResult]) -> list[ProblemResult]:
    """The table's rows with ``new`` replacing theirs, written back whole; in problem order."""
    import json
    from dataclasses import asdict
    rows = _read_table(path)
    for r in new:
        rows[r.problem] = r
    tmp = path.with_name(path.name + ".tmp")        # never a half-written table
    tmp.write_text("".join(json.dumps(asdict(r)) + "\n" for r in rows.values()))
    tmp.replace(path)
    return sorted(rows.values(), key=lambda r: _order(r.problem))
