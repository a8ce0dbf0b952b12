"""Profile a model's forward pass and attribute its time to kernel families.

profile_model(model, inputs) runs the forward under torch.profiler and returns one FamilyTime
row per family (plus "other"), times per forward pass in microseconds, sorted by time. The
planner ranks these rows by Amdahl's law, so the one property that matters most is that every
microsecond is counted exactly once.

What is timed
- On a GPU (CUDA, or ROCm, which reports through the same CUDA activity): device time of every
  kernel, memcpy and memset in the profiled window. Each activity is matched, by correlation id,
  to the runtime call that launched it (cudaLaunchKernel, cuLaunchKernelEx for Triton,
  hipLaunchKernel...), which sits in the CPU op tree under the op or scope that made it; so each
  is counted exactly once, under the family of that op. Activities whose launch can't be placed
  stay in "other" under their kernel name. Profiler scopes shown on the GPU timeline are not time.
- On CPU: each aten op's self CPU time (its time minus its children's), on the thread that ran
  the forward. Time in Python between ops (and in our scopes themselves) is not op time and is
  left out.

Attribution rules (the family of one op, walking the op tree from the root down)
1. An op is classified by its name (aten::softmax -> softmax, aten::linear/mm/addmm/bmm/matmul
   -> matmul, aten::scaled_dot_product_attention and its fused variants -> attention, ...; see
   _OP_FAMILY), and a profiler scope named "family::<name>" classifies everything inside it.
2. Composite families are recognized by module: forward hooks open such a scope around
   nn.LayerNorm (layernorm), nn.RMSNorm or any class named like *RMSNorm* (rmsnorm), classes
   named like rotary embeddings (rotary) and gated MLPs (fused_mlp). A module of another name
   that has one weight [D] and an eps and computes RMSNorm on a probe (random inputs, compared
   with the family's formula: a KernelBench "Model" written as the formula) is rmsnorm too. A
   rotary-named module counts only when its input is 4-D ([B, H, S, Dh], the rotation itself):
   Hugging Face's *RotaryEmbedding modules only make the cos/sin tables, which is other work.
   Model code can also open "family::<name>" itself, as our apply_rotary() does.
3. The OUTERMOST classified ancestor wins: aten::linear's child aten::addmm, the bmm/softmax of
   an SDPA math fallback, the log_softmax/nll_loss under aten::cross_entropy_loss, and the
   pow/mean/rsqrt of a composite RMSNorm all belong to the enclosing family. (The innermost rule
   would split SDPA into matmul+softmax and RMSNorm's mean into reduce.)
4. Exception: fused_mlp is a weak scope. Matmuls (and any other classified op) inside a gated
   MLP keep their own family: the projections are ordinary GEMMs that a matmul kernel targets,
   and only the elementwise glue (silu, mul) between them is what a fused MLP kernel removes.
5. Everything with no classified ancestor is "other"; its top_ops name what is left.

A "call" of a family is an op or scope where rule 1/2 starts that family (not its children),
so F.linear -> addmm is one matmul call, and an RMSNorm module is one rmsnorm call.

total_us is measured apart from the attribution (GPU: all device activities; CPU: the spans of
top-level ops), so sum(family time_us) == total_us is a real check that nothing counts twice.

Call shapes (FamilyTime.shapes: the main input of each call, with its dtype and calls per
forward): rmsnorm, layernorm, softmax, reduce (aten::sum/mean): x; cross_entropy: the logits as
passed, [rows, V]; matmul: [M, K, N], plus "batch" for batched products; attention: q
[B, H, S, Dh] plus "kv_heads"; rotary: x [B, H, S, Dh]; fused_mlp: x plus "d_model" and
"ffn_dim". A module family's shape is the module's first tensor input; a scope placed in model
code records none, so its shape is the first tensor read by the first op inside it.
"""
from __future__ import annotations

import math
import re
import warnings
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field

import torch
import torch.nn as nn
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, record_function

from kernels import FAMILY_NAMES

# Every family the profiler recognizes; kernels/ has files for a subset (FAMILY_NAMES).
FAMILIES = ("rmsnorm", "softmax", "layernorm", "cross_entropy",
            "matmul", "attention", "fused_mlp", "rotary", "reduce")
OTHER = "other"
SCOPE_PREFIX = "family::"
_FORWARD_SCOPE = "engine::forward"
_WEAK = frozenset({"fused_mlp"})   # scopes that don't absorb classified ops (rule 4)
TOP_OPS = 5                        # how many op names each row keeps

def _op_table() -> dict:
    """aten op name -> family, from each family's ``profile_ops`` (kernels/<family>.py)."""
    import kernels
    return {op: fam.name for fam in kernels.all_families() for op in fam.profile_ops}


_OP_FAMILY = _op_table()


