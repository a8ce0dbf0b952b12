"""``python -m engine kernelbench DIR --level N``: optimize KernelBench problems, score fast_p.

A KernelBench problem is one file: class ``Model(nn.Module)``, ``get_inputs()`` and
``get_init_inputs()`` (https://github.com/ScalingIntelligence/KernelBench). Problems are the
``*.py`` files in DIR/level<N>/ (or in DIR itself when it has no such folder). Each one gets a
full run (profile, loop, verified kernels; model spec = the file), then its kept kernels go into
the model and it is scored as KernelBench scores a submission:

- correct: on ``--trials`` fresh inputs the optimized model's outputs match the original's within
  KernelBench's torch.allclose(atol=1e-2, rtol=1e-2) (kernels that fail the engine's end-to-end
  check are left out first, as at the end of any run);
- fast_p: the fraction of problems that are correct AND faster than the baseline by more than
  p times (speedup > p), for p = 1.0, 1.5, 2.0, against eager PyTorch and against
  torch.compile(max-autotune) of the original.

A problem where no kernel applies is correct with speedup exactly 1.0 (the optimized model is the
original): it never counts as faster. Under Triton's CPU interpreter the timings are
interpreter timings (labelled; kernels run in Python, far slower than eager) and torch.compile is
skipped, so fast_p against it is n/a: the command shows the pipeline, a GPU measures it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from engine import integrate
from engine import kernel_runtime as rt

PS = (1.0, 1.5, 2.0)
KB_ATOL = KB_RTOL = 1e-2


class KernelBenchError(ValueError):
    pass


@dataclass
class ProblemResult:
    problem: str
    run_id: str | None = None
    status: str = "ok"                   # ok | invalid | error
    correct: bool = False
    kernels: list = field(default_factory=list)     # kernel names that served calls
    eager_us: float | None = None
    optimized_us: float | None = None
    compile_us: float | None = None
    timing_mode: str = ""
    detail: str = ""

    def speedup(self, baseline: str) -> float | None:
        base = self.eager_us if baseline == "eager" else self.compile_us
        if not self.correct or not base or not self.optimized_us:
            return None
        return base / self.optimized_us


def problem_files(folder: str, level: int, match: str = "*.py") -> list[Path]:
    root = Path(folder)
    if not root.is_dir():
        raise KernelBenchError(f"no such folder: {folder}")
    sub = root / f"level{level}"
    where = sub if sub.is_dir() else root
    # numbered like KernelBench ("23_Softmax.py"): in problem order, 2 before 10
    files = sorted((p for p in where.glob(match) if p.suffix == ".py" and not p.name.startswith("_")),
                   key=lambda p: (int(p.name.split("_")[0]) if p.name.split("_")[0].isdigit() else 1 << 30,
                                  p.name))
    if not files:
        raise KernelBenchError(f"no problem files ({match}) in {where}")
    return files


def kb_correct(model, input_sets, kernels) -> tuple[bool, str]:
    """KernelBench's criterion on the optimized model: allclose(atol=rtol=1e-2) on every output."""
    refs = [integrate._run(model, inp) for inp in input_sets]
    applied = rt.apply(model, kernels)
    try:
        for i, (inp, ref) in enumerate(zip(input_sets, refs)):
            try:
                out = integrate._run(model, inp)
            except Exception as e:
                return False, f"trial {i}: raised {type(e).__name__}: {e}"[:300]
            if len(out) != len(ref):
                return False, f"trial {i}: {len(out)} outputs, expected {len(ref)}"
            for o, r in zip(out, ref):
                if o.shape != r.shape:
                    return False, f"trial {i}: shape {tuple(o.shape)}, expected {tuple(r.shape)}"
                if not torch.allclose(o.double(), r.double(), atol=KB_ATOL, rtol=KB_RTOL, equal_nan=True):
                    return False, f"trial {i}: max |diff| {(o.double() - r.double()).abs().max().item():.3g}"
        return True, f"{len(input_sets)} trial(s) within atol=rtol=1e-2"
    finally:
        applied.remove()


