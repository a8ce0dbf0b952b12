"""The verifier: five stages every candidate must pass before its timing counts.

  1. smoke        compiles, runs one real shape, matches the reference within the dtype's tolerance
  2. shape_sweep  the model's real shapes plus odd, tiny and large ones, in every supported dtype
  3. stability    adversarial inputs (huge, tiny, mixed scales, constant rows, heavy tails, -inf);
                  the NaN/Inf pattern must equal the reference's
  4. determinism  repeated runs on the same inputs are bitwise identical
  5. edge_cases   size-1 and prime sizes, very many rows, non-contiguous inputs

The work is split between two processes (engine/judge.py drives it):
- the **runner** (the sandboxed worker, where candidate code runs) only *runs*: ``run_case``
  builds a case's inputs from its seed, calls the candidate under the guard and returns its
  outputs. Guards on every call: every tensor the call allocates through PyTorch is poisoned
  with NaN (or a sentinel for integers) so an unwritten output fails; inputs must be bitwise
  unchanged afterwards; the output must not alias an input; the call must launch at least one
  Triton kernel of its own; and outside Triton launches it may only allocate, view, reshape and
  copy: any PyTorch compute op (the reference op, PyTorch's implementation of it, any fallback) is
  recorded and rejects the candidate, also when it runs from a launch grid or a heuristic.
  ``tamper_check`` catches candidates that replace clocks, the reference or torch functions.
- the **judge** (a process no candidate code runs in) builds the same inputs from the same seed,
  computes the expected outputs and compares: ``expect`` and ``judge_outputs``. Nothing the
  runner holds decides a verdict.

Expected outputs are the family's reference computed on float64 copies of the inputs, cast to the
output dtype; the comparison is |out - expected| <= atol + rtol * |expected| elementwise, plus
stol * bound for families with an ``error_bound`` (sums of many terms, e.g. |A| @ |B| for a GEMM).
``static_check`` (engine/allowlist.py) runs first, in the engine and again in the runner.
``Verifier`` composes both halves in one process for the kernel tests and the tools, which run
only our own kernels.
"""
from __future__ import annotations

import hashlib
import importlib.util
import sys
import time
import traceback
from dataclasses import asdict, dataclass

STAGES = ("smoke", "shape_sweep", "stability", "determinism", "edge_cases")
# When stages 2-5 run (RunConfig.verify_order, engine/worker.py): "full" before timing; "bench-first"
# after timing, only for a candidate faster than the best (the others get status "slower");
# "auto": bench-first on a GPU, full under the interpreter.
VERIFY_ORDERS = ("auto", "full", "bench-first")


def not_faster(latency_us, noise, best_us, best_noise, min_margin) -> str | None:
    """Why a candidate timed at ``latency_us`` does not beat the best (``best_us``, None: there
    is none), or None when it does: it must be faster by more than ``min_margin`` and by more
    than either timing's relative noise. The loop's keep rule; bench-first's gate is the same."""
    margin = max(min_margin, noise or 0, best_noise or 0)
    if best_us is None or latency_us < best_us * (1 - margin):
        return None
    return (f"{latency_us:.1f} us is not faster than the best {best_us:.1f} us by more than the "
            f"noise ({margin:.1%})")

# aten ops a candidate may call on the host: allocation, views, reshapes, copies, conversions.
ALLOWED_ATEN = {
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros",
    "zeros_like", "new_zeros", "full", "full_like", "new_full", "fill_", "zero_", "ones",
    "ones_like", "view", "_unsafe_view", "reshape", "_reshape_alias", "as_strided", "t",
    "transpose", "permute", "expand", "unsqueeze", "squeeze", "select", "slice", "alias",
    "detach", "clone", "copy_", "_to_copy", "lift_fresh", "unbind",
    "split", "split_with_sizes", "narrow", "resolve_conj", "resolve_neg", "contiguous",
    "flatten", "view_as", "expand_as", "_unsafe_index", "is_same_size", "lift_fresh_copy",
}
# Not _local_scalar_dense: a tensor's values never become Python numbers on the host (float(t),
# t.item()), so no candidate can compute its output in Python and write it back.
POISON_OPS = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"}
# What Triton's own launch path does with tensors inside a launch (the interpreter copies
# arguments to the host and back); anything else inside a launch is the candidate's grid
# function, heuristic or interpreted host code computing with PyTorch.
LAUNCH_ATEN = ALLOWED_ATEN | {"_local_scalar_dense", "_copy_from", "_copy_from_and_resize",
                              "set_", "resize_", "is_pinned", "_pin_memory", "pin_memory"}