def _op_family(name: str) -> str | None:
    if name.startswith(SCOPE_PREFIX):
        fam = name[len(SCOPE_PREFIX):].split("::")[0]
        return fam if fam in FAMILIES else None
    if name.startswith("aten::_scaled_dot_product_"):   # flash / efficient / cudnn / math / for_cpu
        return "attention"
    return _OP_FAMILY.get(name)


@dataclass
class FamilyTime:
    family: str
    time_us: float          # per forward pass: device time on GPU, op self CPU time on CPU
    fraction: float         # share of the forward pass; sums to 1 over all rows
    calls: int              # family calls per forward pass
    shapes: list[dict] = field(default_factory=list)   # [{"shape": [...], "dtype": str, "count": int, ...}]
    top_ops: list[dict] = field(default_factory=list)  # [{"name": str, "time_us": float, "calls": int}]
    has_kernel: bool = False


@dataclass
class ProfileResult:
    families: list[FamilyTime]   # sorted by time_us, descending
    total_us: float              # per forward pass, measured independently of the attribution
    device: str

    def rows(self) -> list[dict]:
        """Plain dicts, as engine.store.Store.save_profile takes them."""
        return [asdict(f) for f in self.families]

    def get(self, family: str) -> FamilyTime | None:
        return next((f for f in self.families if f.family == family), None)


# ---- module hooks: family scopes around composite modules ------------------------------------

def module_family(module: nn.Module) -> str | None:
    """The family a module's whole forward belongs to, or None (most modules)."""
    name = type(module).__name__
    if isinstance(module, nn.LayerNorm):
        return "layernorm"
    if (hasattr(nn, "RMSNorm") and isinstance(module, nn.RMSNorm)) or "rmsnorm" in name.lower():
        return "rmsnorm"
    if re.search(r"Rotary|RoPE|Rope(?![a-z])", name):
        return "rotary"
    if re.search(r"mlp|glu|feedforward|ffn", name, re.IGNORECASE) and _is_gated(module):
        return "fused_mlp"
    if _probes_as_rmsnorm(module):
        return "rmsnorm"
    return None


def _probes_as_rmsnorm(module: nn.Module) -> bool:
    """A module shaped like an RMSNorm (one weight [D], an eps) that computes it on a probe."""
    from engine import kernel_runtime
    from kernels import get
    found = kernel_runtime.rmsnorm_params(module)
    if found is None or found[0].device.type == "meta" or not found[0].is_floating_point():
        return False
    w = found[0]
    tol = get("rmsnorm").tolerance.get(w.dtype)
    return tol is not None and kernel_runtime.probe_rmsnorm(module, (8, w.shape[0]), w.dtype, tol)


def _is_gated(module: nn.Module) -> bool:
    # Gated MLPs name their three projections gate/up/down (ours, HF: gate_proj...) or w1/w3/w2 (Meta).
    names = [n.lower() for n, _ in module.named_children()]
    has = lambda part: any(part in n for n in names)   # noqa: E731
    return (has("gate") and has("up") and has("down")) or {"w1", "w2", "w3"} <= set(names)


def _first_tensor(args, kwargs):
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, torch.Tensor):
            return a
    return None


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class _Hooks:
    """Opens a "family::<name>" profiler scope around each family module's forward, and records
    the module's input shape (the family-level call shape) for calls that start a family."""

    def __init__(self, model: nn.Module):
        self.handles = []
        self.open: list[tuple[str, record_function]] = []    # (family, scope), innermost last
        self.recording = False
        self.shapes: Counter = Counter()                      # (family, shape, dtype, extras) -> calls
        for mod in model.modules():
            fam = module_family(mod)
            if fam is None:
                continue
            self.handles.append(mod.register_forward_pre_hook(self._pre(fam), with_kwargs=True))
            # always_call: the scope closes even when forward raises, so scopes never leak.
            self.handles.append(mod.register_forward_hook(self._post, always_call=True))

    def _pre(self, fam):
        def hook(module, args, kwargs):
            x = _first_tensor(args, kwargs)
            if fam == "rotary" and (x is None or x.dim() != 4):
                self.open.append((None, None))     # a cos/sin table maker: no scope (rule 2)
                return
            if self.recording and _starts_call(self._current(), fam):
                if x is not None:
                    extras = ()
                    if fam == "fused_mlp":
                        extras = (("d_model", x.shape[-1]), ("ffn_dim", _ffn_dim(module)))
                    self.shapes[(fam, tuple(x.shape), _dtype_name(x.dtype), extras)] += 1
            scope = record_function(f"{SCOPE_PREFIX}{fam}::{type(module).__name__}")
            scope.__enter__()
            self.open.append((fam, scope))
        return hook

    def _post(self, module, args, output):
        if self.open:
            scope = self.open.pop()[1]
            if scope is not None:
                scope.__exit__(None, None, None)

    def _current(self) -> str | None:
        cur = None
        for fam, _ in self.open:
            cur = _inherit(cur, fam)
        return cur

    def remove(self):
        while self.open:
            scope = self.open.pop()[1]
            if scope is not None:
                scope.__exit__(None, None, None)
        for h in self.handles:
            h.remove()
        self.handles.clear()


