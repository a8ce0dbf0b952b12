"""Cross-entropy family: mean over counted rows of logsumexp(logits[n, :]) - logits[n, target[n]].

logits [..., V] are viewed as [N, V]; targets are int64 of shape logits.shape[:-1]; rows whose
target is -100 (ignore_index) add nothing and are not counted; the result is a 0-d float32
tensor (NaN when every row is ignored, like torch). The op must read the logits once and the
targets once and write 4 bytes: N*V*itemsize + 8*N + 4 bytes, about 4 flops per logit
(max, subtract, exp, add), so it is memory bound; at 128k vocab one row is 256 KB (bf16).

Numerics: an online log-sum-exp in fp32 (running max m, sum s of exp(x - m) rescaled when m
grows; rows or lanes that have seen only -inf subtract 0 rather than -inf, so no NaN appears).
The loss is formed as (m - x_target) + log(s): the subtraction of two nearby large logits is
exact, where logsumexp - x_target would lose the low bits of a large logsumexp.
The mean is a separate one-program Triton kernel that sums the per-row losses and counts the
counted rows in a fixed order: deterministic, no atomics.

Search space (``SPACE``), rendered by ``render`` into one self-contained candidate source:
- variant "row": a program owns ROWS rows and loops over the vocabulary in chunks of BLOCK_V
  (rows_per_prog > 1 suits small vocabularies; the [ROWS, BLOCK_V] tile is capped at 65536).
- variant "split": each row is cut into ``splits`` vocab slices, one program per (row, slice)
  writes a partial (m, s) to an fp32 workspace [N, splits]; a second kernel merges the partials
  of each row and forms its loss. More programs in flight per row: the speed at 128k vocab.
  splits is lowered at launch (to a power of two) so that a slice holds about 1024+ logits.
- online "chunk" (one max per chunk, one exp per logit) or "lane" (per-lane running max and sum,
  merged after the loop: no cross-lane reduction in the loop, two exps per logit).
- block_v (chunk width, clamped to the row or slice length), num_warps, num_stages (software
  pipelining of the vocab loop), use_exp2 (exp2((x - m) * log2(e))).
Parameters that do not apply render the same source (rows_per_prog with "split", splits with
"row").
Launch-time clamps keep every point valid on the GPU: a program's register tile is at most
65536 elements (ROWS halves until it fits) and num_stages drops until the (stages - 1)
pipelined load buffers fit 48 KB of shared memory (a 4-stage fp32 [8, 4096] loop would ask
for 384 KB and fail to launch).
"""
from __future__ import annotations

import dataclasses
import functools
import math
import textwrap

import torch
import torch.nn.functional as F

from kernels import Family
from kernels import _common as C
from kernels import matmul as MM
from kernels.patterns import Fit, NoFit, Ref, Spelling, T
from kernels.softmax import softmax_input

NAME = "cross_entropy"
SIGNATURE = "kernel_fn(logits, targets)"
ARG_NAMES = ("logits", "targets")
ADVERSARIAL = ("huge", "tiny", "mixed_scale", "constant_rows", "heavy_tail", "neg_inf")
IGNORE_INDEX = -100


def reference(logits, targets):
    """Mean cross-entropy in fp32 (fp64 when given fp64 logits, for the ground truth)."""
    v = logits.shape[-1]
    x = logits.reshape(-1, v)
    if x.dtype != torch.float64:
        x = x.float()
    return F.cross_entropy(x, targets.reshape(-1).long(), ignore_index=IGNORE_INDEX)


# ---------------------------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------------------------

# "huge" logits: rows centered at c ~ U(-2e4, 2e4) (fp16's safe top; exp overflows past 89) with a
# spread of a few ulps; fp32 gets the same range, the scale at which LLM logits could ever sit.
_HUGE = {torch.float16: (2e4, 24.0), torch.bfloat16: (2e4, 200.0), torch.float32: (2e4, 4.0)}


def make_inputs(shape, dtype, device, gen, kind="normal"):
    """{logits: [*shape], targets: int64 [*shape[:-1]]} from ``gen``; ~5% of targets are -100.

    Logit kinds are softmax's, except "neg_inf": ~10% of logits are -inf but never a row's
    target logit (that loss would be +inf), and row 0 (when there are 2+ rows) is entirely -inf
    with its target ignored: its NaN log-sum-exp must not leak into the mean."""
    dtype = C.as_dtype(dtype)
    shape = tuple(int(s) for s in shape)
    n, v = C.rows_and_cols(shape)
    if kind == "neg_inf":
        x = C.randn(gen, n, v) * 3.0
        x = torch.where(C.rand(gen, n, v) < 0.1, float("-inf"), x)
    else:
        x = softmax_input(shape, dtype, gen, kind, huge=_HUGE).reshape(n, v)
    t = torch.randint(0, v, (n,), generator=gen, device=gen.device)
    t = torch.where(C.rand(gen, n) < 0.05, IGNORE_INDEX, t)
    if kind == "neg_inf":
        rows = torch.arange(n, device=gen.device)
        counted = t != IGNORE_INDEX
        safe_t = torch.where(counted, t, 0)
        x[rows[counted], safe_t[counted]] = C.randn(gen, int(counted.sum()))
        if n >= 2:
            x[0] = float("-inf")
            t[0] = IGNORE_INDEX
            t[1] = int(v * C.rand(gen, 1).item()) % v
            x[1, t[1]] = 0.5
    logits = x.reshape(shape).to(dtype).to(device)
    targets = t.reshape(shape[:-1]).to(device)
    return {"logits": logits, "targets": targets}


# |out - expected| <= atol + rtol * |expected| on the 0-d fp32 mean, expected = the fp64
# reference. The inputs' dtype only changes the logits' values, not the arithmetic (fp32), so
# one tolerance serves all. A textbook kernel forming logsumexp - x_target loses up to half an
# fp32 ulp of the logsumexp per row (1e-3 at logits of 2e4, on means of ~40): rtol 1e-4
# keeps it passing; dropping ignore_index, counting ignored rows, or summing padded lanes
# moves the mean by percents.
TOLERANCE = {
    torch.float32: (1e-5, 1e-4),
    torch.float16: (1e-5, 1e-4),
    torch.bfloat16: (1e-5, 1e-4),
}


def cost(shape, dtype):
    """(bytes, flops): logits once, targets (int64) once, 4 bytes out; max, subtract, exp, add
    per logit plus a log, a subtraction and an add per row."""
    item = C.itemsize(dtype)
    n, v = C.rows_and_cols(shape)
    return n * v * item + 8 * n + 4, 4 * n * v + 3 * n


BENCH_SHAPES = ((8192, 128256), (4096, 32000), (2048, 50257), (1000, 1000), (3, 5000),
                (4097, 1023))
SWEEP_SHAPES = ((1, 1), (2, 3), (7, 1000), (33, 257), (3, 4097), (5, 3, 129), (256, 8192),
                (64, 65536), (4, 50257), (9, 32003), (2, 128256))
EDGE_SHAPES = ((1, 1), (1, 4096), (97, 127), (13, 1031), (4099, 7), (65537, 8), (4, 50257),
               (9, 32003))


# ---------------------------------------------------------------------------------------------
# search space and rendering
# ---------------------------------------------------------------------------------------------

SPACE = {
    "variant": ["row", "split"],
    "online": ["chunk", "lane"],
    "block_v": [1024, 2048, 4096, 8192, 16384],
    "rows_per_prog": [1, 2, 4, 8],
    "splits": [2, 4, 8, 16, 32],
    "num_warps": [1, 2, 4, 8, 16],
    "num_stages": [1, 2, 3, 4],
    "use_exp2": [False, True],
}
DEFAULT = {"variant": "row", "online": "chunk", "block_v": 4096, "rows_per_prog": 1,
           "splits": 8, "num_warps": 4, "num_stages": 1, "use_exp2": False}


