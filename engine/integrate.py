"""A run's kept kernels in the real model: place them, check the model end to end, time it.

Which kernels: the best kernel of each target that beats the target's **baseline**, the faster of
eager and torch.compile of the same op (engine/plan.py ``beats_baseline``; a kernel slower than
the op it would replace is never placed, and the check's detail says which were left out and why).
Under Triton's CPU interpreter every kernel is far slower than eager and the timings decide
nothing: an interpreter run places its verified kernels anyway, to check the placement road.

Where they go, two roads:
- **graph** (the main one): the model is captured again on its profiled inputs (engine/capture.py),
  the families matched (engine/match.py) and each matched subgraph a kernel was verified for is
  rewritten into a call of it (engine/place.py); the optimized model runs the rewritten graph,
  eagerly or through torch.compile with the kernels opaque to inductor, and any call whose
  inputs have other shapes or dtypes runs the original model.
- **interception** (when the forward cannot be captured): engine/kernel_runtime.py ``apply``,
  functional calls intercepted and probed module swaps (plain contracts only).

Everything here runs in the caller's process: kernel sources come from the run's database, where
only candidates that passed the verifier are kept, but they are code, and loading them runs them
here, unsandboxed. Integrate kernels only from databases you trust.

The end-to-end check compares the optimized model with the original on fresh inputs. Its error
is max |optimized - original| / max |original| over every floating output (scale-relative: a
logit near 0 carries the rounding error of the large terms it sums), and NaN/Inf must sit in the
same places. In float16/bfloat16 the original itself rounds at every step (a composite RMSNorm
in bf16, say), and a kernel that accumulates in fp32 is closer to the true function than the
original is; so when the optimized model misses the tolerance against the original, both are
compared with a float32 run of the same model, and the optimized one passes if it is no further
from it than the original (within 10%, or the tolerance). When it fails, each kernel is tried
alone; the ones that fail alone are flagged responsible and left out, and the rest are checked
together again. Input sets are made and compared one at a time: a problem whose inputs fill a
quarter of the GPU still fits.

Timings put the variants side by side in one process: eager, torch.compile of the original (the
best of its modes: default, reduce-overhead (CUDA graphs), max-autotune without and with CUDA
graphs, as many as the time left allows), the optimized model eager, and the optimized model
compiled (best of the same modes). The model a run hands back is the fastest of them: never
slower than the faster of eager and torch.compile. Under Triton's CPU interpreter they are
interpreter timings (kernels interpreted in Python: far slower than eager, never GPU figures)
and torch.compile is skipped unless NIGHTSHIFT_E2E_COMPILE=1.
"""
from __future__ import annotations

import atexit
import copy
import gc
import json
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
from engine import hw, plan, sources

# Scale-relative error an optimized model may show against the original. Each kernel is within
# a few ulps of the float64 reference, the original within a few ulps of it the other way, and
# both pass through every layer: fp32 leaves room for ~1000 ulps of drift, fp16/bf16 for a few
# of their much coarser steps.
E2E_TOLERANCE = {"float32": 1e-4, "float16": 5e-3, "bfloat16": 2e-2, "float64": 1e-10}
# torch.compile modes a baseline is the best of (NIGHTSHIFT_COMPILE_MODE picks one instead), in
# the order tried: each costs more compile time than the one before.
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune")
COMPILE_MODE = os.environ.get("NIGHTSHIFT_COMPILE_MODE", "")
VARIANTS = ("eager", "optimized", "compile", "compile_optimized")
MIN_MARGIN = 0.01


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
    spec: dict = field(default_factory=dict)     # the contract it was verified under
    compile_latency_us: float | None = None      # torch.compile of the same op, when timed

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


def kept_kernels(store, run_id: str, skip_flagged: bool = True,
                 beat_baseline: bool = True) -> list[KernelRecord]:
    """The best kernel of each target of the run (targets.best_experiment_id), without the ones
    the latest end-to-end check flagged responsible for a mismatch or left out because the model
    ran slower with them (unless skip_flagged=False), and, with ``beat_baseline``, without the
    ones slower than their target's baseline (the faster of eager and torch.compile)."""
    return placeable(store, run_id, skip_flagged, beat_baseline)[0]


def placeable(store, run_id: str, skip_flagged: bool = True,
              beat_baseline: bool = True) -> tuple[list[KernelRecord], list[tuple[str, str]]]:
    """(records to place, [(kernel name, why left out)])."""
    run = store.get_run(run_id)
    if run is None:
        raise KeyError(f"no run {run_id!r}")
    flagged = set()
    if skip_flagged:
        checks = [c for c in store.e2e_checks(run_id) if c["kind"] == "check"]
        if checks:
            flagged = {f for f, v in (checks[0]["family_flags"] or {}).items()
                       if v in ("responsible", "slower")}
    out, left = [], []
    for t in store.targets(run_id):
        if not t["best_experiment_id"]:
            continue
        e = store.experiment(t["best_experiment_id"])
        name = f"{t['family']}#{e['seq']}"
        if t["family"] in flagged or _flag_key(t["family"], t.get("spec")) in flagged:
            left.append((name, "flagged by the last end-to-end check"))
            continue
        # interpreter timings decide nothing (kernels run in Python, thousands of times slower
        # than eager): an interpreter run places its verified kernels to check the road, and
        # only a GPU run's timings keep a kernel out
        if beat_baseline and run["timing_mode"] != "interpreter":
            ok, why = plan.beats_baseline(t, MIN_MARGIN)
            if not ok:
                left.append((name, why))
                continue
        fam = families.get(t["family"], t.get("spec") or None)
        tol = fam.tolerance[getattr(torch, t["dtype"])]
        out.append(KernelRecord(
            family=t["family"], experiment_id=e["id"], seq=e["seq"], source=e["source"],
            source_hash=e["source_hash"], dtype=t["dtype"],
            shapes=[list(s["shape"]) for s in t["shapes"]], tolerance=tuple(tol),
            device_type="cuda" if run["timing_mode"] == "gpu" else "cpu",
            latency_us=t["best_latency_us"], ref_latency_us=t["ref_latency_us"],
            speedup=t["speedup"], timing_mode=run["timing_mode"], spec=dict(t.get("spec") or {}),
            compile_latency_us=t.get("compile_latency_us")))
    return out, left


def _flag_key(family: str, spec) -> str:
    return family if not spec else f"{family} {json.dumps(spec, sort_keys=True)}"


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
    """Import the records' sources (this runs them, in this process) as runtime kernels, with the
    contract they were verified under and their family's custom-op schema."""
    out = []
    for r in records:
        path = os.path.join(_workdir(), f"{r.family}_{r.source_hash[:16]}.py")
        if not os.path.exists(path):
            with open(path, "w") as f:
                f.write(r.source)
        fam = families.get(r.family, r.spec or None)
        out.append(rt.load_kernel_file(path, r.family, r.dtype, r.device_type, r.shapes,
                                       r.tolerance, r.name, r.spec, fam.op_schema))
    return out


# ---- the two roads --------------------------------------------------------------------------------