def _ffn_dim(module: nn.Module) -> int | None:
    for name, child in module.named_children():
        if ("gate" in name.lower() or name.lower() == "w1") and hasattr(child, "weight"):
            return int(child.weight.shape[0])     # nn.Linear weight [F, D]
    return None


def _starts_call(cur: str | None, label: str | None) -> bool:
    """Does an op/scope classified ``label`` start a new family call under inherited family ``cur``?"""
    return label is not None and (cur is None or (cur in _WEAK and label != cur))


def _inherit(cur: str | None, label: str | None) -> str | None:
    """The family of an op/scope classified ``label`` (None: unclassified) under ``cur`` (rules 3-4)."""
    return label if _starts_call(cur, label) else cur


# ---- call shapes of functional ops -----------------------------------------------------------

_CPP_DTYPES = {"float": "float32", "double": "float64", "c10::Half": "float16", "c10::BFloat16": "bfloat16",
               "long int": "int64", "int": "int32", "short int": "int16", "signed char": "int8",
               "unsigned char": "uint8", "bool": "bool", "c10::Float8_e4m3fn": "float8_e4m3fn",
               "c10::Float8_e5m2": "float8_e5m2", "c10::Float8_e4m3fnuz": "float8_e4m3fnuz",
               "c10::Float8_e5m2fnuz": "float8_e5m2fnuz"}


def _event_dtype(evt, i: int, fallback: str) -> str:
    dtypes = getattr(evt, "input_dtypes", None) or []   # recorded with record_shapes=True
    return _CPP_DTYPES.get(dtypes[i], dtypes[i]) if i < len(dtypes) and dtypes[i] else fallback


def _tensor_inputs(evt) -> list[list[int]]:
    return [list(s) for s in (evt.input_shapes or []) if isinstance(s, (list, tuple)) and len(s) > 0]


def _call_shape(evt, fam: str, fallback_dtype: str) -> tuple | None:
    """(shape, dtype, extras) of the family-level call ``evt`` (an aten op or a code scope)."""
    if evt.name.startswith(SCOPE_PREFIX):
        # A scope placed in model code has no recorded inputs: use the first op inside it that
        # reads a tensor (apply_rotary's first op is x * cos, so this is x).
        for d in _descendants(evt):
            if d.name.startswith("aten::") and _tensor_inputs(d):
                shapes = d.input_shapes
                i = next(i for i, s in enumerate(shapes) if isinstance(s, (list, tuple)) and len(s) > 0)
                return tuple(shapes[i]), _event_dtype(d, i, fallback_dtype), ()
        return None
    shapes = [list(s) if isinstance(s, (list, tuple)) else [] for s in (evt.input_shapes or [])]
    if fam == "matmul":
        mkn = _matmul_mkn(evt.name, shapes)
        if mkn is None:
            return None
        (m, k, n), batch = mkn
        i = 1 if evt.name in ("aten::addmm", "aten::baddbmm") else 0
        return (m, k, n), _event_dtype(evt, i, fallback_dtype), ((("batch", batch),) if batch > 1 else ())
    if not shapes or not shapes[0]:
        return None
    dtype = _event_dtype(evt, 0, fallback_dtype)
    if fam == "attention" and len(shapes) >= 2 and len(shapes[1]) >= 3:
        # SDPA variants take [B, H, S, Dh]; the _flash/_efficient_attention_forward ops [B, S, H, Dh].
        k = shapes[1]
        kv_heads = k[-2] if evt.name in ("aten::_flash_attention_forward",
                                         "aten::_efficient_attention_forward") else k[-3]
        extras = (("kv_heads", kv_heads),)
        # is_causal is SDPA's 6th argument (q, k, v, attn_mask, dropout_p, is_causal, ...); the
        # profiler keeps scalar arguments. Without a mask it says whether the call is causal;
        # with one (a model's own mask), the family's default stands (kernels/attention.py).
        ci = getattr(evt, "concrete_inputs", None) or []
        if (evt.name == "aten::scaled_dot_product_attention" and len(ci) > 5
                and isinstance(ci[5], bool) and len(shapes) > 3 and not shapes[3]):
            extras += (("causal", int(ci[5])),)
        return tuple(shapes[0]), dtype, extras
    return tuple(shapes[0]), dtype, ()


