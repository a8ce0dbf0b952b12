"""Command line: ``python -m engine run ...`` and ``python -m engine verify ...``.

Exit codes: 0 success (verify: the candidate passed), 1 the candidate was rejected (verify) or the
run failed, 2 a usage error (unknown model or family, malformed shape, missing file, a database
that cannot be written). Errors print one line on stderr; nothing is written half-way.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys

import kernels
from engine.verify import VERIFY_ORDERS


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m engine", description="Nightshift: write, verify and keep faster "
                "Triton kernels for a PyTorch model.")
    sub = p.add_subparsers(dest="cmd", required=True)

    r = sub.add_parser("run", help="profile a model and optimize its kernels")
    r.add_argument("--model", default="llama-tiny", help="built-in name (llama-tiny, gpt2, ...), "
                   "hf:NAME (transformers, small config, random weights), path/to/file.py:Name "
                   "(a module class or function), a KernelBench problem path/to/problem.py, or "
                   "op:FAMILY[:SHAPE][,...] (one operator at a shape, e.g. op:softmax:8192x8192)")
    r.add_argument("--dtype", default="auto", help="auto | float32 | float16 | bfloat16")
    r.add_argument("--input-shape", default=None, help="BATCHxSEQ, e.g. 2x32")
    r.add_argument("--families", default=None, help="comma-separated family names; 'all' adds the generated "
                   "regions (any fusible op chain) to the nine (default: the nine, as found)")
    r.add_argument("--proposer", default="search")
    r.add_argument("--budget-experiments", type=int, default=None)
    r.add_argument("--budget-minutes", type=float, default=None)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--db", default=None, help="SQLite file (default data/runs.db)")
    r.add_argument("--resume", default=None, metavar="RUN", help="resume a run by id")
    r.add_argument("--patience", type=int, default=5)
    r.add_argument("--worker-timeout", type=float, default=300.0, help="seconds per candidate")
    r.add_argument("--n-layer", type=int, default=None, help="override the model's layer count")
    r.add_argument("--verify-order", default="auto", choices=VERIFY_ORDERS,
                   help="full: all five stages before timing; bench-first: time after the smoke "
                        "test, verify further only what beats the best; auto (default): "
                        "bench-first on a GPU, full under the interpreter")
    r.add_argument("--compile-modes", default=None, metavar="MODES",
                   help="torch.compile modes each target's reference is also timed in (the "
                        "faster of eager and the best mode is the baseline), comma-separated, "
                        "or none; default on a GPU: default,max-autotune-no-cudagraphs")
    w = r.add_argument_group("scale-out (docs/scaling.md); default: one local worker")
    w.add_argument("--workers", type=int, default=None, metavar="N",
                   help="evaluate on N workers: a local pool, one per GPU (GPUs 0..N-1); with "
                        "--ray, N Ray actors (default there: one per GPU in the cluster)")
    w.add_argument("--ray", default=None, metavar="ADDRESS", dest="ray_address",
                   help="evaluate on a Ray cluster: auto, HOST:PORT, ray://HOST:10001, or "
                        "local to start one on this machine (needs the ray package)")
    g = r.add_argument_group("LLM proposer (--proposer llm | hybrid); the key comes from the "
                             "provider's environment variable, e.g. OPENAI_API_KEY")
    g.add_argument("--llm-model", default=None, help="litellm model, e.g. openai/gpt-4o, "
                   "anthropic/claude-sonnet-4-5, ollama_chat/qwen2.5-coder, hosted_vllm/NAME")
    g.add_argument("--api-base", default=None, help="URL of a local OpenAI-compatible server, "
                   "e.g. http://127.0.0.1:8000/v1")
    g.add_argument("--in-flight", type=int, default=1, help="model requests outstanding while "
                   "the worker evaluates (default 1: wait for each reply)")
    g.add_argument("--max-tokens", type=int, default=None, help="stop proposing after this many "
                   "prompt + reply tokens in the run")
    g.add_argument("--max-cost", type=float, default=None, help="stop proposing after this many "
                   "US dollars in the run")
    g.add_argument("--price-in", type=float, default=None, help="USD per million prompt tokens "
                   "(default: litellm's price table; 0 for local models)")
    g.add_argument("--price-out", type=float, default=None, help="USD per million reply tokens")
    g.add_argument("--llm-timeout", type=float, default=180.0, help="seconds per request")
    g.add_argument("--llm-retries", type=int, default=3, help="retries after a timeout, 429, "
                   "5xx or lost connection")

    v = sub.add_parser("verify", help="judge one candidate file; prints one JSON object")
    v.add_argument("--family", required=True, help="a family name; a contract flag after '+' "
                   "(cross_entropy+linear: the LM head fused in, rmsnorm+residual)")
    v.add_argument("--candidate", required=True, help="path to a .py file defining kernel_fn")
    v.add_argument("--dtype", default=None, help="float32 | float16 | bfloat16")
    v.add_argument("--shape", action="append", default=None,
                   help="main input shape like 64x1024 (repeatable); default a family shape")
    v.add_argument("--seed", type=int, default=0)
    v.add_argument("--timeout", type=float, default=300.0)
    v.add_argument("--no-time", action="store_true", help="verify only, skip timing")

    lb = sub.add_parser("llm-bench", help="experiments per hour of the LLM proposer against a "
                        "scripted local server, with 1 and with N requests in flight")
    lb.add_argument("--delay", type=float, action="append", default=None,
                    help="seconds the server takes per reply (repeatable; default 2)")
    lb.add_argument("--in-flight", default="1,4", help="comma-separated values to compare")
    lb.add_argument("--experiments", type=int, default=6, help="experiments per loop run")
    lb.add_argument("--out", default=None, help="also write the Markdown table to this file")

    sc = sub.add_parser("scaling", help="experiments per hour with 1..N workers (local pool, "
                        "Ray) and the loop's serial costs, as Markdown")
    from engine.scalebench import add_arguments as scaling_arguments
    scaling_arguments(sc)
    from engine.benchfamilies import add_arguments as bench_arguments
    bench_arguments(sub.add_parser("bench", help="every family against PyTorch eager and "
                                   "torch.compile, with the loop's best kernels: Markdown"))

    rp = sub.add_parser("report", help="a run as Markdown (targets, per-shape results, machine)")
    rp.add_argument("run", help="run id, or 'latest'")
    rp.add_argument("--db", default=None)
    rp.add_argument("--out", default=None, help="write to this file instead of stdout")

    e2 = sub.add_parser("e2e", help="check and time a run's optimized model end to end again "
                        "(eager, optimized, torch.compile, compile of the optimized model)")
    e2.add_argument("run", help="run id, or 'latest'")
    e2.add_argument("--db", default=None)
    e2.add_argument("--compile", choices=("auto", "on", "off"), default="auto",
                    help="time torch.compile too (auto: on a GPU, not under the interpreter; "
                         "the best of default, reduce-overhead and max-autotune with and without "
                         "CUDA graphs, or the one mode --compile-mode names)")
    e2.add_argument("--compile-mode", default=None, metavar="MODE",
                    help="time torch.compile in this one mode only, on both sides: default, "
                         "reduce-overhead, max-autotune-no-cudagraphs or max-autotune (default: "
                         "the best of all four; NIGHTSHIFT_COMPILE_MODE does the same for any command)")

    ex = sub.add_parser("export", help="a run's kept kernels as an importable package with "
                        "apply(model) (needs torch and triton only)")
    ex.add_argument("run", help="run id, or 'latest'")
    ex.add_argument("--out", required=True, help="folder to write the package into")
    ex.add_argument("--db", default=None)
    ex.add_argument("--name", default="nightshift_kernels", help="package name")
    ex.add_argument("--force", action="store_true", help="replace an existing package")

    kb = sub.add_parser("kernelbench", help="optimize KernelBench problem files and report fast_p")
    kb.add_argument("dir", help="folder of problem files (its level<N>/ subfolder if present)")
    kb.add_argument("--level", type=int, default=1)
    kb.add_argument("--match", default="*.py", help="glob(s) of the problem files to run, "
                    "comma-separated, e.g. '1_*.py' or '23_*.py,24_*.py,36_*.py'")
    kb.add_argument("--budget-experiments", type=int, default=8, help="experiments per problem")
    kb.add_argument("--budget-minutes", type=float, default=None,
                    help="minutes per problem, its end-to-end timing included")
    kb.add_argument("--families", default=None)
    kb.add_argument("--dtype", default="auto")
    kb.add_argument("--trials", type=int, default=5, help="fresh inputs for correctness")
    kb.add_argument("--seed", type=int, default=0)
    kb.add_argument("--patience", type=int, default=5)
    kb.add_argument("--worker-timeout", type=float, default=300.0)
    kb.add_argument("--db", default=None)
    kb.add_argument("--out", default=None, help="also write the Markdown report to this file "
                    "(and every problem's row to its .jsonl, as each finishes)")
    kb.add_argument("--every", type=int, default=None,
                    help="only the problems whose number is a multiple of this (a fixed sample)")
    kb.add_argument("--resume", action="store_true",
                    help="skip the problems --out's .jsonl already holds")
    kb.add_argument("--stop-after-minutes", type=float, default=None,
                    help="start no problem that would not end within this many minutes of the "
                    "command's start (with --budget-minutes; the rest is left for --resume)")
    kb.add_argument("--min-run-minutes", type=float, default=None,
                    help="raise a problem's --budget-minutes where the scoring's estimate "
                    "(torch.compile of the original in every mode) would leave its run less")
    return p


def _shape(text: str) -> list[int]:
    try:
        dims = [int(x) for x in text.lower().replace(",", "x").split("x")]
    except ValueError:
        raise UsageError(f"malformed shape {text!r}; write it like 64x1024") from None
    if not dims or any(d <= 0 for d in dims):
        raise UsageError(f"malformed shape {text!r}; every dimension must be a positive integer")
    return dims


def cmd_run(a) -> int:
    from engine.loop import ConfigError, RunConfig, execute
    from engine.store import StoreError, check_writable
    compile_mode()
    budget = a.budget_experiments
    if budget is None and a.budget_minutes is None and not a.resume:
        budget = 40
    cfg = RunConfig(model=a.model, dtype=a.dtype, input_shape=a.input_shape,
                    families=kernels.parse_families(a.families),
                    proposer=a.proposer, budget_experiments=budget,
                    budget_minutes=a.budget_minutes, seed=a.seed, db=a.db, patience=a.patience,
                    worker_timeout_s=a.worker_timeout,
                    model_overrides={"n_layer": a.n_layer} if a.n_layer else {},
                    llm_model=a.llm_model, api_base=a.api_base, max_in_flight=a.in_flight,
                    max_tokens_total=a.max_tokens, max_cost_usd=a.max_cost,
                    price_in_per_mtok=a.price_in, price_out_per_mtok=a.price_out,
                    llm_timeout_s=a.llm_timeout, llm_retries=a.llm_retries,
                    workers=a.workers, ray_address=a.ray_address, verify_order=a.verify_order,
                    compile_modes=(None if a.compile_modes is None else
                                   [m.strip() for m in a.compile_modes.split(",")
                                    if m.strip() and m.strip() != "none"]))
    try:
        cfg.validate()
        check_writable(a.db)   # fails here, before any work, and creates nothing
    except (ConfigError, StoreError) as e:
        raise UsageError(str(e)) from None
    # SIGTERM stops the run as Ctrl-C does: it ends "stopped", resumable, its worker gone
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        execute(cfg, resume_run_id=a.resume, log=lambda s: print(s, flush=True))
    except (ConfigError, StoreError) as e:
        raise UsageError(str(e)) from None
    except KeyboardInterrupt:
        print("stopped; resume with --resume RUN", file=sys.stderr)
        return 130
    return 0


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def cmd_verify(a) -> int:
    import kernels
    from engine import verify
    from engine.worker import Worker, WorkerDied
    from engine.benchfamilies import BenchError, _family_names
    spec = {}
    try:
        if "+" in a.family and "," not in a.family:      # a contract flag: rmsnorm+residual
            (name, spec), = _family_names(a.family)
            fam = kernels.get(name, spec)
        else:
            fam = kernels.get(a.family)
    except (kernels.UnknownFamily, BenchError) as e:
        raise UsageError(str(e)) from None
    if not os.path.isfile(a.candidate):
        raise UsageError(f"no such candidate file: {a.candidate}")
    if a.dtype is not None and a.dtype not in fam.dtypes:
        raise UsageError(f"unknown dtype {a.dtype!r}; choose one of {', '.join(fam.dtypes)}")
    shapes = [_shape(s) for s in a.shape] if a.shape else None
    with open(a.candidate, encoding="utf-8", errors="replace") as f:
        source = f.read()
    import torch
    gpu = torch.cuda.is_available()
    dtype = a.dtype or ("bfloat16" if gpu else "float32")
    if shapes is None:
        shapes = [list(fam.bench_shapes[0])] if gpu else [list(fam.sweep_shapes[4])]
    out = {"family": fam.name, **({"spec": spec} if spec else {}), "candidate": a.candidate, "dtype": dtype,
           "timing_mode": "gpu" if gpu else "interpreter"}
    reason = verify.static_check(source, fam.arg_names)
    if reason:
        out.update(passed=False, failed_stage="static", error=reason,
                   stages=[{"name": "static", "status": "failed", "detail": reason}] +
                   [{"name": s, "status": "skipped", "detail": "static check failed"}
                    for s in verify.STAGES])
        print(json.dumps(out, indent=1))
        return 1
    w = Worker(interpret=not gpu)
    try:
        w.start()
        r = w.request({"op": "evaluate", "family": fam.name, "spec": spec or None,
                       "source": source, "dtype": dtype,
                       "shapes": [{"shape": s, "count": 1} for s in shapes], "seed": a.seed,
                       "time": not a.no_time}, timeout_s=a.timeout)
    except WorkerDied as e:
        from engine.loop import _died
        r = _died(e)
    finally:
        w.close()
    if "stages" not in r:
        raise RuntimeError(r.get("error", "worker failed"))
    stages = [{"name": "static", "status": "passed", "detail": ""}] + [
        {"name": s["stage"], "status": s["status"], "detail": s.get("detail", ""),
         "worst_error": s.get("worst_error"), "failed_case": s.get("failed_case")}
        for s in r["stages"]]
    out.update(passed=not r["failed_stage"], failed_stage=r["failed_stage"], error=r["error"],
               stages=stages)
    if r.get("timing"):
        out["timing"] = r["timing"]
        if not gpu:
            out["timing"]["note"] = "interpreter timing: not GPU performance"
    print(json.dumps(out, indent=1, default=str))
    return 0 if out["passed"] else 1


def cmd_report(a) -> int:
    from engine.report import run_markdown
    from engine.store import Store, StoreError
    try:
        store = Store(a.db, readonly=True)
    except StoreError as e:
        raise UsageError(str(e)) from None
    runs = store.list_runs()
    run_id = runs[0]["id"] if a.run == "latest" and runs else a.run
    if store.get_run(run_id) is None:
        raise UsageError(f"no run {a.run!r} in {store.path}")
    text = run_markdown(store, run_id)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    else:
        print(text, end="")
    return 0


def compile_mode(flag: str | None = None) -> None:
    """The one torch.compile mode the end-to-end stage times (``--compile-mode``, else
    NIGHTSHIFT_COMPILE_MODE), set for this process and the stage's own; a name torch.compile does
    not know is a usage error here, not a failed compile in every timing row."""
    from engine import integrate
    mode = flag or os.environ.get("NIGHTSHIFT_COMPILE_MODE", "")
    if mode and mode not in integrate.COMPILE_MODES:
        given = f"--compile-mode {mode!r}" if flag else f"NIGHTSHIFT_COMPILE_MODE={mode!r}"
        raise UsageError(f"{given} is not a torch.compile mode: use one of "
                         f"{', '.join(integrate.COMPILE_MODES)}, or none for the best of all")
    if flag:
        os.environ["NIGHTSHIFT_COMPILE_MODE"] = flag     # the isolated stage reads it too
    integrate.COMPILE_MODE = mode


def cmd_e2e(a) -> int:
    """finish_run again on a stored run: a new check and timing row set, the older ones kept."""
    from engine import integrate
    from engine.report import end_to_end_markdown
    from engine.store import Store, StoreError
    compile_mode(a.compile_mode)
    try:
        store = Store(a.db)
    except StoreError as e:
        raise UsageError(str(e)) from None
    runs = store.list_runs()
    run_id = runs[0]["id"] if a.run == "latest" and runs else a.run
    run = store.get_run(run_id)
    if run is None:
        raise UsageError(f"no run {a.run!r} in {store.path}")
    if run["timing_mode"] == "gpu" and not _cuda():
        raise UsageError(f"run {run_id} was timed on a GPU and this machine has none")
    do_compile = {"auto": None, "on": True, "off": False}[a.compile]
    result = integrate.finish_run(store, run_id, log=lambda s: print(s, flush=True),
                                  do_compile=do_compile)
    if result is None:
        print(f"run {run_id} kept no kernel: nothing to integrate")
        return 0
    print(end_to_end_markdown(store, run_id), end="")
    return 0 if result.status != "error" else 1


def _cuda() -> bool:
    import torch
    return torch.cuda.is_available()


def cmd_bench(a) -> int:
    from engine.benchfamilies import BenchError, main as bench_main
    try:
        return bench_main(a, log=lambda s: print(s, flush=True))
    except BenchError as e:
        raise UsageError(str(e)) from None


def cmd_export(a) -> int:
    from engine.export import ExportError, cmd_export as run_export
    try:
        return run_export(a)
    except ExportError as e:
        raise UsageError(str(e)) from None
    except OSError as e:
        raise UsageError(f"cannot write the package to {a.out}: {e.strerror or e}") from None


def cmd_kernelbench(a) -> int:
    from engine.kernelbench import KernelBenchError, cmd_kernelbench as run_kb
    try:
        return run_kb(a, log=lambda s: print(s, flush=True))
    except KernelBenchError as e:
        raise UsageError(str(e)) from None


def cmd_scaling(a) -> int:
    from engine.scalebench import ScalingError, main as scaling_main
    try:
        return scaling_main(a, log=lambda s: print(s, flush=True))
    except ScalingError as e:
        raise UsageError(str(e)) from None


def main(argv=None) -> int:
    try:
        a = _parser().parse_args(argv)
        if a.cmd == "bench":
            return cmd_bench(a)
        if a.cmd == "llm-bench":
            from engine.llmbench import cmd_llm_bench
            return cmd_llm_bench(a)
        return {"run": cmd_run, "verify": cmd_verify, "report": cmd_report, "export": cmd_export,
                "kernelbench": cmd_kernelbench, "scaling": cmd_scaling,
                "e2e": cmd_e2e}[a.cmd](a)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
