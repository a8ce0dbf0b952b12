"""A run's kept kernels in the real model: integrate them, check the model end to end, time it.

An optimized model is the original with the run's best kernel of each family applied through
engine/kernel_runtime.py (functional interception plus probed module swaps; a kernel serves only
the shapes, dtype and device it was verified on). Everything here runs in the caller's process:
kernel sources come from the run's database, where only candidates that passed the verifier are
kept, but they are code, and loading them runs them here, unsandboxed. Integrate kernels only from
databases you trust.

The end-to-end check compares the optimized model with the original on fresh inputs. Its error
is max |optimized - original| / max |original| over every floating output (scale-relative: a
logit near 0 carries the rounding error of the large terms it sums), and NaN/Inf must sit in the
same places. In float16/bfloat16 the original itself rounds at every step (a composite RMSNorm
in bf16, say), and a kernel that accumulates in fp32 is closer to the true function than the
original is; so when the optimized model misses the tolerance against the original, both are
compared with a float32 run of the same model, and the optimized one passes if it is no further
from it than the original (within 10%, or the tolerance). When it fails, each kernel is tried alone; the ones that fail alone are flagged
responsible and left out, and the rest are checked together again.

Timings put four variants side by side in one process: eager, optimized, torch.compile
(max-autotune) of the original and of the optimized model. Under Triton's CPU interpreter they are
interpreter timings (kernels interpreted in Python: far slower than eager, never GPU figures) and
torch.compile is skipped unless NIGHTSHIFT_E2E_COMPILE=1.
"""
from __future__ import annotations

import atexit
import copy
import math
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass, field

import torch

import kernels as families
from engine import kernel_runtime as rt
from engine import sources

# Scale-relative error an optimized model may show against the original. Each kernel is within
# a few ulps of the float64 reference, the original within a few ulps of it the other way, and
# both pass through every layer: fp32 leaves room for ~1000 ulps of drift, fp16/bf16 for a few
# of their much coarser steps.
E2E_TOLERANCE = {"float32": 1e-4, "float16": 5e-3, "bfloat16": 2e-2, "float64": 1e-10}
COMPILE_MODE = os.environ.get("NIGHTSHIFT_COMPILE_MODE", "max-autotune")
VARIANTS = ("eager", "optimized", "compile", "compile_optimized")


@dataclass
class KernelRecord:
    """A kept kernel as the database has it: the best experiment of one target."""
    family: str
    experiment_id: int
    seq: int
    source: str
    source_hash: str
    dtype: str
    shapes: list                 # family shapes it was verified and timed on
    tolerance: tuple
    device_type: str             # cuda (gpu runs) | cpu (interpreter runs)
    latency_us: float | None = None
    ref_latency_us: float | None = None
    speedup: float | None = None
    timing_mode: str = ""

    @property
    def name(self) -> str:
        return f"{self.family}#{self.seq}"


@dataclass
class CheckResult:
    status: str                          # passed | partial | failed | error | skipped
    max_error: float | None
    tolerance: float
    detail: str
    kernels_used: list = field(default_factory=list)
    family_flags: dict = field(default_factory=dict)
    usable: list = field(default_factory=list)    # Kernel objects that may be applied

    def line(self) -> str:
        err = f", max error {self.max_error:.3g} (tolerance {self.tolerance:g})" if self.max_error is not None else ""
        return f"{self.status}{err}; {self.detail}"