def _matmul_mkn(name: str, shapes: list[list[int]]):
    """([M, K, N], batch) of a matmul-family op from its input shapes, or None."""
    try:
        if name == "aten::linear":                     # x [..., K], weight [N, K]
            x, w = shapes[0], shapes[1]
            return (math.prod(x[:-1]), x[-1], w[0]), 1
        a, b = (shapes[1], shapes[2]) if name in ("aten::addmm", "aten::baddbmm") else (shapes[0], shapes[1])
        if len(a) == 1:
            a = [1] + a
        if len(b) == 1:
            b = b + [1]
        if len(b) == 2:                                # [..., M, K] @ [K, N]: leading dims fold into M
            return (math.prod(a[:-1]), a[-1], b[1]), 1
        lead = torch.broadcast_shapes(tuple(a[:-2]), tuple(b[:-2]))
        return (a[-2], a[-1], b[-1]), math.prod(lead)
    except (IndexError, RuntimeError, TypeError):
        return None


def _descendants(evt):
    stack = list(reversed(evt.cpu_children))
    while stack:
        e = stack.pop()
        yield e
        stack.extend(reversed(e.cpu_children))


# ---- the profile ------------------------------------------------------------------------------

_SCOPE_NAMES = (SCOPE_PREFIX, "engine::", "ProfilerStep")


def _is_annotation(evt) -> bool:
    """A user scope (record_function), on the CPU or its projection on the GPU timeline."""
    return bool(getattr(evt, "is_user_annotation", False)) or evt.name.startswith(_SCOPE_NAMES)


def _is_op(evt) -> bool:
    """A real operator ("aten::mm", "mylib::op"), as opposed to a scope or a runtime API call
    ("cudaLaunchKernel", "cuLaunchKernelEx", "hipLaunchKernel"), which has no "::"."""
    return "::" in evt.name and not _is_annotation(evt)


def _model_device(model: nn.Module, inputs) -> torch.device:
    for t in list(model.parameters()) + list(model.buffers()):
        return t.device
    for t in _input_list(inputs):
        if isinstance(t, torch.Tensor):
            return t.device
    return torch.device("cpu")


def _input_list(inputs):
    if isinstance(inputs, dict):
        return list(inputs.values())
    if isinstance(inputs, (list, tuple)):
        return list(inputs)
    return [inputs]


def _call(model, inputs):
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, (list, tuple)):
        return model(*inputs)
    return model(inputs)


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return f"cuda:{index} ({torch.cuda.get_device_name(index)})"
    return str(device)


def profile_model(model: nn.Module, inputs, warmup: int = 1, iters: int = 3) -> ProfileResult:
    """Profile ``model(*inputs)`` (or model(**inputs) for a dict) under no_grad.

    warmup forwards run first (unprofiled: first calls pay for allocation and autotuning), then
    ``iters`` profiled forwards; every number returned is per forward pass. The model is left
    exactly as it was: the hooks are removed even if the forward raises.
    """
    if iters < 1:
        raise ValueError(f"iters must be >= 1, got {iters}")
    device = _model_device(model, inputs)
    on_gpu = device.type == "cuda"          # ROCm builds report AMD GPUs as "cuda" too
    param_dtype = next((_dtype_name(p.dtype) for p in model.parameters()), "float32")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])

    hooks = _Hooks(model)
    try:
        with torch.no_grad():
            for _ in range(warmup):
                _call(model, inputs)
            if on_gpu:
                torch.cuda.synchronize(device)   # no warmup kernel may run into the profiled window
            hooks.recording = True
            with warnings.catch_warnings():
                # torch 2.11 warns on start that events are cleared per cycle; we run one cycle.
                warnings.filterwarnings("ignore", message=".*clears events at the end of each cycle")
                with torch.profiler.profile(activities=activities, record_shapes=True) as prof:
                    for _ in range(iters):
                        with record_function(_FORWARD_SCOPE):
                            _call(model, inputs)
                    if on_gpu:
                        torch.cuda.synchronize(device)
            hooks.recording = False
    finally:
        hooks.remove()

    events = prof.events()
    _fill_input_dtypes(prof, events)
    result = _attribute(events, on_gpu, param_dtype, hooks.shapes)
    return _finish(result, iters, _device_name(device))


def _fill_input_dtypes(prof, events) -> None:
    """Older torch (2.11, as on our H200) has no FunctionEvent.input_dtypes; the raw kineto
    events behind them have the dtypes, under the same correlation id. Without either, call
    dtypes fall back to the parameters' dtype."""
    if all(hasattr(e, "input_dtypes") for e in events):
        return
    try:
        by_id = {k.correlation_id(): k.dtypes() for k in prof.profiler.kineto_results.events()
                 if k.device_type() == DeviceType.CPU}
    except Exception:                # private API: a profile without dtypes beats no profile
        return
    for e in events:
        if e.device_type == DeviceType.CPU and not hasattr(e, "input_dtypes"):
            e.input_dtypes = by_id.get(e.id)