class CandidateError(Exception):
    """A candidate failed a check; ``stage`` says which, the message says why."""

    def __init__(self, stage: str, message: str):
        super().__init__(message)
        self.stage = stage


# ---------------------------------------------------------------------------------------------
# static check (engine process and runner; no torch needed)
# ---------------------------------------------------------------------------------------------
def static_check(source: str, arg_names: tuple[str, ...]) -> str | None:
    """Why ``source`` cannot be a candidate, or None (engine/allowlist.py). Costs no device time."""
    from engine import allowlist
    return allowlist.check(source, tuple(arg_names))


def source_hash(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------
# runtime guards (runner process)
# ---------------------------------------------------------------------------------------------
class _LaunchState:
    launches = 0
    launch = 0   # > 0 inside a Triton launch: only Triton's own data movement may run there
    bench = 0    # > 0 inside the autotuner's benchmarking (Triton's code; no candidate hooks)


_STATE = _LaunchState()
_patched = False


def install_launch_counter() -> None:
    """Count Triton kernel launches, compiled or interpreted, by wrapping their ``run``; mark
    the autotuner's benchmarking. A heuristic or a grid function runs at launch depth, so the
    guard sees any PyTorch op it executes."""
    global _patched
    if _patched:
        return
    import triton.runtime.jit as jit
    launchers = [jit.JITFunction]
    try:
        from triton.runtime.interpreter import InterpretedFunction
        launchers.append(InterpretedFunction)
    except Exception:
        pass

    def wrap(cls, attr, counter):
        orig = getattr(cls, attr)

        def run(self, *args, **kwargs):
            if counter == "launch" and not kwargs.get("warmup", False):
                _STATE.launches += 1
            setattr(_STATE, counter, getattr(_STATE, counter) + 1)
            try:
                return orig(self, *args, **kwargs)
            finally:
                setattr(_STATE, counter, getattr(_STATE, counter) - 1)
        run.__wrapped__ = orig
        setattr(cls, attr, run)

    for cls in launchers:
        wrap(cls, "run", "launch")
    try:
        from triton.runtime.autotuner import Autotuner
        for attr in ("_bench", "bench"):
            if hasattr(Autotuner, attr):
                wrap(Autotuner, attr, "bench")
                break
    except Exception:
        pass
    _patched = True


def _guard_mode_class():
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Guard(TorchDispatchMode):
        """Poisons fresh allocations and records PyTorch compute ops the candidate runs."""

        def __init__(self, extra_allowed=()):
            super().__init__()
            self.allowed = ALLOWED_ATEN | set(extra_allowed)
            self.bad_ops: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if _STATE.bench > 0:
                return out
            name = func.overloadpacket.__name__
            if _STATE.launch > 0:
                if name not in LAUNCH_ATEN and name not in self.allowed:
                    what = f"{name} (inside a Triton launch)"
                    if what not in self.bad_ops:
                        self.bad_ops.append(what)
                return out
            if name in POISON_OPS and isinstance(out, torch.Tensor):
                _poison(out)
            elif name not in self.allowed and name not in self.bad_ops:
                self.bad_ops.append(name)
            return out

    return Guard


_Guard = None


def _poison(t) -> None:
    import torch
    if t.numel() == 0:
        return
    if t.is_floating_point() or t.is_complex():
        t.fill_(float("nan"))
    elif t.dtype == torch.bool:
        t.fill_(True)
    else:
        t.fill_(torch.iinfo(t.dtype).max // 3)


def warm_imports() -> None:
    """Import now what would otherwise load lazily during the first candidate, so that the tamper
    snapshot is taken after their legitimate re-binding of torch attributes (torch._dynamo wraps
    torch.manual_seed on import, for example)."""
    global _Guard
    import torch
    try:
        import torch._dynamo  # noqa: F401
    except Exception:           # a failed import is retried lazily, and fails there: say why
        traceback.print_exc(file=sys.stderr)
    import triton.testing  # noqa: F401
    if torch.cuda.is_available():
        torch.cuda.init()  # lazy CUDA initialisation rebinds torch.cuda state: do it before the snapshot
    if _Guard is None:
        _Guard = _guard_mode_class()
    with _Guard():
        torch.empty(1).fill_(0)


# ---------------------------------------------------------------------------------------------
# tamper check
# ---------------------------------------------------------------------------------------------
def _watched():
    import time as _time
    import torch
    import torch.nn.functional as F
    import triton
    import triton.testing
    from engine import bench
    objs = {"time": _time, "torch": torch, "torch.Tensor": torch.Tensor,
            "torch.nn.functional": F, "torch.cuda": torch.cuda, "torch.cuda.Event": torch.cuda.Event,
            "triton.testing": triton.testing, "engine.bench": bench,
            "engine.verify": sys.modules[__name__]}
    for name in ("__main__", "engine.worker", "engine.judge"):
        if sys.modules.get(name) is not None:
            objs[name] = sys.modules[name]
    for name, mod in list(sys.modules.items()):
        if name.startswith("kernels.") and mod is not None:
            objs[name] = mod
    return objs


def tamper_snapshot() -> dict:
    """Identity of every function and class the watched modules expose. Plain values (flags such
    as torch.cuda._initialized, counters, caches) change legitimately and are not watched."""
    snap = {}
    for oname, obj in _watched().items():
        for k, v in list(vars(obj).items()):
            if callable(v) or isinstance(v, (staticmethod, classmethod, property)):
                snap[(oname, k)] = id(v)
    return snap


def tamper_check(snapshot: dict) -> str | None:
    objs = _watched()
    for (oname, k), ident in snapshot.items():
        obj = objs.get(oname)
        if obj is None:
            continue
        d = vars(obj)
        if k not in d:
            return f"candidate deleted {oname}.{k}"
        if id(d[k]) != ident:
            return f"candidate replaced {oname}.{k}"
    return None


# ---------------------------------------------------------------------------------------------
# one guarded call
# ---------------------------------------------------------------------------------------------
def load_candidate(source: str, workdir: str):
    """Import ``source`` from a file (Triton reads kernel source through inspect) -> kernel_fn."""
    import os
    h = source_hash(source)
    path = os.path.join(workdir, f"candidate_{h}.py")
    with open(path, "w") as f:
        f.write(source)
    name = f"nightshift_candidate_{h}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    fn = getattr(module, "kernel_fn", None)
    if not callable(fn):
        raise CandidateError("smoke", "kernel_fn is not callable")
    return fn


def _float64(v):
    import torch
    if isinstance(v, torch.Tensor) and v.is_floating_point():
        return v.detach().to(torch.float64)
    return v


def _bytes_equal(a, b) -> bool:
    import torch
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.numel() == 0:
        return True
    # flat views: a "contiguous" tensor may keep any stride on a size-1 dim, which view() refuses
    ac, bc = a.contiguous().reshape(-1), b.contiguous().reshape(-1)
    return torch.equal(ac.view(torch.uint8), bc.view(torch.uint8))


def _storage_span(t):
    if t.numel() == 0:
        return None
    start = t.data_ptr()
    extent = sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride())) + 1
    return start, start + extent * t.element_size()