def kept_kernels(store, run_id: str, skip_flagged: bool = True) -> list[KernelRecord]:
    """The best kernel of each target of the run (targets.best_experiment_id), without the ones
    the latest end-to-end check flagged responsible for a mismatch or left out because the model
    ran slower with them (unless skip_flagged=False)."""
    run = store.get_run(run_id)
    if run is None:
        raise KeyError(f"no run {run_id!r}")
    flagged = set()
    if skip_flagged:
        checks = [c for c in store.e2e_checks(run_id) if c["kind"] == "check"]
        if checks:
            flagged = {f for f, v in (checks[0]["family_flags"] or {}).items()
                       if v in ("responsible", "slower")}
    out = []
    for t in store.targets(run_id):
        if not t["best_experiment_id"] or t["family"] in flagged:
            continue
        e = store.experiment(t["best_experiment_id"])
        fam = families.get(t["family"])
        tol = fam.tolerance[getattr(torch, t["dtype"])]
        out.append(KernelRecord(
            family=t["family"], experiment_id=e["id"], seq=e["seq"], source=e["source"],
            source_hash=e["source_hash"], dtype=t["dtype"],
            shapes=[list(s["shape"]) for s in t["shapes"]], tolerance=tuple(tol),
            device_type="cuda" if run["timing_mode"] == "gpu" else "cpu",
            latency_us=t["best_latency_us"], ref_latency_us=t["ref_latency_us"],
            speedup=t["speedup"], timing_mode=run["timing_mode"]))
    return out


_WORKDIR: list[str] = []


def _workdir() -> str:
    # Triton reads a kernel's source through inspect when it first compiles it, so the files
    # must outlive the import: one folder per process, removed at exit.
    if not _WORKDIR:
        d = tempfile.mkdtemp(prefix="nightshift-kernels-")
        _WORKDIR.append(d)
        atexit.register(shutil.rmtree, d, True)
    return _WORKDIR[0]


def load(records: list[KernelRecord]) -> list[rt.Kernel]:
    """Import the records' sources (this runs them, in this process) as runtime kernels."""
    out = []
    for r in records:
        path = os.path.join(_workdir(), f"{r.family}_{r.source_hash[:16]}.py")
        if not os.path.exists(path):
            with open(path, "w") as f:
                f.write(r.source)
        out.append(rt.load_kernel_file(path, r.family, r.dtype, r.device_type, r.shapes,
                                       r.tolerance, r.name))
    return out


def optimize(model, db=None, run_id: str = "latest", probe: bool = True) -> rt.Applied:
    """Apply the kept kernels of run ``run_id`` in database ``db`` (default data/runs.db) to
    ``model`` in place; returns the handle (``.stats()``, ``.remove()``). The kernels' code runs
    in this process."""
    from engine.store import Store
    store = Store(db, readonly=True)
    try:
        if run_id == "latest":
            runs = store.list_runs()
            if not runs:
                raise KeyError(f"no runs in {store.path}")
            run_id = runs[0]["id"]
        return rt.apply(model, load(kept_kernels(store, run_id)), probe=probe)
    finally:
        store.close()


# ---- comparing outputs ------------------------------------------------------------------------

