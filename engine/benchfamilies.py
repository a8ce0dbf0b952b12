"""``python -m engine bench``: every kernel family against PyTorch, as one Markdown table per family.

For each family and each of its benchmark shapes (``Family.bench_shapes``; tiny shapes with
``--quick``), one process measures, one run per shape and implementation:

- PyTorch eager: the family's reference, the op models run;
- torch.compile of that reference, modes "default", "max-autotune" and
  "max-autotune-no-cudagraphs" (the ratio to max-autotune takes the faster of the two; skipped,
  with the reason in the table, where torch.compile is unavailable or fails, e.g. without a C
  compiler on a CPU);
- the family's starter kernel (its search space's default point);
- the best kernel the loop found, from a run in the database (``--db``, ``--run``; by default the
  latest run with a kept experiment for the family): the kept experiment with the lowest time at
  that shape, or, for a shape the run never timed, the family's best kept experiment; with the
  number of experiments (its seq in the run) and wall time (its created_at minus the run's) the
  loop took to reach it.

Timing is engine/bench.py's: on a GPU device events around each call, warm-up (compilation and
autotuning happen there), the L2 flushed before every repetition, inputs rotated among fresh sets,
median of many repetitions in three rounds. Ceilings are engine/hw.py's measure_ceilings (copy
bandwidth, bf16 matmul rate); each row reports the share of its roofline, max(bytes / copy rate,
flops / matmul rate), naming the roof that binds ("mem" or "mm"), and the ratios of the best
kernel to eager and to torch.compile max-autotune, the faster of its two variants (> 1: the
kernel is faster).

Without a GPU, kernels run under Triton's interpreter and every figure is an interpreter timing:
the table says so ("interpreter: no GPU figures") and ``--quick`` keeps the shapes tiny; the code
paths are the ones a GPU run takes.

Kernels are loaded into this process: rendered starters, and sources from the database that the
loop's verifier accepted; each passes the engine's static check before it is imported.
"""
from __future__ import annotations

import datetime as _dt
import os
import tempfile
import time
import traceback

# max-autotune captures CUDA graphs, which copy inputs that sit at new addresses into the graph's
# own buffers (this benchmark rotates input sets to keep the L2 cold): an extra read and write per
# call that a model with fixed buffers does not pay. Both variants are timed and the ratio to
# max-autotune uses the faster, so no kernel beats torch.compile by a copy it never needed.
COMPILE_MODES = ("default", "max-autotune", "max-autotune-no-cudagraphs")
MAX_AUTOTUNE = ("max-autotune", "max-autotune-no-cudagraphs")
QUICK_SIZE = 1 << 12          # --quick: shapes of at most this problem_size


def add_arguments(p) -> None:
    """The ``bench`` subcommand's options (engine/cli.py)."""
    p.add_argument("--families", default="all", help="comma-separated family names, or 'all'; "
                   "a family's boolean contract flag after '+' (rmsnorm+residual: the residual "
                   "add fused)")
    p.add_argument("--out", default="docs/benchmarks_families.md", help="Markdown file to write")
    p.add_argument("--db", default=None, help="SQLite file with the loop's runs (default data/runs.db)")
    p.add_argument("--run", default=None, help="run id(s) for the best kernels, comma-separated "
                   "(e.g. one op run per shape; default: per family, the latest run with a kept "
                   "experiment for it)")
    p.add_argument("--dtype", default=None, help="float32 | float16 | bfloat16 (default: bfloat16 "
                   "on a GPU, float32 under the interpreter)")
    p.add_argument("--quick", action="store_true", help="tiny shapes (CPU / smoke test)")
    p.add_argument("--max-shapes", type=int, default=None, help="at most this many shapes per family")
    p.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    p.add_argument("--compile-modes", default=",".join(COMPILE_MODES),
                   help="torch.compile modes to time (default: " + ",".join(COMPILE_MODES) + ")")
    p.add_argument("--append", action="store_true", help="add these families' sections to an "
                   "existing --out file (a benchmark split over several commands)")


class BenchError(ValueError):
    """A usage problem (unknown family, run or dtype); the CLI prints it as one line."""


# ---------------------------------------------------------------------------------------------
# what to measure
# ---------------------------------------------------------------------------------------------

