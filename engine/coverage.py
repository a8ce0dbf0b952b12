"""``python -m engine.coverage DIR --level N``: how much of each KernelBench problem gets a target.

For every problem file of the level (engine/kernelbench.py's ``problem_files``): build the model
(shapes shrunk until its parameters and inputs fit ``--max-elems`` on the CPU: the problem's
module-level sizes, and lists of them such as an MLP's layer widths, are halved, largest
first, kernel sizes and strides left alone), capture its forward, match the families,
extract the regions (engine/regions.py) and profile it node by node (engine/profile.py). A
problem is **covered** when the targets (family contracts and regions) hold at least
``--need`` of its profiled time; its row names the targets and, when it is not covered, the
op holding most of what is left and why no target takes it.

``--verify K``: the starter of every region target of every K-th problem (by number) goes
through the five stages under the interpreter (engine/verify.py's in-process ``Verifier`` at
the shrunk shape): the row says how many passed.

This measures coverage on the CPU only; times are CPU self times of aten ops, whose split
between ops differs from a GPU's. Nothing of a problem is run twice in one process: each
problem's module is imported fresh.
"""
from __future__ import annotations

import argparse
import json
import math
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

MAX_ELEMS = 1 << 22         # parameters + inputs (elements) a shrunk problem may hold
MAX_TAPS = 256              # convolutions with more taps per output take minutes interpreted
VERIFY_BUDGET_S = 90        # interpreted verification a problem gets (its later regions wait)
_FIXED_NAMES = ("kernel", "stride", "pad", "dilation", "group", "head", "layer", "block",
                "expansion", "scale", "factor", "dim", "level")   # looked at, shrunk last


@dataclass
class Coverage:
    problem: str
    status: str = "ok"                 # ok | error
    covered: bool = False
    fraction: float = 0.0              # of the profiled time, in targets (families + regions)
    family_fraction: float = 0.0
    region_fraction: float = 0.0
    targets: list = field(default_factory=list)      # "family" / region names, most time first
    regions: int = 0                   # region targets
    shrunk: dict = field(default_factory=dict)       # module sizes changed: name -> [was, now]
    left: str = ""                     # the op holding most of the uncovered time, and why
    verified: str = ""                 # "3/3 starters pass five stages" (sampled problems)
    seconds: float = 0.0
    detail: str = ""


# ---- building a problem at a size the CPU holds ------------------------------------------------

def _sizes(tree) -> dict:
    """Top-level ``NAME = <int>`` assignments of a problem file, and lists or tuples of int
    literals (level 3's ``layer_sizes = [16384, 16384]``, ``[1024] * 16``): key -> (value,
    first line, last line, entries). A list is one key, ``NAME[]``, its largest entry (halving
    it halves every entry), with entries (its ints, its brackets); an int's entries are None."""
    import ast
    out = {}
    known: dict = {}
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)):
            continue
        name = node.targets[0].id
        vals = _int_list(node.value)
        if vals is not None:
            e = node.value.left if isinstance(node.value, ast.BinOp) else node.value
            if max(vals) > 1:
                out[f"{name}[]"] = (max(vals), node.lineno, node.end_lineno,
                                    (vals, "()" if isinstance(e, ast.Tuple) else "[]"))
            continue
        v = _const_int(node.value, known)
        if v is not None and v > 1:
            known[name] = v
            out[name] = (v, node.lineno, node.end_lineno, None)
    return out


def _int_list(e) -> list | None:
    """The ints of a list or tuple of int literals, or of ``[<int>, ...] * <int>``; else None."""
    import ast
    if isinstance(e, ast.BinOp) and isinstance(e.op, ast.Mult):
        vals, n = _int_list(e.left), _const_int(e.right, {})
        return vals * n if vals is not None and n is not None and 0 < n <= 4096 else None
    if not isinstance(e, (ast.List, ast.Tuple)) or not e.elts:
        return None
    vals = [x.value if isinstance(x, ast.Constant) else None for x in e.elts]
    if all(isinstance(v, int) and not isinstance(v, bool) for v in vals):
        return vals
    return None