def _attribute(events, on_gpu: bool, fallback_dtype: str, hook_shapes: Counter) -> dict:
    """Walk the op trees under each forward scope; return raw totals summed over all iterations.

    GPU: a device activity (kernel, memcpy, memset) shares its correlation id with the runtime
    call that launched it ("cudaLaunchKernel", "cuLaunchKernelEx" for Triton, "hipLaunchKernel"),
    and that call sits in the CPU tree under the op or scope that made it. Matching by id counts
    every activity once, including kernels launched straight from a scope (Triton), which the
    profiler's own op->kernel links miss. Those links (FunctionEvent.kernels) are only the
    fallback for activities whose launch call isn't in the tree.
    """
    time = defaultdict(float)                                  # family -> us
    calls = Counter()                                          # family -> calls
    ops = defaultdict(lambda: defaultdict(lambda: [0.0, 0]))   # family -> op name -> [us, runs]
    shapes = Counter(hook_shapes)                              # (family, shape, dtype, extras) -> calls
    cpu_total = 0.0                                            # independent CPU total: top-level op spans
    device = defaultdict(list)                                 # correlation id -> device activities
    if on_gpu:
        for e in events:
            if e.device_type != DeviceType.CPU and not _is_annotation(e):
                device[e.id].append(e)
    matched: set = set()                                       # correlation ids already counted
    walked_ops: list = []                                      # (op event, row) for the fallback

    def visit(evt, cur: str | None, op_name: str | None, under_op: bool):
        nonlocal cpu_total
        is_op = _is_op(evt)
        label = _op_family(evt.name) if is_op or _is_annotation(evt) else None
        fam = _inherit(cur, label)
        row = fam or OTHER
        if _starts_call(cur, label):
            calls[label] += 1
            # Module scopes' shapes came from the hooks (their inputs); the rest from the event.
            is_module_scope = evt.name.startswith(SCOPE_PREFIX) and evt.name.count("::") >= 2
            if not is_module_scope:
                s = _call_shape(evt, label, fallback_dtype)
                if s is not None:
                    shapes[(label,) + s] += 1
        if is_op:
            ops[row][evt.name][1] += 1              # how often this op ran, whatever its time
            op_name = evt.name
            if fam is None and not under_op:
                calls[OTHER] += 1                   # a top-level op outside every family
        if on_gpu:
            if is_op:
                walked_ops.append((evt, row))
            elif evt.id in device and evt.id not in matched and not _is_annotation(evt):
                matched.add(evt.id)
                for d in device[evt.id]:            # a graph launch has several
                    us = d.time_range.elapsed_us()
                    time[row] += us
                    ops[row][op_name or d.name][0] += us
                    if op_name is None:
                        ops[row][d.name][1] += 1    # named by the kernel: count its launches
        elif is_op:
            self_us = evt.self_cpu_time_total
            time[row] += self_us
            ops[row][evt.name][0] += self_us
            if not under_op:
                cpu_total += evt.cpu_time_total
        for child in evt.cpu_children:
            visit(child, fam, op_name, under_op or is_op)

    roots = [e for e in events if e.name == _FORWARD_SCOPE and e.device_type == DeviceType.CPU]
    for root in roots:
        for child in root.cpu_children:
            visit(child, None, None, False)

    if not on_gpu:
        return dict(time=time, calls=calls, ops=ops, shapes=shapes, total=cpu_total)

    # Independent total: every device activity in the profiled window, once.
    left = Counter()                                 # kernel name -> us not matched by id
    total = 0.0
    for cid, acts in device.items():
        for d in acts:
            us = d.time_range.elapsed_us()
            total += us
            if cid not in matched:
                left[d.name] += us
    # Fallback: the profiler's op->kernel links, spending each kernel name's unmatched time once.
    for evt, row in walked_ops:
        for k in evt.kernels:
            take = min(k.duration, left[k.name])
            if take > 0:
                left[k.name] -= take
                time[row] += take
                ops[row][evt.name][0] += take
    for name, us in left.items():                    # launched outside the walked trees
        if us > 1e-6:
            time[OTHER] += us
            ops[OTHER][name][0] += us
    return dict(time=time, calls=calls, ops=ops, shapes=shapes, total=total)


def _finish(raw: dict, iters: int, device: str) -> ProfileResult:
    time, calls, ops, shapes = raw["time"], raw["calls"], raw["ops"], raw["shapes"]
    attributed = sum(time.values())
    rows = []
    for fam in list(FAMILIES) + [OTHER]:
        if time.get(fam, 0.0) <= 0.0 and not (fam != OTHER and calls.get(fam)):
            continue
        fam_shapes = [dict(shape=list(shape), dtype=dtype, count=round(n / iters), **dict(extras))
                      for (f, shape, dtype, extras), n in shapes.items() if f == fam]
        fam_shapes.sort(key=lambda s: -s["count"])
        # Ops with no time of their own (aten::linear around its addmm, views) name nothing useful.
        top = sorted(((n, v) for n, v in ops[fam].items() if v[0] > 0), key=lambda kv: -kv[1][0])[:TOP_OPS]
        rows.append(FamilyTime(
            family=fam,
            time_us=time.get(fam, 0.0) / iters,
            fraction=time.get(fam, 0.0) / attributed if attributed > 0 else 0.0,
            calls=round(calls.get(fam, 0) / iters),
            shapes=fam_shapes,
            top_ops=[dict(name=n, time_us=us / iters, calls=round(c / iters)) for n, (us, c) in top],
            has_kernel=fam in FAMILY_NAMES,
        ))
    rows.sort(key=lambda r: -r.time_us)
    return ProfileResult(families=rows, total_us=raw["total"] / iters, device=device)