def _family_names(text: str) -> list[tuple[str, dict]]:
    """--families: [(family, contract spec)]; "rmsnorm+residual" is rmsnorm under
    {"residual": true} (boolean flags of a family's configure, e.g. softmax+log)."""
    import kernels
    if text.strip() in ("", "all"):
        return [(n, {}) for n in kernels.FAMILY_NAMES]
    out = []
    for item in (f.strip() for f in text.split(",") if f.strip()):
        name, *flags = item.split("+")
        if name not in kernels.FAMILY_NAMES:
            raise BenchError(f"unknown family {name!r}; known families: {', '.join(kernels.FAMILY_NAMES)}")
        spec = {f: True for f in flags if f}
        try:
            kernels.get(name, spec or None)
        except ValueError as e:
            raise BenchError(f"{item}: {e}") from None
        out.append((name, spec))
    return out


def bench_shapes(fam, quick: bool, max_shapes: int | None) -> list[tuple]:
    """The family's benchmark shapes; with ``quick`` its largest sweep/edge shapes of at most
    QUICK_SIZE (two of them unless max_shapes says otherwise)."""
    if quick:
        small = sorted({tuple(s) for s in fam.sweep_shapes + fam.edge_shapes
                        if fam.problem_size(s) <= QUICK_SIZE}, key=fam.problem_size)
        shapes = small[-(max_shapes or 2):]
    else:
        shapes = [tuple(s) for s in fam.bench_shapes]
        if max_shapes:
            shapes = shapes[:max_shapes]
    return shapes


def run_ids(text: str | None) -> list[str]:
    """--run: one run id, several comma-separated, or none."""
    return [r.strip() for r in (text or "").split(",") if r.strip()]


def best_kernels(store, family: str, run_id: str | None, spec: dict | None = None) -> dict | None:
    """{"run": the first run, "runs": every run used, "kept": their kept experiments with
    source, each with "run_start" (its run's created_at), "best_id": the first run's best} for
    ``family``: from every run ``run_id`` names (one id or several, comma-separated: an op run
    per shape, say), or from the latest run with a kept experiment of it; None without one.
    ``spec``: of the targets with that contract only (rmsnorm's plain and residual norms are
    two targets of one family)."""
    from kernels.patterns import spec_key
    ids = run_ids(run_id)
    runs = [store.get_run(i) for i in ids] if ids else store.list_runs()
    found = None
    for run in runs:
        if run is None:
            continue
        targets = {t["id"]: t for t in store.targets(run["id"]) if t["family"] == family
                   and spec_key(t["spec"]) == spec_key(spec)}
        kept = [dict(e, run_start=run["created_at"])
                for e in store.experiments(run["id"], with_source=True)
                if e["family"] == family and e["state"] == "kept" and e["target_id"] in targets]
        if not kept:
            continue
        if found is None:
            target = next(iter(targets.values()), None)
            best_id = target["best_experiment_id"] if target else None
            found = {"run": run, "runs": [], "kept": [], "best_id": best_id or kept[-1]["id"]}
        found["runs"].append(run)
        found["kept"] += kept
        if not ids:
            break
    return found


def pick_best(found: dict, shape: tuple) -> dict:
    """The kept experiment fastest at ``shape``, or the family's best when none timed it."""
    timed = []
    for e in found["kept"]:
        for row in e.get("shape_times") or []:
            if tuple(row["shape"]) == tuple(shape) and row.get("us"):
                timed.append((row["us"], e["seq"], e))
    if timed:
        return min(timed, key=lambda t: (t[0], t[1]))[2]
    return next(e for e in found["kept"] if e["id"] == found["best_id"])


def activation_found(found: dict | None) -> dict | None:
    """The best kernel of the SwiGLU activation's table: the elementwise kernel (by its act_block)
    of the fastest kept fused_mlp experiment of the "separate" variant; None if the run kept none
    (the "fused" variant has no such kernel: its activation is a GEMM epilogue)."""
    from kernels import fused_mlp
    sep = [e for e in (found or {}).get("kept", [])
           if (e.get("params") or {}).get("variant") == "separate" and e.get("latency_us")]
    if not sep:
        return None
    e = min(sep, key=lambda e: e["latency_us"])
    block = e["params"].get("act_block", fused_mlp.DEFAULT["act_block"])
    src = fused_mlp.ACTIVATION.render({"act_block": block})
    run = next(r for r in found["runs"] if r["id"] == e["run_id"])
    note = (f"Best kernel: the SwiGLU kernel (act_block={block}) of run `{run['id']}`'s "
            f"fastest kept fused_mlp experiment of the \"separate\" variant (#{e['seq']}); the "
            f"loop searched the whole MLP, not this kernel alone.")
    return {"run": run, "runs": [run], "kept": [dict(e, source=src, shape_times=None)],
            "best_id": e["id"], "note": note}