class _Applied:
    """A model with a set of kernels in it, on either road: ``module`` is what to call."""

    def __init__(self, module, stats: dict, undo=None, note: str = ""):
        self.module, self._stats, self._undo, self.note = module, stats, undo, note

    def stats(self) -> dict:
        return self._stats() if callable(self._stats) else self._stats

    def remove(self) -> None:
        if self._undo is not None:
            self._undo()


class Road:
    """How kernels get into ``model``: by rewriting its captured graph (``capture`` given) or by
    interception (engine/kernel_runtime.apply). ``apply(kernels, compile_mode)``."""

    def __init__(self, model, capture=None, matches=None, probe: bool = True, families=None):
        self.model, self.capture, self.matches, self.probe = model, capture, matches, probe
        self.families = families
        self.name = "graph" if capture is not None and capture.ok else "interception"

    def apply(self, ks: list, compile_mode: str | None = None) -> _Applied:
        if self.name == "graph":
            from engine import place
            opt = place.Specializing(self.model, ks, compile_mode, (self.capture, self.matches),
                                     self.families)

            def stats():
                pls = [p for p in opt.placements.values() if p is not None]
                return {k.family: {"calls": sum(1 for p in pls for s in p.sites if s["kernel"] == k.name),
                                   "fallthrough": sum(1 for p in pls for s in p.skipped
                                                      if s["family"] == k.family),
                                   "swapped": sorted({s["site"] for p in pls for s in p.sites
                                                      if s["kernel"] == k.name})}
                        for k in ks}
            pl = next(iter(opt.placements.values()))
            own = {k.family for k in ks}     # why a family with a kernel was not served somewhere
            skipped = "; ".join([f"{s['family']} {s['shape']}: {s['why']}" for s in pl.skipped
                                 if s["family"] in own][:6]) if pl else ""
            return _Applied(opt, stats, None, skipped)
        applied = rt.apply(self.model, [k for k in ks if not k.spec], probe=self.probe)
        module = self.model
        if compile_mode is not None:
            module = torch.compile(self.model, mode=None if compile_mode == "default" else compile_mode)
        return _Applied(module, applied.stats, applied.remove)


def graph_road(model, inputs, families=None) -> Road:
    """Capture ``model`` on ``inputs`` and match its families (``families``: the run's, None for
    all): the graph road, or the interception road when the forward cannot be captured."""
    from engine import capture, match
    cap = capture.capture(model, inputs)
    matches = {g.index: match.find(g, families=families) for g in cap.graphs} if cap.ok else None
    road = Road(model, cap if cap.ok else None, matches, families=families)
    road.note = cap.note
    return road


def optimize(model, db=None, run_id: str = "latest", example_inputs=None, probe: bool = True,
             cuda_graph: bool = False):
    """The kept kernels of run ``run_id`` in database ``db`` (default data/runs.db) in ``model``.

    With ``example_inputs`` (a tuple for model(*inputs)): the graph road, returning a new module
    that runs the rewritten graph for inputs shaped like these (and the original model for any
    other); with ``cuda_graph`` as well, that module replayed from a CUDA graph for calls shaped
    like ``example_inputs`` (kernel_runtime.Graphed: its outputs are overwritten by the next
    call). Without: the interception road, applied in place; returns the handle (``.stats()``,
    ``.remove()``). The kernels' code runs in this process."""
    from engine.store import Store
    store = Store(db, readonly=True)
    try:
        if run_id == "latest":
            runs = store.list_runs()
            if not runs:
                raise KeyError(f"no runs in {store.path}")
            run_id = runs[0]["id"]
        ks = load(kept_kernels(store, run_id))
    finally:
        store.close()
    if example_inputs is not None:
        road = graph_road(model, tuple(example_inputs))
        if road.name == "graph":
            mod = road.apply(ks).module
            return rt.Graphed(mod, tuple(example_inputs)) if cuda_graph else mod
    return rt.apply(model, [k for k in ks if not k.spec], probe=probe)


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
        # in float64, a chunk at a time: a whole 7.5 GB fp32 output in float64 is 14 GiB a
        # copy, and four of them ran KernelBench's RMSNorm out of the H200's memory
        of, rf = o.detach().reshape(-1), r.detach().reshape(-1)
        diff = scale = 0.0
        any_fin = False
        for a in range(0, rf.numel(), COMPARE_CHUNK):
            o64, r64 = of[a:a + COMPARE_CHUNK].double(), rf[a:a + COMPARE_CHUNK].double()
            fin = torch.isfinite(r64)
            same_special = torch.equal(fin, torch.isfinite(o64)) and torch.equal(
                torch.nan_to_num(r64[~fin], nan=0.5), torch.nan_to_num(o64[~fin], nan=0.5))
            if not same_special:
                return math.inf, f"output {i}: NaN/Inf in other places than the original's"
            if fin.any():
                any_fin = True
                diff = max(diff, (o64[fin] - r64[fin]).abs().max().item())
                scale = max(scale, r64[fin].abs().max().item())
            del o64, r64, fin
        if not any_fin:
            continue
        err = diff / scale if scale > 0 else (0.0 if diff == 0 else math.inf)
        if err > worst:
            worst, where = err, f"output {i} {tuple(r.shape)}: max |diff| {diff:.3g} at scale {scale:.3g}"
    return worst, where


COMPARE_CHUNK = 1 << 26          # elements compared at once (512 MB a float64 copy)


def _run(model, inputs) -> list:
    with torch.no_grad():
        return [t.detach().clone() for t in flatten(model(*inputs))]


def _nbytes(ts) -> int:
    return sum(t.numel() * t.element_size() for t in ts if isinstance(t, torch.Tensor))


def _free():
    """Hand unused GPU blocks back. Collect first: captured graphs, their modules and closures
    hold tensors in reference cycles that only the collector frees (the scoring of a 7.5 GB
    problem found 128 of the GPU's 140 GB taken after its run)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def gpu_memory_line() -> str:
    """'N GB allocated here, M GB free on the device' (empty without a GPU)."""
    if not torch.cuda.is_available():
        return ""
    free, total = torch.cuda.mem_get_info()
    return (f"GPU memory: {torch.cuda.memory_allocated() / 1e9:.1f} GB allocated here, "
            f"{free / 1e9:.1f} of {total / 1e9:.0f} GB free")


# ---- the end-to-end check ----------------------------------------------------------------------

def _float32_copy(model):
    """A float32 copy of a half-precision model, or None (memory, dtype-bound code)."""
    try:
        return copy.deepcopy(model).float()
    except Exception:
        return None


def _up(inp):
    return [t.float() if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in inp]


class _Refs:
    """The original's outputs per input set (and a float32 run's, for half precision), computed
    when first asked and kept only while they are small: a check never holds more than one set of
    a large model's outputs at a time."""
    KEEP_BYTES = 1 << 30

    def __init__(self, model, input_sets, half: bool):
        self.model, self.sets, self.half = model, input_sets, half
        self.cache, self.hi_cache = {}, {}
        self.hi_model = None
        self.orig_hi = None

    def ref(self, i):
        if i in self.cache:
            return self.cache[i]
        r = _run(self.model, self.sets[i])
        if _nbytes(r) <= self.KEEP_BYTES:
            self.cache[i] = r
        return r

    def hi(self, i):
        if not self.half:
            return None
        if i in self.hi_cache:
            return self.hi_cache[i]
        if self.hi_model is None:
            self.hi_model = _float32_copy(self.model) or False
        if self.hi_model is False:
            return None
        try:
            h = _run(self.hi_model, _up(self.sets[i]))
        except Exception:
            return None
        if _nbytes(h) <= self.KEEP_BYTES:
            self.hi_cache[i] = h
        return h

    def original_hi_error(self):
        """How far the original itself is from its float32 run: the accuracy to keep."""
        if self.orig_hi is None and self.half:
            errs = []
            for i in range(len(self.sets)):
                h = self.hi(i)
                if h is None:
                    return None
                errs.append(compare(self.ref(i), h, same_dtype=False)[0])
            self.orig_hi = max(errs) if errs else None
        return self.orig_hi

    def prefetch(self):
        """Every output now, before any kernel is in the model: the interception road changes the
        model in place, so its original outputs must be taken first (they are kept whatever
        their size: that road serves models export cannot capture, not the largest ones)."""
        self.KEEP_BYTES = float("inf")
        for i in range(len(self.sets)):
            self.ref(i)
            self.hi(i)
        self.original_hi_error()

    def close(self):
        self.hi_model = None
        self.cache.clear()
        self.hi_cache.clear()
        _free()


