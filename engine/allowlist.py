"""The static check: what candidate source may name, as an allow list.

A candidate is hostile until judged: it may come from a model that searches for holes in the judge.
This check runs before a candidate reaches a worker (in the engine process, at no device cost) and
again in the worker before it is imported. It parses the source with size and depth caps and
walks it once, with an explicit stack (no recursion), and accepts only:

- imports of ``torch``, ``triton`` (``triton.language`` and its libdevice, ``triton.tools.
  tensor_descriptor``, Gluon's language, its Hopper TMA / mbarrier / wgmma modules and its
  tensor descriptor), ``math``, ``typing``, ``functools``, ``itertools``, ``heapq`` and
  ``__future__``;
- module names used only as the root of an attribute chain (``tl.load``), never as values (so no
  module can be passed around, rebound or reached under another name), and each chain allowed by
  its module's table below: torch offers allocation, dtypes and device queries, never an op;
- names that are builtins of a small pure set, module aliases, or names the file itself binds
  (never a dunder, never a rebinding of a module alias or an allowed builtin);
- attributes of values from one table for host code (tensor metadata, views, allocation and
  copies; the container methods bookkeeping needs) and one for ``@triton.jit`` bodies (Triton's
  tensor methods): no attribute that starts with an underscore, so nothing reaches a module,
  a frame, a class or a function's globals;
- no classes, ``global``/``nonlocal``, attribute assignment or deletion, generators or
  ``async``; decorators only ``triton.jit`` (and Gluon's ``gluon.jit``, whose bodies are device
  code under the same rules), ``triton.autotune`` and ``triton.heuristics`` (and ``functools``
  caches), with no callbacks in them except heuristics lambdas that compute launch constants
  from ``args[...]``.

What passes still runs under the runtime guard (engine/verify.py) as a second line: every PyTorch
op a candidate executes outside its Triton kernels is recorded and rejects it. The check is
deliberately narrower than Python: a rejection message names the construct and the rule.
"""
from __future__ import annotations

import ast

MAX_SOURCE_BYTES = 256 * 1024      # the largest rendered variant is ~15 KB
MAX_NODES = 60_000
MAX_DEPTH = 120                    # AST nesting (a real kernel nests < 25 deep)
MAX_BRACKET_DEPTH = 60             # checked on the text before parsing: the parser recurses

IMPORTABLE = ("torch", "triton", "math", "typing", "functools", "itertools", "heapq", "__future__")

# --- what each module offers: dotted names under it (a trailing ".*": any public name there) ---
_DTYPES = ("float16", "bfloat16", "float32", "float64", "float8_e4m3fn", "float8_e5m2",
           "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bool",
           "half", "float", "double", "long", "int", "short", "complex64")
TORCH = {
    # allocation (the guard poisons it; torch.tensor builds a launch table from host numbers,
    # attention's persistent schedule), dtypes and their info, device queries; never an op
    *_DTYPES, "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "full", "tensor",
    "full_like", "ones", "ones_like", "dtype", "device", "Tensor", "Size", "finfo", "iinfo",
    "is_tensor", "promote_types", "get_default_dtype", "version.hip", "version.cuda",
    "cuda.get_device_properties", "cuda.get_device_capability", "cuda.current_device",
    "cuda.is_available", "cuda.device_count", "cuda.device",
}
# triton.language is device code: any public name except the internals below, which hand out
# Triton's own objects (builders, handles, the semantic layer) rather than operations on tiles
TL_INTERNALS = {"core", "standard", "random", "target_info", "tensor", "str_to_ty",
                "aggregate_replace", "block_type", "pointer_type", "tuple_type", "constexpr_type",
                "tensor_descriptor_type", "semantic", "builtin", "extra", "math", "os", "sys",
                "inspect", "importlib", "builtins", "functools", "typing", "numbers", "warnings"}