def score_problem(path: Path, cfg_kw: dict, trials: int, log) -> ProblemResult:
    from engine.loop import ConfigError, RunConfig, execute
    from engine.store import Store
    res = ProblemResult(problem=path.name)
    cfg = RunConfig(model=str(path), e2e_check=False, **cfg_kw)
    try:
        cfg.validate()
    except ConfigError as e:
        res.status, res.detail = "invalid", str(e)
        return res
    try:
        res.run_id = execute(cfg, log=lambda s: log(f"  [{path.name}] {s}"))
    except ConfigError as e:                       # the model failed to build or run
        res.status, res.detail = "invalid", str(e)
        return res
    except Exception as e:
        res.status, res.detail = "error", f"{type(e).__name__}: {e}"[:500]
        return res
    store = Store(cfg.db)
    try:
        run = store.get_run(res.run_id)
        res.timing_mode = run["timing_mode"]
        interp = run["timing_mode"] == "interpreter"
        loaded = integrate.run_source(run)
        records = integrate.kept_kernels(store, res.run_id, skip_flagged=False)
        ks = integrate.load(records)
        seed = cfg.seed
        inputs = [loaded.new_inputs(seed + 2000 + i) for i in range(trials)]
        dtype = str(loaded.dtype).removeprefix("torch.")
        check = integrate.check(loaded.model, inputs[:1], ks, dtype) if ks else None
        usable = [k for k in (check.usable if check else [])
                  if any(u["kernel"] == k.name and u["calls"] for u in check.kernels_used)]
        res.kernels = [k.name for k in usable]
        res.correct, why = kb_correct(loaded.model, inputs, usable)
        ref = integrate._run(loaded.model, inputs[0])
        timings = integrate.time_variants(loaded.model, inputs[0], usable, run["timing_mode"],
                                          reps=3 if interp else 50, reference_out=ref)
        by = {t["variant"]: t for t in timings}
        res.eager_us = by["eager"]["latency_us"]
        res.optimized_us = by["optimized"]["latency_us"]
        res.compile_us = by["compile"]["latency_us"]
        res.detail = why + ("" if check is None else f"; end-to-end check: {check.line()}")
        status = "passed" if res.correct else "failed"
        used = check.kernels_used if check else []
        flags = check.family_flags if check else {}
        store.add_e2e_check(res.run_id, "kernelbench", status,
                            check.max_error if check else 0.0, KB_RTOL, res.detail, used, flags,
                            timings)
    except Exception as e:
        res.status, res.detail = "error", f"scoring failed: {type(e).__name__}: {e}"[:500]
    finally:
        store.close()
    return res


def fast_p(results: list[ProblemResult], baseline: str, p: float) -> float | None:
    """Fraction of all problems that are correct and faster than ``baseline`` by more than p;
    None when the baseline was not measured for any problem (torch.compile skipped)."""
    if not results:
        return None
    if baseline == "compile" and not any(r.compile_us for r in results):
        return None
    wins = sum(1 for r in results if (s := r.speedup(baseline)) is not None and s > p)
    return wins / len(results)


def markdown(results: list[ProblemResult], level: int, interp: bool) -> str:
    out = [f"## KernelBench level {level}: {len(results)} problem(s)", ""]
    if interp:
        out += ["**Interpreter timings** (Triton's CPU interpreter): kernels run in Python, far "
                "slower than eager; torch.compile skipped. These figures show the pipeline, not "
                "GPU performance.", ""]
    out += ["| problem | run | correct | kernels used | eager (us) | optimized (us) | "
            "torch.compile (us) | vs eager | vs compile |", "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        se, sc = r.speedup("eager"), r.speedup("compile")
        out.append(f"| {r.problem} | {r.run_id or '-'} | "
                   f"{'yes' if r.correct else 'no' if r.status == 'ok' else r.status} | "
                   f"{', '.join(r.kernels) or 'none'} | {_us(r.eager_us)} | {_us(r.optimized_us)} | "
                   f"{_us(r.compile_us)} | {_x(se)} | {_x(sc)} |")
    out += ["", "| fast_p | p = " + " | p = ".join(f"{p:g}" for p in PS) + " |",
            "|---|" + "---|" * len(PS)]
    for base, label in (("eager", "vs eager"), ("compile", "vs torch.compile")):
        vals = [fast_p(results, base, p) for p in PS]
        out.append(f"| {label} | " + " | ".join("n/a" if v is None else f"{v:.2f}" for v in vals) + " |")
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
    files = problem_files(a.dir, a.level, getattr(a, "match", "*.py"))
    try:
        Store(a.db).close()
    except StoreError as e:
        raise KernelBenchError(str(e)) from None
    families = [f.strip() for f in a.families.split(",")] if a.families else None
    cfg_kw = dict(budget_experiments=a.budget_experiments, families=families, db=a.db,
                  seed=a.seed, patience=a.patience, worker_timeout_s=a.worker_timeout,
                  dtype=a.dtype)
    results = []
    for path in files:
        log(f"problem {path.name} ...")
        r = score_problem(path, cfg_kw, a.trials, log)
        log(f"problem {path.name}: {r.status}, correct={r.correct}, kernels={r.kernels or 'none'}"
            + (f", {r.speedup('eager'):.3g}x eager" if r.speedup("eager") else ""))
        results.append(r)
    interp = any(r.timing_mode == "interpreter" for r in results) or not torch.cuda.is_available()
    text = markdown(results, a.level, interp)
    if a.out:
        Path(a.out).write_text(text)
    print(text, end="")
    return 0