def _online_stats(p, rows: bool) -> str:
    """Source of the vocab loop leaving per-row m (running max) and s (sum of exp(x - m)).

    With ``rows`` the tile is [ROWS, BLOCK_V] over ``row_mask`` and ``x_row`` [ROWS, 1]; without,
    a single row (one vocab slice [lo, lo + SLICE)) with scalar m and s."""
    e2 = p["use_exp2"]
    if rows:
        shape, loop = "[ROWS, BLOCK_V]", "for start in tl.range(0, V, BLOCK_V, num_stages=NUM_STAGES):"
        cols = '''cols = start + tl.arange(0, BLOCK_V)
mask = row_mask[:, None] & (cols < V)[None, :]
x = tl.load(x_row + cols[None, :], mask=mask, other=float("-inf")).to(tl.float32)'''
        red, bc, m0 = "axis=1", "[:, None]", "tl.full([ROWS], float(\"-inf\"), dtype=tl.float32)"
        s0 = "tl.zeros([ROWS], dtype=tl.float32)"
    else:
        shape, loop = "[BLOCK_V]", "for start in tl.range(0, SLICE, BLOCK_V, num_stages=NUM_STAGES):"
        cols = '''cols = lo + start + tl.arange(0, BLOCK_V)
x = tl.load(x_row + cols, mask=cols < V, other=float("-inf")).to(tl.float32)'''
        red, bc, m0, s0 = "axis=0", "", "float(\"-inf\")", "0.0"
    if p["online"] == "chunk":
        return f'''
m = {m0}  # running max
s = {s0}  # sum of exp(x - m)
{loop}
{C.indent(cols, 4)}
    m_new = tl.maximum(m, tl.max(x, {red}))
    # rows that saw only -inf so far subtract 0: exp(-inf - 0) = 0, not exp(-inf + inf) = NaN
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    s = s * {C.exp_expr("m - m_ref", e2)} + tl.sum({C.exp_expr(f"x - m_ref{bc}", e2)}, {red})
    m = m_new'''
    return f'''
m_lane = tl.full({shape}, float("-inf"), dtype=tl.float32)  # per-lane running max
s_lane = tl.zeros({shape}, dtype=tl.float32)  # per-lane sum of exp(x - m_lane)
{loop}
{C.indent(cols, 4)}
    m_new = tl.maximum(m_lane, x)
    # lanes that saw only -inf so far subtract 0: exp(-inf - 0) = 0, not exp(-inf + inf) = NaN
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    s_lane = s_lane * {C.exp_expr("m_lane - m_ref", e2)} + {C.exp_expr("x - m_ref", e2)}
    m_lane = m_new
m = tl.max(m_lane, {red})                                          # merge the lanes
m_ref = tl.where(m == float("-inf"), 0.0, m)
s = tl.sum(s_lane * {C.exp_expr(f"m_lane - m_ref{bc}", e2)}, {red})'''


_ROW_LOSS = '''
t = tl.load(targets_ptr + rows, mask=row_mask, other=IGNORE_INDEX)     # [ROWS] int64
# torch raises on targets outside [0, V); here they are never read out of bounds
valid = row_mask & (t != IGNORE_INDEX) & (t >= 0) & (t < V)
x_t = tl.load(logits_ptr + rows * stride_ln + tl.where(valid, t, 0), mask=valid, other=0.0).to(tl.float32)
# logsumexp - x_t = (m - x_t) + log(s); m - x_t is exact for nearby large logits.
# A row that is all -inf gives NaN (like torch) unless it is ignored.
loss = (m - x_t) + tl.log(s)
tl.store(loss_ptr + rows, tl.where(valid, loss, 0.0), mask=row_mask)'''


def _row_kernel(p):
    return f'''@triton.jit
def _ce_rows(logits_ptr, targets_ptr, loss_ptr, N, V, stride_ln,
             ROWS: tl.constexpr, BLOCK_V: tl.constexpr, NUM_STAGES: tl.constexpr,
             IGNORE_INDEX: tl.constexpr):
    """Tile [ROWS, BLOCK_V] sliding along the vocabulary: online log-sum-exp per row, then
    loss[row] = logsumexp - logits[row, target] (0 for ignored rows). Reads each logit once."""
    rows = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)   # [ROWS]; int64 offsets
    row_mask = rows < N
    x_row = logits_ptr + rows[:, None] * stride_ln                     # [ROWS, 1] row starts
{C.indent(_online_stats(p, rows=True), 4)}
{C.indent(_ROW_LOSS, 4)}
'''


def _split_kernels(p):
    return f'''@triton.jit
def _ce_partials(logits_ptr, part_m_ptr, part_s_ptr, V, stride_ln, SLICE,
                 SPLITS: tl.constexpr, BLOCK_V: tl.constexpr, NUM_STAGES: tl.constexpr):
    """Program (row, k) reduces vocab slice [k*SLICE, (k+1)*SLICE) of one row to a partial
    (m, s): its max and the sum of exp(x - m). SLICE is a multiple of BLOCK_V; an empty slice
    writes (-inf, 0). Writes 8 bytes per (row, slice) to the fp32 workspaces [N, SPLITS]."""
    row = tl.program_id(0).to(tl.int64)
    k = tl.program_id(1)
    x_row = logits_ptr + row * stride_ln
    lo = k * SLICE                                                     # < V + SLICE: fits int32
{C.indent(_online_stats(p, rows=False), 4)}
    tl.store(part_m_ptr + row * SPLITS + k, m)
    tl.store(part_s_ptr + row * SPLITS + k, s)


@triton.jit
def _ce_merge(logits_ptr, targets_ptr, part_m_ptr, part_s_ptr, loss_ptr, N, V, stride_ln,
              SPLITS: tl.constexpr, ROWS: tl.constexpr, IGNORE_INDEX: tl.constexpr):
    """Tile [ROWS, SPLITS]: merge each row's partials, m = max(m_k), s = sum(s_k * exp(m_k - m)),
    then loss[row] as in the one-kernel variant. Reads 8*SPLITS bytes and one logit per row."""
    rows = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)   # [ROWS]
    row_mask = rows < N
    ks = tl.arange(0, SPLITS)
    offs = rows[:, None] * SPLITS + ks[None, :]                        # [ROWS, SPLITS]
    pm = tl.load(part_m_ptr + offs, mask=row_mask[:, None], other=float("-inf"))
    ps = tl.load(part_s_ptr + offs, mask=row_mask[:, None], other=0.0)
    m = tl.max(pm, axis=1)                                             # [ROWS]
    m_ref = tl.where(m == float("-inf"), 0.0, m)                       # all -inf: subtract 0
    s = tl.sum(ps * {C.exp_expr("pm - m_ref[:, None]", p["use_exp2"])}, axis=1)
{C.indent(_ROW_LOSS, 4)}
'''


_MEAN_KERNEL = '''@triton.jit
def _ce_mean(loss_ptr, targets_ptr, out_ptr, N, BLOCK: tl.constexpr, IGNORE_INDEX: tl.constexpr):
    """One program: sum of loss[0:N] and count of targets != IGNORE_INDEX, in a fixed order
    (per-lane partial sums, then one tree reduction), then out = sum / count. Deterministic;
    0 / 0 = NaN when every row is ignored, like torch."""
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    cnt = tl.zeros([BLOCK], dtype=tl.int32)
    for start in range(0, N, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < N
        acc += tl.load(loss_ptr + offs, mask=mask, other=0.0)
        t = tl.load(targets_ptr + offs, mask=mask, other=IGNORE_INDEX)
        cnt += (t != IGNORE_INDEX).to(tl.int32)
    total = tl.sum(acc, axis=0)
    count = tl.sum(cnt, axis=0).to(tl.float32)
    tl.store(out_ptr, total / count)
'''