# ---------------------------------------------------------------------------------------------
# loading and timing
# ---------------------------------------------------------------------------------------------

class _Loader:
    """Imports candidate sources from files (Triton reads kernel source through inspect)."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="nightshift-bench-")
        self.cache: dict[str, object] = {}

    def load(self, source: str, arg_names):
        from engine import verify
        h = verify.source_hash(source)
        if h not in self.cache:
            why = verify.static_check(source, tuple(arg_names))
            if why:
                raise RuntimeError(f"static check failed: {why}")
            self.cache[h] = verify.load_candidate(source, self.dir)
        return self.cache[h]


def _compiled(reference, mode: str):
    import torch
    torch._dynamo.reset()      # a fresh graph cache per (shape, mode): no recompilation limits
    return torch.compile(reference, mode=mode, dynamic=False)


def _time(fn, sets, gpu: bool) -> dict:
    from engine import bench
    return bench.time_call(fn, sets, gpu)


def _cell(res) -> str:
    if res is None:
        return "-"
    if isinstance(res, str):
        return res
    return f"{res['us']:.1f}"


def _short(e: BaseException) -> str:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {msg}"[:160]


def measure_family(fam, shapes, dtype: str, gpu: bool, ceilings: dict, loader: _Loader,
                   found: dict | None, modes: list[str], compile_note: list, log) -> list[dict]:
    """One row per shape: eager, torch.compile per mode, starter, best, roofline, ratios."""
    import torch
    from engine import bench
    device = "cuda" if gpu else "cpu"
    tdtype = getattr(torch, dtype)
    l2 = 0
    if gpu:
        l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 * 2**20)
    starter = loader.load(fam.starter(), fam.arg_names)
    rows = []
    for shape in shapes:
        gen = torch.Generator(device=device).manual_seed(1234)
        nbytes, flops = fam.cost(shape, tdtype)
        k = bench.input_set_count(nbytes, l2, gpu)
        sets = [fam.make_inputs(shape, tdtype, device, gen) for _ in range(k)]
        row = {"shape": shape, "bytes": nbytes, "flops": flops, "results": {}}
        # the baselines time what models run (a fused residual norm's contract stacks [h; y]
        # for the judge; the model adds, then normalizes, and stacks nothing)
        impls = [("eager", lambda: fam.baseline_op())]
        for mode in modes:
            impls.append((f"compile:{mode}", lambda m=mode: _compiled(fam.baseline_op(), m)))
        impls.append(("starter", lambda: starter))
        best = pick_best(found, shape) if found else None
        if best is not None:
            impls.append(("best", lambda b=best: loader.load(b["source"], fam.arg_names)))
            row["best_exp"] = best
        for name, make in impls:
            t0 = time.perf_counter()
            try:
                res = _time(make(), sets, gpu)
            except Exception as e:                       # one failing implementation is one cell
                res = "failed: " + _short(e)
                if name.startswith("compile:") and not compile_note:
                    compile_note.append(f"torch.compile unavailable or failed ({_short(e)})")
                if os.environ.get("NIGHTSHIFT_BENCH_DEBUG"):
                    traceback.print_exc()
            row["results"][name] = res
            log(f"  {fam.name} {'x'.join(map(str, shape))} {name}: {_cell(res)}"
                f"{' us' if isinstance(res, dict) else ''} ({time.perf_counter() - t0:.1f} s)")
        if ceilings:
            t_mem = nbytes / (ceilings["copy_gbps"] * 1e3)
            t_mm = flops / (ceilings["matmul_tflops"] * 1e6) if ceilings.get("matmul_tflops") else 0.0
            row["sol_us"], row["roof"] = max(t_mem, t_mm), ("mm" if t_mm > t_mem else "mem")
        rows.append(row)
        del sets
        if gpu:
            torch.cuda.empty_cache()
    return rows


# ---------------------------------------------------------------------------------------------
# the table
# ---------------------------------------------------------------------------------------------

def _us(row, name):
    r = row["results"].get(name)
    return r["us"] if isinstance(r, dict) else None


def max_autotune_us(row) -> float | None:
    """The faster of torch.compile max-autotune with and without CUDA graphs at this row."""
    times = [t for t in (_us(row, f"compile:{m}") for m in MAX_AUTOTUNE) if t]
    return min(times) if times else None


def _ratio(num, den) -> str:
    return f"{num / den:.3g}x" if num and den else "-"


def family_table(fam, rows: list[dict], modes: list[str], found: dict | None) -> list[str]:
    heads = ["shape", "eager (us)"] + [f"compile {m} (us)" for m in modes] + [
        "starter (us)", "best (us)", "best found at", "best / eager", "best / max-autotune",
        "best % of roofline", "starter / eager", "starter / max-autotune", "starter % of roofline"]
    out = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    for row in rows:
        eager, ma = _us(row, "eager"), max_autotune_us(row)
        best, starter = _us(row, "best"), _us(row, "starter")
        exp = row.get("best_exp")
        at = (f"exp {exp['seq']}, {exp['created_at'] - exp['run_start']:.0f} s"
              + (f" of `{exp['run_id']}`" if len(found["runs"]) > 1 else "")
              if exp is not None else "no run")
        sol = row.get("sol_us")

        def pct(t):
            return f"{100 * sol / t:.0f}% ({row['roof']})" if sol and t else "-"

        cells = ["x".join(map(str, row["shape"])), _cell(row["results"].get("eager"))]
        cells += [_cell(row["results"].get(f"compile:{m}")) for m in modes]
        cells += [_cell(row["results"].get("starter")), _cell(row["results"].get("best")), at,
                  _ratio(eager, best), _ratio(ma, best), pct(best),
                  _ratio(eager, starter), _ratio(ma, starter), pct(starter)]
        out.append("| " + " | ".join(cells) + " |")
    return out


def markdown(meta: dict, sections: list[tuple], modes: list[str], header: bool = True) -> str:
    """The header (machine, versions, date, ceilings, notes) and one table per family; without
    ``header`` (appending), the same facts as one line under each family's title."""
    dev = meta["device"]
    if not header:
        lines = []
        for fam, rows, found in sections:
            lines += ["", f"## {_title(fam)}", "",
                      f"Measured {meta['date']} on {dev.get('name', '?')}, torch {dev.get('torch')}, "
                      f"triton {dev.get('triton')}, dtype {meta['dtype']}"
                      + ("; interpreter: no GPU figures" if meta["timing_mode"] == "interpreter" else "")
                      + "".join(f"; {n}" for n in meta.get("notes", [])) + "."]
            lines += _section(fam, rows, found, modes)
        return "\n".join(lines) + "\n"
    lines = ["# Kernel families against PyTorch", "",
             f"- machine: {dev.get('name', '?')} ({dev.get('vendor', '?')}), torch {dev.get('torch')}, "
             f"triton {dev.get('triton')}, python {dev.get('python')}",
             f"- date: {meta['date']}; dtype {meta['dtype']}; "
             f"{'quick (tiny shapes)' if meta['quick'] else 'benchmark shapes'}"]
    ceil = meta.get("ceilings") or {}
    if ceil:
        lines.append(f"- measured ceilings: copy {ceil['copy_gbps']:.0f} GB/s (read + write), "
                     f"bf16 matmul {ceil['matmul_tflops']:.0f} TFLOP/s; roofline = max(bytes / copy "
                     f"rate, flops / matmul rate), (mem) or (mm) names the roof that binds")
    if meta["timing_mode"] == "interpreter":
        lines.append("- **interpreter: no GPU figures.** Kernels ran under Triton's CPU interpreter "
                     "and PyTorch on the CPU; these timings exercise the benchmark, they measure "
                     "nothing about GPU performance")
    else:
        lines.append("- timing: device events, warm-up first, L2 flushed before every repetition, "
                     "inputs rotated, median of three rounds (engine/bench.py)")
    for note in meta.get("notes", []):
        lines.append(f"- {note}")
    lines.append("- \"/ max-autotune\": against the faster of max-autotune with and without CUDA "
                 "graphs (graphs copy inputs that arrive at new addresses, as rotated inputs do)")
    lines.append(f"- times in microseconds per call; ratios > 1: the loop's best kernel is faster; "
                 f"\"best found at\": its experiment number in the run and the run's wall time "
                 f"until then; wall time of this benchmark {meta['wall_s']:.0f} s")
    for fam, rows, found in sections:
        lines += ["", f"## {_title(fam)}", ""] + _section(fam, rows, found, modes)
    return "\n".join(lines) + "\n"


