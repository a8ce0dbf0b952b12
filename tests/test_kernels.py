"""The four kernel families: their rendered candidates against the float64 reference, the
adversarial inputs, the tolerances' teeth, cost() and make_inputs().

Without a GPU every candidate runs under Triton's CPU interpreter (tests/conftest.py sets
TRITON_INTERPRET=1), where each program instance costs about a millisecond, so shapes are tiny
and rows few. With a GPU the same tests run the compiled kernels on it.
"""
from __future__ import annotations

import ast
import math
import random
import sys

import pytest
import torch

import kernels
from tests.kernel_helpers import (  # noqa: F401
    DEVICE, as_f64, gen, inputs_for, load_candidate, point_id, sample_points)
from kernels import cross_entropy, layernorm, rmsnorm, softmax

# the interpreter computes masked-off lanes too (inf - inf, log(0), ...): numpy warns, harmlessly
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MODULES = {"rmsnorm": rmsnorm, "softmax": softmax, "layernorm": layernorm,
           "cross_entropy": cross_entropy}
FAMILIES = {name: mod.FAMILY for name, mod in MODULES.items()}

# Small shapes: a non-power-of-two D, 3-D leading dims, and a D that spans several chunks of
# the smallest chunk sizes (1024) so the looped variants really loop.
SHAPES = ((3, 37), (2, 3, 20), (2, 2100))


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def cand_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("candidates")


def main_dtype(fam, inputs):
    return inputs[fam.arg_names[0]].dtype


def tol_ratio(fam, out, inputs) -> float:
    """max |out - expected| / (atol + rtol*|expected|); NaN where exactly one side is NaN or
    where infinities differ. expected: the reference on float64 copies, cast to out's dtype."""
    expected = fam.reference(**as_f64(inputs)).to(out.dtype)
    assert out.shape == expected.shape, (out.shape, expected.shape)
    atol, rtol = fam.tolerance[main_dtype(fam, inputs)]
    o, e = out.double(), expected.double()
    if not torch.equal(torch.isnan(o), torch.isnan(e)):
        return math.nan
    inf = torch.isinf(e) | torch.isinf(o)
    if not torch.equal(o[inf], e[inf]):
        return math.nan
    fin = ~(torch.isnan(e) | inf)
    if not fin.any():
        return 0.0
    return float(((o - e).abs()[fin] / (atol + rtol * e.abs()[fin])).max())


def assert_close(fam, out, inputs, what=""):
    ref_dtype = fam.reference(**inputs).dtype
    assert out.dtype == ref_dtype, f"{what}: dtype {out.dtype} != reference {ref_dtype}"
    r = tol_ratio(fam, out, inputs)
    assert r <= 1.0, f"{what}: error is {r:.3g}x the tolerance"
    return r