MODULES: dict[str, set | str] = {
    "torch": TORCH,
    "triton": {"jit", "autotune", "heuristics", "Config", "cdiv", "next_power_of_2", "language",
               "tools", "tools.tensor_descriptor", "tools.tensor_descriptor.TensorDescriptor",
               "tools.tensor_descriptor.TensorDescriptor.from_tensor"},
    "triton.language": "device",
    "triton.language.math": "device",
    "triton.language.extra": {"libdevice", "cuda", "hip", "cuda.libdevice", "hip.libdevice"},
    "triton.language.extra.libdevice": "device",
    "triton.language.extra.cuda.libdevice": "device",
    "triton.language.extra.hip.libdevice": "device",
    "triton.tools.tensor_descriptor": {"TensorDescriptor", "TensorDescriptor.from_tensor"},
    "torch.cuda": {"get_device_properties", "get_device_capability", "current_device",
                   "is_available", "device_count", "device"},
    "torch.version": {"hip", "cuda"},
    "math": {"sqrt", "log", "log2", "log10", "exp", "exp2", "ceil", "floor", "pi", "e", "inf",
             "nan", "isqrt", "prod", "gcd", "lcm", "isfinite", "isinf", "isnan", "pow", "fabs",
             "tanh", "erf", "cos", "sin", "copysign", "trunc", "fsum", "comb", "perm", "log1p",
             "expm1", "atan", "atan2", "hypot", "ldexp", "frexp", "modf", "fmod", "remainder",
             "tau", "ulp", "nextafter", "dist", "cbrt", "sumprod"},
    "typing": {"Optional", "Tuple", "List", "Dict", "Union", "Any", "Sequence", "Callable"},
    "functools": {"lru_cache", "cache", "reduce"},
    "itertools": {"product", "chain", "accumulate", "repeat", "count", "islice", "permutations",
                  "combinations", "pairwise", "starmap", "zip_longest"},
    "heapq": {"heapify", "heappush", "heappop", "heapreplace", "heappushpop"},   # on lists, in C
    "__future__": {"annotations"},
    # Gluon (Triton >= 3.5): the same device code one level down (warp groups, shared memory,
    # mbarriers, TMA and wgmma written out), on Hopper; its host side offers layouts and
    # tensor descriptors only
    "triton.experimental": {"gluon"},
    "triton.experimental.gluon": {"jit"},
    "triton.experimental.gluon.language": "device",
    "triton.experimental.gluon.language.nvidia": {"hopper"},
    "triton.experimental.gluon.language.nvidia.hopper": {"fence_async_shared", "warpgroup_mma",
                                                         "warpgroup_mma_wait"},
    "triton.experimental.gluon.language.nvidia.hopper.tma": {
        "async_copy_global_to_shared", "async_copy_shared_to_global", "async_load", "async_store",
        "store_wait"},
    "triton.experimental.gluon.language.nvidia.hopper.mbarrier": {
        "init", "expect", "wait", "arrive", "invalidate", "MBarrierLayout"},
    "triton.experimental.gluon.nvidia": {"hopper"},
    "triton.experimental.gluon.nvidia.hopper": {"TensorDescriptor", "TensorDescriptor.from_tensor"},
}
# Gluon's language module: device code as triton.language, less what hands out its internals
GL_INTERNALS = TL_INTERNALS | {"aggregate_replace", "base_type", "base_value", "distributed_type",
                               "shared_memory_descriptor", "shared_memory_descriptor_type",
                               "tuple", "tuple_type", "to_tensor", "amd", "nvidia", "fpsan"}
DEVICE_INTERNALS = {"triton.experimental.gluon.language": GL_INTERNALS}
# the submodules a dotted name leads into (for chains and from-imports): every table below a root
SUBMODULES = {m for m in MODULES if "." in m}

BUILTINS = {"range", "len", "min", "max", "abs", "int", "float", "bool", "str", "tuple", "list",
            "dict", "set", "frozenset", "enumerate", "zip", "reversed", "sorted", "sum", "any",
            "all", "round", "divmod", "pow", "isinstance", "hasattr", "map", "filter", "print",
            "slice", "ValueError", "TypeError", "RuntimeError", "NotImplementedError",
            "AssertionError", "KeyError", "IndexError", "ZeroDivisionError", "ArithmeticError",
            "OverflowError", "Exception", "True", "False", "None"}