# ==== the graph road: time per captured node ===================================================
#
# profile_graph(capture, matches) runs the model with every captured graph executed node by
# node under a profiler scope "node::<graph>:<node>" and attributes each device activity (GPU)
# or each aten op's self CPU time (CPU) to the innermost node scope around it: every
# microsecond goes to exactly one node, or to "other" when no node scope holds it (Python
# between graphs, a kernel launched outside them). A node belongs to the match that claimed it
# (engine/match.py), else to "other". The total is measured apart (GPU: every device activity in
# the window; CPU: the spans of top-level ops), so sum(rows) == total is a real check.

NODE_PREFIX = "node::"


@dataclass
class TargetPlan:
    """A target the graph profile proposes: one family under one contract, its real shapes."""
    family: str
    spec: dict
    dtype: str
    shapes: list                 # [{"shape": [...], "count": n}], most time first
    fraction: float              # share of the forward these shapes' matches take
    time_us: float
    matches: int
    label: str = ""              # how the target reads ("" : the family; a region: its ops)


@dataclass
class GraphProfile:
    result: ProfileResult
    node_us: dict                # "graph:node" -> us per forward
    targets: list                # TargetPlan, most time first
    unplaced: list               # [{"family", "why", "time_us", "count"}]: recognized, no contract


class _Timed(torch.fx.Interpreter):
    """Runs a graph node by node, each call in a profiler scope named after the node."""

    def __init__(self, gm, index: int):
        super().__init__(gm)
        self.prefix = f"{NODE_PREFIX}{index}:"

    def run_node(self, n):
        if n.op != "call_function":
            return super().run_node(n)
        with record_function(self.prefix + n.name):
            return super().run_node(n)


def _timed_runner(cap):
    def wrap(graph):
        interp = _Timed(graph.gm, graph.index)
        if graph.origin == "export":
            codegen = graph.gm.graph._codegen

            def run(*args, **kwargs):
                return interp.run(*codegen.process_inputs(*args, **kwargs))
            return run
        return lambda *flat: interp.run(*flat)
    return cap.runner(wrap)


def _graph_attribute(events, on_gpu: bool) -> dict:
    node_us = defaultdict(float)                       # "graph:node" -> us
    other = defaultdict(lambda: [0.0, 0])              # op or kernel name -> [us, calls]
    device = defaultdict(list)
    if on_gpu:
        for e in events:
            if e.device_type != DeviceType.CPU and not _is_annotation(e):
                device[e.id].append(e)
    matched: set = set()
    cpu_total = 0.0

    def visit(evt, node, under_op):
        nonlocal cpu_total
        if _is_annotation(evt) and evt.name.startswith(NODE_PREFIX):
            node = evt.name[len(NODE_PREFIX):]
        is_op = _is_op(evt)
        if on_gpu:
            if not _is_annotation(evt) and evt.id in device and evt.id not in matched:
                matched.add(evt.id)
                for d in device[evt.id]:
                    us = d.time_range.elapsed_us()
                    if node is not None:
                        node_us[node] += us
                    else:
                        other[d.name][0] += us
                        other[d.name][1] += 1
        elif is_op:
            if node is not None:
                node_us[node] += evt.self_cpu_time_total
            else:
                other[evt.name][0] += evt.self_cpu_time_total
                other[evt.name][1] += 1
            if not under_op:
                cpu_total += evt.cpu_time_total
        for child in evt.cpu_children:
            visit(child, node, under_op or is_op)

    for root in (e for e in events if e.name == _FORWARD_SCOPE and e.device_type == DeviceType.CPU):
        for child in root.cpu_children:
            visit(child, None, False)
    if on_gpu:
        total = 0.0
        for cid, acts in device.items():
            for d in acts:
                us = d.time_range.elapsed_us()
                total += us
                if cid not in matched:            # launched outside the walked trees
                    other[d.name][0] += us
                    other[d.name][1] += 1
    else:
        total = cpu_total
    return dict(node_us=node_us, other=other, total=total)


def _match_dtype(m) -> str:
    import kernels
    fam = kernels.get(m.family, m.fit.spec or None) if m.fit else kernels.get(m.family)
    for arg in fam.arg_names:
        ref = m.fit.args.get(arg) if m.fit else None
        if ref is not None and ref.name is not None:
            meta = m.meta(ref.name)
            if meta is not None:
                return _dtype_name(meta["dtype"])
    meta = m.out_meta()
    return _dtype_name(meta["dtype"]) if meta else "float32"