@pytest.fixture
def poison_empty(monkeypatch):
    """torch.empty / empty_like return NaN-filled (float) or garbage (int) memory, as the
    verifier's allocations do, so an output element a kernel fails to write shows up."""
    real_empty, real_like = torch.empty, torch.empty_like

    def fill(t):
        if t.is_floating_point():
            t.fill_(float("nan"))
        elif t.dtype in (torch.int32, torch.int64):
            t.fill_(-123456789)
        return t

    monkeypatch.setattr(torch, "empty", lambda *a, **k: fill(real_empty(*a, **k)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **k: fill(real_like(*a, **k)))


def non_contiguous(fam, dtype, seed):
    """Inputs whose main tensor is a row-strided slice (row stride != D)."""
    inp = inputs_for(fam, (3, 45), dtype, seed)
    name = fam.arg_names[0]
    wide = inputs_for(fam, (3, 64), dtype, seed + 1)[name]
    wide[:, :45] = inp[name]
    inp[name] = wide[:, :45]
    assert not inp[name].is_contiguous()
    return inp


def transposed(fam, dtype, seed):
    """Inputs whose main tensor has a strided last dim (a transpose)."""
    inp = inputs_for(fam, (5, 4), dtype, seed)
    name = fam.arg_names[0]
    inp[name] = inp[name].t().contiguous().t()
    assert inp[name].stride(-1) != 1
    return inp


def run_checked(fam, fn, inputs, what):
    """Call a candidate, check it left its inputs alone and matches the reference."""
    before = {k: v.clone() for k, v in inputs.items() if torch.is_tensor(v)}
    out = fn(**inputs)
    for k, v in before.items():
        assert torch.equal(v.isnan(), inputs[k].isnan()) and torch.equal(
            v.nan_to_num(0.0), inputs[k].nan_to_num(0.0)), f"{what}: input {k} was modified"
    return assert_close(fam, out, inputs, what)


# ---------------------------------------------------------------------------------------------
# the families and their sources
# ---------------------------------------------------------------------------------------------

def test_registry():
    assert set(FAMILIES) <= set(kernels.FAMILY_NAMES)   # other families are other files' tests
    for name, fam in FAMILIES.items():
        assert kernels.get(name) is fam
        assert fam.name == name
        assert set(fam.tolerance) == set(DTYPES)
        assert fam.signature.startswith("kernel_fn(" + ", ".join(fam.arg_names) + ")")
        assert set(fam.default) == set(fam.space)
        for k, v in fam.default.items():
            assert v in fam.space[k], (name, k)
    with pytest.raises(kernels.UnknownFamily):
        kernels.get("gelu")


_ALLOWED_IMPORTS = {"torch", "triton", "triton.language", "math"}
# torch attributes a candidate may touch: allocation, dtypes, and the device query of the
# persistent grid. Everything numeric happens in Triton.
_ALLOWED_TORCH = {"empty", "empty_like", "float32", "int64", "cuda"}


@pytest.mark.parametrize("name", list(FAMILIES))
def test_render_every_value(name):
    """Every single-parameter change from the default renders a self-contained, parseable source
    that imports only torch/triton/math and uses torch only to allocate."""
    fam = FAMILIES[name]
    points = [dict(fam.default)] + [dict(fam.default, **{k: v})
                                    for k, vals in fam.space.items() for v in vals]
    sources = set()
    for p in points:
        src = fam.render(p)
        assert src == fam.render(dict(p)), "render is not deterministic"
        sources.add(src)
        tree = ast.parse(src)
        funcs = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert "kernel_fn" in funcs
        args = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "kernel_fn").args
        assert tuple(a.arg for a in args.args) == fam.arg_names
        assert ast.get_docstring(tree), "a candidate opens with a docstring"
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                assert {a.name for a in node.names} <= _ALLOWED_IMPORTS, ast.dump(node)
            elif isinstance(node, ast.ImportFrom):
                raise AssertionError(f"from-import in a candidate: {ast.dump(node)}")
            elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                  and node.value.id == "torch"):
                assert node.attr in _ALLOWED_TORCH, f"torch.{node.attr} in a candidate"
        assert "tl.atomic" not in src
    assert len(sources) > len(fam.space), "parameters should change the source"
    assert fam.starter() == fam.render(fam.default)
    with pytest.raises(ValueError):
        fam.render({"no_such_param": 1})
    with pytest.raises(ValueError):
        fam.render({next(iter(fam.space)): "no_such_value"})


# ---------------------------------------------------------------------------------------------
# candidates against the reference
# ---------------------------------------------------------------------------------------------

POINTS = [(name, p) for name, fam in FAMILIES.items() for p in sample_points(fam, 8)]


@pytest.mark.parametrize("name,point", POINTS, ids=[f"{n}-{point_id(p)}" for n, p in POINTS])
def test_points_match_reference(name, point, cand_dir, poison_empty):
    fam = FAMILIES[name]
    fn = load_candidate(fam.render(point), cand_dir)
    for di, dtype in enumerate(DTYPES):
        for si, shape in enumerate(SHAPES):
            inp = inputs_for(fam, shape, dtype, seed=100 * di + si)
            run_checked(fam, fn, inp, f"{name} {point} {shape} {dtype}")
        run_checked(fam, fn, non_contiguous(fam, dtype, 7 + di), f"{name} row-strided {dtype}")
    run_checked(fam, fn, transposed(fam, torch.float32, 11), f"{name} transposed")