def _launcher(p):
    head = '''

def kernel_fn(logits, targets):
    """Mean cross-entropy of logits [..., V] against int64 targets [...] (-100 = ignored);
    returns a 0-d float32 tensor."""
    V = logits.shape[-1]
    if logits.stride(-1) != 1:
        logits = logits.contiguous()     # kernels assume unit stride along V; any row stride works
    x2 = logits.reshape(-1, V)           # [N, V]: a view whenever the leading dims can merge
    N = x2.shape[0]
    t = targets.reshape(-1).to(torch.int64).contiguous()   # [N]
    out = torch.empty((), dtype=torch.float32, device=logits.device)
    loss = torch.empty((N,), dtype=torch.float32, device=logits.device)   # per-row losses
    if N > 0 and V > 0:'''
    if p["variant"] == "row":
        body = '''
        block_v = min(BLOCK_V, _pow2(V))   # no wider than the row
        rows = _fit_rows(ROWS_PER_PROG, block_v)
        # pipelined loads keep (stages - 1) tiles [rows, block_v] in shared memory
        stages = _fit_stages(NUM_STAGES, rows * block_v * x2.dtype.itemsize)
        _ce_rows[(_cdiv(N, rows),)](
            x2, t, loss, N, V, x2.stride(0), ROWS=rows, BLOCK_V=block_v, NUM_STAGES=stages,
            IGNORE_INDEX=IGNORE_INDEX, num_warps=NUM_WARPS, num_stages=stages)'''
    else:
        body = '''
        # slices of fewer than ~MIN_SLICE logits cost more to launch and merge than they save
        splits = min(SPLITS, _pow2(_cdiv(V, MIN_SLICE)))
        per = _cdiv(V, splits)                             # logits per slice
        block_v = min(BLOCK_V, _pow2(per))      # no wider than a slice
        slice_len = _cdiv(per, block_v) * block_v          # whole chunks per slice
        stages = _fit_stages(NUM_STAGES, block_v * x2.dtype.itemsize)   # pipelined chunk buffers
        part_m = torch.empty((N, splits), dtype=torch.float32, device=logits.device)
        part_s = torch.empty((N, splits), dtype=torch.float32, device=logits.device)
        _ce_partials[(N, splits)](
            x2, part_m, part_s, V, x2.stride(0), slice_len, SPLITS=splits, BLOCK_V=block_v,
            NUM_STAGES=stages, num_warps=NUM_WARPS, num_stages=stages)
        _ce_merge[(_cdiv(N, MERGE_ROWS),)](
            x2, t, part_m, part_s, loss, N, V, x2.stride(0), SPLITS=splits, ROWS=MERGE_ROWS,
            IGNORE_INDEX=IGNORE_INDEX, num_warps=4)'''
    tail = '''
    elif N > 0:
        raise ValueError("cross_entropy over an empty vocabulary (V == 0)")
    _ce_mean[(1,)](loss, t, out, N, BLOCK=MEAN_BLOCK, IGNORE_INDEX=IGNORE_INDEX, num_warps=4)
    return out
'''
    return head + body + tail


def render(params) -> str:
    """Complete candidate source for one point of SPACE (missing params take DEFAULT values)."""
    p = C.resolve(NAME, SPACE, DEFAULT, params)
    if p["variant"] == "row":
        traffic = ("reads each logit once (N*V*itemsize), the targets twice (16*N) and writes and\n"
                   "re-reads 4*N bytes of per-row losses")
    else:
        traffic = (f"reads each logit once (N*V*itemsize), writes and re-reads an fp32 workspace\n"
                   f"of 2*{p['splits']}*4*N bytes, the targets twice (16*N) and the per-row losses (8*N)")
    doc = f'''"""Cross-entropy candidate ({p["variant"]}, online={p["online"]}): mean over counted rows of
logsumexp(logits[n, :]) - logits[n, target[n]], ignore_index = -100, as a 0-d fp32 tensor.

logits [..., V] are viewed as [N, V] (leading dims merged; any row stride, unit column stride);
targets int64 [N]. fp32 online log-sum-exp; the mean is a one-program kernel summing in a fixed
order (deterministic, no atomics).
Bytes the op must move: N*V*itemsize + 8*N + 4 (logits, targets, the result).
This variant {traffic}.
Point: {C.point_line(SPACE, p)}
"""
{C.IMPORTS_SRC}
IGNORE_INDEX = -100
BLOCK_V = {p["block_v"]}        # vocab chunk width (clamped to the row / slice)
ROWS_PER_PROG = {p["rows_per_prog"]}   # rows per program ("row" variant)
SPLITS = {p["splits"]}          # vocab slices per row ("split" variant; fewer for short rows)
MIN_SLICE = 1024       # logits a slice should at least hold
NUM_WARPS = {p["num_warps"]}
NUM_STAGES = {p["num_stages"]}       # software-pipelining depth of the vocab loop
MERGE_ROWS = 16        # rows per program of the split merge
MEAN_BLOCK = 1024      # lanes of the one-program mean
'''
    parts = [doc, C.FIT_ROWS_SRC, "\n"]
    parts.append(_row_kernel(p) if p["variant"] == "row" else _split_kernels(p))
    parts += ["\n", _MEAN_KERNEL, _launcher(p)]
    return C.tidy("\n".join(parts))


FAMILY = Family(
    name=NAME,
    signature=SIGNATURE,
    arg_names=ARG_NAMES,
    reference=reference,
    make_inputs=make_inputs,
    tolerance=TOLERANCE,
    cost=cost,
    bench_shapes=BENCH_SHAPES,
    sweep_shapes=SWEEP_SHAPES,
    edge_shapes=EDGE_SHAPES,
    adversarial=ADVERSARIAL,
    space=SPACE,
    default=DEFAULT,
    render=render,
    description="Mean cross-entropy of logits [..., V] and int64 targets, ignore_index=-100, fp32.",
    notes={"ignore_index": IGNORE_INDEX, "output": "0-d float32",
           "all_ignored": "NaN, like torch", "max_tile_elems": 65536},
)


# ---------------------------------------------------------------------------------------------
# spellings: how model code writes it (kernels/patterns.py)
# ---------------------------------------------------------------------------------------------

def _gather_mean(x, t):
    return -torch.log_softmax(x, -1).gather(-1, t.unsqueeze(-1)).mean()


def _gather_squeeze(x, t):
    return -torch.log_softmax(x, -1).gather(1, t.unsqueeze(1)).squeeze(1).mean()


_XT = (("x", T((4, 16))), ("t", T((4,), "int64")))
_CE_LOOSE = ("weight", "reduction", "ignore_index", "label_smoothing")
SPELLINGS = (
    # F.cross_entropy / nn.CrossEntropyLoss, and log_softmax followed by nll_loss
    Spelling("cross_entropy", lambda x, t: F.cross_entropy(x, t), _XT, loose=_CE_LOOSE),
    Spelling("log_softmax_nll", lambda x, t: F.nll_loss(F.log_softmax(x, -1), t), _XT,
             loose=("weight", "reduction", "ignore_index")),
    # picking the target's log-probability by hand: no ignore_index
    Spelling("log_softmax_gather", _gather_mean, _XT),
    Spelling("log_softmax_gather_squeeze", _gather_squeeze, _XT),
)
_NONE, _MEAN, _SUM = 0, 1, 2     # at::Reduction, as the aten ops take it