def _title(fam) -> str:
    """A section's title: the family, and its contract where not the plain one."""
    from kernels.patterns import spec_key
    return fam.name + (f" `{spec_key(fam.spec)}`" if fam.spec else "")


def _section(fam, rows, found, modes) -> list[str]:
    lines = [f"{fam.description} `{fam.signature}`"]
    if found and found.get("note"):
        lines.append(found["note"])
    elif found:
        runs = found["runs"]
        what = ", ".join(f"`{r['id']}` ({r['model']})" for r in runs)
        lines.append(f"Best kernels from run{'s' if len(runs) > 1 else ''} {what}, "
                     f"{runs[0]['timing_mode']} timings, {len(found['kept'])} kept experiment(s) "
                     f"of {fam.name}; at each shape the fastest kept kernel timed there.")
    else:
        lines.append(fam.notes.get("no_run", "No run in the database has a kept experiment for "
                                             "this family: starter only."))
    return lines + [""] + family_table(fam, rows, modes, found)


# ---------------------------------------------------------------------------------------------
# entry point
# ---------------------------------------------------------------------------------------------

def main(args, log=print) -> int:
    """Run the benchmark described by ``args`` (see add_arguments); write the Markdown file."""
    import torch

    import kernels
    from engine import hw
    from engine.store import Store, StoreError
    t_start = time.perf_counter()
    names = _family_names(args.families)
    gpu = torch.cuda.is_available()
    if not gpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")   # before the first kernel is defined
        if os.environ.get("TRITON_INTERPRET") != "1":
            raise BenchError("no GPU and TRITON_INTERPRET is not 1: Triton kernels cannot run")
    dtype = args.dtype or ("bfloat16" if gpu else "float32")
    if dtype not in ("float32", "float16", "bfloat16"):
        raise BenchError(f"unknown dtype {dtype!r}; choose float32, float16 or bfloat16")
    modes = [] if args.no_compile else [m.strip() for m in args.compile_modes.split(",") if m.strip()]
    device = hw.detect()
    ceilings = hw.measure_ceilings() if gpu else {}
    if not gpu:
        log("interpreter: no GPU figures (Triton's CPU interpreter; timings exercise the code only)")
    store = None
    try:
        store = Store(args.db, readonly=True)
    except StoreError as e:
        if args.run:
            raise BenchError(str(e)) from None
        log(f"no database ({e}): starters only")
    for rid in run_ids(args.run) if store is not None else []:
        if store.get_run(rid) is None:
            raise BenchError(f"no run {rid!r} in {store.path}")
    loader = _Loader()
    compile_note: list[str] = []
    sections = []
    for name, spec in names:
        fam = kernels.get(name, spec or None)
        shapes = bench_shapes(fam, args.quick, args.max_shapes)
        found = best_kernels(store, name, args.run, spec) if store is not None else None
        log(f"{name}{''.join('+' + f for f in spec)}: {len(shapes)} shape(s), best kernel from "
            f"{('run ' + found['run']['id']) if found else 'no run'}")
        rows = measure_family(fam, shapes, dtype, gpu, ceilings, loader, found, modes,
                              compile_note, log)
        sections.append((fam, rows, found))
        if name == "fused_mlp":        # and its memory-bound part, the activation, timed apart
            from kernels import fused_mlp
            act, act_found = fused_mlp.ACTIVATION, activation_found(found)
            rows = measure_family(act, bench_shapes(act, args.quick, args.max_shapes), dtype, gpu,
                                  ceilings, loader, act_found, modes, compile_note, log)
            sections.append((act, rows, act_found))
    notes = list(compile_note)
    if args.no_compile:
        notes.append("torch.compile not run (--no-compile)")
    meta = {"device": device, "ceilings": ceilings, "dtype": dtype, "quick": args.quick,
            "timing_mode": device["timing_mode"], "notes": notes,
            "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "wall_s": time.perf_counter() - t_start}
    append = getattr(args, "append", False) and os.path.exists(args.out)
    text = markdown(meta, sections, modes, header=not append)
    out_dir = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(out_dir, exist_ok=True)
    with open(args.out, "a" if append else "w") as f:
        f.write(text)
    log(f"wrote {args.out}")
    if store is not None:
        store.close()
    return 0
