"""Regions: the rest of a captured graph, cut into maximal fusible subgraphs, each a target.

Beside the family matches (engine/match.py), ``find(graph, matches)`` walks the nodes no
placeable match claimed and grows regions of the ops kernels/region.py's table holds:

- pointwise chains (arithmetic, activations, casts, comparisons, eval-mode batch norm);
- reductions over any set of dims (sum, mean, amax, var, logsumexp, norms, softmax, log-softmax,
  layer / group / instance norm) with their pointwise prologue and epilogue, several
  reductions in one region when they reduce the same dims (x - x.mean(1) / x.std(1));
- scans (cumsum, cumprod) along one dim, with prologue (a mask) and epilogue;
- a GEMM (linear, mm, addmm, bmm, matmul) with its pointwise epilogue (bias, scale,
  activation, residual, clamp) and a following reduction over the output's last dim where one
  tile holds the row: one kernel, the epilogue applied to the accumulator in registers. A
  matmul family match of a lone GEMM op is absorbed when an epilogue follows it (``Found.
  absorbed``: the region's target replaces the family's; its space holds the same GEMM
  choices), and so is a reduce or softmax family match of a lone op inside such a region (a
  row sum after a GEMM: computed on the accumulator, not written and read back). A reduce
  family's lone sum or mean of pointwise ops, or read by them, is absorbed into their region
  as well (a loss's mean of its terms: the terms are never written out; an L1 norm's
  x / x.abs().mean(1): x read by one kernel). A GEMM with nothing after it, a
  reduction of a model's input, and a softmax with no GEMM before it stay their family's
  targets.

A region grows backwards from its output (the latest fusible node not yet taken): a producer
joins when it is fusible, no match claimed it, every one of its users is already inside (so
the region has one output and removing it removes them all), and the grown region is still one
the generator can write (``build``: one domain every value maps into, every reduction over the
same dims, no reduction of a scan). Convolutions, pooling, views, concatenation, gathers,
recurrent layers and anything with integer values bound regions: they stay outside.

Every region becomes a JSON spec (kernels/region.py) naming its ops; its family is "region",
its label the op names (``mul+leaky_relu``), grouped into one target per (spec, dtype) like a
family's contracts.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, field

import torch
import torch.fx as fx

from engine import capture as cap
from kernels import region as R

MAX_OPS = 48          # a region larger than this is cut (compile time, register pressure)
_TUPLE_OPS = {"max", "min", "_native_batch_norm_legit_no_training"}   # values at getitem 0
_CHANNEL_ARGS = {"batch_norm": ("weight", "bias", "running_mean", "running_var"),
                 "_native_batch_norm_legit_no_training": ("weight", "bias", "running_mean",
                                                          "running_var"),
                 "group_norm": ("weight", "bias"), "instance_norm": ("weight", "bias")}
_RENAME = {("max", "other"): "aten.maximum.default", ("min", "other"): "aten.minimum.default"}


@dataclass
class Region:
    """One fusible region of a captured graph."""
    graph: int                      # the graph's index in the capture
    nodes: list                     # its nodes, graph order, the output last
    output: fx.Node
    inputs: list                    # the external nodes the spec's in0, in1, ... are
    spec: dict                      # kernels/region.py's spec (JSON)
    shape: tuple                    # the domain shape: the family shape of its target
    dtype: str

    @property
    def name(self) -> str:
        return self.spec["name"]


# a reduction after a GEMM is fused only where one tile holds the whole row (its N columns):
# the fp32 accumulator of [BLOCK_M >= 16, N] stays within a program's registers
GEMM_ROW_MAX = 1024
GEMM_OPS = ("linear", "mm", "addmm", "bmm", "matmul")


@dataclass
class Left:
    """A node no match and no region holds, and why (for coverage reports)."""
    node: fx.Node
    why: str


@dataclass
class Found:
    regions: list = field(default_factory=list)
    left: list = field(default_factory=list)
    absorbed: list = field(default_factory=list)   # family matches a GEMM region took over


# ---- which nodes regions may hold ------------------------------------------------------------

def _tensor(v) -> bool:
    return isinstance(v, torch.Tensor)


def _static(v) -> bool:
    try:
        [int(s) for s in v.shape]
        return True
    except Exception:
        return False


def op_of(n: fx.Node) -> tuple[str, fx.Node] | None:
    """(the aten op's qualified name as the spec holds it, the node whose arguments it takes),
    or None when regions cannot hold ``n``. A getitem 0 of max.dim / batch norm's tuple stands
    for its op; an op written in place stands for its functional form when nothing else reads
    the tensor it writes."""
    src = n
    if n.op != "call_function":
        return None
    if n.target is operator.getitem:
        s = n.args[0]
        if (not isinstance(s, fx.Node) or n.args[1] != 0 or len(s.users) != 1
                or not isinstance(s.target, torch._ops.OpOverload)
                or s.target._opname not in _TUPLE_OPS):
            return None
        src = s
    t = src.target
    if not isinstance(t, torch._ops.OpOverload) or t.namespace != "aten":
        return None
    name, overload = t._opname, t._overloadname
    qual = f"aten.{name}.{overload}"
    if (name, overload) in _RENAME:
        qual = _RENAME[(name, overload)]
    elif name in R.IN_PLACE:
        base = src.args[0] if src.args else None
        if (not isinstance(base, fx.Node) or base.op != "call_function" or len(base.users) != 1
                or base.target is operator.getitem):
            return None
        fn = R.IN_PLACE[name]
        qual = f"aten.{fn}.{overload}"
        try:
            R.aten_op(qual)
        except AttributeError:
            return None
    if R.op_parts(qual)[0] not in R.OPS:
        return None
    v = cap.val(n)
    index = R.op_parts(qual)[0] in ("argmax", "argmin") and _tensor(v) and v.dtype == torch.int64
    if not _tensor(v) or not _static(v) or not (v.is_floating_point() or v.dtype == torch.bool or index):
        return None
    if v.dtype == torch.float64:
        return None
    name = R.op_parts(qual)[0]
    if name == "dropout":
        a = dict(zip(("input", "p", "train"), src.args))
        if a.get("train") and a.get("p"):
            return None
    if name == "instance_norm":
        a = R.named_args(qual, list(src.args), dict(src.kwargs))
        if not a.get("use_input_stats"):
            return None
    for a in list(src.args) + list(src.kwargs.values()):
        for x in (a if isinstance(a, (list, tuple)) else [a]):
            if isinstance(x, fx.Node):
                xv = cap.val(x)
                if not _tensor(xv) or not _static(xv):
                    return None
                if not (xv.is_floating_point() or xv.dtype == torch.bool) or xv.dtype == torch.float64:
                    return None
    return qual, src


# ---- building a spec from a node set -----------------------------------------------------------

def _model_strides(a: fx.Node) -> list | None:
    """The strides the model passes input ``a`` in, where not contiguous and no two elements
    share memory but along an expanded dim (stride 0): a transposed view, a slice of a wider
    buffer, channels-last, an expanded bias. The verifier's edge cases run the real shape in
    this layout; the placed site is guarded on it."""
    from engine.verify import overlaps
    v = a.meta.get("val")
    if (not isinstance(v, torch.Tensor) or v.is_contiguous() or v.numel() <= 1
            or overlaps(v.shape, v.stride())):
        return None
    return [int(x) for x in v.stride()]


def _dtype_arg(src: fx.Node):
    """The dtype a node is told to produce, by keyword or position (``x.float()``,
    ``x.to(torch.bfloat16)``, ``sum(dtype=...)``, ``softmax(x, 1, torch.float32)``), else None."""
    want = src.kwargs.get("dtype")
    if not isinstance(want, torch.dtype):
        want = next((a for a in src.args[1:] if isinstance(a, torch.dtype)), None)
    return want


class NotARegion(Exception):
    pass


def _shape(n) -> tuple:
    return tuple(int(s) for s in cap.val(n).shape)


def _dtype(n) -> str:
    return str(cap.val(n).dtype).removeprefix("torch.")


def _tensor_args(qual: str, src: fx.Node) -> dict:
    """Schema name -> argument (node or literal) of the op's table tensor slots."""
    a = R.named_args(qual, list(src.args), dict(src.kwargs))
    name = R.op_parts(qual)[0]
    return {k: a.get(k) for k in R.OPS[name][1]}


def _gemm_parts(name: str, a: dict) -> tuple:
    """(a, b, the added term or None, {"layout", "batch", "k", "n"}) of a GEMM op's named
    arguments: a [*lead, M, K] @ b, with b [K, N] shared by every leading row ("kn"), a
    linear layer's weight [N, K] ("nk"), or a batched [*lead, K, N] with a's leading dims
    ("batch" of them); raises NotARegion for what the generator does not take."""
    layout = "kn"
    if name == "linear":
        x, w, add, layout = a["input"], a["weight"], a.get("bias"), "nk"
    elif name == "addmm":
        x, w, add = a["mat1"], a["mat2"], a["self"]
    elif name == "matmul":
        x, w, add = a["self"], a["other"], None
    else:                                        # mm, bmm
        x, w, add = a["self"], a["mat2"], None
    if not (isinstance(x, fx.Node) and isinstance(w, fx.Node)):
        raise NotARegion("a GEMM of a constant")
    if x is w:
        raise NotARegion("a GEMM of a tensor with itself")
    xs, ws = _shape(x), _shape(w)
    if len(xs) < 2 or len(ws) < 2:
        raise NotARegion("a GEMM of a vector")
    if _dtype(x) != _dtype(w) or _dtype(x) not in ("float32", "float16", "bfloat16"):
        raise NotARegion(f"a GEMM of {_dtype(x)} and {_dtype(w)}")
    if layout == "nk":
        if len(ws) != 2:
            raise NotARegion("a linear layer's weight that is not a matrix")
        k, n, batch = ws[1], ws[0], 0
    else:
        if len(ws) == 2:
            batch = 0
        elif len(ws) == len(xs) and xs[:-2] == ws[:-2]:
            batch = len(xs) - 2
        else:
            raise NotARegion("a GEMM whose batch dims broadcast")
        k, n = ws[-2], ws[-1]
    if xs[-1] != k:
        raise NotARegion("a GEMM's inner dims differ")
    return x, w, add, {"layout": layout, "batch": batch, "k": int(k), "n": int(n)}


def build(nodes: list, order: dict) -> Region:
    """The Region the node set ``nodes`` is (the last in graph order its output), or raises
    NotARegion with why the generator cannot serve it."""
    nodes = sorted(nodes, key=order.get)
    inside = set(nodes)
    out = nodes[-1]
    ops = {}                                     # node -> (qual, src): the spec's values
    sources = set()                              # tuple ops whose getitem 0 is the value
    for n in nodes:
        if n.target is operator.getitem:
            o = op_of(n)
            if o is not None:
                sources.add(o[1])
    for n in nodes:
        if n in sources:
            continue
        o = op_of(n)
        if o is None:
            raise NotARegion(f"{n.name} is not a region op")
        if o[1] is not n and o[1] not in inside:
            raise NotARegion("a tuple op outside its getitem")
        ops[n] = o
    # flips at the region's edges: of an input (read with its index reversed) or of the output
    # (written reversed); a flip between two computed values has no register form here
    flip_in: dict = {}                           # flip node -> (its input, dims)
    flip_out = None
    for n in [n for n in nodes if n in ops and R.op_parts(ops[n][0])[0] == "flip"]:
        x, dims = n.args[0], [int(d) % len(_shape(n)) for d in n.args[1]]
        if isinstance(x, fx.Node) and x not in inside:
            flip_in[n] = (x, dims)
        elif n is out and isinstance(x, fx.Node) and x in ops:
            flip_out = dims
        else:
            raise NotARegion("a flip between two values of the region")
        del ops[n]
    every = nodes                                # the region's nodes, its flips included
    if flip_out is not None:
        out = out.args[0]
        nodes = nodes[:-1]
    values = [n for n in nodes if n in ops]
    if not values or values[-1] is not out:
        raise NotARegion("the output is not a value")
    flipped_src = {}                             # an input -> the dims it is read reversed
    for x, dims in flip_in.values():
        if flipped_src.get(x, dims) != dims:
            raise NotARegion("an input read flipped two ways")
        flipped_src[x] = dims
    if any(x in flipped_src for n in values for x in n.all_input_nodes if x not in flip_in):
        raise NotARegion("an input read both flipped and not")
    # the domain: a reduction's (or scan's) input shape, else the output's
    reds = []
    for n in values:
        qual, src = ops[n]
        name = R.op_parts(qual)[0]
        if R.OPS[name][0] in ("red", "scan"):
            reds.append(n)
    split = None
    convs = [n for n in values if R.OPS[R.op_parts(ops[n][0])[0]][0] == "conv"]
    gemms = [n for n in values if R.OPS[R.op_parts(ops[n][0])[0]][0] == "gemm"]
    if len(convs) > 1:
        raise NotARegion("two convolutions")
    if len(gemms) > 1 or (gemms and convs):
        raise NotARegion("two GEMMs" if len(gemms) > 1 else "a GEMM beside a convolution")
    if convs:
        dom = _shape(convs[0])
    elif gemms:
        dom = _shape(gemms[0])
    elif reds:
        first_q, first_src = ops[reds[0]]
        x = _tensor_args(first_q, first_src)
        xin = next(iter(x.values()))
        dom = _shape(xin)
    else:
        dom = _shape(out)
    rank = len(dom)
    # positional maps: each value's dims -> domain dims (None: a leading dim beyond the domain)
    pos: dict = {}
    in_pos: dict = {}                            # external node -> its map (spec form)
    roles: dict = {}                             # a convolution's x, w, b -> their role
    conv: dict | None = None
    gemm: dict | None = None
    red_dims = None

    def ext_map(a, p):
        """The spec map of external input ``a`` seen at positions ``p``: the domain dim where it
        has the domain's size, None where it broadcasts."""
        s = _shape(a)
        m = []
        for size, d in zip(s, p):
            if d is None:
                if size != 1:
                    raise NotARegion("an input wider than the domain")
                m.append(None)
            elif size == dom[d]:
                m.append(d)
            elif size == 1:
                m.append(None)
            else:
                raise NotARegion(f"an input of shape {list(s)} does not broadcast to {list(dom)}")
        return m

    def use_input(a, p):
        m = ext_map(a, p)
        if a in in_pos and in_pos[a] != m:
            raise NotARegion("an input read in two alignments")
        in_pos[a] = m

    def aligned(k: int, base: list | None) -> list:
        """Positions of a rank-k value right-aligned against ``base`` (positions), or the domain."""
        if base is None:
            base = list(range(rank))
        if k <= len(base):
            return list(base[len(base) - k:])
        first = base[0] if base else rank
        lead = [first - (k - len(base)) + i for i in range(k - len(base))]
        if base and base[0] is None or any(x < 0 for x in lead):
            raise NotARegion("a value of higher rank than the domain")
        return lead + list(base)

    for n in values:
        qual, src = ops[n]
        name = R.op_parts(qual)[0]
        kind = R.OPS[name][0]
        targs = {k: (flip_in[v][0] if v in flip_in else v) for k, v in _tensor_args(qual, src).items()}
        k = len(_shape(n))
        internal = [a for a in targs.values() if isinstance(a, fx.Node) and a in pos]
        if kind == "gemm":
            if internal or n is not values[0]:
                raise NotARegion("a GEMM of a value computed in the region")
            x, w, add, gemm = _gemm_parts(name, R.named_args(qual, list(src.args), dict(src.kwargs)))
            roles[x], roles[w] = "gemm_a", "gemm_b"
            if isinstance(add, fx.Node):          # a linear layer's bias, addmm's added term
                use_input(add, aligned(len(_shape(add)), None))
            pos[n] = list(range(rank))
            continue
        if kind == "conv":        # a convolution, or a pooling (one with no weights)
            what = "pooling" if name in R.POOLS else "convolution"
            if internal or n is not values[0]:
                raise NotARegion(f"a {what} of a value computed in the region")
            a = R.named_args(qual, list(src.args), dict(src.kwargs))
            if name in R.POOLS:
                x = a["self"]
                if not isinstance(x, fx.Node) or len(_shape(x)) != rank or rank < 3:
                    raise NotARegion("a pooling without its batch and channel dims")
                try:
                    conv = R.pool_conv(name, a, _shape(x))
                except ValueError as e:
                    raise NotARegion(str(e)) from None
                roles[x] = "conv_x"
            else:
                x, w, b = a["input"], a["weight"], a.get("bias")
                if not (isinstance(x, fx.Node) and isinstance(w, fx.Node)) or len(_shape(x)) != rank:
                    raise NotARegion("a convolution without its batch dim")
                if not all(isinstance(a.get(k), (list, tuple)) for k in ("stride", "padding", "dilation")):
                    raise NotARegion("a convolution with padding given by name")
                roles[x], roles[w] = "conv_x", "conv_w"
                if isinstance(b, fx.Node):
                    roles[b] = "conv_b"
                conv = {"transposed": name.startswith("conv_transpose"),
                        "stride": [int(v) for v in a["stride"]], "padding": [int(v) for v in a["padding"]],
                        "dilation": [int(v) for v in a["dilation"]], "groups": int(a["groups"]),
                        "output_padding": [int(v) for v in (a.get("output_padding") or [0] * (rank - 2))],
                        "w_shape": list(_shape(w))}
                if not torch.backends.cudnn.allow_tf32:
                    # the model turned TF32 convolutions off: its eager convolution is IEEE
                    # fp32, and so is the region's reference (absent: torch's default, on)
                    conv["tf32"] = False
                if len(conv["stride"]) != rank - 2 or len(conv["padding"]) != rank - 2:
                    raise NotARegion("a convolution's stride or padding for fewer dims")
            if R.conv_out(conv, _shape(x)) != dom:
                raise NotARegion(f"a {what} whose output size the formula does not give")
            pos[n] = list(range(rank))
            continue
        if kind in ("red", "scan"):
            xa = next(iter(targs.values()))
            if name in ("argmax", "argmin"):
                if n is not out:
                    raise NotARegion(f"{name} read by other ops of the region")
                if xa in pos:
                    # fp32 rounding of a computed value could move the index off torch's
                    raise NotARegion(f"{name} of a value computed in the region")
            if not isinstance(xa, fx.Node) or _shape(xa) != dom:
                raise NotARegion("reductions of different shapes")
            xp = pos[xa] if xa in pos else list(range(rank))
            if xp != list(range(rank)):
                raise NotARegion("a reduction of a value not laid out as the domain")
            if xa not in pos:
                use_input(xa, xp)
            a = R.named_args(qual, list(src.args), dict(src.kwargs))
            if name == "group_norm":
                g = int(a["num_groups"])
                if rank < 2 or dom[1] % g:
                    raise NotARegion("group norm: channels not a multiple of the groups")
                mine, sp = list(range(2, rank + 1)), [1, g]
            else:
                d = R.reduced_dims(name, a, rank)
                if d is None:
                    raise NotARegion(f"{name}: its dims")
                mine, sp = d, None
                if split:
                    raise NotARegion("a reduction beside a group norm")
            if sp is not None:
                if split not in (None, sp) or (red_dims is not None and split is None):
                    raise NotARegion("a group norm beside another reduction")
                split = sp
            if red_dims is None:
                red_dims = mine
            elif red_dims != mine:
                raise NotARegion("reductions over different dims")
            if kind == "scan" and len(mine) != 1:
                raise NotARegion("a scan over several dims")
            # channel arguments (weights of group / instance norm)
            for cname in _CHANNEL_ARGS.get(name, ()):
                c = targs.get(cname)
                if isinstance(c, fx.Node):
                    if c in pos:
                        raise NotARegion("a computed norm weight")
                    use_input(c, [1])
            for oname, c in targs.items():
                if oname in _CHANNEL_ARGS.get(name, ()) or c is xa:
                    continue
                if isinstance(c, fx.Node) and c not in pos:     # layer norm's weight, bias
                    use_input(c, aligned(len(_shape(c)), xp))
            keep = bool(a.get("keepdim", False))
            if kind == "scan" or name in ("softmax", "_softmax", "log_softmax", "_log_softmax",
                                          "layer_norm", "group_norm", "instance_norm"):
                pos[n] = list(range(rank))
            elif keep or k == rank:
                pos[n] = list(range(rank))
            else:
                dd = R.reduced_dims(name, a, rank)
                pos[n] = [d for d in range(rank) if d not in dd]
            if len(pos[n]) != k:
                raise NotARegion(f"{name}: an output rank the generator does not expect")
            continue
        # pointwise: positions from the widest internal argument, else the domain
        if name in _CHANNEL_ARGS:
            xa = targs.get("input")
            base = pos[xa] if isinstance(xa, fx.Node) and xa in pos else aligned(k, None)
            if isinstance(xa, fx.Node) and xa not in pos:
                use_input(xa, base)
            for cname in _CHANNEL_ARGS[name]:
                c = targs.get(cname)
                if isinstance(c, fx.Node):
                    if c in pos:
                        raise NotARegion("computed batch norm statistics")
                    use_input(c, [base[1]])
            pos[n] = base
            continue
        if internal:
            widest = max(internal, key=lambda a: len(_shape(a)))
            base = aligned(k, pos[widest])
        else:
            base = aligned(k, None)
        for a in targs.values():
            if not isinstance(a, fx.Node):
                continue
            p = aligned(len(_shape(a)), base)
            if a in pos:
                # an internal argument must sit where the output's positions say
                if [x for x, s in zip(pos[a], _shape(a)) if s != 1] != \
                        [x for x, s in zip(p, _shape(a)) if s != 1]:
                    raise NotARegion("values of the region in two alignments")
            else:
                use_input(a, p)
        pos[n] = base
    # sizes: every value's non-1 dims have the domain's size there
    for n in values:
        for s, d in zip(_shape(n), pos[n]):
            if d is None or (s != 1 and s != dom[d]):
                raise NotARegion("a value that does not fit the domain")
    if conv is not None:
        if red_dims not in (None, [1]) or split:
            raise NotARegion("a convolution with a reduction over other dims than its channels")
        if set(roles) & set(in_pos):
            raise NotARegion("a convolution's input read by its epilogue too")
    if gemm is not None:
        if red_dims not in (None, [rank - 1]) or split:
            raise NotARegion("a GEMM with a reduction over other dims than its output's last")
        if red_dims and dom[-1] > GEMM_ROW_MAX:
            raise NotARegion(f"a reduction over {dom[-1]} GEMM columns: wider than one tile "
                             f"(at most {GEMM_ROW_MAX})")
        if set(roles) & set(in_pos):
            raise NotARegion("a GEMM's operand read by its epilogue too")
    for a, role in roles.items():
        in_pos[a] = role
    # the spec
    inputs = sorted(in_pos, key=lambda a: order.get(a, -1))
    idx = {a: i for i, a in enumerate(inputs)}
    vidx = {n: j for j, n in enumerate(values)}

    def enc(v):
        if isinstance(v, fx.Node) and v in flip_in:
            v = flip_in[v][0]                  # the input itself: its spec entry says flipped
        if isinstance(v, fx.Node):
            if v in vidx:
                return {"v": vidx[v]}
            if v in idx:
                return {"in": idx[v]}
            if v in inside:                    # the tuple op's own node: not a value
                raise NotARegion("a tuple read as a value")
            raise NotARegion("an argument that is not a tensor input")
        if isinstance(v, (list, tuple)):
            return [enc(x) for x in v]
        return R.encode(v)

    spec_inputs = []
    for a in inputs:
        dt = _dtype(a)
        if dt not in ("float32", "float16", "bfloat16", "bool"):
            raise NotARegion(f"an input of dtype {dt}")
        if isinstance(in_pos[a], str):
            spec_inputs.append({"map": None, "dtype": dt, "role": in_pos[a]})
        else:
            spec_inputs.append({"map": in_pos[a], "dtype": dt})
            st = _model_strides(a)
            if st is not None:
                spec_inputs[-1]["strides"] = st
            if a in flipped_src:
                spec_inputs[-1]["flip"] = flipped_src[a]     # its own dims, read reversed
    if all(i["dtype"] == "bool" for i in spec_inputs):
        raise NotARegion("no floating input")
    spec_ops = []
    for n in values:
        qual, src = ops[n]
        m = []
        for s, d in zip(_shape(n), pos[n]):
            m.append(d if (s == dom[d] and not (s == 1 and _reduced_here(n, ops, d, red_dims, split)))
                     else None)
        op = {"op": qual, "args": [enc(a) for a in src.args],
              "kwargs": {k: enc(v) for k, v in src.kwargs.items()}, "map": m, "dtype": _dtype(n)}
        if R.op_parts(qual)[0] in ("_to_copy", "to", "type_as"):
            s0 = src.args[0]
            op["src_dtype"] = _dtype(s0) if isinstance(s0, fx.Node) else None
        spec_ops.append(op)
    float_in = next(i["dtype"] for i in spec_inputs if i["dtype"] != "bool")
    out_dt = _dtype(out)
    # the output's dtype is the model's own where an explicit cast sets it (RMSNorm's
    # x.to(torch.float32), rotary's cos.to(x.dtype), a sum(dtype=...), a router's
    # softmax(logits, 1, torch.float32)) and type promotion keeps it: every float value read after it is fixed too, or it is a float32 tensor of
    # one or more dims, which any float16 / bfloat16 tensor promotes to. The reference then
    # returns that dtype for inputs of any dtype, so the kernel must too.
    fixed: dict = {}
    for n in values:
        src = ops[n][1]
        floats = [a for a in src.all_input_nodes if _dtype(a) != "bool"]
        fixed[n] = (_dtype_arg(src) is not None
                    or any(fixed.get(a) and _dtype(a) == "float32" and len(_shape(a)) > 0
                           for a in floats)        # a 0-dim tensor promotes no other tensor
                    or (bool(floats) and all(fixed.get(a, False) for a in floats)))
    name = R.region_name(spec_ops)
    name = ("flip+" if flipped_src else "") + name + ("+flip" if flip_out is not None else "")
    spec = {"name": name, "rank": rank, "split": split,
            "red": red_dims or [], "inputs": spec_inputs, "ops": spec_ops,
            "out_dtype": None if out_dt == float_in and not fixed[out] else out_dt}
    if flip_out is not None:
        spec["out_flip"] = flip_out
    if (flipped_src or flip_out is not None) and (split or conv is not None or gemm is not None):
        raise NotARegion("a flip beside a group norm, a convolution or a GEMM")
    shape = dom
    if conv is not None:
        conv.update(x=idx[next(a for a, r in roles.items() if r == "conv_x")],
                    w=next((idx[a] for a, r in roles.items() if r == "conv_w"), None),
                    b=next((idx[a] for a, r in roles.items() if r == "conv_b"), None))
        spec["conv"] = conv
        shape = _shape(next(a for a, r in roles.items() if r == "conv_x"))   # the family shape
    if gemm is not None:
        gemm.update(a=idx[next(a for a, r in roles.items() if r == "gemm_a")],
                    b=idx[next(a for a, r in roles.items() if r == "gemm_b")])
        spec["gemm"] = gemm
        shape = tuple(dom[:-1]) + (gemm["k"], gemm["n"])     # the family shape: (*lead, M, K, N)
    try:
        R.validate(spec)
    except ValueError as e:
        raise NotARegion(str(e)) from None
    return Region(-1, every, every[-1], inputs, spec, shape, float_in)


def _reduced_here(n, ops, d, red_dims, split) -> bool:
    """Is domain dim ``d`` one the value ``n`` was reduced over (keepdim: size 1 there)?"""
    qual, src = ops[n]
    name = R.op_parts(qual)[0]
    if R.OPS[name][0] != "red" or not red_dims:
        return False
    if name in ("softmax", "_softmax", "log_softmax", "_log_softmax", "layer_norm",
                "group_norm", "instance_norm"):
        return False
    dd = set(red_dims)
    if split:
        dd = {x - 1 if x > split[0] else x for x in dd}
    return d in dd


# ---- growing regions ---------------------------------------------------------------------------

# family matches a GEMM region may take over (a lone op each): the GEMM itself, and a reduction
# or softmax over its output's rows, which the region then computes on the accumulator
ABSORBED = ("matmul", "reduce", "softmax")


def find(graph: cap.Graph, matches=()) -> Found:
    """The regions of ``graph`` outside the placeable ``matches``, and the nodes left out."""
    order = {n: i for i, n in enumerate(graph.gm.graph.nodes)}
    claimed = set()
    absorbable = {}          # node of a lone-op match a GEMM region may take -> the match
    for m in matches:
        if m.placeable:
            if (m.family in ABSORBED and len(m.nodes) == 1 and op_of(m.nodes[0]) is not None
                    and (m.family != "matmul" or _is_gemm(m.nodes[0]))):
                absorbable[m.nodes[0]] = m
            else:
                claimed |= set(m.nodes)
    # a reduction or softmax a family's match holds joins only a region with a GEMM in it
    after = {n for n, m in absorbable.items() if m.family != "matmul"}
    # ... and a reduce family's reduction joins the region of the pointwise ops it reduces
    fold = {n for n, m in absorbable.items() if m.family == "reduce"}
    taken: set = set()
    found = Found()
    fusible = {n for n in graph.gm.graph.nodes if n not in claimed and op_of(n) is not None}
    # a tuple op (max.dim, batch norm) joins with its getitem
    partner = {}
    for n in list(fusible):
        o = op_of(n)
        if o[1] is not n:
            partner[n] = o[1]

    def grow(members: set, reg: Region, skip: set) -> tuple[set, Region]:
        """The region grown backwards from ``members`` (see the module doc), ``skip`` left out."""
        grown = True
        while grown and len(members) < MAX_OPS:
            grown = False
            for m in sorted(members, key=order.get, reverse=True):
                for a in m.all_input_nodes:
                    if a in members or a not in fusible or a in taken or a in skip:
                        continue
                    extra = {a} | ({partner[a]} if a in partner else set())
                    if not all(u in members or u in extra for x in extra for u in x.users):
                        continue
                    try:
                        reg2 = build(list(members | extra), order)
                    except NotARegion:
                        continue
                    members |= extra
                    reg = reg2
                    grown = True
        return members, reg

    for n in reversed(list(graph.gm.graph.nodes)):
        if n not in fusible or n in taken or (n.target is not operator.getitem
                                              and any(p is n for p in partner.values())):
            continue
        members = {n} | ({partner[n]} if n in partner else set())
        a = n.args[0] if n.args else None
        if (op_of(n)[0].startswith("aten.flip.") and isinstance(a, fx.Node) and a in fusible
                and a not in taken and a not in partner.values() and list(a.users) == [n]):
            members.add(a)            # a flip of the output: a region with what it reverses
        try:
            reg = build(list(members), order)
        except NotARegion as e:
            found.left.append(Left(n, str(e)))
            continue
        start = (set(members), reg)
        members, reg = grow(set(members), reg, set())
        if members & after and not reg.spec.get("gemm"):
            if start[0] & after:
                if not (start[0] & fold and R._depth(reg.spec) > 1):
                    continue            # the family's own reduction, with nothing to fuse
                # a reduce family's sum or mean of a computed value (a loss's mean of its
                # pointwise terms): one region, the terms never written out and read back
            elif not _between(members & after, fold, members):
                members, reg = grow(*start, after)
            # else a reduce family's sum or mean between a prologue and an epilogue (an L1
            # norm's x / x.abs().mean(1)): one region, x read by one kernel, not two
        if R._depth(reg.spec) == 0:
            continue                    # copies and casts alone: nothing to compute
        if reg.spec.get("gemm") and R._depth(reg.spec) == 1 and members & set(absorbable):
            continue                    # a GEMM with no epilogue: the matmul family's target
        reg.graph = graph.index
        taken |= members
        found.regions.append(reg)
    found.absorbed = [m for n, m in absorbable.items() if n in taken]
    for n in graph.gm.graph.nodes:
        if (n.op == "call_function" and n not in claimed and n not in taken and n not in fusible):
            found.left.append(Left(n, _why_left(n)))
    found.regions.sort(key=lambda r: order[r.output])
    return found


def _between(reductions: set, fold: set, members: set) -> bool:
    """One reduce family's reduction whose operand the region computes (its prologue) and whose
    result the region's ops read: fused, its operand is never written out. Two reductions, or a
    reduction of a model's input, stay their family's targets (a row sum of a raw input is
    already one pass, and a NaN in it would spread over its whole row of the region); so does
    one whose prologue reads a GEMM (``relu(linear(x)).sum(-1)``: the sum belongs in the GEMM's
    epilogue, on the accumulator)."""
    if len(reductions) != 1 or not reductions <= fold:
        return False
    (r,) = reductions
    return (bool(r.args) and isinstance(r.args[0], fx.Node) and r.args[0] in members
            and not any(_is_gemm(a) for m in members for a in m.all_input_nodes))


def _is_gemm(n: fx.Node) -> bool:
    o = op_of(n)
    return o is not None and R.OPS[R.op_parts(o[0])[0]][0] == "gemm"


def _why_left(n: fx.Node) -> str:
    t = n.target
    name = getattr(t, "_opname", getattr(t, "__name__", str(t)))
    if name in ("conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
                "conv_transpose3d", "convolution"):
        return "convolution the region generator does not take (padding by name, no batch dim)"
    if name in ("linear", "matmul", "mm", "bmm", "addmm", "einsum", "baddbmm"):
        return "GEMM no family contract took"
    return f"{name}: not an op regions hold"


__all__ = ["Region", "Found", "Left", "find", "build", "op_of", "NotARegion", "MAX_OPS"]