def from_match(m):
    """Mean cross-entropy over rows of 2-D logits [N, V] and int64 targets [N]; where the logits
    are an LM head's output that only the loss reads (``Match.linear_of``), the LM head fused in
    (spec linear), the plain loss of the logits its fallback."""
    x, t, out = m.meta("x"), m.meta("t"), m.out_meta()
    if x is None or t is None or out is None or not x["dtype"].is_floating_point:
        return None
    if t["dtype"] not in (torch.int64, torch.int32):
        return None                          # class probabilities, not indices
    if len(x["shape"]) != 2 or tuple(t["shape"]) != (x["shape"][0],):
        raise NoFit(f"logits {list(x['shape'])}, targets {list(t['shape'])}: the contract takes "
                    f"[N, V] logits (classes last) and [N] targets")
    gather = "gather" in m.pattern
    if not gather:
        if m.node("weight") is not None:
            raise NoFit("class weights: the contract weighs every class the same")
        if m.scalar("reduction") not in (_NONE, _MEAN, _SUM):
            raise NoFit(f"reduction {m.scalar('reduction')}: the contract takes none, the mean "
                        f"or the sum")
        if (m.scalar("label_smoothing") or 0.0) != 0.0:
            raise NoFit("label smoothing: the contract has none")
        if m.scalar("ignore_index") != IGNORE_INDEX:
            raise NoFit(f"ignore_index {m.scalar('ignore_index')}: the contract ignores -100")
    post = () if out["dtype"] == torch.float32 else (("to", str(out["dtype"]).removeprefix("torch.")),)
    targets = Ref("t", (("long",),)) if t["dtype"] != torch.int64 else Ref("t")
    spec = {"ignore_index": None} if gather else {}
    if not gather and m.scalar("reduction") in (_SUM, _NONE):
        spec["reduction"] = "sum" if m.scalar("reduction") == _SUM else "none"
    plain = Fit(spec, tuple(x["shape"]), {"logits": Ref("x"), "targets": targets}, post=post)
    head = None if gather else m.linear_of("x")
    if head is None:
        return plain
    # the logits are an LM head's, read by the loss alone: the kernel computes them itself
    hidden, weight, between, upcast, extra = head
    hs = tuple(int(d) for d in hidden.meta["val"].shape)          # [*lead, K]
    m.rebind("hidden", hidden, through=between)
    m.rebind("weight", weight)
    spec_l = dict(spec, linear=True, **({"upcast": True} if upcast else {}))
    args = {"hidden": Ref("hidden"), "weight": Ref("weight"), "targets": targets}
    if extra["bias"] is not None:
        m.rebind("bias", extra["bias"])
        spec_l["bias"] = True
        v = int(x["shape"][1])             # a [1, V] buffer added to the logits is read as [V]
        args["bias"] = Ref("bias", (("reshape", [v]),) if extra["bias"].meta["val"].dim() != 1 else ())
    spec_l.update({k: extra[k] for k in ("scale", "softcap") if extra[k] is not None})
    return Fit(spec_l, hs + (int(x["shape"][1]),), args, post=post, fallback=plain)


def _inputs_no_ignore(shape, dtype, device, gen, kind="normal"):
    """The family's inputs with every target a class (the hand-written spelling has no ignore
    index: -100 would be an out-of-range gather there)."""
    inp = make_inputs(shape, dtype, device, gen, kind)
    t = inp["targets"]
    v = int(shape[-1])
    inp["targets"] = torch.where(t == IGNORE_INDEX, torch.remainder(torch.arange(t.numel(), device=t.device)
                                                                    .reshape(t.shape), v), t)
    if kind == "neg_inf" and t.numel() >= 1:
        # row 0 is all -inf in that kind; with a target it would be +inf: give it a finite logit
        inp["logits"] = inp["logits"].clone()
        inp["logits"].reshape(-1, v)[0, int(inp["targets"].reshape(-1)[0])] = 0.0
    return inp


def _reference_reduced(reduction):
    """The reference under ``reduction``: "sum" (ignored rows add 0; all ignored: 0) or "none"
    (per-row losses [N], ignored rows 0); fp32, fp64 for fp64 logits."""
    def ref(logits, targets):
        v = logits.shape[-1]
        x = logits.reshape(-1, v)
        if x.dtype != torch.float64:
            x = x.float()
        return F.cross_entropy(x, targets.reshape(-1).long(), ignore_index=IGNORE_INDEX,
                               reduction=reduction)
    return ref


def _none_cost(shape, dtype):
    """cost, with 4 bytes a row out (the per-row losses) instead of one 4-byte result."""
    n, _ = C.rows_and_cols(shape)
    b, f = cost(shape, dtype)
    return b - 4 + 4 * n, f


def _render_none(params, base=None):
    # the family's per-row kernels; their losses are the result (no reduction kernel)
    src = (base or render)(params)
    call = ("    _ce_mean[(1,)](loss, t, out, N, BLOCK=MEAN_BLOCK, IGNORE_INDEX=IGNORE_INDEX, num_warps=4)\n"
            "    return out\n")
    assert call in src
    src = src.replace(call, "    return loss                   # [N] fp32, ignored rows 0\n")
    assert _MEAN_KERNEL.strip() in src
    src = src.replace(_MEAN_KERNEL.strip(), "")
    src = src.replace("mean over counted rows of\n", "per row,\n", 1)
    src = src.replace("as a 0-d fp32 tensor.", "as fp32 [N] (ignored rows 0).", 1)
    return src.replace('"""Cross-entropy candidate', '"""Per-row cross-entropy candidate (reduction="none")', 1)


def _render_sum(params, base=None):
    # the family's kernels; the one-program reduction stores the sum instead of the mean
    src = (base or render)(params)
    src = src.replace("tl.store(out_ptr, total / count)", "tl.store(out_ptr, total)")
    src = src.replace("mean over counted rows of\n", "sum over counted rows of\n", 1)
    return src.replace('"""Cross-entropy candidate', '"""Summed cross-entropy candidate (reduction="sum")', 1)


# ---------------------------------------------------------------------------------------------
# the LM head fused in (spec {"linear": true}): loss of hidden @ weight^T, the logits never stored
# ---------------------------------------------------------------------------------------------
# A language model's loss is cross_entropy(lm_head(h), targets). Apart, the LM head's GEMM writes
# the logits [N, V] (16384 x 128256 bf16 at LLaMA-3-8B's 8 x 2048: 4.2 GB; 8.4 GB more where the
# model upcasts them, as transformers does) and the loss reads them back. Fused, each GEMM tile
# [BLOCK_M, BLOCK_N] of logits is reduced in registers to one partial log-sum-exp per row (its
# max m and sum s of exp(x - m)) plus the target's logit where the target falls in the tile; a
# merge kernel combines a row's cdiv(V, BLOCK_N) partials. Memory traffic drops to the operands
# and 8 bytes per (row, vocab tile); the GEMM's flops (2*N*K*V) stay. Placed only where nothing
# else reads the logits (a forward that returns the loss alone: a training step's model).
#
# Shape: hidden's shape followed by V, (*lead, K, V) (N = prod(lead) rows); weight [V, K] in
# nn.Linear's layout; targets int64 [*lead], -100 ignored. Precision: fp32 accumulation over K
# (fp32 operands without TF32), the log-sum-exp in fp32 on the unrounded logits; a model rounds
# its logits to bf16 before the loss, which the tolerance admits (LINEAR_BOUND_TOL).

LINEAR_ARGS = ("hidden", "weight", "targets")


def linear_problem(shape) -> tuple[int, int, int]:
    """(N, K, V) of a family shape (*lead, K, V)."""
    shape = tuple(int(s) for s in shape)
    if len(shape) < 3:
        raise ValueError(f"a cross_entropy+linear shape is (*hidden.shape, V), e.g. (N, K, V), got {shape}")
    n = 1
    for s in shape[:-2]:
        n *= s
    return n, shape[-2], shape[-1]


def _logits64(hidden, weight):
    k = hidden.shape[-1]
    x, w = hidden.reshape(-1, k), weight
    if x.dtype != torch.float64:
        x, w = x.float(), w.float()
    return x @ w.t()                                               # [N, V]


@dataclasses.dataclass(frozen=True)
class Head:
    """What the model does to the LM head's GEMM before the loss reads the logits:
    l = softcap * tanh(scale * (hidden @ weight^T + bias) / softcap), each part optional
    (a bias: Phi, GPT-J; a scale: Cohere's logit_scale, Granite's 1 / logits_scaling; a soft
    cap: Gemma 2's final_logit_softcapping)."""
    bias: bool = False
    scale: float | None = None
    softcap: float | None = None

    @staticmethod
    def of(spec: dict) -> "Head":
        return Head(bool(spec.get("bias", False)), spec.get("scale"), spec.get("softcap"))

    def apply(self, logits, bias=None):
        """The transform on float logits [N, V] (fp64 in the reference, the model's dtype in
        the baseline, where the model computes it)."""
        if bias is not None:
            logits = logits + bias.to(logits.dtype)
        if self.scale is not None:
            logits = logits * self.scale
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits


def _linear_reference(reduction, head: Head = Head()):
    def ref(hidden, weight, targets, bias=None):
        """cross_entropy(head(hidden @ weight^T), targets) in fp32 on the unrounded logits
        (fp64 for fp64 operands: the ground truth)."""
        return F.cross_entropy(head.apply(_logits64(hidden, weight), bias), targets.reshape(-1).long(),
                               ignore_index=IGNORE_INDEX, reduction=reduction)
    return ref


def _linear_baseline(upcast: bool, reduction, head: Head = Head()):
    def base(hidden, weight, targets, bias=None):
        """What the model runs: the LM head's GEMM (and bias) writing the logits in its dtype,
        the scale and soft cap in that dtype, an upcast to fp32 where the model does, the loss
        reading them."""
        logits = head.apply(F.linear(hidden, weight, bias))
        logits = logits.float() if upcast else logits
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1).long(),
                               ignore_index=IGNORE_INDEX, reduction=reduction)
    return base


def _linear_bound(reduction, head: Head = Head()):
    def bound(hidden, weight, targets, bias=None):
        """Per row, max_j (|h| @ |W|^T + |b|)_j * |scale| (a bound on every logit's magnitude
        and, times the unit roundoff, on its rounding; the soft cap's tanh only shrinks an
        error) times max(1, sqrt(K) / 8) (fp32 accumulation, as the matmul family's bound),
        plus softcap / 4 for the fp32 tanh's own error (about 2^-21 * softcap: within the fp32
        bound tolerance of 2^-18 times it), reduced as the loss is (mean over counted rows, sum,
        or per row): a row's loss moves by at most twice its largest logit error."""
        k = hidden.shape[-1]
        x, w = hidden.reshape(-1, k).abs(), weight.abs()
        if x.dtype != torch.float64:
            x, w = x.float(), w.float()
        mag = x @ w.t()
        if bias is not None:
            mag = mag + bias.abs().to(mag.dtype)
        per_row = mag.amax(dim=1) * abs(head.scale or 1.0) * max(1.0, math.sqrt(k) / 8.0) * 2.0   # [N]
        if head.softcap is not None:
            per_row = per_row + head.softcap / 4.0
        counted = targets.reshape(-1) != IGNORE_INDEX
        per_row = torch.where(counted, per_row, 0.0)
        if reduction == "none":
            return per_row
        total = per_row.sum()
        return total if reduction == "sum" else total / counted.sum().clamp(min=1)
    return bound


# stol on the bound above: 64 fp32 ulps of accumulation (matmul's), plus for 16-bit operands
# one rounding of each logit to the operands' dtype (the unit roundoff: 2^-11 fp16, 2^-8 bf16),
# which a model's own LM head makes before its loss
LINEAR_BOUND_TOL = {
    torch.float32: 64 * 2.0**-24,
    torch.float16: 64 * 2.0**-24 + 2.0**-11,
    torch.bfloat16: 64 * 2.0**-24 + 2.0**-8,
}
LINEAR_ADVERSARIAL = ("huge", "tiny", "mixed_scale", "constant_rows", "heavy_tail")


def make_linear_inputs(shape, dtype, device, gen, kind="normal"):
    """{hidden [*lead, K], weight [V, K], targets int64 [*lead]} from ``gen``; ~5% of targets
    are -100. Logits hidden @ weight^T have a spread of about 2 ("normal", an LM's), of
    about 1000 ("huge": m - x_target must stay exact), 1e-4 ("tiny": the loss is about log V),
    row scales 10^-2..10^2 ("mixed_scale"), every row's logits equal ("constant_rows": weight
    rows all alike, loss = log V exactly, where a padded column counted as 0 instead of -inf
    would show), or Cauchy-tailed hidden states ("heavy_tail")."""
    dtype = C.as_dtype(dtype)
    n, k, v = linear_problem(shape)
    lead = tuple(int(s) for s in shape[:-2])
    h = C.randn(gen, n, k)
    w = C.randn(gen, v, k) * (2.0 / math.sqrt(max(k, 1)))
    if kind == "huge":
        h = h * 500.0
    elif kind == "tiny":
        h = h * 1e-4
    elif kind == "mixed_scale":
        h = h * (10.0 ** (C.rand(gen, n, 1) * 4.0 - 2.0))
    elif kind == "constant_rows":
        w = w[:1].expand(v, k).clone() if v > 0 else w
    elif kind == "heavy_tail":
        h = C.cauchy(gen, n, k).clamp(-1e3, 1e3)
    t = torch.randint(0, max(v, 1), (n,), generator=gen, device=gen.device)
    t = torch.where(C.rand(gen, n) < 0.05, IGNORE_INDEX, t)
    return {"hidden": h.reshape(lead + (k,)).to(dtype).to(device),
            "weight": w.to(dtype).to(device), "targets": t.reshape(lead).to(device)}


def make_linear_bias_inputs(shape, dtype, device, gen, kind="normal"):
    """make_linear_inputs and a bias [V] (spread 0.5; 50 where kind is "huge")."""
    inp = make_linear_inputs(shape, dtype, device, gen, kind)
    v = linear_problem(shape)[2]
    b = C.randn(gen, v) * (50.0 if kind == "huge" else 0.5)
    inp["bias"] = b.to(C.as_dtype(dtype)).to(device)
    return inp


def linear_cost(shape, dtype):
    """(bytes, flops): hidden and the weight once, the targets, the 4-byte result; the GEMM's
    2*N*K*V flops plus the loss's 4 per logit. The logits are never written: compute bound."""
    item = C.itemsize(dtype)
    n, k, v = linear_problem(shape)
    return (n * k + v * k) * item + 8 * n + 4, 2 * n * k * v + 4 * n * v + 3 * n


# GPT-2's LM head at 8 x 1024 tokens, LLaMA-3-8B's at 2 x 2048 and 8 x 2048, LLaMA-2's vocabulary
LINEAR_BENCH_SHAPES = ((8, 1024, 768, 50257), (4096, 4096, 128256), (16384, 4096, 128256),
                       (2048, 4096, 32000))
LINEAR_SWEEP_SHAPES = ((1, 16, 1), (2, 3, 5), (7, 33, 100), (2, 5, 64, 257), (33, 64, 1000),
                       (4, 128, 4097))
LINEAR_EDGE_SHAPES = ((1, 1, 1), (1, 8, 3), (97, 16, 127), (3, 17, 50257), (130, 24, 300))

LINEAR_SPACE = {
    "block_m": [64, 128],
    "block_n": [64, 128, 256],
    "block_k": [32, 64],
    "group_m": [1, 8, 16],
    "num_warps": [4, 8],
    "num_stages": [2, 3, 4],
    "loads": ["pointers", "tma", "tma_ws"],
    "epilogue": ["whole", "halves"],
    "use_exp2": [False, True],
}
LINEAR_DEFAULT = {"block_m": 128, "block_n": 128, "block_k": 32, "group_m": 8, "num_warps": 4,
                  "num_stages": 3, "loads": "pointers", "epilogue": "whole", "use_exp2": False}


def _head_steps(head: Head, bias_words: str) -> list:
    """The head transform in words, in its order (for the candidate's docstrings)."""
    return [w for w, on in ((bias_words, head.bias), (f"times {head.scale!r}", head.scale is not None),
                            (f"capped at c = {head.softcap!r} (c * tanh(l / c))", head.softcap is not None))
            if on]


def _head_src(head: Head) -> str:
    """Source applying the model's head transform to the fp32 tile ``acc`` (vocab tile pid_n),
    in the order the model applies it: bias, scale, soft cap."""
    out = ""
    if head.bias:
        out += """hcols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
acc = acc + tl.load(bias_ptr + hcols, mask=hcols < N, other=0.0).to(tl.float32)[None, :]   # + bias [V]
"""
    if head.scale is not None:
        out += f"acc = acc * {float(head.scale)!r}                      # the model's logit scale\n"
    if head.softcap is not None:
        c = float(head.softcap)
        out += f"acc = _tanh(acc * {1.0 / c!r}) * {c!r}        # soft cap: c * tanh(l / c)\n"
    return out