def flatten(out) -> list:
    """The tensors of a model's output, in order (tensors, tuples, lists, dicts, HF ModelOutput)."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        return [t for v in out.values() for t in flatten(v)]
    if isinstance(out, (list, tuple)):
        return [t for v in out for t in flatten(v)]
    return []


def compare(out: list, ref: list, same_dtype: bool = True) -> tuple[float, str]:
    """(scale-relative max error, where): inf when structure, shapes or NaN/Inf places differ
    (or dtypes, unless same_dtype=False: against a float32 run of a bf16 model)."""
    if len(out) != len(ref):
        return math.inf, f"{len(out)} output tensors, the original has {len(ref)}"
    worst, where = 0.0, ""
    for i, (o, r) in enumerate(zip(out, ref)):
        if o.shape != r.shape or (o.dtype != r.dtype and (same_dtype or o.is_floating_point()
                                                          != r.is_floating_point())):
            return math.inf, (f"output {i}: {o.dtype} {tuple(o.shape)}, the original "
                              f"{r.dtype} {tuple(r.shape)}")
        if not r.is_floating_point():
            if not torch.equal(o, r):
                return math.inf, f"output {i} (integer) differs"
            continue
        o64, r64 = o.detach().double(), r.detach().double()
        fin = torch.isfinite(r64)
        same_special = torch.equal(fin, torch.isfinite(o64)) and torch.equal(
            torch.nan_to_num(r64[~fin], nan=0.5), torch.nan_to_num(o64[~fin], nan=0.5))
        if not same_special:
            return math.inf, f"output {i}: NaN/Inf in other places than the original's"
        if not fin.any():
            continue
        diff = (o64[fin] - r64[fin]).abs().max().item()
        scale = r64[fin].abs().max().item()
        err = diff / scale if scale > 0 else (0.0 if diff == 0 else math.inf)
        if err > worst:
            worst, where = err, f"output {i} {tuple(r.shape)}: max |diff| {diff:.3g} at scale {scale:.3g}"
    return worst, where


def _run(model, inputs) -> list:
    with torch.no_grad():
        return [t.detach().clone() for t in flatten(model(*inputs))]


# ---- the end-to-end check ----------------------------------------------------------------------

def _float32_refs(model, input_sets: list) -> list | None:
    """Outputs of a float32 copy of a half-precision ``model`` on each input set (float inputs
    up-cast), or None when the copy cannot be made or run (memory, dtype-bound code)."""
    try:
        hi = copy.deepcopy(model).float()
        try:
            up = [[t.float() if isinstance(t, torch.Tensor) and t.is_floating_point() else t
                   for t in inp] for inp in input_sets]
            return [_run(hi, inp) for inp in up]
        finally:
            del hi
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    except Exception:
        return None


def check(model, input_sets: list, kernels: list, dtype: str, probe: bool = True) -> CheckResult:
    """Outputs of ``model`` with ``kernels`` applied against without, on each of ``input_sets``
    (for half precision, also against a float32 run: see the module doc). Finds the kernels
    responsible for a mismatch by applying them one at a time."""
    tol = E2E_TOLERANCE.get(dtype, 1e-4)
    refs = [_run(model, inp) for inp in input_sets]
    hi_refs = _float32_refs(model, input_sets) if dtype in ("float16", "bfloat16") else None
    # how far the original itself is from its float32 run: the accuracy to keep
    orig_hi = (max(compare(r, h, same_dtype=False)[0] for r, h in zip(refs, hi_refs))
               if hi_refs else None)

    def attempt(ks):
        """(error against the original, where, stats, error against float32 or None)."""
        applied = rt.apply(model, ks, probe=probe)
        try:
            worst, where, outs = 0.0, "", []
            for inp, ref in zip(input_sets, refs):
                outs.append(_run(model, inp))
                err, w = compare(outs[-1], ref)
                if err > worst or not where:
                    worst, where = err, w
            hi = (max(compare(o, h, same_dtype=False)[0] for o, h in zip(outs, hi_refs))
                  if hi_refs and worst > tol and math.isfinite(worst) else None)
            return worst, where, applied.stats(), hi
        except Exception as e:                       # a kernel that raises fails the check
            return (math.inf, f"raised {type(e).__name__}: {' '.join(str(e).split())[:300]}",
                    applied.stats(), None)
        finally:
            applied.remove()

    def ok(err, hi) -> bool:
        return err <= tol or (hi is not None and hi <= max(tol, 1.1 * orig_hi))

    def against_fp32(err, hi) -> str:
        return (f"error {err:.3g} against the original, but against a float32 run of the model "
                f"{hi:.3g}, the original's own {orig_hi:.3g}: no less accurate")

    err, where, stats, hi = attempt(kernels)
    used = [dict(family=k.family, kernel=k.name, calls=stats.get(k.family, {}).get("calls", 0),
                 fallthrough=stats.get(k.family, {}).get("fallthrough", 0),
                 swapped=stats.get(k.family, {}).get("swapped", [])) for k in kernels]
    flags = {u["family"]: ("ok" if u["calls"] else "unused") for u in used}
    served = ", ".join(f"{u['kernel']} {u['calls']} call(s)" for u in used if u["calls"]) or "no call"
    unused = [u["kernel"] for u in used if not u["calls"]]
    note = f"kernels served {served}" + (f"; unused (shape/dtype not verified or op not "
                                        f"intercepted): {', '.join(unused)}" if unused else "")
    if ok(err, hi):
        if err > tol:
            note += "; " + against_fp32(err, hi)
        return CheckResult("passed", err, tol, note, used, flags, list(kernels))
    responsible = []
    for k in kernels:
        if flags[k.family] == "unused":
            continue
        e_k, w_k, _, hi_k = attempt([k])
        if not ok(e_k, hi_k):
            responsible.append((k, e_k, w_k + (f", against float32 {hi_k:.3g} (the original "
                                                f"{orig_hi:.3g})" if hi_k is not None else "")))
    bad = {k.family for k, _, _ in responsible}
    rest = [k for k in kernels if k.family not in bad]
    blame = "; ".join(f"{k.name} alone: error {e:.3g} ({w})" for k, e, w in responsible)
    if rest and bad:
        err2, where2, _, hi2 = attempt(rest)
        if ok(err2, hi2):
            for f in bad:
                flags[f] = "responsible"
            return CheckResult("partial", err2, tol, f"all kernels: error {err:.3g} ({where}); "
                               f"{blame}; without them: passed", used, flags, rest)
    for u in used:                                 # nothing identifiable: use none of them
        if u["calls"]:
            flags[u["family"]] = "responsible"
    return CheckResult("failed", err, tol, f"all kernels: error {err:.3g} ({where})"
                       + (f"; {blame}" if blame else "; no single kernel fails alone"), used, flags, [])


# ---- timing -------------------------------------------------------------------------------------

def _median_time(fn, inputs, device, warmup: int, reps: int,
                 budget_s: float = 0.0, max_reps: int = 200) -> tuple[float, float]:
    """(median us per call, relative spread) of fn(*inputs) under no_grad: ``reps`` calls, then
    more while the calls so far took less than ``budget_s`` (cheap variants get many samples,
    an interpreted one a few)."""
    cuda = device.type == "cuda"
    times = []
    with torch.no_grad():
        for _ in range(warmup):
            fn(*inputs)
        if cuda:
            torch.cuda.synchronize(device)
        while len(times) < reps or (sum(times) < budget_s * 1e6 and len(times) < max_reps):
            if cuda:
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn(*inputs)
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b) * 1e3)
            else:
                t0 = time.perf_counter()
                fn(*inputs)
                times.append((time.perf_counter() - t0) * 1e6)
    med = statistics.median(times)
    times.sort()
    lo, hi = times[len(times) // 4], times[(3 * len(times)) // 4] if len(times) >= 4 else times[-1]
    return med, ((hi - lo) / med if med > 0 else 0.0)


def _device(model, inputs) -> torch.device:
    """Where the model runs: its first parameter's device, else its first tensor input's."""
    return next((t.device for t in list(model.parameters()) + list(inputs)
                 if isinstance(t, torch.Tensor)), torch.device("cpu"))


def drop_slower(model, inputs, kernels: list, reps: int = 20) -> tuple[list, list]:
    """Keep or revert at the model level, on a GPU: while the optimized model is slower than the
    original (by more than 1% and its timing noise), leave out the kernel whose absence makes it
    fastest. A kernel faster alone can lose in the model: a launch-bound model (small batches,
    many short ops) pays each Triton launch's CPU cost (~50 us against ~17 us for an ATen op on
    the H200 host) while the GPU waits. Returns (kernels kept, [(kernel, note)] left out)."""
    device = _device(model, inputs)

    def timed(ks) -> tuple[float, float]:
        if not ks:
            return _median_time(model, inputs, device, 3, reps)
        applied = rt.apply(model, ks)
        try:
            return _median_time(model, inputs, device, 3, reps)
        finally:
            applied.remove()

    kept, dropped = list(kernels), []
    eager, noise_e = timed([])
    cur, noise_c = timed(kept)
    while kept and cur > eager * (1.01 + max(noise_e, noise_c)):
        trials = [(timed([k for k in kept if k is not leave]), leave) for leave in kept]
        (best, noise_c), leave = min(trials, key=lambda t: t[0][0])
        dropped.append((leave, f"the model ran {cur / 1e3:.3g} ms with it, {best / 1e3:.3g} ms "
                               f"without (original {eager / 1e3:.3g} ms)"))
        kept.remove(leave)
        cur = best
    return kept, dropped


def compile_wanted(timing_mode: str) -> tuple[bool, str]:
    env = os.environ.get("NIGHTSHIFT_E2E_COMPILE")
    if env is not None:
        return env not in ("0", "", "false"), "NIGHTSHIFT_E2E_COMPILE"
    if timing_mode == "interpreter":
        return False, ("torch.compile skipped under the interpreter: compiling takes tens of "
                       "seconds per variant on CPU and would time nothing a GPU runs; set "
                       "NIGHTSHIFT_E2E_COMPILE=1 to force it")
    return True, ""


def time_variants(model, inputs, kernels: list, timing_mode: str, do_compile: bool | None = None,
                  reps: int | None = None, warmup: int | None = None,
                  reference_out: list | None = None) -> list[dict]:
    """Time eager, optimized, torch.compile(max-autotune) and torch.compile of the optimized model
    on ``inputs``, one process, one after the other. Returns rows for Store.add_e2e_check."""
    interp = timing_mode == "interpreter"
    reps = reps or (3 if interp else 20)
    warmup = 2 if warmup is None else warmup
    device = _device(model, inputs)
    label = "interpreter timing" if interp else ""
    rows = []

    def row(variant, fn, note="", interpreted=False):
        # Interpreted kernels take seconds per forward and have nothing to warm up: one call
        # (the code path, labelled); everything else gets warm-up and repetitions (at least a
        # second's worth on CPU).
        w, n, budget = (0, 1, 0.0) if interpreted else (warmup, reps, 1.0 if device.type == "cpu" else 0.0)
        try:
            us, noise = _median_time(fn, inputs, device, w, n, budget)
            rows.append(dict(variant=variant, latency_us=us, noise=noise, timing_mode=timing_mode,
                             note="; ".join(x for x in (label, note) if x)))
        except Exception as e:
            rows.append(dict(variant=variant, latency_us=None, noise=None, timing_mode=timing_mode,
                             note=f"failed: {type(e).__name__}: {' '.join(str(e).split())[:300]}"))

    row("eager", model)
    if kernels:
        applied = rt.apply(model, kernels)
        try:
            row("optimized", model, interpreted=interp)
        finally:
            applied.remove()
    else:
        rows.append(dict(variant="optimized", latency_us=rows[0]["latency_us"], noise=rows[0]["noise"],
                         timing_mode=timing_mode, note="no kernel to apply: the optimized model is the original"))
    wanted, why = compile_wanted(timing_mode) if do_compile is None else (do_compile, "")
    if not wanted:
        for v in ("compile", "compile_optimized"):
            rows.append(dict(variant=v, latency_us=None, noise=None, timing_mode=timing_mode, note=why))
        return rows
    for variant in ("compile", "compile_optimized"):
        applied = None
        try:
            m = copy.deepcopy(model)
            if variant == "compile_optimized":
                if not kernels:
                    rows.append(dict(variant=variant, latency_us=None, noise=None,
                                     timing_mode=timing_mode, note="no kernel to apply"))
                    continue
                applied = rt.apply(m, kernels)     # removed below: function swaps are global
            torch._dynamo.reset()
            compiled = torch.compile(m, mode=COMPILE_MODE)
            t0 = time.perf_counter()
            with torch.no_grad():
                out = flatten(compiled(*inputs))             # compiles
            took = time.perf_counter() - t0
            note = f"mode={COMPILE_MODE}, first call (compile) {took:.1f} s"
            if reference_out is not None:
                err, _ = compare([t.detach() for t in out], reference_out)
                note += f", max error vs eager {err:.3g}"
            row(variant, compiled, note, interpreted=interp and variant == "compile_optimized")
        except Exception as e:
            rows.append(dict(variant=variant, latency_us=None, noise=None, timing_mode=timing_mode,
                             note=f"torch.compile failed: {type(e).__name__}: "
                                  f"{' '.join(str(e).split())[:300]}"))
        finally:
            if applied is not None:
                applied.remove()
    return rows


# ---- end of a run -------------------------------------------------------------------------------

def run_source(run: dict, input_shape=None) -> sources.Loaded:
    """The run's model rebuilt as it was profiled (same spec, dtype, shape, seed, overrides)."""
    cfg = run["config"]
    gpu = run["timing_mode"] == "gpu"
    dtype = cfg.get("dtype", "auto")
    if dtype == "auto":
        dtype = sources.default_dtype(cfg["model"], gpu)
    return sources.load(cfg["model"], dtype=dtype, device="cuda" if gpu else "cpu",
                        input_shape=input_shape or cfg.get("input_shape"), seed=cfg.get("seed", 0),
                        check=False, **(cfg.get("model_overrides") or {}))