@pytest.mark.parametrize("name", list(FAMILIES))
def test_starter_adversarial(name, cand_dir, poison_empty):
    """Every adversarial kind passes for the starter, in every dtype, with a D that is not a
    power of two; the starter is bitwise deterministic."""
    fam = FAMILIES[name]
    fn = load_candidate(fam.starter(), cand_dir)
    for kind in fam.adversarial:
        for di, dtype in enumerate(DTYPES):
            inp = inputs_for(fam, (6, 300), dtype, seed=di, kind=kind)
            run_checked(fam, fn, inp, f"{name} {kind} {dtype}")
    inp = inputs_for(fam, (4, 500), torch.float16, seed=3, kind="heavy_tail")
    a, b = fn(**inp), fn(**inp)
    assert torch.equal(a.view(-1).view(torch.int16 if a.element_size() == 2 else torch.int32),
                       b.view(-1).view(torch.int16 if b.element_size() == 2 else torch.int32))


@pytest.mark.parametrize("name", list(FAMILIES))
def test_looped_variants_adversarial(name, cand_dir):
    """The looped variants (several chunks per row) on the kinds that break running maxima and
    variance merges."""
    fam = FAMILIES[name]
    looped = {"rmsnorm": [{"variant": "chunked", "block_d": 1024}],
              "layernorm": [{"variant": "chunked", "block_d": 1024, "stats": s}
                            for s in ("two_pass", "chunk_merge")],
              "softmax": [{"variant": v, "online": o, "block_d": 1024}
                          for v, o in (("online", "chunk"), ("online", "lane"), ("three_pass", "chunk"))],
              "cross_entropy": [{"online": o, "block_v": 1024, "variant": v, "splits": 4}
                                for v, o in (("row", "chunk"), ("row", "lane"), ("split", "chunk"), ("split", "lane"))]}
    for point in looped[name]:
        fn = load_candidate(fam.render(point), cand_dir)
        for kind in fam.adversarial:
            for di, dtype in enumerate(DTYPES):
                inp = inputs_for(fam, (3, 2500), dtype, seed=10 + di, kind=kind)
                run_checked(fam, fn, inp, f"{name} {point} {kind} {dtype}")


@pytest.mark.parametrize("name", ["rmsnorm", "softmax", "layernorm"])
def test_one_pass_wide_row_fallback(name, cand_dir):
    """one_pass falls back to its looped kernel when next_pow2(D) > 65536."""
    fam = FAMILIES[name]
    fn = load_candidate(fam.starter(), cand_dir)
    inp = inputs_for(fam, (1, 70001), torch.float32, seed=5)
    run_checked(fam, fn, inp, f"{name} D=70001")


@pytest.mark.parametrize("name", list(FAMILIES))
def test_launch_clamps(name, cand_dir):
    """Every candidate keeps its register tile within MAX_TILE and lowers num_stages until the
    pipelined buffers fit PIPELINE_SMEM (the interpreter cannot see shared memory; on an H200 a
    4-stage fp32 [8, 4096] chunk loop asked for 384 KB and failed to launch)."""
    fam = FAMILIES[name]
    mod = sys.modules[load_candidate(fam.render(dict(fam.default, num_stages=4)), cand_dir).__module__]
    for stages in (1, 2, 3, 4):
        for tile_bytes in (64, 4096 * 2, 3 * 4096 * 4, 10 * 8192 * 4):
            got = mod._fit_stages(stages, tile_bytes)
            assert 1 <= got <= stages
            assert got == 1 or (got - 1) * tile_bytes <= mod.PIPELINE_SMEM
    assert mod._fit_stages(4, 10 * 8192 * 4) == 1 and mod._fit_stages(4, 1024) == 4
    for rows in (1, 2, 4, 8):
        for block in (1, 1024, 8192, 65536):
            r = mod._fit_rows(rows, block)
            assert 1 <= r <= rows and (r == 1 or r * block <= mod.MAX_TILE)


def test_edge_cases(cand_dir):
    fam = FAMILIES["cross_entropy"]
    for point in (fam.default, {"variant": "split", "splits": 4, "block_v": 1024}):
        fn = load_candidate(fam.render(point), cand_dir)
        # every target ignored: NaN, like torch
        inp = inputs_for(fam, (4, 50), torch.float32, seed=1)
        inp["targets"] = torch.full_like(inp["targets"], -100)
        out = fn(**inp)
        assert out.shape == () and out.dtype == torch.float32 and torch.isnan(out)
        # one unbatched row: logits [V], a 0-d target
        inp = inputs_for(fam, (33,), torch.float16, seed=2)
        inp["targets"] = torch.tensor(5, device=DEVICE)
        run_checked(fam, fn, inp, "unbatched")
        # single class: loss 0
        inp = inputs_for(fam, (3, 1), torch.float32, seed=3)
        inp["targets"] = torch.zeros(3, dtype=torch.int64, device=DEVICE)
        assert float(fn(**inp)) == 0.0
    for name in ("rmsnorm", "softmax", "layernorm"):
        fam = FAMILIES[name]
        fn = load_candidate(fam.starter(), cand_dir)
        for shape in ((1, 1), (5, 1), (64,)):
            run_checked(fam, fn, inputs_for(fam, shape, torch.float32, seed=4), f"{name} {shape}")
    fam = FAMILIES["layernorm"]
    fn = load_candidate(fam.starter(), cand_dir)
    inp = inputs_for(fam, (3, 40), torch.float16, seed=6)
    inp["weight"] = inp["bias"] = None
    run_checked(fam, fn, inp, "layernorm without affine")