# attributes of values in host code: tensor metadata, views, allocation, copies and casts (data
# movement the guard allows), device properties, and what bookkeeping with dicts/lists needs
HOST_ATTRS = {
    "shape", "dtype", "device", "ndim", "dim", "size", "stride", "numel", "nelement",
    "element_size", "itemsize", "is_contiguous", "contiguous", "data_ptr", "storage_offset",
    "is_cuda", "is_floating_point", "is_complex", "requires_grad", "type", "index", "view",
    "view_as", "reshape", "flatten", "unflatten", "unsqueeze", "squeeze", "transpose", "permute",
    "expand", "expand_as", "t", "T", "mT", "narrow", "select", "unbind", "split", "chunk",
    "movedim", "to", "float", "half", "bfloat16", "new_empty", "new_empty_strided", "new_zeros",
    "new_full", "new_ones", "zero_", "fill_", "copy_", "clone", "detach", "is_fp16", "is_bf16",
    "get", "items", "keys", "values", "append", "extend", "pop", "setdefault", "clear", "insert",
    "update", "startswith", "endswith", "lower", "upper", "strip", "count",
    "multi_processor_count", "shared_memory_per_block_optin", "max_shared_memory_per_block_optin",
    "L2_cache_size", "total_memory", "name", "major", "minor", "warp_size",
    "regs_per_multiprocessor", "max_threads_per_multi_processor", "gcnArchName",
    "from_tensor", "block_shape", "base", "strides", "get_default_for",
    "bit_length", "is_integer", "real",
}
# attributes of values inside @triton.jit bodies: Triton's tensor methods and type queries
DEVICE_ATTRS = {
    "to", "dtype", "shape", "T", "element_ty", "type", "numel", "reshape", "trans", "permute",
    "broadcast_to", "expand_dims", "view", "ravel", "split", "join", "sum", "max", "min",
    "argmax", "argmin", "cumsum", "cumprod", "reduce", "sort", "flip", "exp", "exp2", "log",
    "log2", "sqrt", "rsqrt", "abs", "sigmoid", "softmax", "cos", "sin", "floor", "ceil", "erf",
    "fma", "xor_sum", "histogram", "associative_scan", "load", "store", "gather", "scatter",
    "atomic_add", "atomic_max", "atomic_min", "primitive_bitwidth", "fp_mantissa_width",
    "is_floating", "is_int", "is_int_signed", "is_fp16", "is_bf16", "is_fp32", "is_fp64",
    "is_fp8", "scalar", "int_bitwidth", "is_ptr", "is_block", "block_shape", "strides",
    "cast", "unsqueeze", "squeeze", "item_size", "itemsize",
    # Gluon's shared memory and descriptors: a buffer of a ring (or rows of one), its block's
    # type and bytes
    "index", "slice", "block_type", "nbytes", "layout",
}
# Triton decorator and config arguments that take callables: none may be given
CALLBACK_KWARGS = {"prune_configs_by", "pre_hook", "post_hook", "perf_model",
                   "early_config_prune", "do_bench", "launch_metadata", "repr"}
DECORATORS = {"triton.jit", "triton.autotune", "triton.heuristics", "functools.lru_cache",
              "functools.cache", "triton.experimental.gluon.jit"}
JIT_DECORATORS = {"triton.jit", "triton.experimental.gluon.jit"}   # their bodies are device code

_FORBIDDEN_NODES = {
    ast.ClassDef: "class definitions", ast.Global: "global statements",
    ast.Nonlocal: "nonlocal statements", ast.AsyncFunctionDef: "async functions",
    ast.AsyncFor: "async loops", ast.AsyncWith: "async with", ast.Await: "await",
    ast.Yield: "generators (yield)", ast.YieldFrom: "generators (yield from)",
    ast.Delete: "del statements",
}
if hasattr(ast, "TryStar"):
    _FORBIDDEN_NODES[ast.TryStar] = "except* blocks"
if hasattr(ast, "TypeAlias"):
    _FORBIDDEN_NODES[ast.TypeAlias] = "type aliases"


class Rejected(Exception):
    """Why a candidate source is not allowed, with the line it is on."""