# tanh in fp32 (the interpreter and every backend have exp): odd Taylor terms below |x| = 1/16,
# where 1 - 2 / (exp(2|x|) + 1) would cancel (relative error < 1e-12 there), the exp form above
# (absolute error a few fp32 ulps of 1), the sign restored
_TANH_SRC = """
@triton.jit
def _tanh(x):
    ax = tl.abs(x)
    x2 = x * x
    small = x * (1.0 + x2 * (-0.3333333333333333 + x2 * (0.13333333333333333 + x2 * -0.05396825396825397)))
    big = 1.0 - 2.0 / (tl.exp(2.0 * ax) + 1.0)
    big = tl.where(x < 0, -big, big)
    return tl.where(ax < 0.0625, small, big)
"""


def _lce_epilogue(p, head: Head = Head()) -> str:
    """Source reducing the fp32 tile ``acc`` [BLOCK_M, BLOCK_N] (rows rm, vocab tile pid_n) to the
    row partials and the target logits (after the model's head transform, if any); epilogue
    "halves" works on two [BLOCK_M, BLOCK_N / 2] halves (half the registers for the exp
    temporaries of a 128 x 256 tile)."""
    e2 = p["use_exp2"]
    head = _head_src(head) + """rows = rm.to(tl.int64)
row_mask = rm < M
t = tl.load(t_ptr + rows, mask=row_mask, other=IGNORE_INDEX)
"""
    if p["epilogue"] == "halves":
        red = f'''halves = tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))
lo, hi = tl.split(halves)
c_lo = pid_n * BLOCK_N + tl.arange(0, BLOCK_N // 2)               # their vocab columns
c_hi = c_lo + BLOCK_N // 2
# padded vocab columns add nothing: -inf, not the 0 the GEMM left there
x_lo = tl.where((c_lo < N)[None, :], lo, float("-inf"))
x_hi = tl.where((c_hi < N)[None, :], hi, float("-inf"))
m = tl.maximum(tl.max(x_lo, axis=1), tl.max(x_hi, axis=1))        # [BLOCK_M] tile max
m_ref = tl.where(m == float("-inf"), 0.0, m)                       # a row of -inf: subtract 0
s = (tl.sum({C.exp_expr("x_lo - m_ref[:, None]", e2)}, axis=1)
     + tl.sum({C.exp_expr("x_hi - m_ref[:, None]", e2)}, axis=1))    # sum of exp(x - m)
x_t = (tl.sum(tl.where(c_lo[None, :] == t[:, None], lo, 0.0), axis=1)
       + tl.sum(tl.where(c_hi[None, :] == t[:, None], hi, 0.0), axis=1))'''
    else:
        red = f'''cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)                # the tile's vocab columns
# padded vocab columns add nothing: -inf, not the 0 the GEMM left there
x = tl.where((cols < N)[None, :], acc, float("-inf"))
m = tl.max(x, axis=1)                                              # [BLOCK_M] tile max
m_ref = tl.where(m == float("-inf"), 0.0, m)                       # a row of -inf: subtract 0
s = tl.sum({C.exp_expr("x - m_ref[:, None]", e2)}, axis=1)          # sum of exp(x - m)
x_t = tl.sum(tl.where(cols[None, :] == t[:, None], acc, 0.0), axis=1)'''
    tail = """
tl.store(pm_ptr + rows * NT + pid_n, m, mask=row_mask)
tl.store(ps_ptr + rows * NT + pid_n, s, mask=row_mask)
# the target's logit, from the one tile holding its column (ignored rows never match)
hit = row_mask & (t >= pid_n * BLOCK_N) & (t < pid_n * BLOCK_N + BLOCK_N) & (t < N)
tl.store(px_ptr + rows, x_t, mask=hit)"""
    return "\n" + head + red + tail


_LCE_ARGS = ("a_ptr, b_ptr, t_ptr, pm_ptr, ps_ptr, px_ptr, M, N, K, NT,\n"
             "               stride_am, stride_ak, stride_bk, stride_bn,\n"
             "               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,\n"
             "               GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, IEEE: tl.constexpr,\n"
             "               DOT_FP32: tl.constexpr, IGNORE_INDEX: tl.constexpr")


def _lce_tile_kernel(p, head: Head = Head()) -> str:
    body = MM.plain_tile_head() + '''
a_ptrs = a_ptr + ram[:, None] * stride_am + rk[None, :] * stride_ak          # hidden [BLOCK_M, BLOCK_K]
b_ptrs = b_ptr + rk[:, None] * stride_bk + rbn[None, :] * stride_bn         # weight^T [BLOCK_K, BLOCK_N]
acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
''' + MM.k_loop([("acc", "b_ptrs", "b")]) + _lce_epilogue(p, head)
    return f'''@triton.jit
def _lce_tiles({_LCE_ARGS.replace("b_ptr, t_ptr", "b_ptr, bias_ptr, t_ptr") if head.bias else _LCE_ARGS}):
    """One tile [BLOCK_M, BLOCK_N] of the logits a @ b (hidden [M, K] @ weight^T [K, N]) in an
    fp32 accumulator, reduced to each row's partial (m, s) for vocab tile pid_n (fp32
    workspaces [M, NT]) and, where the row's target is in the tile, its logit (px [M])."""
{C.indent(body, 4)}
'''


def _lce_tma_kernel(p, head: Head = Head()) -> str:
    ws = ", warp_specialize=True" if p["loads"] == "tma_ws" else ""
    body = f'''
num_pid_m = tl.cdiv(M, BLOCK_M)
num_pid_n = tl.cdiv(N, BLOCK_N)
num_pid_in_group = GROUP_M * num_pid_n
for tile in tl.range(tl.program_id(0), num_pid_m * num_pid_n, NUM_PROGS, flatten=True{ws}):
{C.indent(MM.GROUP_ORDER_SRC.strip(chr(10)), 4)}
    off_m = pid_m * BLOCK_M
    off_n = pid_n * BLOCK_N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
{C.indent(MM.tma_kmajor_k_loop([("acc", "b_desc", "b")]), 4)}
    rm = off_m + tl.arange(0, BLOCK_M)
{C.indent(_lce_epilogue(p, head), 4)}'''
    return f'''@triton.jit
def _lce_tiles_tma(a_desc, b_desc, {"bias_ptr, " if head.bias else ""}t_ptr, pm_ptr, ps_ptr, px_ptr, M, N, K, NT, NUM_PROGS,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   GROUP_M: tl.constexpr, IEEE: tl.constexpr, DOT_FP32: tl.constexpr,
                   IGNORE_INDEX: tl.constexpr):
    """_lce_tiles with every operand tile moved by TMA (hidden [M, K], weight [N, K] K-major,
    transposed in registers; the descriptors zero-fill past the edges), on a persistent grid:
    NUM_PROGS programs walk the tiles in one flattened loop (loads "tma_ws": warp-specialized,
    producer warps loading the next tile's operands while consumers reduce this one)."""
{C.indent(body, 4)}
'''