def _overlaps(a, b) -> bool:
    sa, sb = _storage_span(a), _storage_span(b)
    return bool(sa and sb and sa[0] < sb[1] and sb[0] < sa[1])


def guarded_call(fn, inputs: dict, extra_allowed=()):
    """Run fn(**inputs) under the guard; return the output. Raises CandidateError(stage '')."""
    global _Guard
    import torch
    if _Guard is None:
        _Guard = _guard_mode_class()
    install_launch_counter()     # the guard tells launches from host code by it (idempotent)
    before = _STATE.launches
    guard = _Guard(extra_allowed)
    try:
        with guard:
            out = fn(**inputs)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    except CandidateError:
        raise
    except Exception as e:
        tb = traceback.format_exception(type(e), e, e.__traceback__)
        raise CandidateError("", f"raised {type(e).__name__}: {str(e)[:400]}\n" +
                             "".join(tb[-3:])[-1200:]) from None
    if guard.bad_ops:
        raise CandidateError("", "computed with PyTorch op(s) " + ", ".join(
            f"aten.{o}" for o in guard.bad_ops[:6]) +
            " outside its Triton kernels; a candidate must compute with its own Triton kernel")
    if _STATE.launches == before:
        raise CandidateError("", "launched no Triton kernel")
    return out


def _overflow_at(dtype) -> float:
    """The smallest magnitude that rounds to Inf in ``dtype``: its largest finite value plus
    half an ulp there (65520 for fp16); Inf for integer outputs."""
    import math
    import torch
    if not dtype.is_floating_point:
        return math.inf
    fi = torch.finfo(dtype)
    ulp = math.ldexp(1.0, math.frexp(fi.max)[1] - 1 - round(-math.log2(fi.eps)))
    return float(fi.max) + ulp / 2