def _bracket_depth(source: str) -> int:
    depth = best = 0
    for ch in source:
        if ch in "([{":
            depth += 1
            best = max(best, depth)
        elif ch in ")]}":
            depth -= 1
    return best


def parse(source: str) -> ast.Module:
    """Parse with caps on size and nesting; raises Rejected, never MemoryError or RecursionError."""
    if not isinstance(source, str):
        raise Rejected("the candidate is not text")
    size = len(source.encode("utf-8", "replace"))
    if size > MAX_SOURCE_BYTES:
        raise Rejected(f"source is {size} bytes; at most {MAX_SOURCE_BYTES} are accepted")
    if "\x00" in source:
        raise Rejected("source contains a NUL byte")
    if _bracket_depth(source) > MAX_BRACKET_DEPTH:
        raise Rejected(f"brackets nest deeper than {MAX_BRACKET_DEPTH} levels")
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise Rejected(f"syntax error at line {e.lineno}: {e.msg}") from None
    except (MemoryError, RecursionError, ValueError, OverflowError) as e:
        raise Rejected(f"source cannot be parsed within limits ({type(e).__name__})") from None
    # nesting depth and size, iteratively
    stack, n = [(tree, 0)], 0
    while stack:
        node, d = stack.pop()
        n += 1
        if d > MAX_DEPTH:
            raise Rejected(f"expressions nest deeper than {MAX_DEPTH} levels "
                           f"(line {getattr(node, 'lineno', '?')})")
        if n > MAX_NODES:
            raise Rejected(f"source has more than {MAX_NODES} syntax nodes")
        stack.extend((c, d + 1) for c in ast.iter_child_nodes(node))
    return tree


def _module_allows(module: str, rest: str) -> str | None:
    """What ``module.rest`` is: "leaf" (an allowed object), "module:<name>" (a submodule, whose
    own table applies further), or None (not allowed)."""
    rule = MODULES.get(module)
    if rule is None:
        return None
    full = f"{module}.{rest}"
    if full in SUBMODULES or full in MODULES:
        return f"module:{full}"
    if rule == "device":
        first = rest.split(".")[0]
        if first.startswith("_") or first in DEVICE_INTERNALS.get(module, TL_INTERNALS) \
                or not first[:1].isalpha():
            return None
        return "leaf" if "." not in rest else None
    if rest in rule:
        # a dotted entry may itself be a submodule prefix ("tools" -> "tools.tensor_descriptor")
        return "leaf"
    return None


def resolve_chain(module: str, attrs: list[str]) -> tuple[str | None, int]:
    """Walk ``module.a.b.c``: (None, i) when attribute i is not allowed, else ("leaf" | module
    name, number of attributes consumed by module tables). Attributes after a leaf are attributes
    of a value (checked against HOST_ATTRS/DEVICE_ATTRS by the caller)."""
    cur = module
    i = 0
    while i < len(attrs):
        # the longest dotted run the current module's table names
        found = None
        for j in range(len(attrs), i, -1):
            what = _module_allows(cur, ".".join(attrs[i:j]))
            if what is not None:
                found = (what, j)
                break
        if found is None:
            return None, i
        what, j = found
        i = j
        if what == "leaf":
            return "leaf", i
        cur = what.split(":", 1)[1]
    return cur, i