def check(model, input_sets: list, kernels: list, dtype: str, probe: bool = True,
          road: Road | None = None) -> CheckResult:
    """Outputs of ``model`` with ``kernels`` placed (``road``: the graph road when given, else
    interception) against without, on each of ``input_sets`` (for half precision, also against
    a float32 run: see the module doc). Finds the kernels responsible for a mismatch by placing
    them one at a time."""
    road = road or Road(model, probe=probe)
    tol = E2E_TOLERANCE.get(dtype, 1e-4)
    refs = _Refs(model, input_sets, dtype in ("float16", "bfloat16"))
    if road.name != "graph":
        refs.prefetch()

    def attempt(ks):
        """(error against the original, where, stats, error against float32 or None)."""
        applied = road.apply(ks)
        try:
            worst, where, hi = 0.0, "", None
            for i, inp in enumerate(input_sets):
                out = _run(applied.module, inp)
                err, w = compare(out, refs.ref(i))
                if err > worst or not where:
                    worst, where = err, w
                if worst > tol and math.isfinite(worst) and refs.half:
                    h = refs.hi(i)
                    if h is not None:
                        e_hi = compare(out, h, same_dtype=False)[0]
                        hi = e_hi if hi is None else max(hi, e_hi)
                del out
            return worst, where, applied.stats(), hi, applied.note
        except Exception as e:                       # a kernel that raises fails the check
            return (math.inf, f"raised {type(e).__name__}: {' '.join(str(e).split())[:300]}",
                    applied.stats(), None, applied.note)
        finally:
            applied.remove()

    def ok(err, hi) -> bool:
        orig_hi = refs.original_hi_error() if hi is not None else None
        return err <= tol or (hi is not None and orig_hi is not None and hi <= max(tol, 1.1 * orig_hi))

    def against_fp32(err, hi) -> str:
        return (f"error {err:.3g} against the original, but against a float32 run of the model "
                f"{hi:.3g}, the original's own {refs.original_hi_error():.3g}: no less accurate")

    try:
        err, where, stats, hi, note = attempt(kernels)
        used = [dict(family=k.family, kernel=k.name, spec=k.spec,
                     calls=stats.get(k.family, {}).get("calls", 0),
                     fallthrough=stats.get(k.family, {}).get("fallthrough", 0),
                     swapped=stats.get(k.family, {}).get("swapped", [])) for k in kernels]
        flags = {_flag_key(u["family"], u["spec"]): ("ok" if u["calls"] else "unused") for u in used}
        served = ", ".join(f"{u['kernel']} {u['calls']} {'site' if road.name == 'graph' else 'call'}(s)"
                           for u in used if u["calls"]) or "nothing"
        unused = [u["kernel"] for u in used if not u["calls"]]
        text = f"{road.name} road: kernels served {served}" + (
            f"; unused (shape/dtype/spec not verified, or not matched): {', '.join(unused)}" if unused else "")
        if note:
            text += f"; not placed: {note}"
        if ok(err, hi):
            if err > tol:
                text += "; " + against_fp32(err, hi)
            return CheckResult("passed", err, tol, text, used, flags, list(kernels))
        responsible = []
        for k in kernels:
            if flags[_flag_key(k.family, k.spec)] == "unused":
                continue
            e_k, w_k, _, hi_k, _ = attempt([k])
            if not ok(e_k, hi_k):
                responsible.append((k, e_k, w_k + (f", against float32 {hi_k:.3g} (the original "
                                                    f"{refs.original_hi_error():.3g})" if hi_k is not None
                                                   and refs.original_hi_error() is not None else "")))
        bad = {id(k) for k, _, _ in responsible}
        rest = [k for k in kernels if id(k) not in bad]
        blame = "; ".join(f"{k.name} alone: error {e:.3g} ({w})" for k, e, w in responsible)
        if rest and bad:
            err2, where2, _, hi2, _ = attempt(rest)
            if ok(err2, hi2):
                for k, _, _ in responsible:
                    flags[_flag_key(k.family, k.spec)] = "responsible"
                return CheckResult("partial", err2, tol, f"{road.name} road: all kernels: error "
                                   f"{err:.3g} ({where}); {blame}; without them: passed", used, flags, rest)
        for u in used:                                 # nothing identifiable: use none of them
            if u["calls"]:
                flags[_flag_key(u["family"], u["spec"])] = "responsible"
        return CheckResult("failed", err, tol, f"{road.name} road: all kernels: error {err:.3g} ({where})"
                           + (f"; {blame}" if blame else "; no single kernel fails alone"), used, flags, [])
    finally:
        refs.close()


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