def compare(out, expected, atol: float, rtol: float, extra=None) -> tuple[bool, float, str]:
    """(ok, worst absolute error, why-not) for out vs expected of the same shape; ``extra``, a
    tensor broadcastable to them, is added to the allowed error elementwise. Over CHUNK_ELEMS
    elements the comparison runs a slice at a time along the first dim longer than 1: its
    float64 copies and masks take ~40 bytes an element, 75 GB at a [112, 64, 512, 512] output
    whose reference cannot be computed in slices (a norm over every element)."""
    dim = next((d for d in range(out.ndim) if int(out.shape[d]) > 1), None)
    if (out.numel() <= CHUNK_ELEMS or dim is None or tuple(out.shape) != tuple(expected.shape)):
        return _compare(out, expected, atol, rtol, extra)
    ext = None if extra is None else extra.expand_as(expected)
    worst = 0.0
    for lo, hi in _slices(out, dim):
        ok, w, why = _compare(out.narrow(dim, lo, hi - lo), expected.narrow(dim, lo, hi - lo),
                              atol, rtol, None if ext is None else ext.narrow(dim, lo, hi - lo))
        if not ok:
            return False, w, f"{why} (in indices {lo}..{hi - 1} of dim {dim})"
        worst = max(worst, w)
    return True, worst, ""


def _compare(out, expected, atol: float, rtol: float, extra=None) -> tuple[bool, float, str]:
    import torch
    # an output may come back in host memory (the worker's shared buffer); it is judged where
    # the reference is
    e = expected.detach().to(torch.float64)
    o = out.detach().to(e.device, torch.float64)
    nan_o, nan_e = torch.isnan(o), torch.isnan(e)
    if not torch.equal(nan_o, nan_e):
        n = int((nan_o != nan_e).sum())
        where = "NaN where the reference is finite" if bool((nan_o & ~nan_e).any()) \
            else "finite where the reference is NaN"
        return False, float("nan"), f"{n} element(s) {where}"
    # GPUs flush float32/bfloat16 subnormals to zero (Triton's exp, FTZ arithmetic): an output
    # below the dtype's smallest normal number may read 0. (fp16 families set their own atol:
    # fp16's subnormals, from 6e-8, are values its "tiny" inputs really produce.)
    if out.dtype in (torch.float32, torch.bfloat16):
        atol = max(atol, torch.finfo(out.dtype).tiny)
    ext = None if extra is None else extra.detach().to(e.device, torch.float64).expand_as(e)
    differ = (torch.isposinf(o) != torch.isposinf(e)) | (torch.isneginf(o) != torch.isneginf(e))
    if bool(differ.any()):
        # an Inf against a finite value of its sign is a rounding at the edge of the dtype's
        # range (an fp16 output whose exact value is 65510 may round either way): accepted
        # where the finite one's allowed error reaches the overflow threshold, max + ulp/2
        fin_v = torch.where(torch.isinf(o), e, o)
        reach = fin_v.abs() + atol + rtol * fin_v.abs() + (0 if ext is None else ext)
        same = torch.sign(o) == torch.sign(e)
        edge = differ & torch.isfinite(fin_v) & same & (reach >= _overflow_at(out.dtype))
        if bool((differ & ~edge).any()):
            return False, float("inf"), f"{int((differ & ~edge).sum())} element(s) differ in Inf"
    fin = torch.isfinite(e) & torch.isfinite(o)
    if not bool(fin.any()):
        return True, 0.0, ""
    err = (o[fin] - e[fin]).abs()
    bound = atol + rtol * e[fin].abs()
    if ext is not None:
        bound = bound + ext[fin]
    worst = float(err.max())
    bad = err > bound
    if bool(bad.any()):
        i = int((err / bound).argmax())
        return False, worst, (f"{int(bad.sum())} of {int(fin.sum())} element(s) out of tolerance; "
                              f"worst |out-ref| {worst:.3g} (out {float(o[fin][i]):.6g}, ref "
                              f"{float(e[fin][i]):.6g}; atol {atol:g}, rtol {rtol:g})")
    return True, worst, ""


# ---------------------------------------------------------------------------------------------
# stages and cases
# ---------------------------------------------------------------------------------------------
@dataclass
class StageResult:
    stage: str
    status: str              # passed | failed | skipped | slower
    worst_error: float | None = None
    failed_case: str | None = None
    detail: str = ""
    duration_s: float = 0.0

    def row(self) -> dict:
        return asdict(self)