def finish_run(store, run_id: str, log=print, do_compile: bool | None = None) -> CheckResult | None:
    """Integrate the run's kept kernels into its model, check it end to end, time it; store the
    result (e2e_checks, e2e_timings) and log one line. Never raises: a failure to integrate is
    recorded with status "error". Returns None when no kernel was kept."""
    run = store.get_run(run_id)
    records = kept_kernels(store, run_id, skip_flagged=False)
    if not records:
        return None
    interp = run["timing_mode"] == "interpreter"
    try:
        loaded = run_source(run)
        seed = run["config"].get("seed", 0)
        # fresh inputs: other random values than the profiled ones; one set under the
        # interpreter (each interpreted kernel call takes a second), three on a GPU
        input_sets = [inp for i in range(1 if interp else 3)
                      for inp in loaded.check_inputs(seed + 1000 + i)]
        ks = load(records)
        result = check(loaded.model, input_sets, ks, str(loaded.dtype).removeprefix("torch."))
        ref = _run(loaded.model, input_sets[0])
        if run["timing_mode"] == "gpu" and result.usable:
            result.usable, dropped = drop_slower(loaded.model, input_sets[0], result.usable)
            for k, why in dropped:
                result.family_flags[k.family] = "slower"
                result.detail += f"; left out {k.name}: {why}"
        timings = time_variants(loaded.model, input_sets[0], result.usable, run["timing_mode"],
                                do_compile, reference_out=ref)
    except Exception as e:
        msg = f"{type(e).__name__}: {' '.join(str(e).split())[:500]}"
        store.add_e2e_check(run_id, "check", "error", None, None, f"integration failed: {msg}",
                            [], {r.family: "unknown" for r in records})
        log(f"end-to-end: could not integrate the kept kernels: {msg}")
        return CheckResult("error", None, 0.0, msg)
    ids = {r.family: r.experiment_id for r in records}
    for u in result.kernels_used:
        u["experiment_id"] = ids.get(u["family"])
    store.add_e2e_check(run_id, "check", result.status, result.max_error, result.tolerance,
                        result.detail, result.kernels_used, result.family_flags, timings)
    log("end-to-end: " + result.line() + "; " + timing_line(timings))
    return result


def timing_line(timings: list[dict]) -> str:
    by = {t["variant"]: t for t in timings}
    parts = []
    for v in VARIANTS:
        t = by.get(v)
        if t and t["latency_us"]:
            parts.append(f"{v} {_fmt_us(t['latency_us'])}")
    eager, opt = by.get("eager"), by.get("optimized")
    if eager and opt and eager["latency_us"] and opt["latency_us"]:
        parts.append(f"optimized/eager speedup {eager['latency_us'] / opt['latency_us']:.3g}x")
    skipped = [t for t in timings if t["latency_us"] is None and t.get("note")]
    if skipped:   # the note's first clause, e.g. "torch.compile skipped under the interpreter"
        parts.append(f"{skipped[0]['variant']}: {skipped[0]['note'].split(':')[0][:100]}")
    if any(t["timing_mode"] == "interpreter" for t in timings):
        parts.append("[interpreter timing]")
    return ", ".join(parts)


def _fmt_us(us: float) -> str:
    return f"{us / 1e6:.3g} s" if us >= 1e6 else f"{us / 1e3:.3g} ms" if us >= 1e3 else f"{us:.3g} us"