def profile_graph(cap, matches: dict, warmup: int = 1, iters: int = 3,
                  max_shapes: int = 4, regions: dict | None = None) -> GraphProfile:
    """Profile the captured model (engine/capture.py) with its ``matches`` ({graph index:
    [Match]}) and ``regions`` ({graph index: [engine.regions.Region]}: the fusible rest, one
    target per region spec); per-forward figures. See the section comment above."""
    from kernels.patterns import spec_key
    model, inputs, kwargs = cap.model, cap.inputs, cap.kwargs
    device = _model_device(model, inputs)
    on_gpu = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    run = _timed_runner(cap)
    with torch.no_grad():
        for _ in range(warmup):
            run(*inputs, **kwargs)
        if on_gpu:
            torch.cuda.synchronize(device)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*clears events at the end of each cycle")
            with torch.profiler.profile(activities=activities) as prof:
                for _ in range(iters):
                    with record_function(_FORWARD_SCOPE):
                        run(*inputs, **kwargs)
                if on_gpu:
                    torch.cuda.synchronize(device)
    if cap.method == "dynamo":
        torch._dynamo.reset()
    raw = _graph_attribute(prof.events(), on_gpu)
    if regions:
        # a match whose nodes a region took is served by the region: one no contract serves
        # (softmax over dim 1), or a lone GEMM the region fuses with its epilogue
        # (engine/regions.py); its time is the region's, counted once
        taken = {(gi, n) for gi, rs in regions.items() for r in rs for n in r.nodes}
        matches = {gi: [m for m in ms if not any((gi, n) in taken for n in m.nodes)]
                   for gi, ms in matches.items()}
    node_us = {k: v / iters for k, v in raw["node_us"].items()}
    total = raw["total"] / iters

    owner = {}                                         # "graph:node" -> match
    for gi, ms in matches.items():
        for m in ms:
            for n in m.nodes:
                owner[f"{gi}:{n.name}"] = m
    for gi, rs in (regions or {}).items():
        for r in rs:
            for n in r.nodes:
                owner[f"{gi}:{n.name}"] = r
    fam_time = defaultdict(float)
    fam_calls = Counter()
    fam_ops = defaultdict(lambda: defaultdict(lambda: [0.0, 0]))
    match_us = {}
    for gi, ms in matches.items():
        for m in ms:
            us = sum(node_us.get(f"{gi}:{n.name}", 0.0) for n in m.nodes)
            match_us[id(m)] = us
            fam_time[m.family] += us
            fam_calls[m.family] += 1
            for n in m.nodes:
                op = f"aten::{getattr(n.target, '_opname', n.target)}"
                fam_ops[m.family][op][0] += node_us.get(f"{gi}:{n.name}", 0.0)
                fam_ops[m.family][op][1] += 1
    other_ops = defaultdict(lambda: [0.0, 0])
    for key, us in node_us.items():
        if key not in owner:
            gi, name = key.split(":", 1)
            node = next((n for n in cap.graphs[int(gi)].gm.graph.nodes if n.name == name), None)
            op = f"aten::{getattr(node.target, '_opname', getattr(node.target, '__name__', '?'))}" if node else name
            other_ops[op][0] += us
            other_ops[op][1] += 1
    for name, (us, calls) in raw["other"].items():
        other_ops[name][0] += us / iters
        other_ops[name][1] += round(calls / iters)
    region_rows = _region_time(regions or {}, node_us)
    other_us = sum(v[0] for v in other_ops.values())
    attributed = sum(fam_time.values()) + sum(g["time_us"] for g in region_rows.values()) + other_us

    # targets: placeable matches by (family, spec); the shapes with the most time
    groups: dict = {}
    unplaced: dict = {}
    for gi, ms in matches.items():
        for m in ms:
            if not m.placeable:
                u = unplaced.setdefault((m.family, m.why_not), {"family": m.family, "why": m.why_not,
                                                                "time_us": 0.0, "count": 0})
                u["time_us"] += match_us[id(m)]
                u["count"] += 1
                continue
            g = groups.setdefault((m.family, spec_key(m.fit.spec)), {"spec": m.fit.spec, "by": {}})
            key = (tuple(int(s) for s in m.fit.shape), _match_dtype(m))
            e = g["by"].setdefault(key, [0, 0.0])
            e[0] += 1
            e[1] += match_us[id(m)]
    targets = []
    for (fam, _), g in groups.items():
        by_dtype = Counter()
        for (shape, dt), (n, us) in g["by"].items():
            by_dtype[dt] += us if us > 0 else 1e-9 * n
        dtype = by_dtype.most_common(1)[0][0]
        ranked = sorted(((shape, n, us) for (shape, dt), (n, us) in g["by"].items() if dt == dtype),
                        key=lambda t: (-t[2], -t[1]))[:max_shapes]
        us = sum(t[2] for t in ranked)
        targets.append(TargetPlan(fam, g["spec"], dtype,
                                  [{"shape": list(s), "count": n} for s, n, _ in ranked],
                                  us / attributed if attributed > 0 else 0.0, us,
                                  sum(t[1] for t in ranked)))
    targets += _region_targets(region_rows, attributed, max_shapes)
    targets.sort(key=lambda t: -t.time_us)

    from kernels import FAMILY_NAMES
    rows = []
    for fam in FAMILY_NAMES:
        if fam not in fam_calls:
            continue
        shapes = [dict(shape=list(shape), dtype=dt, count=n, spec=g["spec"])
                  for (f, _), g in groups.items() if f == fam for (shape, dt), (n, _) in g["by"].items()]
        shapes += [dict(shape=[], dtype="", count=u["count"], why_not=u["why"])
                   for (f, _), u in unplaced.items() if f == fam]
        top = sorted(fam_ops[fam].items(), key=lambda kv: -kv[1][0])[:TOP_OPS]
        rows.append(FamilyTime(fam, fam_time[fam], fam_time[fam] / attributed if attributed > 0 else 0.0,
                               fam_calls[fam], shapes,
                               [dict(name=n, time_us=v[0], calls=v[1]) for n, v in top if v[0] > 0],
                               has_kernel=any(t.family == fam for t in targets)))
    for g in region_rows.values():       # a row per region target, named by its ops
        shapes = [dict(shape=list(shape), dtype=dt, count=n, spec=g["spec"])
                  for (shape, dt), (n, _) in g["by"].items()]
        top = sorted(g["ops"].items(), key=lambda kv: -kv[1][0])[:TOP_OPS]
        rows.append(FamilyTime(g["spec"]["name"], g["time_us"],
                               g["time_us"] / attributed if attributed > 0 else 0.0,
                               g["calls"], shapes,
                               [dict(name=n, time_us=v[0], calls=v[1]) for n, v in top if v[0] > 0],
                               has_kernel=True))
    top = sorted(other_ops.items(), key=lambda kv: -kv[1][0])[:TOP_OPS]
    if other_us > 0 or not rows:
        rows.append(FamilyTime(OTHER, other_us, other_us / attributed if attributed > 0 else 0.0,
                               sum(v[1] for v in other_ops.values()), [],
                               [dict(name=n, time_us=v[0], calls=v[1]) for n, v in top if v[0] > 0]))
    rows.sort(key=lambda r: -r.time_us)
    return GraphProfile(ProfileResult(rows, total, _device_name(device)), node_us, targets,
                        sorted(unplaced.values(), key=lambda u: -u["time_us"]))