def _const_int(e, known: dict):
    """The int an expression of literals, earlier sizes and + - * // ** is, else None
    (``M = 16384 * 4``, ``dim = 2 * hidden``)."""
    import ast
    if isinstance(e, ast.Constant):
        return e.value if isinstance(e.value, int) and not isinstance(e.value, bool) else None
    if isinstance(e, ast.Name):
        return known.get(e.id)
    if isinstance(e, ast.BinOp):
        a, b = _const_int(e.left, known), _const_int(e.right, known)
        if a is None or b is None:
            return None
        ops = {ast.Add: lambda: a + b, ast.Sub: lambda: a - b, ast.Mult: lambda: a * b,
               ast.FloorDiv: lambda: a // b if b else None, ast.Pow: lambda: a ** b if b < 64 else None}
        f = ops.get(type(e.op))
        return f() if f else None
    return None


def _module(path: Path, text: str):
    """The problem's module from (edited) source text: sizes derived from others (a bias shape
    from the channel count) follow the edit."""
    import types
    mod = types.ModuleType(f"kb_{path.stem}")
    mod.__file__ = str(path)
    exec(compile(text, str(path), "exec"), mod.__dict__)
    return mod


def _elems(module) -> int | None:
    """Elements the problem holds at its module's sizes: parameters + inputs, or an eighth of
    everything its forward writes when that is more (a [32768, 64] @ [64, 32768] makes 4 GB);
    measured on the meta device, forward included. None when it cannot be built or run there
    (a size another one must divide, a norm shape that matched a dim by coincidence)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Written(TorchDispatchMode):
        total = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in (out if isinstance(out, (tuple, list)) else (out,)):
                if isinstance(t, torch.Tensor):
                    Written.total += t.numel()
            return out
    try:
        with torch.device("meta"):
            model = module.Model(*module.get_init_inputs()).eval()
            inputs = module.get_inputs()
            inputs = [t.to("meta") if isinstance(t, torch.Tensor) else t for t in inputs]
            with torch.no_grad(), Written():
                model(*inputs)
        n = sum(p.numel() for p in model.parameters()) + sum(b.numel() for b in model.buffers())
        n += sum(t.numel() for t in inputs if isinstance(t, torch.Tensor))
        return max(n, Written.total // 8)
    except Exception:
        return None


def shrink(path: Path, max_elems: int):
    """(module, {name: [was, now]}): the problem with its module-level size constants halved,
    largest first, until it holds at most ``max_elems`` elements; names that read like kernel
    sizes, strides or counts go last, and a halving the problem cannot be built with is undone."""
    import ast
    text = path.read_text()
    lines = text.split("\n")
    sizes = _sizes(ast.parse(text))
    now = {k: v for k, (v, *_) in sizes.items()}

    def edited():
        out = list(lines)
        for k, (v, ln, end, entries) in sizes.items():
            if now[k] == v:
                continue
            if entries:                          # a list: every entry scaled as its largest
                vals, br = entries
                vals = [max(1, x * now[k] // v) for x in vals]
                inner = ", ".join(str(x) for x in vals) + ("," if br == "()" and len(vals) == 1 else "")
                out[ln - 1] = f"{k[:-2]} = {br[0]}{inner}{br[1]}"
            else:
                out[ln - 1] = f"{k} = {now[k]}"
            for i in range(ln, end):
                out[i] = ""
        return "\n".join(out)
    module = _module(path, text)
    n = _elems(module)
    frozen: set = set()
    for _ in range(64):
        if n is None or n <= max_elems:
            break
        cand = {k: v for k, v in now.items() if k not in frozen and v >= 4}
        if not cand:
            break
        plain = {k: v for k, v in cand.items() if not any(f in k.lower() for f in _FIXED_NAMES)}
        pick = max(plain or cand, key=lambda k: (cand[k] >= 16, cand[k]))
        was = now[pick]
        now[pick] = max(1, was // 2)
        trial = _module(path, edited())
        m = _elems(trial)
        if m is None:
            now[pick] = was                      # a size some other size must divide: keep it
            frozen.add(pick)
            continue
        module, n = trial, m
    return module, {k: [v, now[k]] for k, (v, *_) in sizes.items() if now[k] != v}


def load_problem(path: Path, max_elems: int):
    """(model, inputs, shrunk) of a problem file, eval mode, fp32, on the CPU."""
    module, shrunk = shrink(path, max_elems)
    torch.manual_seed(0)
    model = module.Model(*module.get_init_inputs()).eval()
    torch.manual_seed(1)
    inputs = tuple(module.get_inputs())
    return model, inputs, shrunk


# ---- one problem -------------------------------------------------------------------------------

def cover(path: Path, need: float, max_elems: int, verify: bool) -> Coverage:
    from engine import capture, match, regions
    from engine import profile as profiler
    t0 = time.monotonic()
    res = Coverage(problem=path.name)
    try:
        model, inputs, res.shrunk = load_problem(path, max_elems)
        with torch.no_grad():
            model(*inputs)                       # it runs at these sizes
        cap = capture.capture(model, inputs)
        if not cap.ok:
            res.status, res.left = "ok", f"not captured: {cap.note[:200]}"
            return res
        matches = {g.index: match.find(g) for g in cap.graphs}
        found = {g.index: regions.find(g, matches[g.index]) for g in cap.graphs}
        regs = {gi: f.regions for gi, f in found.items()}
        gp = profiler.profile_graph(cap, matches, warmup=1, iters=2, regions=regs)
        rows = {r.family: r for r in gp.result.families}
        total = sum(r.time_us for r in gp.result.families) or 1.0
        fam = sum(t.time_us for t in gp.targets if t.family != "region")
        reg = sum(t.time_us for t in gp.targets if t.family == "region")
        res.family_fraction, res.region_fraction = fam / total, reg / total
        res.fraction = res.family_fraction + res.region_fraction
        res.covered = res.fraction >= need
        res.targets = [t.label or t.family for t in gp.targets][:12]
        res.regions = sum(1 for t in gp.targets if t.family == "region")
        other = rows.get("other")
        unplaced = gp.unplaced
        if other is not None and other.top_ops:
            top = other.top_ops[0]
            why = _why(top["name"], found, cap)
            res.left = f"{top['name'].removeprefix('aten::')} {top['time_us'] / total:.0%}: {why}"
        elif unplaced:
            u = unplaced[0]
            res.left = f"{u['family']} {u['time_us'] / total:.0%}: {u['why']}"
        if verify:
            res.verified = _verify(gp.targets)
    except Exception as e:
        res.status = "error"
        res.detail = f"{type(e).__name__}: {str(e)[:300]}"
        res.left = res.detail[:200]
        if isinstance(e, KeyboardInterrupt):
            raise
        traceback.print_exc()
    finally:
        res.seconds = time.monotonic() - t0
    return res


def _why(op: str, found: dict, cap) -> str:
    """Why no region holds the nodes of aten op ``op`` (the first left-out reason for it)."""
    name = op.removeprefix("aten::")
    for f in found.values():
        for left in f.left:
            t = left.node.target
            if getattr(t, "_opname", getattr(t, "__name__", "")) == name:
                return left.why
    return "outside every node (Python between graphs, or a kernel no node launched)"


def _verify(targets) -> str:
    """Each region target's starter through the five stages (interpreter, in process)."""
    import tempfile
    import kernels
    from engine import verify as V
    V.install_launch_counter()
    from kernels.region import _conv_taps as R_taps
    ok, n, fails, skipped = 0, 0, [], 0
    tmp = tempfile.mkdtemp()
    t0 = time.monotonic()
    for t in targets:
        if t.family != "region":
            continue
        n += 1
        if time.monotonic() - t0 > VERIFY_BUDGET_S:
            fails.append(f"{t.label}: not run (the problem's {VERIFY_BUDGET_S} s for it spent)")
            continue
        cv = t.spec.get("conv")
        if cv and R_taps(cv) > MAX_TAPS:
            n -= 1
            skipped += 1
            continue
        try:
            fam = kernels.get("region", json.loads(json.dumps(t.spec)))
            src = fam.starter()
            why = V.static_check(src, fam.arg_names)
            if why:
                fails.append(f"{t.label}: static: {why[:80]}")
                continue
            fn = V.load_candidate(src, tmp)
            # the interpreter runs every program in Python: the real shape halved to 2^15; a
            # convolution (every tap of every program in Python) at its smallest odd input
            shape = list(t.shapes[0]["shape"])
            if fam.spec.get("conv"):
                shape = list(fam.sweep_shapes[0])
            while math.prod(shape) > 1 << 15:
                i = max(range(len(shape)), key=lambda k: shape[k])
                shape[i] = (shape[i] + 1) // 2
            if fam.spec.get("split"):
                d, g = fam.spec["split"]
                shape[d] = max(g, shape[d] // g * g)
            v = V.Verifier(fam, {"dtype": "float32", "shapes": [{"shape": shape}]}, "cpu", True)
            for st in V.STAGES:
                r = v.run_stage(fn, st)
                if r.status != "passed":
                    fails.append(f"{t.label}: {st}: {r.detail[:100]}")
                    break
            else:
                ok += 1
        except Exception as e:
            fails.append(f"{t.label}: {type(e).__name__}: {str(e)[:100]}")
    return (f"{ok}/{n}" + (f" ({'; '.join(fails[:2])})" if fails else "")
            + (f", {skipped} convolution(s) of > {MAX_TAPS} taps not run" if skipped else ""))


# ---- the table ---------------------------------------------------------------------------------

def markdown(level: int, rows: list[Coverage], need: float) -> str:
    cov = sum(1 for r in rows if r.covered)
    out = [f"### Level {level}: {cov} of {len(rows)} problems covered "
           f"({cov / max(len(rows), 1):.0%}; targets hold >= {need:.0%} of the profiled time)", "",
           "| problem | covered | in targets (families + regions) | targets | left (op, share, why) | starters verified |",
           "|---|---|---|---|---|---|"]
    for r in rows:
        tg = ", ".join(r.targets[:5]) + (" ..." if len(r.targets) > 5 else "")
        out.append(f"| {r.problem} | {'yes' if r.covered else 'no'} | {r.fraction:.0%} "
                   f"({r.family_fraction:.0%} + {r.region_fraction:.0%}) | {tg or '-'} | "
                   f"{(r.left if not r.covered else '') or '-'} | {r.verified or '-'} |")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    from engine.kernelbench import problem_files
    p = argparse.ArgumentParser(prog="python -m engine.coverage", description=__doc__.split("\n")[0])
    p.add_argument("dir", help="KernelBench's folder of levels (level1/, level2/, ...)")
    p.add_argument("--level", type=int, required=True)
    p.add_argument("--match", default="*.py", help="problem files (globs, comma-separated)")
    p.add_argument("--need", type=float, default=0.5, help="share of the time targets must hold")
    p.add_argument("--max-elems", type=int, default=MAX_ELEMS)
    p.add_argument("--verify", type=int, default=0,
                   help="verify region starters of every K-th problem (0: none)")
    p.add_argument("--out", help="Markdown table here; <out>.jsonl keeps the rows")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    for path in problem_files(a.dir, a.level, a.match):
        num = int(path.name.split("_")[0]) if path.name.split("_")[0].isdigit() else 0
        r = cover(path, a.need, a.max_elems, bool(a.verify) and num % a.verify == 0)
        print(f"{path.name}: {'covered' if r.covered else 'not covered'} {r.fraction:.0%} "
              f"{r.targets[:4]} {r.left if not r.covered else ''} {r.verified} {r.seconds:.1f}s",
              flush=True)
        rows.append(r)
    text = markdown(a.level, rows, a.need)
    if a.out:
        Path(a.out).write_text(text)
        Path(a.out).with_suffix(".jsonl").write_text("".join(json.dumps(asdict(r)) + "\n" for r in rows))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