def drop_slower(model, inputs, kernels: list, reps: int = 20, road: Road | None = None,
                deadline: float | None = None, gpu_us: float | None = None) -> tuple[list, list]:
    """Keep or revert at the model level, on a GPU: while the optimized model is slower than the
    original (by more than 1% and its timing noise), leave out the kernel whose absence makes it
    fastest. A kernel faster alone can lose in the model: a launch-bound model (small batches,
    many short ops) pays each Triton launch's CPU cost (~50 us against ~17 us for an ATen op on
    the H200 host) while the GPU waits. ``gpu_us``: the optimized model's expected device time
    (expected_gpu_us); where the optimized model is slower and waits on the host by that
    measure (host_bound), both sides are timed again as CUDA graph replays, where launches cost
    no host time, and those timings decide (the end-to-end stage replays the optimized model
    the same way). Returns (kernels kept, [(kernel, note)] left out)."""
    device = _device(model, inputs)
    road = road or Road(model)
    graphed = False                    # timings from CUDA graph replays (host_bound below)

    def run_time(module) -> tuple[float, float]:
        if graphed:
            g = rt.Graphed(module, inputs)
            try:
                return _median_time(g, inputs, device, 3, reps)
            finally:
                del g
                _free()
        return _median_time(module, inputs, device, 3, reps)

    def timed(ks) -> tuple[float, float]:
        if not ks:
            return run_time(model)
        applied = road.apply(ks)
        try:
            return run_time(applied.module)
        finally:
            applied.remove()

    kept, dropped = list(kernels), []
    eager, noise_e = timed([])
    cur, noise_c = timed(kept)
    how = ""
    if (kept and device.type == "cuda" and cur > eager * (1.01 + max(noise_e, noise_c))
            and host_bound(cur, gpu_us)):
        graphed = True
        try:
            (eager, noise_e), (cur, noise_c) = timed([]), timed(kept)
            how = ", both replayed from CUDA graphs"
        except Exception:              # no graph for this model: its plain timings decide
            graphed = False
    while kept and cur > eager * (1.01 + max(noise_e, noise_c)):
        if deadline is not None and time.monotonic() > deadline:
            for k in kept:
                dropped.append((k, "the model ran slower with the kernels and the budget ran out "
                                   "before the one to blame was found"))
            return [], dropped
        try:
            trials = [(timed([k for k in kept if k is not leave]), leave) for leave in kept]
        except Exception:
            if not graphed:
                raise
            # a subset that cannot be captured: every side timed plainly from here on
            graphed, how = False, ""
            (eager, noise_e), (cur, noise_c) = timed([]), timed(kept)
            continue
        (best, noise_c), leave = min(trials, key=lambda t: t[0][0])
        dropped.append((leave, f"the model ran {cur / 1e3:.3g} ms with it, {best / 1e3:.3g} ms "
                               f"without (original {eager / 1e3:.3g} ms{how})"))
        kept.remove(leave)
        cur = best
    return kept, dropped


def expected_gpu_us(gpu_us: float | None, saved_us: float) -> float | None:
    """The optimized model's device time per forward, expected: the profile's ``gpu_us`` less
    what the placed kernels save on their targets (eager reference less best, per forward), at
    least a tenth of it. Removing GPU work is what makes a forward wait on the host: BERT-base
    8x512 ran 5.19 ms for 4.78 ms of profiled GPU work (not launch-bound), its kernels then
    saving ~3.2 ms of it."""
    if not gpu_us:
        return None
    return max(gpu_us - max(saved_us, 0.0), 0.1 * gpu_us)


def compile_wanted(timing_mode: str) -> tuple[bool, str]:
    env = os.environ.get("NIGHTSHIFT_E2E_COMPILE")
    if env is not None:
        return env not in ("0", "", "false"), "NIGHTSHIFT_E2E_COMPILE"
    if timing_mode == "interpreter":
        return False, ("torch.compile skipped under the interpreter: compiling takes tens of "
                       "seconds per variant on CPU and would time nothing a GPU runs; set "
                       "NIGHTSHIFT_E2E_COMPILE=1 to force it")
    return True, ""


def compile_modes(device: torch.device) -> tuple:
    if COMPILE_MODE:
        return (COMPILE_MODE,)
    if device.type != "cuda":                         # no CUDA graphs off the GPU
        return tuple(m for m in COMPILE_MODES if m in ("default", "max-autotune-no-cudagraphs"))
    return COMPILE_MODES


# ---- what a torch.compile costs, before it starts -----------------------------------------------

# Inductor's max-autotune benchmarks its GEMM and convolution choices (Triton templates, cuBLAS)
# for every distinct shape it compiles, and that is most of the compile. Measured on the H200
# (torch 2.11, Triton 3.6): LLaMA-1B at 4 layers, 4x2048 bf16, ~15 s for each of its 5 mm shapes
# (8192 rows by 2048x2048, 256x2048, 5632x2048, 2048x5632, 32000x2048: N x K); KernelBench level
# 3's 43_MinGPTCausalAttention in fp32, two addmm and two bmm, 85.2 s in
# max-autotune-no-cudagraphs against 2.5 s in default: ~20 s a shape. 15-30 s a shape in all:
# an estimate too short runs past the budget, one too long only skips a mode. fp32 GEMMs tune
# slower (more of Inductor's template choices run on CUDA cores, each timed at fp32 speed):
# KernelBench 44_MiniGPTBlock, 6 fp32 shapes of 65536 rows, 272.0 s in a fresh process (45 s a
# shape; the 3.6-minute problem ran 402 s on an estimate of 20 s a shape), 43's 4 shapes 107.7 s.
AUTOTUNE_S_PER_SHAPE = 20.0
AUTOTUNE_S_PER_SHAPE_FP32 = 45.0
# Convolutions tune by their size: KernelBench level 3's ResNetBasicBlock (three fp32 convolutions
# of 10x224x224, up to 37 GFLOP each) tuned in 9.3 s together, LeNet-5's (two convolutions and
# three small addmm) in 22.3 s, where level 2's single 155- and 618-GFLOP convolutions took 43 and
# 46 s (max-autotune-no-cudagraphs less default, H200, torch 2.11). A convolution under
# SMALL_CONV_FLOP counts AUTOTUNE_S_PER_SMALL_CONV whatever its dtype (still ~3x what was seen).
AUTOTUNE_S_PER_SMALL_CONV, SMALL_CONV_FLOP = 12.0, 50e9
# A default compile before one was measured: Inductor's own ~2 s plus ~20 ms an aten op of the
# graph (43_MinGPTCausalAttention, ~25 ops: 2.5 s on the H200). reduce-overhead compiles the same
# Inductor graph (0.6 s after default's 2.5 s there: Inductor's cache); max-autotune after
# another max-autotune mode in the same process reuses its tuning (4.8 s there).
COMPILE_BASE_S, COMPILE_S_PER_OP = 2.0, 0.02
# The end-to-end stage without its compiles: the model built again, captured again (as long as
# the run's capture took, counted apart), checked on its input sets (and a float32 run), kept or
# reverted at the model level, timed eagerly. Measured on the H200 (bf16, 8 x 1024 GPT-2 small,
# 8 x 512 BERT-base): 20-27 s besides the capture; at 10 s the stage ran out before compiling
# the optimized model in both runs.
STAGE_FIXED_S = 25.0

# aten ops Inductor lowers to a tuned GEMM or convolution (export graphs keep linear, matmul and
# einsum; a dispatch sees mm, addmm, bmm, baddbmm, convolution)
_GEMM_OPS = {"mm", "addmm", "bmm", "baddbmm", "linear", "matmul", "einsum"}
_CONV_OPS = {"convolution", "_convolution", "conv1d", "conv2d", "conv3d", "conv_transpose1d",
             "conv_transpose2d", "conv_transpose3d"}