# ---------------------------------------------------------------------------------------------
# the tolerances have teeth, and are fair
# ---------------------------------------------------------------------------------------------

def _ratio(fam, out, inputs):
    r = tol_ratio(fam, out, inputs)
    return math.inf if math.isnan(r) else r


def test_tolerance_rejects_wrong_softmax():
    fam = FAMILIES["softmax"]
    for dtype in DTYPES:
        # no max subtraction: exp(2e4) overflows to inf, inf / inf = NaN
        inp = inputs_for(fam, (6, 300), dtype, seed=1, kind="huge")
        x = inp["x"].float()
        assert _ratio(fam, (x.exp() / x.exp().sum(-1, keepdim=True)).to(dtype), inp) > 1
        # padded lanes loaded as 0 instead of -inf (a 300-wide row in a 512-wide block)
        inp = inputs_for(fam, (6, 300), dtype, seed=2, kind="tiny")
        x = torch.nn.functional.pad(inp["x"].float(), (0, 212))
        e = (x - x.max(-1, keepdim=True).values).exp()
        assert _ratio(fam, (e / e.sum(-1, keepdim=True))[:, :300].to(dtype), inp) > 1


def test_tolerance_rejects_wrong_rmsnorm():
    fam = FAMILIES["rmsnorm"]
    for dtype in DTYPES:
        inp = inputs_for(fam, (6, 300), dtype, seed=1, kind="tiny")
        x, w = inp["x"].float(), inp["weight"].float()
        ms = x.pow(2).mean(-1, keepdim=True)
        no_eps = x * torch.rsqrt(ms) * w
        assert _ratio(fam, no_eps.to(dtype), inp) > 1
        eps_1e5 = x * torch.rsqrt(ms + 1e-5) * w
        assert _ratio(fam, eps_1e5.to(dtype), inp) > 1
    # squares accumulated in fp16 overflow on "huge"
    inp = inputs_for(fam, (6, 300), torch.float16, seed=2, kind="huge")
    x = inp["x"]
    ms16 = (x * x).mean(-1, keepdim=True, dtype=torch.float16)
    assert _ratio(fam, (x * torch.rsqrt(ms16 + 1e-6) * inp["weight"]).to(torch.float16), inp) > 1


def test_tolerance_rejects_wrong_layernorm():
    fam = FAMILIES["layernorm"]

    def naive(inp, acc):
        """var = E[x^2] - E[x]^2 with the input and sums held in ``acc``."""
        x = inp["x"].to(acc)
        mean = x.mean(-1, keepdim=True, dtype=acc)
        var = ((x * x).mean(-1, keepdim=True, dtype=acc) - mean * mean).clamp_min(0)
        y = (x.float() - mean.float()) * torch.rsqrt(var.float() + inp["eps"])
        return (y * inp["weight"].float() + inp["bias"].float()).to(inp["x"].dtype)

    inp = inputs_for(fam, (6, 300), torch.float16, seed=1, kind="mixed_scale")
    assert _ratio(fam, naive(inp, torch.float16), inp) > 1
    # ... and the same formula fails even in fp32 on fp32 offset rows
    inp = inputs_for(fam, (6, 300), torch.float32, seed=1, kind="mixed_scale")
    assert _ratio(fam, naive(inp, torch.float32), inp) > 1
    # unbiased variance (D - 1) on a narrow row
    inp = inputs_for(fam, (6, 7), torch.float32, seed=2)
    x = inp["x"]
    y = (x - x.mean(-1, keepdim=True)) * torch.rsqrt(x.var(-1, keepdim=True, unbiased=True) + inp["eps"])
    assert _ratio(fam, y * inp["weight"] + inp["bias"], inp) > 1