def _lce_merge_kernel(p) -> str:
    e2 = p["use_exp2"]
    return f'''@triton.jit
def _lce_merge(t_ptr, pm_ptr, ps_ptr, px_ptr, loss_ptr, M, N, NT,
               ROWS: tl.constexpr, CHUNK: tl.constexpr, IGNORE_INDEX: tl.constexpr):
    """Tile [ROWS, CHUNK] sliding over each row's NT partials: m = max(m_k), s = sum(s_k *
    exp(m_k - m)), then loss[row] = (m - x_target) + log(s) (0 for ignored rows)."""
    rows = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)   # [ROWS]
    row_mask = rows < M
    m = tl.full([ROWS], float("-inf"), dtype=tl.float32)
    s = tl.zeros([ROWS], dtype=tl.float32)
    for start in range(0, NT, CHUNK):
        ks = start + tl.arange(0, CHUNK)
        mask = row_mask[:, None] & (ks < NT)[None, :]
        offs = rows[:, None] * NT + ks[None, :]
        pm = tl.load(pm_ptr + offs, mask=mask, other=float("-inf"))
        ps = tl.load(ps_ptr + offs, mask=mask, other=0.0)
        m_new = tl.maximum(m, tl.max(pm, axis=1))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        s = s * {C.exp_expr("m - m_ref", e2)} + tl.sum(ps * {C.exp_expr("pm - m_ref[:, None]", e2)}, axis=1)
        m = m_new
    t = tl.load(t_ptr + rows, mask=row_mask, other=IGNORE_INDEX)
    valid = row_mask & (t != IGNORE_INDEX) & (t >= 0) & (t < N)
    x_t = tl.load(px_ptr + rows, mask=valid, other=0.0)
    # logsumexp - x_t = (m - x_t) + log(s): m - x_t is exact for nearby large logits
    loss = (m - x_t) + tl.log(s)
    tl.store(loss_ptr + rows, tl.where(valid, loss, 0.0), mask=row_mask)
'''


_LCE_POINTERS_CALL = '''_lce_tiles[(_cdiv(N, bm) * nt,)](
            x2, weight, t, part_m, part_s, part_x, N, V, K, nt, x2.stride(0), x2.stride(1),
            weight.stride(1), weight.stride(0), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
            GROUP_M=GROUP_M, EVEN_K=K % bk == 0, IEEE=ieee, DOT_FP32=dot_fp32,
            IGNORE_INDEX=IGNORE_INDEX, num_warps=NUM_WARPS, num_stages=stages)'''

_LCE_TMA_HOST = '''

def _lce_tma(x2, weight, t, part_m, part_s, part_x, bm, bn, bk, stages, ieee, dot_fp32):
    # the TMA tiles, or False where the device or the operands' layouts rule descriptors out
    N, K = x2.shape
    V = weight.shape[0]
    if K == 0 or not _has_tma(x2.device) or not (_rows_ok(x2) and _rows_ok(weight)):
        return False
    tiles = _cdiv(N, bm) * _cdiv(V, bn)
    progs = min(tiles, _num_sms(x2.device))
    _lce_tiles_tma[(progs,)](
        TensorDescriptor(x2, [N, K], [x2.stride(0), 1], [bm, bk]),
        TensorDescriptor(weight, [V, K], [weight.stride(0), 1], [bn, bk]),
        t, part_m, part_s, part_x, N, V, K, part_m.shape[1], progs, BLOCK_M=bm, BLOCK_N=bn,
        BLOCK_K=bk, GROUP_M=GROUP_M, IEEE=ieee, DOT_FP32=dot_fp32, IGNORE_INDEX=IGNORE_INDEX,
        num_warps=NUM_WARPS, num_stages=stages)
    return True
'''


def _lce_tma_host(head: Head) -> str:
    if not head.bias:
        return _LCE_TMA_HOST
    src = _LCE_TMA_HOST.replace("def _lce_tma(x2, weight, t,", "def _lce_tma(x2, weight, bias, t,")
    return src.replace("        t, part_m, part_s, part_x, N, V, K,", "        bias, t, part_m, part_s, part_x, N, V, K,")


def _lce_launcher(p, head: Head = Head()) -> str:
    call = _LCE_POINTERS_CALL
    if p["loads"] != "pointers":
        call = ("if not _lce_tma(x2, weight, t, part_m, part_s, part_x, bm, bn, bk, stages, ieee,\n"
                "                        dot_fp32):\n            " + call.replace("\n", "\n    "))
    sig, check, also = "hidden, weight, targets", "", ""
    steps = _head_steps(head, "plus bias [V]")
    if steps:
        also = "\n    The logits are hidden @ weight^T " + ", then ".join(steps) + "."
    if head.bias:
        sig = "hidden, weight, targets, bias"
        call = call.replace("x2, weight, t, part_m", "x2, weight, bias, t, part_m")
        check = '''
    if bias.shape != (V,) or bias.dtype != weight.dtype:
        raise ValueError(f"bias must be [V={V}] in the weight's dtype, got {list(bias.shape)} {bias.dtype}")'''
    return f'''

def kernel_fn({sig}):
    """Mean cross-entropy of the logits hidden @ weight^T (hidden [..., K], weight [V, K], any
    strides) against int64 targets [...] (-100 = ignored), the logits never stored; returns a
    0-d float32 tensor.{also}"""
    K = hidden.shape[-1]
    V = weight.shape[0]
    if weight.dim() != 2 or weight.shape[1] != K:
        raise ValueError(f"weight must be [V, K={{K}}], got {{list(weight.shape)}}")
    if hidden.dtype != weight.dtype:
        raise ValueError("hidden and weight must share a dtype"){check}
    x2 = hidden.reshape(-1, K)           # [N, K]: a view whenever the leading dims can merge
    N = x2.shape[0]
    t = targets.reshape(-1).to(torch.int64).contiguous()   # [N]
    if t.numel() != N:
        raise ValueError(f"targets hold {{t.numel()}} rows, hidden {{N}}")
    out = torch.empty((), dtype=torch.float32, device=hidden.device)
    loss = torch.empty((N,), dtype=torch.float32, device=hidden.device)   # per-row losses
    if N > 0 and V > 0:
        # the interpreter's tl.dot cannot multiply bf16 tiles (numpy has none): upcast them there
        dot_fp32 = hidden.dtype == torch.bfloat16 and hidden.device.type == "cpu"
        ieee = hidden.dtype == torch.float32 or dot_fp32
        bm, bn, bk, stages = _fit_gemm(BLOCK_M, BLOCK_N, BLOCK_K, NUM_STAGES, NUM_WARPS, N, V,
                                       K, x2.element_size(), _smem_budget(hidden.device))
        nt = _cdiv(V, bn)                # vocab tiles: partials per row
        part_m = torch.empty((N, nt), dtype=torch.float32, device=hidden.device)
        part_s = torch.empty((N, nt), dtype=torch.float32, device=hidden.device)
        part_x = torch.empty((N,), dtype=torch.float32, device=hidden.device)   # target logits
        {call}
        _lce_merge[(_cdiv(N, MERGE_ROWS),)](
            t, part_m, part_s, part_x, loss, N, V, nt, ROWS=MERGE_ROWS,
            CHUNK=min(MERGE_CHUNK, max(2, _pow2(nt))), IGNORE_INDEX=IGNORE_INDEX, num_warps=4)
    elif N > 0:
        raise ValueError("cross_entropy over an empty vocabulary (V == 0)")
    _ce_mean[(1,)](loss, t, out, N, BLOCK=MEAN_BLOCK, IGNORE_INDEX=IGNORE_INDEX, num_warps=4)
    return out
'''