@dataclass
class Case:
    shape: tuple
    dtype: str
    kind: str = "normal"
    layout: str = "contiguous"   # contiguous | row_strided | column_major | model
    seed: int = 0                # the case's inputs: the same in the runner and in the judge

    def __str__(self) -> str:
        s = f"shape={list(self.shape)} dtype={self.dtype}"
        if self.kind != "normal":
            s += f" inputs={self.kind}"
        if self.layout != "contiguous":
            s += f" layout={self.layout}"
        return s

    def row(self) -> dict:
        return {"shape": list(self.shape), "dtype": self.dtype, "kind": self.kind,
                "layout": self.layout, "seed": int(self.seed)}

    @classmethod
    def from_row(cls, r: dict) -> "Case":
        return cls(tuple(int(x) for x in r["shape"]), str(r["dtype"]), str(r.get("kind", "normal")),
                   str(r.get("layout", "contiguous")), int(r.get("seed", 0)))


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _relayout(t, layout: str):
    """Same values as ``t`` in a non-contiguous layout models really pass."""
    import torch
    if layout == "row_strided" and t.dim() >= 1:
        # rows of a wider buffer, as when q/k/v are sliced out of one fused projection
        big = torch.empty(*t.shape[:-1], t.shape[-1] + 13, dtype=t.dtype, device=t.device)
        big[..., : t.shape[-1]].copy_(t)
        return big[..., : t.shape[-1]]
    if layout == "column_major" and t.dim() >= 2:
        return t.transpose(-1, -2).contiguous().transpose(-1, -2)
    return t


def overlaps(shape, strides) -> bool:
    """Would two elements of ``shape`` at ``strides`` share memory, other than along a dim of
    stride 0 (an expanded view)? Innermost first, each dim must step past the ones inside."""
    reach = 1
    for d in sorted((d for d in range(len(shape)) if shape[d] > 1 and strides[d] != 0),
                    key=lambda d: strides[d]):
        if strides[d] < reach:
            return True
        reach = strides[d] * shape[d]
    return False


def _restride(t, strides):
    """Same values as ``t`` with the given strides (the model's layout): a fresh buffer holding
    NaN where the layout skips memory, so a kernel that reads a gap shows it; a dim of stride 0
    (an expanded view) repeats the values of its first index."""
    import torch
    strides = tuple(int(x) for x in strides)
    if len(strides) != t.dim() or overlaps(t.shape, strides):
        return t                   # a layout that would overlap at this shape is not the model's
    base_shape = tuple(1 if st == 0 else n for n, st in zip(t.shape, strides))
    src = t[tuple(slice(0, 1) if st == 0 else slice(None) for st in strides)]
    need = 1 + sum((n - 1) * st for n, st in zip(base_shape, strides))
    buf = torch.full((max(need, 1),), float("nan"), dtype=t.dtype, device=t.device) \
        if t.dtype.is_floating_point else torch.zeros(max(need, 1), dtype=t.dtype, device=t.device)
    out = buf.as_strided(base_shape, [0 if n == 1 and st == 0 else st
                                      for n, st in zip(base_shape, strides)])
    out.copy_(src)
    return out.expand(t.shape) if base_shape != tuple(t.shape) else out


def case_inputs(fam, case: Case, device: str) -> dict:
    """A case's inputs, a pure function of (family, case, device): the runner and the judge
    build bitwise the same tensors from the case's seed."""
    import torch
    gen = torch.Generator(device=device)
    gen.manual_seed(int(case.seed))
    inp = fam.make_inputs(case.shape, getattr(torch, case.dtype), device, gen, kind=case.kind)
    if case.layout == "model":
        for name, strides in fam.model_strides.items():
            if isinstance(inp.get(name), torch.Tensor):
                inp[name] = _restride(inp[name], strides)
    elif case.layout != "contiguous":
        first = fam.arg_names[0]
        inp[first] = _relayout(inp[first], case.layout)
    return inp


def run_case(fn, fam, case: Case, device: str, repeats: int = 1) -> list:
    """Runner side: the candidate's outputs on a case's inputs, ``repeats`` calls on the same
    inputs (determinism). Raises CandidateError for what the guards see."""
    import torch
    inputs = case_inputs(fam, case, device)
    tensors = {k: v for k, v in inputs.items() if isinstance(v, torch.Tensor)}
    saved = {k: v.clone() for k, v in tensors.items()}
    on = next(iter(tensors.values())).device if tensors else None
    outs = []
    for rep in range(repeats):
        out = guarded_call(fn, inputs, fam.allowed_host_ops)
        for k, v in tensors.items():
            if not _bytes_equal(v, saved[k]):
                raise CandidateError("", f"modified its input {k!r}")
        if not isinstance(out, torch.Tensor):
            raise CandidateError("", f"returned {type(out).__name__}, not a tensor")
        if on is not None and out.device != on:
            raise CandidateError("", f"returned a tensor on {out.device}; its inputs are on {on}")
        for k, v in tensors.items():
            if _overlaps(out, v):
                raise CandidateError("", f"output aliases input {k!r}")
        # repeats are compared with the first bitwise here, where they were computed, and only
        # the first goes to the judge: three 6.4 GB outputs through host memory took 40 s of a
        # 66 s budget on the H200 (LeakyReLU, KernelBench level 1). No weaker than the judge
        # comparing them: the process that runs the candidate produced every repeat's bytes
        if outs and not _bytes_equal(outs[0], out):
            raise CandidateError("", f"run {rep + 1} differs from run 1 in "
                                     f"{_differing(outs[0], out)} element(s): not bitwise deterministic")
        if not outs:
            outs.append(out.detach())
        del out
    return outs