class _Checker:
    def __init__(self, tree: ast.Module):
        self.tree = tree
        self.aliases: dict[str, str] = {}     # name -> dotted module or object path
        self.bound: set[str] = set()
        self.jit_bodies: set[int] = set()     # id() of nodes inside @triton.jit functions
        self.heuristic_lambdas: set[int] = set()
        self.uses_jit = False

    # -- pass 1: imports and bindings ---------------------------------------------------------
    def collect(self) -> None:
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    root = a.name.split(".")[0]
                    if root not in IMPORTABLE:
                        self.fail(node, f"import of {a.name!r} is not allowed (allowed: "
                                        f"{', '.join(IMPORTABLE)})")
                    if a.name not in MODULES and a.name not in SUBMODULES:
                        self.fail(node, f"import of {a.name!r} is not allowed")
                    if a.asname:
                        self.alias(node, a.asname, a.name)
                    else:
                        self.alias(node, root, root)
            elif isinstance(node, ast.ImportFrom):
                mod = node.module or ""
                if node.level or mod.split(".")[0] not in IMPORTABLE or mod not in MODULES:
                    self.fail(node, f"import from {('.' * node.level) + mod!r} is not allowed")
                for a in node.names:
                    if a.name == "*":
                        self.fail(node, "star imports are not allowed")
                    what = _module_allows(mod, a.name)
                    if what is None:
                        self.fail(node, f"{mod}.{a.name} is not something a candidate may use")
                    if mod != "__future__":
                        self.alias(node, a.asname or a.name, f"{mod}.{a.name}")
        for node in ast.walk(self.tree):
            for name, where in self._binds(node):
                if name in self.aliases:
                    self.fail(where, f"{name!r} names an imported module or function and may "
                                     f"not be rebound")
                if name in BUILTINS:
                    self.fail(where, f"the builtin {name!r} may not be rebound")
                if name.startswith("__"):
                    self.fail(where, f"the name {name!r} is not allowed")
                self.bound.add(name)

    def alias(self, node, name: str, target: str) -> None:
        if name in self.aliases and self.aliases[name] != target:
            self.fail(node, f"{name!r} is imported twice as different things")
        if name in BUILTINS or name.startswith("__"):
            self.fail(node, f"the name {name!r} may not be bound by an import")
        self.aliases[name] = target

    @staticmethod
    def _binds(node):
        """(name, node) for every name ``node`` binds (outside imports)."""
        if isinstance(node, (ast.FunctionDef, ast.Lambda)):
            if isinstance(node, ast.FunctionDef):
                yield node.name, node
            a = node.args
            for arg in a.posonlyargs + a.args + a.kwonlyargs + [a.vararg, a.kwarg]:
                if arg is not None:
                    yield arg.arg, node
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            yield node.id, node
        elif isinstance(node, ast.ExceptHandler) and node.name:
            yield node.name, node
        elif isinstance(node, ast.MatchAs) and node.name:
            yield node.name, node
        elif isinstance(node, ast.MatchStar) and node.name:
            yield node.name, node

    # -- pass 2: every node ---------------------------------------------------------------------
    def fail(self, node, why: str):
        line = getattr(node, "lineno", None)
        raise Rejected(f"line {line}: {why}" if line else why)

    def dotted(self, node) -> tuple[str | None, list[str]]:
        """(root name, attribute names) of a chain like ``a.b.c`` (root None if not a Name)."""
        attrs = []
        while isinstance(node, ast.Attribute):
            attrs.append(node.attr)
            node = node.value
        attrs.reverse()
        return (node.id if isinstance(node, ast.Name) else None), attrs

    def decorator_name(self, d) -> str | None:
        target = d.func if isinstance(d, ast.Call) else d
        root, attrs = self.dotted(target)
        if root is None or root not in self.aliases:
            return None
        return ".".join([self.aliases[root]] + attrs)

    def check(self) -> None:
        self.collect()
        # mark jit bodies and heuristics lambdas first (they change the rules inside)
        for node in ast.walk(self.tree):
            if isinstance(node, ast.FunctionDef):
                names = []
                for d in node.decorator_list:
                    name = self.decorator_name(d)
                    if name not in DECORATORS:
                        self.fail(d, "decorators other than triton.jit, triton.autotune, "
                                     "triton.heuristics and functools caches are not allowed")
                    names.append(name)
                    if isinstance(d, ast.Call):
                        self.check_decorator_call(name, d)
                if JIT_DECORATORS & set(names):
                    self.uses_jit = True
                    for inner in ast.walk(node):
                        if inner is not node:
                            self.jit_bodies.add(id(inner))
            elif isinstance(node, ast.Call):
                name = self.decorator_name(node)
                if name in ("triton.autotune", "triton.Config", "triton.heuristics"):
                    for kw in node.keywords:
                        if kw.arg in CALLBACK_KWARGS or kw.arg is None:
                            self.fail(kw.value, f"{name} may not be given "
                                                f"{kw.arg or '**kwargs'}: no callbacks")
                if name in JIT_DECORATORS:
                    self.uses_jit = True
        stack = [(self.tree, None)]     # pre-order, in source order: the first offence is named
        while stack:
            node, parent = stack.pop()
            self.visit(node, parent)
            stack.extend((c, node) for c in reversed(list(ast.iter_child_nodes(node))))

    def check_decorator_call(self, name: str, call: ast.Call) -> None:
        if name in JIT_DECORATORS:
            for kw in call.keywords:
                if not _literal(kw.value):
                    self.fail(kw.value, "triton.jit options must be literal constants")
            if call.args:
                self.fail(call, "triton.jit takes options as keywords only")
        elif name == "triton.heuristics":
            values = call.args[0] if call.args else next(
                (k.value for k in call.keywords if k.arg == "values"), None)
            if not isinstance(values, ast.Dict) or len(call.args) + len(call.keywords) != 1:
                self.fail(call, "triton.heuristics takes one dict literal of lambdas")
            for k, v in zip(values.keys, values.values):
                if not (isinstance(k, ast.Constant) and isinstance(k.value, str)):
                    self.fail(values, "triton.heuristics keys must be string literals")
                self.check_heuristic(v)
        elif name == "triton.autotune":
            for kw in call.keywords:
                if kw.arg == "configs":
                    continue          # a list of triton.Config calls or a name bound to one
                if kw.arg in ("key", "reset_to_zero", "restore_value", "warmup", "rep",
                              "cache_results") and _literal(kw.value):
                    continue
                self.fail(kw.value if kw.value else call, f"triton.autotune option "
                                                          f"{kw.arg or '**'} is not allowed here")
        elif name in ("functools.lru_cache", "functools.cache"):
            for a in list(call.args) + [k.value for k in call.keywords]:
                if not _literal(a):
                    self.fail(a, "cache options must be literal constants")

    def check_heuristic(self, fn) -> None:
        """A heuristics value: ``lambda args: <launch constant>`` computed from args[...] only."""
        if not isinstance(fn, ast.Lambda) or len(fn.args.args) != 1 or fn.args.vararg \
                or fn.args.kwarg or fn.args.kwonlyargs or fn.args.defaults:
            self.fail(fn, "a triton.heuristics value must be a one-argument lambda")
        arg = fn.args.args[0].arg
        ok_calls = {"triton.next_power_of_2", "triton.cdiv"} | {f"math.{m}" for m in MODULES["math"]}
        for node in ast.walk(fn.body):
            if isinstance(node, ast.Name):
                if node.id != arg and node.id not in ("min", "max", "int", "bool", "abs", "len") \
                        and node.id not in self.aliases:
                    self.fail(node, f"a heuristic may only read {arg}[...] (found {node.id!r})")
            elif isinstance(node, ast.Call):
                if isinstance(node.func, ast.Name) and node.func.id in ("min", "max", "int",
                                                                         "bool", "abs", "len"):
                    continue
                if self.decorator_name(node) not in ok_calls:
                    self.fail(node, "a heuristic may call only min, max, int, bool, abs, len, "
                                    "triton.next_power_of_2, triton.cdiv and math functions")
            elif isinstance(node, ast.Attribute):
                root, attrs = self.dotted(node)
                if root in self.aliases:
                    continue          # a module chain: checked by the general rules
                if node.attr not in ("shape", "dtype", "numel", "element_size", "stride",
                                     "itemsize", "is_fp16", "is_bf16", "is_floating_point"):
                    self.fail(node, f"a heuristic may read only tensor metadata (found "
                                    f".{node.attr})")
            elif isinstance(node, (ast.Lambda, ast.NamedExpr, ast.ListComp, ast.DictComp,
                                   ast.SetComp, ast.GeneratorExp)):
                self.fail(node, "a heuristic is one expression over its args")
        self.heuristic_lambdas.add(id(fn))

    def visit(self, node, parent) -> None:
        kind = type(node)
        if kind in _FORBIDDEN_NODES:
            self.fail(node, f"{_FORBIDDEN_NODES[kind]} are not allowed in a candidate")
        in_jit = id(node) in self.jit_bodies
        if isinstance(node, ast.Name):
            self.visit_name(node, parent)
        elif isinstance(node, ast.Attribute):
            self.visit_attribute(node, parent, in_jit)
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for sub in ast.walk(t):
                    if isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store):
                        self.fail(sub, "assigning to an attribute is not allowed")
                    if in_jit and isinstance(sub, ast.Subscript) and isinstance(sub.ctx, ast.Store):
                        self.fail(sub, "item assignment inside a Triton kernel is not allowed")
        elif isinstance(node, ast.Call) and in_jit:
            self.visit_device_call(node)
        elif isinstance(node, ast.Constant) and isinstance(node.value, (bytes, complex)):
            self.fail(node, f"{type(node.value).__name__} literals are not allowed")
        elif isinstance(node, ast.JoinedStr):
            pass
        elif isinstance(node, ast.FormattedValue) and node.format_spec is not None:
            for sub in ast.walk(node.format_spec):
                if isinstance(sub, ast.FormattedValue):
                    self.fail(node, "nested format specifications are not allowed")

    def visit_name(self, node: ast.Name, parent) -> None:
        name = node.id
        if name.startswith("__"):
            self.fail(node, f"the name {name!r} is not allowed in a candidate")
        if isinstance(node.ctx, ast.Store):
            return
        if name in self.aliases:
            target = self.aliases[name]
            is_module = target in MODULES or target in SUBMODULES
            used_as_root = isinstance(parent, ast.Attribute) and parent.value is node
            if is_module and not used_as_root:
                self.fail(node, f"the module {name!r} may be used only as in {name}.something, "
                                f"not as a value")
            return                    # a from-imported object of an allowed table: a leaf
        if name in BUILTINS or name in self.bound:
            if name == "hasattr" and isinstance(parent, ast.Call) and parent.func is node:
                a = parent.args
                if len(a) != 2 or not (isinstance(a[1], ast.Constant) and isinstance(a[1].value, str)
                                       and not a[1].value.startswith("_")):
                    self.fail(parent, "hasattr takes an object and a public name as a literal")
            return
        self.fail(node, f"the name {name!r} is not defined in the candidate and is not an "
                        f"allowed builtin")

    def visit_attribute(self, node: ast.Attribute, parent, in_jit: bool) -> None:
        if node.attr.startswith("_"):
            self.fail(node, f"attributes starting with an underscore (.{node.attr}) are not "
                            f"allowed")
        if isinstance(parent, ast.Attribute) and parent.value is node:
            return                    # the outermost Attribute of a chain checks the chain
        root, attrs = self.dotted(node)
        inner = node
        while isinstance(inner, ast.Attribute):
            inner = inner.value
        if root is not None and root in self.aliases:
            target = self.aliases[root]
            parts = target.split(".")
            # from-imported object (e.g. TensorDescriptor): its module and dotted rest
            if target in MODULES or target in SUBMODULES:
                what, used = resolve_chain(target, attrs)
            else:
                mod = next(m for m in sorted(MODULES, key=len, reverse=True)
                           if target.startswith(m + ".") or target == m)
                rest = target[len(mod) + 1:].split(".") if target != mod else []
                what, used = resolve_chain(mod, rest + attrs)
                used -= len(rest)
            if what is None:
                bad = ".".join([root] + attrs[:max(used, 0) + 1])
                self.fail(node, f"{bad} is not something a candidate may use "
                                f"({'.'.join(parts)} offers allocation, dtypes, device "
                                f"queries and Triton's own API only)")
            leftover = attrs[used:]
            if what != "leaf" and not leftover:
                self.fail(node, f"the module {'.'.join([root] + attrs)} may be used only as in "
                                f"{'.'.join([root] + attrs)}.something, not as a value")
        else:
            leftover = attrs
        allowed = DEVICE_ATTRS if in_jit else HOST_ATTRS
        for a in leftover:
            if a not in allowed:
                where = "inside a Triton kernel" if in_jit else "in host code"
                self.fail(node, f"the attribute .{a} is not allowed {where} (a candidate must "
                                f"compute with its own Triton kernel)")

    def visit_device_call(self, node: ast.Call) -> None:
        """Inside a @triton.jit body: calls of Triton / libdevice / math, other jit functions
        (defined in the file) and a few builtins only; never host helpers."""
        f = node.func
        if isinstance(f, ast.Name):
            target = self.aliases.get(f.id)
            if target is not None and not target.startswith(("triton.", "math.")):
                self.fail(node, f"{f.id} ({target}) may not be called inside a Triton kernel")
            if target is not None or f.id in self.bound or f.id in (
                    "range", "min", "max", "len", "int", "float", "bool", "abs", "isinstance",
                    "tuple", "print", "ValueError", "AssertionError", "RuntimeError"):
                return
        elif isinstance(f, ast.Attribute):
            return                    # checked as an attribute
        elif isinstance(f, ast.Subscript):
            return
        self.fail(node, "inside a Triton kernel only Triton, math and jit functions may be called")

    def finish(self) -> None:
        if not self.uses_jit:
            raise Rejected("no @triton.jit kernel: a candidate must compute with its own Triton "
                           "kernel")