def render_linear(params, head: Head = Head()) -> str:
    """Complete candidate source of the LM head + cross-entropy (spec {"linear": true}) for one
    point of LINEAR_SPACE (missing params take LINEAR_DEFAULT values); ``head``: what the model
    does to the logits before the loss (a bias, a scale, a soft cap), applied to each fp32 tile."""
    p = C.resolve(NAME, LINEAR_SPACE, LINEAR_DEFAULT, params)
    tma = p["loads"] != "pointers"
    how = {"pointers": "one program per tile, loads through pointers",
           "tma": "persistent TMA tiles (pointer tiles where descriptors are ruled out)",
           "tma_ws": "persistent TMA tiles, warp-specialized (pointer tiles where descriptors "
                     "are ruled out)"}[p["loads"]]
    steps = _head_steps(head, "plus the bias b [V] (kernel_fn's last argument; V*itemsize more bytes)")
    transform = ("\n" + textwrap.fill("As the model computes them, the logits are hidden @ weight^T "
                                        + ", then ".join(steps) + ", each fp32 tile transformed "
                                        "before its reduction.", 96)) if steps else ""
    doc = f'''"""Cross-entropy candidate with the LM head fused in ({p["loads"]}): mean over counted rows of
logsumexp(l[n, :]) - l[n, target[n]], l = hidden @ weight^T never stored, ignore_index = -100,
as a 0-d fp32 tensor.

hidden [..., K] viewed as [N, K], weight [V, K] (nn.Linear's layout), targets int64 [N]. Each
GEMM tile [BLOCK_M, BLOCK_N] (fp32 accumulator; fp32 operands without TF32) is reduced in
registers to a partial (max, sum of exp) per row and the target's logit; a merge kernel combines
the cdiv(V, BLOCK_N) partials of a row, a one-program kernel takes the mean in a fixed order.
Bytes the op must move: (N*K + V*K)*itemsize + 8*N + 4; flops 2*N*K*V (+4 per logit).{transform}
This variant: {how}; it writes and re-reads 8 bytes per (row, vocab tile).
Point: {C.point_line(LINEAR_SPACE, p)}
"""
{C.IMPORTS_SRC}
IGNORE_INDEX = -100
BLOCK_M = {p["block_m"]}          # GEMM tile rows (clamped at launch)
BLOCK_N = {p["block_n"]}          # GEMM tile columns: the vocab width of one partial
BLOCK_K = {p["block_k"]}           # K step
GROUP_M = {p["group_m"]}            # row-tiles per group of the swizzled tile order
NUM_WARPS = {p["num_warps"]}
NUM_STAGES = {p["num_stages"]}         # software-pipelining depth of the K loop
MERGE_ROWS = 16        # rows per program of the merge
MERGE_CHUNK = 64       # partials per row a merge step reads
MEAN_BLOCK = 1024      # lanes of the one-program mean
'''
    parts = [doc, MM.GEMM_HELPERS_SRC, _TANH_SRC if head.softcap is not None else "", "\n",
             _lce_tile_kernel(p, head), "\n", _lce_merge_kernel(p),
             "\n", _MEAN_KERNEL]
    if tma:
        parts += [C.NUM_SMS_SRC, "\n\n", C.TMA_HELPERS_SRC, C.ROWS_OK_SRC, "\n\n",
                  _lce_tma_kernel(p, head), _lce_tma_host(head)]
    parts.append(_lce_launcher(p, head))
    return C.tidy("\n".join(parts))


# bf16/fp16 targets' first moves: the TMA tiles at matmul's bf16 opener tile, then 128 x 128
LINEAR_HALF_OPENERS = ({"loads": "tma", "block_n": 256, "block_k": 64, "num_warps": 8,
                        "num_stages": 3},
                       {"loads": "tma", "block_k": 64, "num_warps": 8, "num_stages": 4})


def _linear_openers(shape, dtype: str) -> tuple:
    return () if str(dtype).removeprefix("torch.") == "float32" else LINEAR_HALF_OPENERS


def _configure_linear(spec: dict) -> Family:
    reduction = spec.get("reduction", "mean")
    upcast = bool(spec.get("upcast", False))
    head = Head.of(spec)
    base = functools.partial(render_linear, head=head)
    render = {"mean": base, "sum": functools.partial(_render_sum, base=base),
              "none": functools.partial(_render_none, base=base)}[reduction]

    def cost(shape, dtype):
        b, f = linear_cost(shape, dtype)
        n, _, v = linear_problem(shape)
        b += v * C.itemsize(dtype) if head.bias else 0
        f += n * v * (int(head.bias) + int(head.scale is not None) + 4 * int(head.softcap is not None))
        return (b - 4 + 4 * n, f) if reduction == "none" else (b, f)
    what = {"mean": "mean", "sum": "summed", "none": "per-row"}[reduction]
    args = LINEAR_ARGS + (("bias",) if head.bias else ())
    logits = "hidden @ weight^T" + (" + bias" if head.bias else "")
    logits = f"({logits}) * {head.scale!r}" if head.scale is not None else logits
    logits = f"{head.softcap!r} * tanh(({logits}) / {head.softcap!r})" if head.softcap is not None else logits
    return dataclasses.replace(
        FAMILY, signature=f"kernel_fn({', '.join(args)}) with the LM head fused in",
        arg_names=args, reference=_linear_reference(reduction, head),
        baseline=_linear_baseline(upcast, reduction, head),
        make_inputs=make_linear_bias_inputs if head.bias else make_linear_inputs,
        cost=cost, bench_shapes=LINEAR_BENCH_SHAPES, sweep_shapes=LINEAR_SWEEP_SHAPES,
        edge_shapes=LINEAR_EDGE_SHAPES, adversarial=LINEAR_ADVERSARIAL, space=LINEAR_SPACE,
        default=LINEAR_DEFAULT, render=render, error_bound=_linear_bound(reduction, head),
        bound_tol=LINEAR_BOUND_TOL, openers_for=_linear_openers,
        description=(f"The LM head fused into the {what} cross-entropy: loss of the logits "
                     f"{logits} against int64 targets (ignore_index -100), the logits never "
                     f"stored; fp32."),
        notes={"ignore_index": IGNORE_INDEX, "shape": "(*hidden.shape, V)",
               "weight": "[V, K], nn.Linear's layout", "bound": "compute"},
        op_schema=("(Tensor hidden, Tensor weight, Tensor targets, Tensor bias) -> Tensor" if head.bias
                   else "(Tensor hidden, Tensor weight, Tensor targets) -> Tensor"),
        spec=dict(spec))


def configure(spec: dict) -> Family:
    """``spec["ignore_index"] = None``: no row is ignored (targets are always classes); the
    kernels are the family's (they ignore -100, which then never occurs). ``spec["reduction"]``:
    "sum", the losses of the counted rows summed, or "none", the per-row losses (ignored rows
    0), as F.cross_entropy(reduction=...). ``spec["linear"]``: the LM head before the loss
    fused in, kernel_fn(hidden, weight, targets), the logits never stored (``upcast``: the
    model casts its logits to fp32 before the loss, which its baseline does too; ``bias``:
    the head's bias, kernel_fn(hidden, weight, targets, bias); ``scale``: the logits times
    that number; ``softcap``: c * tanh(logits / c) after the scale)."""
    def number(key, positive):
        v = spec.get(key)
        return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)
                             and math.isfinite(v) and (v > 0 if positive else v != 0))
    head_keys = {"upcast", "bias", "scale", "softcap"}
    if (set(spec) - {"ignore_index", "reduction", "linear"} - head_keys
            or spec.get("ignore_index", IGNORE_INDEX) not in (None, IGNORE_INDEX)
            or spec.get("reduction", "mean") not in ("mean", "sum", "none")
            or not spec.get("linear") and set(spec) & head_keys
            or spec.get("linear") and spec.get("ignore_index", IGNORE_INDEX) is None
            or spec.get("bias", False) not in (True, False)
            or not number("scale", False) or not number("softcap", True)):
        raise ValueError(f"cross_entropy takes a spec {{ignore_index: None, reduction: sum|none, "
                         f"linear: bool, and with linear: upcast: bool, bias: bool, scale: a "
                         f"finite nonzero number, softcap: a positive number}}; got {spec!r}")
    if spec.get("linear"):
        return _configure_linear(spec)
    if not spec or spec == {"reduction": "mean"}:
        return FAMILY
    fam = FAMILY
    if spec.get("ignore_index", IGNORE_INDEX) is None:
        fam = dataclasses.replace(fam, make_inputs=_inputs_no_ignore,
                                  description="Mean cross-entropy, every target a class (no ignore index).")
    if spec.get("reduction") == "sum":
        fam = dataclasses.replace(fam, reference=_reference_reduced("sum"), render=_render_sum,
                                  description="Summed cross-entropy (reduction='sum').")
    if spec.get("reduction") == "none":
        fam = dataclasses.replace(fam, reference=_reference_reduced("none"), render=_render_none,
                                  cost=_none_cost, description="Per-row cross-entropy (reduction='none').")
    return dataclasses.replace(fam, spec=dict(spec))


FAMILY = dataclasses.replace(
    FAMILY, spellings=SPELLINGS, from_match=from_match,
    op_schema="(Tensor logits, Tensor targets) -> Tensor",
    profile_ops=("aten::cross_entropy_loss",))