def _differing(a, b) -> int:
    """Elements of a and b (same shape and dtype) whose bytes differ."""
    import torch
    size = a.element_size()
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    if a.shape != b.shape or a.dtype != b.dtype or size not in ints:
        return max(a.numel(), b.numel())
    av, bv = a.contiguous().reshape(-1).view(ints[size]), b.contiguous().reshape(-1).view(ints[size])
    return int((av != bv).sum())


@dataclass
class Expected:
    """What the judge holds for one case: the expected output and how close is close enough."""
    shape: tuple
    dtype: object
    value: object            # fp64 reference cast to the output dtype
    atol: float
    rtol: float
    extra: object = None     # stol * error bound, or None


def reference_meta(fam, inputs: dict):
    """The reference's output on ``inputs`` as a meta tensor (shape and dtype, no values)."""
    import torch
    try:        # without computing it twice
        return fam.reference(**{k: v.to("meta") if isinstance(v, torch.Tensor) else v
                                for k, v in inputs.items()})
    except Exception:                      # an op without a meta kernel: run it
        return fam.reference(**inputs).to("meta")


def expect(fam, case: Case, device: str, inputs: dict | None = None, native=None) -> Expected:
    """Judge side: the reference's answer for a case, computed from the judge's own inputs
    (``inputs`` and ``native``, the meta output, when the caller built them already)."""
    import torch
    if inputs is None:
        inputs = case_inputs(fam, case, device)
    if native is None:
        native = reference_meta(fam, inputs)
    f64 = {k: _float64(v) for k, v in inputs.items()}
    del inputs
    value = fam.reference(**f64).to(native.dtype)
    tdt = getattr(torch, case.dtype)
    atol, rtol = fam.tolerance[tdt]
    stol = fam.bound_tol.get(tdt)
    extra = stol * fam.error_bound(**f64) if stol and fam.error_bound is not None else None
    return Expected(tuple(native.shape), native.dtype, value, atol, rtol, extra)


# A case whose output holds more elements than this is judged in chunks of dim-0 rows (where
# the family's rows are independent): the float64 reference and the comparison take about 26
# bytes an element; over a [112, 64, 512, 512] fp32 RMSNorm at once that was 49 GB on the judge's
# GPU beside the runner's 46 GB, and the judge ran out of memory.
CHUNK_ELEMS = 1 << 25