def test_tolerance_rejects_wrong_cross_entropy():
    fam = FAMILIES["cross_entropy"]
    F = torch.nn.functional
    for dtype in DTYPES:
        inp = inputs_for(fam, (200, 30), dtype, seed=1)
        x, t = inp["logits"].float(), inp["targets"]
        assert (t == -100).any()
        per_row = F.cross_entropy(x, t, reduction="none", ignore_index=-100)
        counting_ignored = per_row.sum() / t.numel()
        assert _ratio(fam, counting_ignored, inp) > 1
        # no max subtraction on huge logits
        inp = inputs_for(fam, (40, 300), dtype, seed=2, kind="huge")
        x, t = inp["logits"].float(), inp["targets"]
        valid = t != -100
        lse = x.exp().sum(-1).log()
        no_max = (lse - x.gather(1, t.clamp_min(0)[:, None])[:, 0])[valid].mean()
        assert _ratio(fam, no_max, inp) > 1
        # padded vocab lanes loaded as 0 instead of -inf
        inp = inputs_for(fam, (40, 300), dtype, seed=3, kind="tiny")
        x, t = F.pad(inp["logits"].float(), (0, 212)), inp["targets"]
        assert _ratio(fam, F.cross_entropy(x, t, ignore_index=-100), inp) > 1


@pytest.mark.parametrize("name", list(FAMILIES))
def test_tolerance_is_fair(name):
    """The reference computed the plain way in fp32 (what a correct fp32-accumulating kernel
    does; torch's CPU kernels) stays well inside the tolerance on every kind and dtype."""
    fam = FAMILIES[name]
    for kind in ("normal",) + fam.adversarial:
        for di, dtype in enumerate(DTYPES):
            inp = inputs_for(fam, (8, 1000), dtype, seed=di, kind=kind)
            f32 = {k: v.float() if torch.is_tensor(v) and v.is_floating_point() else v
                   for k, v in inp.items()}
            out = fam.reference(**f32).to(fam.reference(**inp).dtype)
            assert _ratio(fam, out, inp) < 0.75, (kind, dtype)


# ---------------------------------------------------------------------------------------------
# make_inputs and cost
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(FAMILIES))
def test_make_inputs(name):
    fam = FAMILIES[name]
    for kind in ("normal",) + fam.adversarial:
        for dtype in DTYPES:
            shape = (3, 4, 50)
            a = fam.make_inputs(shape, dtype, DEVICE, gen(1), kind)
            b = fam.make_inputs(shape, dtype, DEVICE, gen(1), kind)
            c = fam.make_inputs(shape, dtype, DEVICE, gen(2), kind)
            assert tuple(a) == fam.arg_names
            main = a[fam.arg_names[0]]
            assert main.shape == shape and main.dtype == dtype and main.device.type == DEVICE
            assert torch.equal(main.nan_to_num(0.0), b[fam.arg_names[0]].nan_to_num(0.0))
            assert not torch.equal(main.nan_to_num(0.0), c[fam.arg_names[0]].nan_to_num(0.0))
            assert not main.isnan().any()
            if kind == "neg_inf":
                assert (main == float("-inf")).any() and not (main == float("inf")).any()
            else:
                assert main.isfinite().all(), (kind, dtype)
            if kind == "constant_rows":
                assert (main == main[..., :1]).all()
            for k, v in a.items():
                if torch.is_tensor(v) and k != fam.arg_names[0]:
                    assert v.device.type == DEVICE
                    if v.is_floating_point():
                        assert v.dtype == dtype and v.shape == shape[-1:]
    with pytest.raises(ValueError):
        fam.make_inputs((2, 8), torch.float32, DEVICE, gen(0), "no_such_kind")
    # dtype given by name works too
    assert fam.make_inputs((2, 8), "bfloat16", DEVICE, gen(0))[fam.arg_names[0]].dtype == torch.bfloat16


