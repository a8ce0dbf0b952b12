"""The judge on what it must accept: every family's starter and every kernel a recorded run kept,
verified again through the sandboxed worker and the judge (all five stages, at each kernel's own
target shapes and dtype). A correct kernel rejected here is a false reject.

    python -m engine.judgebench --db data/recorded_h200.db --db data/recorded_h200_hopper.db \
        --workers 4 --out docs/judge_reverify.md

Prints one line per kernel and writes a Markdown table. Several workers share one GPU (nothing
is timed: only verdicts are compared).
"""
from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import kernels
from engine.worker import Worker, WorkerDied


def kept_kernels(db_paths: list[str]) -> list[dict]:
    """Distinct kept sources with their targets' dtype and shapes, oldest first."""
    seen, out = set(), []
    for path in db_paths:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        con.row_factory = sqlite3.Row
        rows = con.execute(
            "SELECT e.id, e.family, e.source, e.source_hash, t.dtype, t.shapes FROM experiments e "
            "JOIN targets t ON t.id = e.target_id WHERE e.state = 'kept' ORDER BY e.id").fetchall()
        for r in rows:
            key = (r["family"], r["source_hash"], r["dtype"], r["shapes"])
            if key in seen:
                continue
            seen.add(key)
            out.append({"what": f"{Path(path).name} #{r['id']}", "family": r["family"],
                        "source": r["source"], "dtype": r["dtype"],
                        "shapes": json.loads(r["shapes"])})
        con.close()
    return out


def starters(dtype: str, gpu: bool) -> list[dict]:
    out = []
    for fam in kernels.all_families():
        shape = fam.bench_shapes[0] if gpu else fam.sweep_shapes[min(4, len(fam.sweep_shapes) - 1)]
        out.append({"what": "starter", "family": fam.name, "source": fam.starter(),
                    "dtype": dtype, "shapes": [{"shape": list(shape), "count": 1}]})
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m engine.judgebench")
    p.add_argument("--db", action="append", default=[], help="recorded database (repeatable)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--limit", type=int, default=None, help="at most this many kernels")
    p.add_argument("--out", default=None)
    p.add_argument("--no-starters", action="store_true", help="only the recorded kernels")
    p.add_argument("--only", action="append", default=[],
                   help="only this kernel, as the table names it ('recorded_h200.db #12'; repeatable)")
    a = p.parse_args(argv)
    import torch
    gpu = torch.cuda.is_available()
    todo = ([] if a.no_starters else starters("bfloat16" if gpu else "float32", gpu)) + \
        kept_kernels(a.db)
    if a.only:
        todo = [t for t in todo if t["what"] in a.only]
        missing = set(a.only) - {t["what"] for t in todo}
        if missing:
            print(f"no kept kernel named {', '.join(sorted(missing))}", file=sys.stderr)
            return 2
    todo = todo[:a.limit] if a.limit else todo
    print(f"{len(todo)} kernels, {a.workers} workers, {'gpu' if gpu else 'interpreter'}",
          flush=True)
    free: list[Worker] = []
    lock = threading.Lock()
    box = None
    for i in range(a.workers):
        w = Worker(interpret=not gpu, name=f"w{i}", fresh_retime=False)
        hello = w.start()
        box = hello.get("sandbox")
        free.append(w)

    def judge(item):
        with lock:
            w = free.pop()
        t0 = time.monotonic()
        try:
            r = w.request({"op": "evaluate", "family": item["family"], "source": item["source"],
                           "dtype": item["dtype"], "shapes": item["shapes"], "seed": 11,
                           "time": False}, timeout_s=a.timeout)
            if r.get("restart"):
                w.restart()
            res = dict(item, failed_stage=r["failed_stage"], error=r["error"],
                       stages=[s["status"] for s in r["stages"]])
        except WorkerDied as e:
            w.restart()
            res = dict(item, failed_stage=e.stage or "worker", error=str(e)[:300], stages=[])
        except Exception as e:          # recorded with the kernel; the others go on
            w.restart()
            res = dict(item, failed_stage="judge", error=f"{type(e).__name__}: {str(e)[:300]}",
                       stages=[])
        res["seconds"] = time.monotonic() - t0
        with lock:
            free.append(w)
        line = (f"{res['what']:<34} {res['family']:<13} {res['dtype']:<9} "
                f"{'passed' if not res['failed_stage'] else 'FAILED at ' + res['failed_stage']}"
                f" {res['seconds']:6.1f} s")
        print(line + ("" if not res["failed_stage"] else f"  {res['error'][:200]}"), flush=True)
        return res

    t0 = time.monotonic()
    with ThreadPoolExecutor(a.workers) as ex:
        results = list(ex.map(judge, todo))
    wall = time.monotonic() - t0
    for w in free:
        w.close()
    ok = sum(1 for r in results if not r["failed_stage"])
    summary = (f"{ok} of {len(results)} passed all five stages ({wall:.0f} s, {a.workers} "
               f"workers; sandbox mode {box.get('mode') if box else '?'})")
    print(summary, flush=True)
    if a.out:
        lines = ["# Re-verified through the judge and the sandbox\n", summary + "\n",
                 "| kernel | family | dtype | shapes | verdict | seconds |", "|---|---|---|---|---|---|"]
        for r in results:
            shapes = "; ".join("x".join(str(d) for d in s["shape"]) for s in r["shapes"])
            verdict = "passed" if not r["failed_stage"] else (
                f"failed at {r['failed_stage']}: {r['error'][:120]}".replace("|", "/"))
            lines.append(f"| {r['what']} | {r['family']} | {r['dtype']} | {shapes} | {verdict} | "
                         f"{r['seconds']:.1f} |")
        Path(a.out).write_text("\n".join(lines) + "\n")
    return 0 if ok == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