def _slices(t, dim: int):
    """(lo, hi) index ranges along ``dim`` of ``t`` holding at most CHUNK_ELEMS elements each
    (one index at least)."""
    n = int(t.shape[dim])
    step = max(1, CHUNK_ELEMS // max(1, t.numel() // n))
    return [(lo, min(n, lo + step)) for lo in range(0, n, step)]


def row_slicer(fam, inputs: dict, native, dim: int = 0):
    """``take(lo, hi)``: the inputs of indices lo..hi along the output's dim ``dim``, whose
    reference output is that slice of the whole one; or None where the case cannot be split so
    (slices tied to each other by the op, an input whose size there only matches by chance:
    checked on two indices' meta output and on four indices' values). An input is sliced at the
    dim broadcasting lines up with ``dim`` where its size is the output's there, else (a
    per-channel weight, [C] beside [N, C, H, W]) at its one dim of that size, else read whole."""
    import torch
    if native.ndim <= dim or (dim == 0 and not fam.shrink_lead):
        return None
    n, rank = int(native.shape[dim]), native.ndim
    if n < 2:
        return None
    at = {}
    for k, v in inputs.items():
        if not isinstance(v, torch.Tensor) or v.ndim == 0:
            continue
        sizes = [int(x) for x in v.shape]
        # the same dim (a reduction's input, which has more dims than its output, keeps the
        # leading ones), the dim broadcasting lines up, a lower-rank input's one dim of size n
        tries = ([dim, dim + v.ndim - rank] if v.ndim >= rank else [dim - (rank - v.ndim)])
        j = next((j for j in tries if 0 <= j < v.ndim and sizes[j] == n), None)
        if j is None and v.ndim < rank and sizes.count(n) == 1:
            j = sizes.index(n)
        if j is not None:
            at[k] = j
    if not at:
        return None

    def take(lo: int, hi: int) -> dict:
        return {k: (v.narrow(at[k], lo, hi - lo) if k in at else v) for k, v in inputs.items()}
    try:        # two indices, not one: a [D] weight sliced to [1] would still broadcast
        two = reference_meta(fam, take(0, 2))
    except Exception:
        return None
    want = list(native.shape)
    want[dim] = 2
    if list(two.shape) != want or two.dtype != native.dtype:
        return None
    # and on values: indices 2..3 alone give what they give among 0..3 (a scan, a softmax or a
    # norm along the dim ties them together: a region can reduce any dims)
    k = min(4, n)
    try:
        together = fam.reference(**{a: _float64(v) for a, v in take(0, k).items()})
        alone = fam.reference(**{a: _float64(v) for a, v in take(k - 2, k).items()})
    except Exception:
        return None
    if not torch.allclose(together.narrow(dim, k - 2, 2), alone, rtol=1e-9, atol=1e-12, equal_nan=True):
        return None
    return take


def case_slicer(fam, inputs: dict, native):
    """(dim, take) for judging a large case in slices of the output: dim 0 where its rows are
    independent, else the first other dim that is (a batch norm's channels, a reduction over
    dim 0's kept columns); None where none is (a norm over every element)."""
    for dim in range(native.ndim):
        take = row_slicer(fam, inputs, native, dim)
        if take is not None:
            return dim, take
    return None


def judge_in_rows(fam, case: Case, take, native, out, dim: int = 0) -> float:
    """The worst error of ``out`` against the reference computed CHUNK_ELEMS at a time along
    ``dim`` (``take``: row_slicer's for that dim, for the case's inputs). Raises CandidateError
    as judge_outputs does."""
    if tuple(out.shape) != tuple(native.shape) or out.dtype != native.dtype:
        raise CandidateError("", f"returned shape {list(out.shape)} {out.dtype}; the "
                                 f"reference returns {list(native.shape)} {native.dtype}")
    worst = 0.0
    where = "rows" if dim == 0 else f"indices of dim {dim}"
    for lo, hi in _slices(native, dim):
        exp = expect(fam, case, "", take(lo, hi), native.narrow(dim, lo, hi - lo))
        ok, w, why = compare(out.narrow(dim, lo, hi - lo), exp.value, exp.atol, exp.rtol, exp.extra)
        if not ok:
            raise CandidateError("", f"wrong result in {where} {lo}..{hi - 1}: {why}")
        worst = max(worst, w if w == w else 0.0)
        del exp
    return worst


def judge_outputs(exp: Expected, outs: list) -> float:
    """Judge side: the worst error of ``outs`` (one per repeat) against ``exp``; raises
    CandidateError when the first is wrong or a repeat differs from it bitwise."""
    first = outs[0]
    if tuple(first.shape) != exp.shape or first.dtype != exp.dtype:
        raise CandidateError("", f"returned shape {list(first.shape)} {first.dtype}; the "
                                 f"reference returns {list(exp.shape)} {exp.dtype}")
    ok, worst, why = compare(first, exp.value, exp.atol, exp.rtol, exp.extra)
    if not ok:
        raise CandidateError("", f"wrong result: {why}")
    for rep, again in enumerate(outs[1:]):
        if not _bytes_equal(first, again):
            diff = int((first.double() != again.double()).sum())
            raise CandidateError("", f"run {rep + 2} differs from run 1 in {diff} element(s): "
                                     f"not bitwise deterministic")
    return worst


class Verifier:
    """The five stages' cases for one family on one device, and (for our own kernels, in one
    process: the kernel tests, the tools) ``check``/``run_stage``, which run and judge in place.
    Untrusted candidates are judged across two processes by engine/judge.py with the same
    cases."""

    def __init__(self, fam, spec: dict, device: str, interpret: bool):
        self.fam = fam
        self.device = device
        self.interpret = interpret
        self.dtype = spec["dtype"]
        self.real_shapes = [tuple(s["shape"]) for s in spec["shapes"]] or [fam.bench_shapes[0]]
        self.seed = int(spec.get("seed", 0))
        # Under the interpreter every program instance is Python: keep checks to small sizes.
        self.numel_cap = spec.get("numel_cap") or (1 << 15 if interpret else 1 << 27)
        self.size = fam.problem_size   # a shape's size against numel_cap (default: its numel)
        self.dtypes = [d for d in fam.dtypes if d in spec.get("dtypes", fam.dtypes)]

    def _fit(self, shapes):
        seen, out = set(), []
        for s in shapes:
            s = tuple(s)
            if s not in seen and self.size(s) <= self.numel_cap:
                seen.add(s)
                out.append(s)
        return out

    def _shrunk(self, shape) -> tuple:
        """A real shape over the cap with fewer leading rows (dim 0) until it fits: the stages
        that check values (smoke, stability, determinism's first case, edge layouts) need the
        real row length, not the real row count. The shape sweep and determinism still run the
        real shape itself. A softmax over [4096, 393216] fp32 is 6.4 GB a case: its stability
        stage at that size (kinds x dtypes cases, float64 references) ran past the worker's
        timeout."""
        shape = tuple(shape)
        if not self.fam.shrink_lead or not shape or shape[0] <= 1:
            return shape
        lo, hi = 1, int(shape[0])          # the largest dim 0 that fits, by bisection
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.size((mid,) + shape[1:]) <= self.numel_cap:
                lo = mid
            else:
                hi = mid - 1
        return (lo,) + shape[1:]

    def _seeded(self, stage: str, cases: list[Case]) -> list[Case]:
        base = (self.seed * 1_000_003 + (STAGES.index(stage) + 1) * 7919) % (2**62)
        for i, c in enumerate(cases):
            c.seed = base + i * 104_729
        return cases

    def cases(self, stage: str) -> list[Case]:
        fam, dt = self.fam, self.dtype
        real = self.real_shapes
        small_real = self._fit(real) or [self._shrunk(min(real, key=self.size))]
        if stage == "smoke":
            cs = [Case(small_real[0], dt)]
        elif stage == "shape_sweep":
            # a real shape over the cap runs in the run's dtype alone (the dtype its kernel is
            # placed for; the other dtypes are swept at the smaller shapes): at [4096, 393216]
            # fp32 each case is 6.4 GB in, 6.4 GB out and a float64 reference
            shapes = list(dict.fromkeys(real)) + self._fit(fam.sweep_shapes)
            cs = [Case(s, d) for s in shapes for d in self.dtypes
                  if self.size(s) <= self.numel_cap or (s in real and d == dt)]
        elif stage == "stability":
            odd = self._fit(fam.sweep_shapes)
            other = odd[min(3, len(odd) - 1)] if odd else small_real[0]
            cs = []
            for kind in fam.adversarial:
                cs += [Case(small_real[0], d, kind) for d in self.dtypes]
                cs.append(Case(other, dt, kind))
        elif stage == "determinism":
            cs = [Case(s, dt) for s in list(dict.fromkeys([small_real[0], real[0]]))]
        elif stage == "edge_cases":
            cs = [Case(s, dt) for s in self._fit(fam.edge_shapes)]
            odd = self._fit(fam.sweep_shapes)
            for s in list(dict.fromkeys([small_real[0]] + odd[2:4])):
                cs += [Case(s, dt, layout="row_strided"), Case(s, dt, layout="column_major")]
            if fam.model_strides:
                # the real shape in the layout the model passes (its recorded strides)
                cs.append(Case(tuple(real[0]), dt, layout="model"))
        else:
            raise ValueError(stage)
        return self._seeded(stage, cs)

    def recheck_case(self) -> Case:
        """The case correctness is checked on again after timing: the first real shape."""
        case = Case(tuple(self.real_shapes[0]), self.dtype, seed=self.seed * 31 + 17)
        return case if self.size(case.shape) <= self.numel_cap else self.cases("smoke")[0]

    # -- in one process (our own kernels only) ---------------------------------------------------
    def check(self, fn, case: Case, repeats: int = 1):
        """Run and judge one case here; returns (out, worst error). Raises CandidateError."""
        outs = run_case(fn, self.fam, case, self.device, repeats)
        worst = judge_outputs(expect(self.fam, case, self.device), outs)
        return outs[0], worst

    def run_stage(self, fn, stage: str) -> StageResult:
        t0 = time.perf_counter()
        worst = 0.0
        cases = self.cases(stage)
        for case in cases:
            try:
                _, w = self.check(fn, case, repeats=3 if stage == "determinism" else 1)
                worst = max(worst, w if w == w else 0.0)
            except CandidateError as e:
                return StageResult(stage, "failed", worst_error=worst, failed_case=str(case),
                                   detail=str(e), duration_s=time.perf_counter() - t0)
        return StageResult(stage, "passed", worst_error=worst,
                           detail=f"{len(cases)} case(s)", duration_s=time.perf_counter() - t0)