def _gemm_key(name: str, args: tuple) -> tuple | None:
    """The GEMM or convolution an aten op ``name`` on ``args`` (tensors or FakeTensors, and
    plain values) hands Inductor's autotuner, as a key: equal keys are tuned once. linear and
    matmul fold their leading dims as Inductor does ([B, T, K] x [N, K]: an mm of B*T rows);
    None for any other op, and for a matrix-vector product (not tuned)."""
    ts = [a for a in args if isinstance(a, torch.Tensor)]
    try:
        if name in _CONV_OPS and len(ts) >= 2:
            rest = tuple(repr(a) for a in args if not isinstance(a, torch.Tensor))
            return ("conv", tuple(ts[0].shape), tuple(ts[1].shape), rest, ts[0].dtype)
        if name not in _GEMM_OPS or len(ts) < 2:
            return None
        if name == "einsum":
            return ("einsum", next((a for a in args if isinstance(a, str)), ""),
                    tuple(tuple(t.shape) for t in ts), ts[0].dtype)
        if name in ("addmm", "baddbmm"):
            ts = ts[1:]
        a, b = ts[0], ts[1]
        dt = a.dtype
        if name == "linear":           # x [..., K], w [N, K], bias: an addmm of the folded rows
            return ("addmm" if len(ts) > 2 else "mm", math.prod(a.shape[:-1]), b.shape[0],
                    b.shape[1], dt)
        if a.dim() < 2 or b.dim() < 2:
            return None
        if b.dim() == 2:               # mm, addmm, [..., M, K] @ [K, N]
            return (name if name == "addmm" else "mm", math.prod(a.shape[:-1]), b.shape[1],
                    b.shape[0], dt)
        batch = tuple(torch.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
        return ("baddbmm" if name == "baddbmm" else "bmm", math.prod(batch), a.shape[-2],
                b.shape[-1], a.shape[-1], dt)
    except Exception:                  # symbolic sizes: no static key
        return None


def gemm_shapes(graphs) -> set:
    """The distinct GEMM and convolution shapes of captured graphs (engine/capture.py Graph, each
    node's value in node.meta["val"]): what a max-autotune compile of them tunes."""
    keys = set()
    for g in graphs:
        for n in g.nodes():
            name = getattr(n.target, "_opname", None) if n.op == "call_function" else None
            if name in _GEMM_OPS or name in _CONV_OPS:
                args = tuple(a.meta.get("val") if isinstance(a, torch.fx.Node) else a
                             for a in n.args)
                key = _gemm_key(name, args)
                if key is not None:
                    keys.add(key)
    return keys


def _small_conv(key: tuple) -> bool:
    """A gemm_shapes key of a convolution under SMALL_CONV_FLOP (its FLOP taken at the input's
    spatial size: at stride > 1 an overcount, which only errs long)."""
    if key[0] != "conv":
        return False
    x, w = key[1], key[2]
    return 2.0 * x[0] * math.prod(x[2:]) * math.prod(w) < SMALL_CONV_FLOP


def graph_figures(graphs, capture_s: float = 0.0) -> dict:
    """What a compile estimate needs of a captured model, plain JSON (a run keeps it): its aten
    ops, its distinct GEMM/convolution shapes (those in fp32 and the small convolutions apart
    from the rest, see compile_estimate_s), how long the capture took."""
    ops = sum(1 for g in graphs for n in g.nodes() if n.op == "call_function")
    keys = gemm_shapes(graphs)
    small = {k for k in keys if _small_conv(k)}
    return {"aten_ops": ops, "gemm_shapes": len(keys),
            "gemm_shapes_fp32": sum(1 for k in keys - small if k[-1] == torch.float32),
            "small_convs": len(small), "capture_s": round(float(capture_s), 2)}


def reference_gemm_shapes(fam, shapes, dtype: str) -> set | None:
    """The distinct GEMM shapes a family's reference runs over ``shapes`` (the target's family
    shapes): what the reference stage's max-autotune baseline tunes. Traced with fake tensors
    (no memory, no compute); None when the reference cannot be traced so."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode
    keys = set()

    class _Gemms(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            key = _gemm_key(getattr(func, "_opname", ""), tuple(args))
            if key is not None:
                keys.add(key)
            return func(*args, **(kwargs or {}))
    try:
        with FakeTensorMode():
            for shape in shapes:
                inp = fam.make_inputs(tuple(shape), dtype, "cpu", torch.Generator().manual_seed(0))
                with _Gemms():
                    ref = fam.baseline_op()          # what the reference stage compiles
                    ref(**inp) if isinstance(inp, dict) else ref(*inp)
    except Exception:
        return None
    return keys


def compile_estimate_s(mode: str, gemm_shapes: int | None, default_s: float | None = None,
                       aten_ops: int = 0, tuned: bool = False, fp32_shapes: int = 0,
                       small_convs: int = 0) -> float:
    """Seconds a torch.compile of one model in ``mode`` is expected to take, before it starts.
    The default mode costs ``default_s``, its measured compile, or before there is one
    COMPILE_BASE_S plus COMPILE_S_PER_OP for each of ``aten_ops``; reduce-overhead the same
    (Inductor's graph again, CUDA graphs over it). A max-autotune mode costs that plus
    AUTOTUNE_S_PER_SHAPE for each of the graph's ``gemm_shapes`` distinct GEMM/convolution
    shapes (AUTOTUNE_S_PER_SHAPE_FP32 for the ``fp32_shapes`` of them in float32,
    AUTOTUNE_S_PER_SMALL_CONV for the ``small_convs``, counted in neither), unless
    ``tuned`` (a max-autotune mode already compiled the same GEMMs in this process: Inductor
    keeps its choices, and the next one costs about a default compile).
    ``gemm_shapes`` None (a graph not captured): three times the default compile."""
    base = default_s if default_s is not None else COMPILE_BASE_S + COMPILE_S_PER_OP * aten_ops
    if not mode.startswith("max-autotune") or tuned:
        return base
    if gemm_shapes is None:
        return 3.0 * base
    small = min(small_convs, gemm_shapes)
    fp32 = min(fp32_shapes, gemm_shapes - small)
    return (base + AUTOTUNE_S_PER_SHAPE * (gemm_shapes - small - fp32)
            + AUTOTUNE_S_PER_SHAPE_FP32 * fp32 + AUTOTUNE_S_PER_SMALL_CONV * small)


def modes_estimate_s(modes, gemm_shapes: int | None, default_s: float | None = None,
                     aten_ops: int = 0, tuned: bool = False, fp32_shapes: int = 0,
                     small_convs: int = 0) -> float:
    """compile_estimate_s summed over ``modes`` tried one after the other in one process (the
    first max-autotune mode tunes, the ones after it reuse its choices)."""
    total = 0.0
    for mode in modes:
        total += compile_estimate_s(mode, gemm_shapes, default_s, aten_ops, tuned, fp32_shapes,
                                    small_convs)
        tuned = tuned or (mode.startswith("max-autotune") and gemm_shapes is not None)
    return total


def stage_estimate_s(figures: dict | None, timing_mode: str,
                     cap_s: float | None = None) -> float | None:
    """Seconds the end-to-end stage (``finish_run``) is expected to take with every compile
    mode: STAGE_FIXED_S, the capture again, the original compiled in each mode (the first
    max-autotune mode tuning its GEMMs) and the optimized model in each (tuned by then). None
    when the run's graph figures (``graph_figures``) are not known or no mode is compiled: the
    caller keeps its flat share. ``cap_s``: the most the caller can give the stage; when every
    mode does not fit in it, the estimate of the modes that do (the stage tries them cheapest
    first and skips the rest, so keeping time for a mode it will skip only starves the loop:
    measured on a GPT-2 at a 2.4-minute budget, 72 s kept, max-autotune skipped anyway, ~30 s
    used). At least the first mode's (a compile baseline always runs)."""
    return stage_modes_s(figures, timing_mode, cap_s)[1]


def stage_modes_s(figures: dict | None, timing_mode: str,
                  cap_s: float | None = None) -> tuple[tuple, float | None]:
    """(modes, seconds): stage_estimate_s and the compile modes its figure holds."""
    if not figures or not compile_wanted(timing_mode)[0]:
        return (), None
    modes = compile_modes(torch.device("cuda" if timing_mode == "gpu" else "cpu"))
    ops, gemms = figures.get("aten_ops", 0), figures.get("gemm_shapes")
    fp32, small = figures.get("gemm_shapes_fp32", 0), figures.get("small_convs", 0)

    def est(ms):
        return (STAGE_FIXED_S + figures.get("capture_s", 0.0)
                + modes_estimate_s(ms, gemms, aten_ops=ops, fp32_shapes=fp32, small_convs=small)
                + modes_estimate_s(ms, gemms, aten_ops=ops, tuned=True))
    for k in range(len(modes), 1, -1):
        if cap_s is None or est(modes[:k]) <= cap_s:
            return tuple(modes[:k]), est(modes[:k])
    return tuple(modes[:1]), est(modes[:1])


def time_variants(model, inputs, kernels: list, timing_mode: str, do_compile: bool | None = None,
                  reps: int | None = None, warmup: int | None = None,
                  reference_out: list | None = None, road: Road | None = None,
                  deadline: float | None = None, baseline_always: bool = False,
                  gpu_us: float | None = None, compile_kernels: list | None = None,
                  gpu_us_optimized: float | None = None) -> list[dict]:
    """Time eager, the optimized model, torch.compile of the original and of the optimized model
    (each compiled one the best of the modes that fit before ``deadline``) on ``inputs``, one
    process, one after the other. Returns rows for Store.add_e2e_check; the fastest row's note
    says it is the one shipped. ``gpu_us``: the device time of one eager forward (the run's
    profile), and ``gpu_us_optimized`` the optimized model's expected one (expected_gpu_us):
    either tells a forward that waits on the host (a CUDA graph's case) at any length.
    ``compile_kernels``: the kernels compile_optimized runs (default ``kernels``): those the check
    passed, where ``kernels`` may be fewer (drop_slower's verdict is on the eager model's host
    time, which a compiled model does not pay the same way)."""
    interp = timing_mode == "interpreter"
    reps = reps or (3 if interp else 20)
    warmup = 2 if warmup is None else warmup
    device = _device(model, inputs)
    label = "interpreter timing" if interp else ""
    road = road or Road(model)
    rows = []

    def measure(fn, interpreted=False):
        # Interpreted kernels take seconds per forward and have nothing to warm up: one call
        # (the code path, labelled); everything else gets warm-up and repetitions (at least a
        # second's worth on CPU).
        w, n, budget = (0, 1, 0.0) if interpreted else (warmup, reps, 1.0 if device.type == "cpu" else 0.0)
        return _median_time(fn, inputs, device, w, n, budget)

    def row(variant, fn, note="", interpreted=False):
        try:
            us, noise = measure(fn, interpreted)
            rows.append(dict(variant=variant, latency_us=us, noise=noise, timing_mode=timing_mode,
                             note="; ".join(x for x in (label, road.name + " road" if variant == "optimized"
                                                        else "", note) if x)))
        except Exception as e:
            rows.append(dict(variant=variant, latency_us=None, noise=None, timing_mode=timing_mode,
                             note=f"failed: {type(e).__name__}: {' '.join(str(e).split())[:300]}"))

    row("eager", model)
    if kernels:
        applied = road.apply(kernels)
        try:
            row("optimized", applied.module, interpreted=interp)
            if not interp and road.name == "graph":
                _bare_graph_note(rows[-1], road, measure)
            if not interp and device.type == "cuda":
                _graphed_row(rows[-1], applied.module, inputs, measure, reference_out,
                             host_bound(rows[0]["latency_us"], gpu_us)
                             or host_bound(rows[-1]["latency_us"], gpu_us_optimized))
        finally:
            applied.remove()
    else:
        rows.append(dict(variant="optimized", latency_us=rows[0]["latency_us"], noise=rows[0]["noise"],
                         timing_mode=timing_mode, note="no kernel to apply: the optimized model is the original"))
    wanted, why = compile_wanted(timing_mode) if do_compile is None else (do_compile, "")
    if not wanted:
        for v in ("compile", "compile_optimized"):
            rows.append(dict(variant=v, latency_us=None, noise=None, timing_mode=timing_mode, note=why))
        return _mark_shipped(rows)
    # what each mode's compile is estimated at before it starts (compile_estimate_s): the graph's
    # figures (the graph road's capture; none on the interception road), the default compile
    # once measured, whether a max-autotune mode has tuned the GEMMs in this process, and the
    # timing after the compile ((warm-up + reps) forwards at about eager's latency)
    graphs = road.capture.graphs if road.capture is not None else None
    figures = graph_figures(graphs) if graphs else {}
    eager_s = (rows[0]["latency_us"] or 0.0) / 1e6
    cost = dict(gemm_shapes=figures.get("gemm_shapes"), aten_ops=figures.get("aten_ops", 0),
                fp32_shapes=figures.get("gemm_shapes_fp32", 0),
                small_convs=figures.get("small_convs", 0), default_s=None, tuned=False,
                timing_s=(warmup + reps) * eager_s + (1.0 if device.type == "cpu" else 0.0))
    for variant in ("compile", "compile_optimized"):
        ck = kernels if compile_kernels is None else compile_kernels
        if variant == "compile_optimized" and not ck:
            rows.append(dict(variant=variant, latency_us=None, noise=None, timing_mode=timing_mode,
                             note="no kernel to apply"))
            continue
        # the kernels' claim against compile needs the optimized model compiled as well: once
        # compile has a figure, compile_optimized's first mode runs whatever the time left (a
        # GPT-2 small run on the H200 shipped compile, 8.76 ms, with the end-to-end stage's 7 s
        # left and its attention kernel at 4.3x compile's never tried under compile)
        compiled = any(r["variant"] == "compile" and r.get("latency_us") for r in rows)
        rows.append(_best_compiled(variant, model, inputs, ck, road, measure, timing_mode,
                                   label, reference_out, deadline,
                                   interpreted=interp and variant == "compile_optimized",
                                   all_modes=baseline_always and variant == "compile", cost=cost,
                                   first_always=baseline_always or (
                                       variant == "compile_optimized" and compiled)))
    return _mark_shipped(rows)


def _bare_graph_note(row: dict, road: Road, measure) -> None:
    """The captured graph run with no kernel placed, timed beside the optimized row and named in
    its note: what the graph road changes besides the kernels (a model's per-forward checks and
    the host syncs they make, which the capture leaves out: transformers' LLaMA tests its
    position ids every forward) shows apart from what the kernels give."""
    from engine import place
    if not row.get("latency_us"):
        return
    try:
        bare = place.optimized(road.capture, place.place(road.capture, [], road.matches, road.families))
        said = f"the captured graph with no kernel {measure(bare)[0]:.1f} us"
    except Exception as e:     # the figure is context: its failure leaves the row's time as it was
        said = f"the captured graph with no kernel: failed ({type(e).__name__})"
    row["note"] = "; ".join(x for x in (row["note"], said) if x)


# A forward longer than this is taken not to wait on the host unless its profile says it does
# (host_bound): no CUDA graph is tried (it would hold a second copy of the inputs and the
# graph's own activations for nothing)
GRAPH_BELOW_US = 5000.0
# An eager forward whose wall time is this many times its device time waits on the host: BERT-base
# at 8 x 512 on the H200 took 10.9 ms a forward for 4.8 ms of GPU work (its attention kernel, 9x
# eager's, left the optimized model at 10.9 ms: the GPU saved time only to wait longer)
HOST_BOUND = 1.25


def host_bound(eager_us: float | None, gpu_us: float | None) -> bool:
    """Whether a forward timed at ``eager_us`` (wall, device events around the call) with
    ``gpu_us`` of device work (the profile's) is launch-bound."""
    return bool(eager_us and gpu_us and eager_us > HOST_BOUND * gpu_us)


def _graphed_row(row: dict, module, inputs, measure, reference_out,
                 waits_on_host: bool = False) -> None:
    """The optimized row replayed from a CUDA graph (kernel_runtime.Graphed) where that is
    faster and agrees with the reference as the rewritten model does; the row says which.
    Tried for a short forward, or a long one ``waits_on_host``."""
    if not row.get("latency_us") or (row["latency_us"] > GRAPH_BELOW_US and not waits_on_host):
        return
    g = None
    try:
        g = rt.Graphed(module, inputs)
        us, noise = measure(g)
        err = own = 0.0
        if reference_out is not None:       # as close to the original as the rewritten model is
            with torch.no_grad():
                err = compare([t.detach() for t in flatten(g(*inputs))], reference_out)[0]
                own = compare([t.detach() for t in flatten(module(*inputs))], reference_out)[0]
        if g.calls["original"]:
            why = "the replay fell back to the model"
        elif not err <= max(2.0 * own, 1e-6):
            why = f"the replay's output is off by {err:.3g} (the rewritten model's by {own:.3g})"
        elif us < row["latency_us"] * (1.0 - max(0.01, row.get("noise") or 0.0)):
            row["note"] = "; ".join(x for x in (row["note"], f"CUDA graph replay (the rewritten model "
                                                f"launched from Python: {_fmt_us(row['latency_us'])})") if x)
            row["latency_us"], row["noise"] = us, noise
            return
        else:
            why = f"no faster ({_fmt_us(us)})"
    except Exception as e:
        why = f"failed: {type(e).__name__}: {' '.join(str(e).split())[:120]}"
    finally:
        del g
        _free()
    row["note"] = "; ".join(x for x in (row["note"], f"CUDA graph not used: {why}") if x)


def _best_compiled(variant, model, inputs, kernels, road, measure, timing_mode, label,
                   reference_out, deadline, interpreted=False, all_modes=False,
                   cost: dict | None = None, first_always: bool = False) -> dict:
    """One row: the fastest of the compile modes tried, each mode's figure in the note. A mode
    whose compile (and timing) the time left cannot hold is skipped, estimated before it starts
    by compile_estimate_s from ``cost`` (time_variants': the graph's GEMM shapes and aten ops,
    the default compile once measured, whether a max-autotune mode tuned already; updated
    here); the row's "skipped" lists them. With ``all_modes`` none is (the baseline a
    KernelBench table compares with is the best of every mode: on level 1's
    12_Matmul_with_diagonal_matrices max-autotune-no-cudagraphs ran 77.7 us, default 85 us; a
    budget spent by the loop must not weaken it). With ``first_always`` the first mode runs
    whatever the time left (KernelBench's compile of the optimized model: the kernels and
    inductor's fusions together are the variant a placed GEMM most needs, and a default compile
    costs seconds)."""
    device = _device(model, inputs)
    cost = cost if cost is not None else dict(gemm_shapes=None, aten_ops=0, fp32_shapes=0,
                                              small_convs=0, default_s=None, tuned=False,
                                              timing_s=0.0)
    best, notes, skipped = None, [], []
    for n, mode in enumerate(compile_modes(device)):
        left = (deadline - time.monotonic()) if deadline is not None else math.inf
        need = cost["timing_s"] + compile_estimate_s(mode, cost["gemm_shapes"], cost["default_s"],
                                                     cost["aten_ops"], cost["tuned"],
                                                     cost["fp32_shapes"], cost.get("small_convs", 0))
        if not all_modes and not (first_always and n == 0) and left < max(need, 5.0):
            tunes = (mode.startswith("max-autotune") and not cost["tuned"]
                     and cost["gemm_shapes"])
            why = (f"its compile and timing are estimated at {need:.0f} s"
                   + (f" ({cost['gemm_shapes']} GEMM/convolution shape(s) to autotune)" if tunes else "")
                   + f", {max(left, 0):.0f} s left in the budget")
            notes.append(f"{mode} skipped: {why}")
            skipped.append(f"{mode} (~{need:.0f} s, {max(left, 0):.0f} s left)")
            continue
        applied = None
        try:
            torch._dynamo.reset()
            if variant == "compile_optimized":
                applied = road.apply(kernels, compile_mode=mode)
                fn = applied.module
            else:
                fn = torch.compile(model, mode=None if mode == "default" else mode)
            t0 = time.perf_counter()
            with torch.no_grad():
                out = flatten(fn(*inputs))                  # compiles
            last_compile = time.perf_counter() - t0
            if mode == "default":
                cost["default_s"] = last_compile
            if mode.startswith("max-autotune"):
                cost["tuned"] = True                        # Inductor keeps its choices
            err = compare([t.detach() for t in out], reference_out)[0] if reference_out is not None else None
            del out
            us, noise = measure(fn, interpreted)
            notes.append(f"{mode} {_fmt_us(us)} (compile {last_compile:.1f} s"
                         + (f", max error vs eager {err:.3g}" if err is not None else "") + ")")
            if best is None or us < best[0]:
                best = (us, noise, mode)
        except Exception as e:
            notes.append(f"{mode} failed: {type(e).__name__}: {' '.join(str(e).split())[:160]}")
        finally:
            if applied is not None:
                applied.remove()
            torch._dynamo.reset()
            _free()
    if best is None:
        return dict(variant=variant, latency_us=None, noise=None, timing_mode=timing_mode,
                    note="; ".join(x for x in (label, "torch.compile: " + "; ".join(notes)) if x),
                    skipped=skipped)
    return dict(variant=variant, latency_us=best[0], noise=best[1], timing_mode=timing_mode,
                note="; ".join(x for x in (label, f"best mode {best[2]}", "modes: " + "; ".join(notes)) if x),
                skipped=skipped)


def _mark_shipped(rows: list[dict]) -> list[dict]:
    """The fastest variant is what the run hands back (never slower than eager or compile)."""
    timed = [r for r in rows if r["latency_us"]]
    if timed:
        best = min(timed, key=lambda r: r["latency_us"])
        best["note"] = "; ".join(x for x in ("shipped: the fastest variant", best["note"]) if x)
    return rows


def shipped(timings: list[dict]) -> str | None:
    return next((t["variant"] for t in timings if (t.get("note") or "").startswith("shipped")), None)


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


def _input_sets(loaded, seed: int, want: int) -> list:
    """Fresh input sets for the check: ``want`` of them, fewer when one set is large (a model's
    inputs beyond 1/16 of the GPU get one set: a run holds a few copies of them at most)."""
    first = loaded.check_inputs(seed)
    size = max(_nbytes(s) for s in first)
    limit = (torch.cuda.get_device_properties(0).total_memory / 16 if torch.cuda.is_available()
             else 1 << 30)
    n = 1 if size > limit else want
    sets = list(first)
    for i in range(1, n):
        sets += loaded.check_inputs(seed + i)
    return sets


def finish_run(store, run_id: str, log=print, do_compile: bool | None = None,
               deadline: float | None = None) -> CheckResult | None:
    """Place the run's kept kernels that beat their baselines in its model, check it end to end,
    time it; store the result (e2e_checks, e2e_timings) and log one line. Never raises: a
    failure to integrate is recorded with status "error". Returns None when no kernel was kept.
    ``deadline`` (time.monotonic()): the compile modes that do not fit before it are skipped."""
    run = store.get_run(run_id)
    records, left_out = placeable(store, run_id, skip_flagged=False)
    any_kept = records or left_out
    if not any_kept:
        return None
    interp = run["timing_mode"] == "interpreter"
    device = hw.detect()               # the machine that times this check (maybe not the run's)
    try:
        loaded = run_source(run)
        seed = run["config"].get("seed", 0)
        # fresh inputs: other random values than the profiled ones; one set under the
        # interpreter (each interpreted kernel call takes a second), three on a GPU
        input_sets = _input_sets(loaded, seed + 1000, 1 if interp else 3)
        road = graph_road(loaded.model, loaded.inputs, run["config"].get("families"))
        ks = load(records)
        dtype = str(loaded.dtype).removeprefix("torch.")
        if ks:
            result = check(loaded.model, input_sets, ks, dtype, road=road)
        else:
            result = CheckResult("skipped", None, E2E_TOLERANCE.get(dtype, 1e-4),
                                 "no kernel beats its baseline: the optimized model is the original")
        if road.name == "interception" and road.capture is None:
            result.detail += "; the forward could not be captured: kernels placed by interception"
        for name, why in left_out:
            result.detail += f"; left out {name}: {why}"
            result.family_flags[name.split("#")[0]] = "slower_than_baseline"
        ref = _run(loaded.model, input_sets[0])
        checked = list(result.usable)
        gpu_opt = expected_gpu_us(run.get("model_time_us"), saved_us(records, checked))
        if run["timing_mode"] == "gpu" and result.usable:
            result.usable, dropped = drop_slower(loaded.model, input_sets[0], result.usable,
                                                 road=road, deadline=deadline, gpu_us=gpu_opt)
            for k, why in dropped:
                result.family_flags[_flag_key(k.family, k.spec)] = "slower"
                result.detail += f"; left out {k.name} (eager; compiled with it): {why}"
        # compiled, every checked kernel: a kernel the eager model's host time hid (BERT-base
        # 8x512 on the H200 left its attention, 3x compile's, out at 5.46 ms against 5.32)
        # may still win under torch.compile, which the compile_optimized row measures
        timings = time_variants(loaded.model, input_sets[0], result.usable, run["timing_mode"],
                                do_compile, reference_out=ref, road=road, deadline=deadline,
                                gpu_us=run.get("model_time_us"), compile_kernels=checked,
                                gpu_us_optimized=gpu_opt)
        del ref, input_sets
        _free()
    except Exception as e:
        msg = f"{type(e).__name__}: {' '.join(str(e).split())[:500]}"
        store.add_e2e_check(run_id, "check", "error", None, None, f"integration failed: {msg}",
                            [], {r.family: "unknown" for r in records}, device=device)
        log(f"end-to-end: could not integrate the kept kernels: {msg}")
        return CheckResult("error", None, 0.0, msg)
    ids = {r.name: r.experiment_id for r in records}
    for u in result.kernels_used:
        u["experiment_id"] = ids.get(u["kernel"])
    ship = shipped(timings)
    if ship:
        result.detail += f"; ships: {ship}"
    compiled_in(result.family_flags, [_flag_key(k.family, k.spec) for k in checked], ship)
    store.add_e2e_check(run_id, "check", result.status, result.max_error, result.tolerance,
                        result.detail, result.kernels_used, result.family_flags, timings,
                        device=device)
    skipped = "; ".join(f"{t['variant']}: {', '.join(t['skipped'])}" for t in timings
                        if t.get("skipped"))
    if skipped:
        store.event(run_id, "end-to-end: torch.compile modes skipped, their estimated compile "
                            f"longer than the budget had left: {skipped}", "warn")
    log("end-to-end: " + result.line() + "; " + timing_line(timings))
    return result


def saved_us(records: list, kernels: list) -> float:
    """Device time per forward the ``kernels`` save on their targets: eager reference less best,
    from the run's ``records`` (KernelRecords, matched to the kernels by name)."""
    names = {k.name for k in kernels}
    return sum(max(r.ref_latency_us - r.latency_us, 0.0) for r in records
               if r.name in names and r.ref_latency_us and r.latency_us)


def compiled_in(flags: dict, checked: list[str], ship: str | None) -> dict:
    """Where the shipped variant is the compiled optimized model, a kernel left out of the
    eager one for its host time ("slower") is in what ships: flagged "slower_eager" instead,
    which placement does not skip (``flags`` updated in place and returned)."""
    if ship == "compile_optimized":
        for key in checked:
            if flags.get(key) == "slower":
                flags[key] = "slower_eager"
    return flags


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
    comp = by.get("compile")
    best_opt = min((t["latency_us"] for v, t in by.items() if v in ("optimized", "compile_optimized")
                    and t["latency_us"]), default=None)
    if comp and comp["latency_us"] and best_opt:
        parts.append(f"best optimized/compile {comp['latency_us'] / best_opt:.3g}x")
    ship = shipped(timings)
    if ship:
        parts.append(f"ships {ship}")
    skipped = [t for t in timings if t["latency_us"] is None and t.get("note")]
    if skipped:   # the note's first clause, e.g. "torch.compile skipped under the interpreter"
        parts.append(f"{skipped[0]['variant']}: {skipped[0]['note'].split(':')[0][:100]}")
    if any(t["timing_mode"] == "interpreter" for t in timings):
        parts.append("[interpreter timing]")
    return ", ".join(parts)


def _fmt_us(us: float) -> str:
    return f"{us / 1e6:.3g} s" if us >= 1e6 else f"{us / 1e3:.3g} ms" if us >= 1e3 else f"{us:.3g} us"