def test_make_inputs_magnitudes():
    big = lambda fam, kind, dtype: fam.make_inputs((16, 512), dtype, DEVICE, gen(0), kind)[fam.arg_names[0]].float()
    x = big(FAMILIES["rmsnorm"], "huge", torch.float16)
    assert (x * x).max() > 65504 and x.abs().max() < 65504       # fp16 squares overflow
    x = big(FAMILIES["rmsnorm"], "tiny", torch.float32)
    assert x.abs().max() < 1e-3 and x.abs().max() > 1e-7
    x = big(FAMILIES["softmax"], "huge", torch.float16)
    assert x.abs().max() > 1e3
    x = big(FAMILIES["layernorm"], "mixed_scale", torch.float32)
    mean, std = x.mean(-1).abs(), x.std(-1)
    assert (mean / std).min() > 100                               # offset rows
    assert std.max() / std.min() > 100                             # rows of very different scales


def test_cross_entropy_targets():
    fam = FAMILIES["cross_entropy"]
    inp = fam.make_inputs((2, 2000, 30), torch.bfloat16, DEVICE, gen(0))
    t = inp["targets"]
    assert t.dtype == torch.int64 and t.shape == (2, 2000)
    ignored = (t == -100).float().mean().item()
    assert 0.03 < ignored < 0.07
    assert ((t == -100) | ((t >= 0) & (t < 30))).all()
    inp = fam.make_inputs((50, 30), torch.float32, DEVICE, gen(1), "neg_inf")
    x, t = inp["logits"], inp["targets"]
    counted = t != -100
    assert torch.isfinite(x[counted, t[counted]]).all()          # no +inf loss
    assert (x[0] == float("-inf")).all() and t[0] == -100         # ignored all -inf row
    assert fam.reference(**inp).isfinite()
    assert fam.reference(**inp).dtype == torch.float32


def test_cost():
    n, d = 4096, 4096
    for dtype, item in ((torch.float16, 2), (torch.float32, 4), ("bfloat16", 2)):
        assert rmsnorm.cost((n, d), dtype)[0] == 2 * n * d * item + d * item
        assert layernorm.cost((n, d), dtype)[0] == 2 * n * d * item + 2 * d * item
        assert softmax.cost((n, d), dtype)[0] == 2 * n * d * item
        assert cross_entropy.cost((n, d), dtype)[0] == n * d * item + 8 * n + 4
    # leading dims multiply out
    assert rmsnorm.cost((8, 2048, 4096), torch.bfloat16) == rmsnorm.cost((8 * 2048, 4096), torch.bfloat16)
    for fam in FAMILIES.values():
        for shape in fam.bench_shapes:
            b, f = fam.cost(shape, torch.bfloat16)
            assert isinstance(b, int) and isinstance(f, int) and b > 0 and f > 0
            assert f >= 3 * math.prod(shape)     # a few flops per element, never zero
            assert b >= math.prod(shape) * 2      # at least the main input once


def test_shapes():
    wanted = {"rmsnorm": [(4096, 4096), (16384, 4096), (2048, 768), (8, 2048, 4096)],
              "softmax": [(4096, 4096), (8192, 8192), (4096, 50257), (8, 32, 2048, 2048)],
              "layernorm": [(4096, 4096), (8192, 4096), (2048, 768)],
              "cross_entropy": [(4096, 32000), (8192, 128256), (2048, 50257)]}
    for name, fam in FAMILIES.items():
        assert set(wanted[name]) <= set(fam.bench_shapes)
        assert (1, 1) in fam.sweep_shapes and (1, 1) in fam.edge_shapes
        assert (65537, 8) in fam.edge_shapes
        for s in fam.bench_shapes + fam.sweep_shapes + fam.edge_shapes:
            assert all(isinstance(v, int) and v > 0 for v in s)


def test_rendered_launchers_call_no_triton_constexpr_function_in_host_code():
    # triton.cdiv / triton.next_power_of_2 are Triton constexpr functions: ~3 us a host call
    # through their wrapper (Triton 3.9); the matmul launcher made nine a call. Rendered sources
    # use the plain helpers every source carries, which agree with Triton's
    import triton
    from kernels import _common as C
    ns: dict = {}
    exec(C.IMPORTS_SRC, ns)
    for n in range(0, 3000):
        assert ns["_pow2"](n) == triton.next_power_of_2(n)
        assert all(ns["_cdiv"](n, d) == triton.cdiv(n, d) for d in (1, 3, 64, 1000))
    for fam in kernels.all_families():
        src = fam.starter()
        assert "triton.cdiv(" not in src and "triton.next_power_of_2(" not in src, fam.name
        assert "def _cdiv(" in src, fam.name