# ---- regions (engine/regions.py): targets of the family "region", one per spec -----------------

def _region_time(regions: dict, node_us: dict) -> dict:
    """spec key -> {"spec", "time_us", "calls", "by": {(shape, dtype): [count, us]}, "ops"}."""
    from kernels.patterns import spec_key
    out: dict = {}
    for gi, rs in regions.items():
        for r in rs:
            us = sum(node_us.get(f"{gi}:{n.name}", 0.0) for n in r.nodes)
            g = out.setdefault(spec_key(r.spec), {"spec": r.spec, "time_us": 0.0, "calls": 0,
                                                  "by": {}, "ops": defaultdict(lambda: [0.0, 0])})
            g["time_us"] += us
            g["calls"] += 1
            e = g["by"].setdefault((tuple(int(s) for s in r.shape), r.dtype), [0, 0.0])
            e[0] += 1
            e[1] += us
            for n in r.nodes:
                op = f"aten::{getattr(n.target, '_opname', getattr(n.target, '__name__', '?'))}"
                g["ops"][op][0] += node_us.get(f"{gi}:{n.name}", 0.0)
                g["ops"][op][1] += 1
    return out


def _region_targets(region_rows: dict, attributed: float, max_shapes: int) -> list:
    """A TargetPlan per region spec: family "region", labelled by the region's ops, its
    domain shapes in the dtype it mostly runs in."""
    out = []
    for g in region_rows.values():
        by_dtype = Counter()
        for (shape, dt), (n, us) in g["by"].items():
            by_dtype[dt] += us if us > 0 else 1e-9 * n
        dtype = by_dtype.most_common(1)[0][0]
        ranked = sorted(((shape, n, us) for (shape, dt), (n, us) in g["by"].items() if dt == dtype),
                        key=lambda t: (-t[2], -t[1]))[:max_shapes]
        us = sum(t[2] for t in ranked)
        out.append(TargetPlan("region", g["spec"], dtype,
                              [{"shape": list(s), "count": n} for s, n, _ in ranked],
                              us / attributed if attributed > 0 else 0.0, us,
                              sum(t[1] for t in ranked), label=g["spec"]["name"]))
    return out