def _literal(node) -> bool:
    try:
        ast.literal_eval(node)
        return True
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False


def check(source: str, arg_names: tuple[str, ...]) -> str | None:
    """Why ``source`` may not be a candidate with ``kernel_fn(*arg_names)``, or None."""
    try:
        tree = parse(source)
        kernel_fn = [n for n in tree.body if isinstance(n, ast.FunctionDef)
                     and n.name == "kernel_fn"]
        if not kernel_fn:
            return "no top-level function kernel_fn"
        fn = kernel_fn[-1]
        params = [a.arg for a in fn.args.posonlyargs + fn.args.args]
        if tuple(params[:len(arg_names)]) != tuple(arg_names) or (
                len(params) > len(arg_names)
                and len(fn.args.defaults) < len(params) - len(arg_names)):
            return f"kernel_fn must take ({', '.join(arg_names)}); it takes ({', '.join(params)})"
        c = _Checker(tree)
        c.check()
        c.finish()
    except Rejected as e:
        return str(e)
    except (RecursionError, MemoryError) as e:     # belt and braces: the walk is iterative
        return f"source cannot be checked within limits ({type(e).__name__})"
    return None


def rules_text() -> str:
    """The allow list in a few lines, for the LLM proposer's prompt."""
    torch_names = sorted(n for n in TORCH if "." not in n and n not in _DTYPES)
    return (
        f"imports only {', '.join(IMPORTABLE)} (triton.language, its libdevice, "
        f"triton.tools.tensor_descriptor.TensorDescriptor; on Hopper, Gluon: "
        f"triton.experimental.gluon.jit and .language, its nvidia.hopper tma / mbarrier / "
        f"warpgroup_mma, gluon.nvidia.hopper.TensorDescriptor); from torch only dtypes, "
        f"{', '.join(torch_names)}, torch.cuda device queries and torch.version; modules only as "
        f"`module.name` (never rebound, passed or returned); tensors on the host only "
        f"{', '.join(sorted(HOST_ATTRS & {'shape', 'stride', 'dtype', 'device', 'view', 'reshape', 'contiguous', 'transpose', 'permute', 'expand', 'unsqueeze', 'squeeze', 'flatten', 'to', 'clone', 'copy_', 'new_empty', 'numel', 'dim', 'data_ptr', 'is_contiguous', 'element_size'}))} "
        f"and the like (no compute methods, no .item/.tolist/.numpy); no names or attributes "
        f"starting with an underscore; no classes, global/nonlocal, attribute assignment, del, "
        f"yield, async; builtins only {', '.join(sorted(BUILTINS - {'True', 'False', 'None'}))}; "
        f"decorators only triton.jit / triton.autotune (literal configs, no hooks) / "
        f"triton.heuristics (lambdas over args[...] metadata); inside @triton.jit only Triton, "
        f"libdevice, math and other jit functions. At most {MAX_SOURCE_BYTES // 1024} KB.")
