"""Regions: the fusible rest of a graph found beside the family matches, each a target whose
contract and starter are generated from its JSON spec (engine/regions.py, kernels/region.py)."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import kernels
from engine import capture, match, regions, verify
from tests.kernel_helpers import DEVICE, gen, load_candidate


def _found(model, *inputs):
    cap = capture.capture(model.eval(), inputs)
    g = cap.graphs[0]
    ms = match.find(g)
    return ms, regions.find(g, ms)


def _by_name(found):
    return {r.name: r for r in found.regions}


class Chain(nn.Module):             # a pointwise chain with a broadcast scalar and a bias row
    def forward(self, x, b):
        return F.leaky_relu(x * 2.0 + b, 0.1).clamp(max=3.0)


class GemmEpilogue(nn.Module):      # KernelBench's Gemm_Multiply_LeakyReLU, with GELU
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 24)

    def forward(self, x):
        return F.gelu(self.lin(x) * 0.5)


class Reductions(nn.Module):        # over the middle dim, two outer dims, and a softmax on dim 1
    def forward(self, x):
        a = torch.softmax(x, dim=1) * 2.0
        b = x.amax(dim=(0, 2))
        c = (x - x.mean(dim=1, keepdim=True)).abs().amax(dim=1)
        return a, b, c


class MaskedCumsum(nn.Module):
    def forward(self, x, mask):
        return torch.cumsum(x * mask, dim=1) * 0.5


class Norms(nn.Module):
    def __init__(self):
        super().__init__()
        self.gn = nn.GroupNorm(2, 4)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        return F.relu(self.gn(x)), torch.sigmoid(self.bn(x))


class Pooled(nn.Module):
    def __init__(self, pool):
        super().__init__()
        self.pool = pool

    def forward(self, x):
        return torch.relu(self.pool(x))


class Composites(nn.Module):
    """Ops PyTorch writes as other aten ops, which the export keeps whole: a triplet loss
    (two row norms, then a mean of a hinge), a margin ranking loss, relu6."""

    def forward(self, a, p, n, y):
        return (F.triplet_margin_loss(a, p, n) + F.margin_ranking_loss(a[:, 0], p[:, 0], y)
                + F.relu6(n).mean())


class Decomposed(nn.Module):
    """Ops with aten kernels of their own that PyTorch's decompositions write as region ops:
    F.glu's halves, nn.PReLU, lerp, addcmul, BCE with logits (log-sigmoid), xlogy (isnan),
    nan_to_num (isnan, isposinf, isneginf)."""

    def __init__(self):
        super().__init__()
        self.act = nn.PReLU(8)
        with torch.no_grad():
            self.act.weight.copy_(torch.linspace(0.1, 0.8, 8))

    def forward(self, x, y, t):
        b = self.act(F.glu(x, 1))
        c = torch.lerp(b, y, 0.3) + torch.addcmul(y, y, b, value=0.5)
        return (F.binary_cross_entropy_with_logits(c, t), torch.xlogy(c.abs(), y.abs() + 1.0),
                torch.nan_to_num(torch.log(t) * torch.isinf(y), neginf=-30.0))


class Elementwise(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x, y):
        return self.fn(x, y)


class IndexOf(nn.Module):
    def __init__(self, fn, **kw):
        super().__init__()
        self.fn, self.kw = fn, kw

    def forward(self, x):
        return self.fn(x, **self.kw)


class Flipped(nn.Module):           # any function of the inputs
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def test_regions_found_in_models_written_several_ways():
    _, f = _found(Chain(), torch.randn(4, 8), torch.randn(8))
    chain = _by_name(f)["mul+add+leaky_relu+clamp"]
    assert chain.spec["red"] == [] and [i["map"] for i in chain.spec["inputs"]] == [[0, 1], [1]]

    ms, f = _found(GemmEpilogue(), torch.randn(3, 16))
    assert [m.family for m in ms] == ["matmul"]                 # the GEMM: a matmul match ...
    assert list(_by_name(f)) == ["gemm+mul+gelu"]               # ... fused with its epilogue
    assert f.absorbed == ms                                     # the region's target, not the family's
    g = _by_name(f)["gemm+mul+gelu"]
    assert g.spec["gemm"]["layout"] == "nk" and g.shape == (3, 16, 24)   # (M, K, N): x @ W^T

    ms, f = _found(Reductions(), torch.randn(2, 6, 5))
    got = _by_name(f)
    assert got["softmax+mul"].spec["red"] == [1]                # dim 1: no softmax contract
    assert got["max"].spec["red"] == [0, 2]
    # the mean of the input stays the reduce family's (a raw input's row mean is one pass)
    assert got["sub+abs+max"].spec["red"] == [1] and not f.absorbed

    _, f = _found(MaskedCumsum(), torch.randn(3, 9), torch.rand(3, 9) > 0.5)
    scan = _by_name(f)["mul+cumsum+mul"]
    assert scan.spec["red"] == [1] and [i["dtype"] for i in scan.spec["inputs"]] == ["float32", "bool"]

    _, f = _found(Norms(), torch.randn(2, 4, 3, 5))
    got = _by_name(f)
    assert got["group_norm+relu"].spec["split"] == [1, 2]       # channels as [groups, C/groups]
    assert got["batch_norm+sigmoid"].spec["red"] == []          # eval mode: per-channel pointwise


def test_a_reduction_read_outside_is_its_own_regions_output_never_recomputed_inside():
    class FeedsBack(nn.Module):
        def forward(self, x):
            s = x.amax(dim=0, keepdim=True).exp()
            return s, x * s                 # s is an output and an input of the product

    _, f = _found(FeedsBack(), torch.randn(5, 7))
    got = _by_name(f)
    assert set(got) == {"max+exp", "mul"}
    assert got["mul"].inputs[1] is got["max+exp"].output     # read from its region, not refused


def test_a_reduction_of_a_reduced_value_is_not_fused_with_it():
    class Twice(nn.Module):                 # the second logsumexp reduces a size-1 dim
        def forward(self, x):
            y = torch.logsumexp(x, dim=1, keepdim=True)
            return torch.logsumexp(y, dim=1, keepdim=True) * 2.0

    _, f = _found(Twice(), torch.randn(4, 9))
    assert [r.name for r in f.regions] == ["logsumexp", "logsumexp+mul"]
    assert [list(r.shape) for r in f.regions] == [[4, 9], [4, 1]]


def test_spec_round_trips_through_json_and_rebuilds_the_same_contract():
    _, f = _found(Norms(), torch.randn(2, 4, 3, 5))
    for r in f.regions:
        text = json.dumps(r.spec)
        back = json.loads(text)
        assert back == r.spec
        a, b = kernels.get("region", r.spec), kernels.get("region", back)
        assert a.starter() == b.starter() and a.arg_names == b.arg_names
        assert verify.static_check(a.starter(), a.arg_names) is None
        x = a.make_inputs(tuple(r.shape), torch.float32, DEVICE, gen(0))
        assert tuple(a.reference(**x).shape) == tuple(cap_val(r.output).shape)
    with pytest.raises(ValueError):
        kernels.get("region", {"name": "x", "rank": 1, "red": [], "inputs": [], "ops": []})


def cap_val(node):
    return capture.val(node)


def test_domain_restricted_regions_get_inputs_where_every_op_is_defined():
    class Domains(nn.Module):
        def forward(self, x, y):
            return torch.log(x - y) + torch.sqrt(x.sum(dim=1, keepdim=True)) + 1.0 / (y * y + x)

    _, f = _found(Domains(), torch.rand(3, 6) + 3, torch.rand(3, 6))
    (r,) = [r for r in f.regions if "log" in r.name]
    fam = kernels.get("region", r.spec)
    assert set(fam.adversarial) - {"nan", "inf"}              # tiny / large where the ops hold
    for kind in ("normal",) + tuple(k for k in fam.adversarial if k not in ("nan", "inf")):
        for dt in (torch.float32, torch.float16):
            x = fam.make_inputs((3, 6), dt, DEVICE, gen(1), kind)
            ref = fam.reference(**{k: v.double() for k, v in x.items()})
            assert torch.isfinite(ref).all(), (kind, dt)
    # and NaN, or +-inf, among otherwise in-domain inputs: the output has NaN and Inf exactly
    # where they reach (the judge compares their places)
    for kind, bad in (("nan", torch.isnan), ("inf", torch.isinf)):
        x = fam.make_inputs((30, 60), torch.float32, DEVICE, gen(1), kind)
        ref = fam.reference(**{k: v.double() for k, v in x.items()})
        full = [f"in{i}" for i, inp in enumerate(r.spec["inputs"]) if None not in inp["map"]]
        assert full and all(bool(bad(x[k]).any()) for k in full), kind   # the activations
        assert not any(bool(bad(v).any()) for k, v in x.items() if k not in full)
        assert not bool(torch.isfinite(ref).all()) and bool(torch.isfinite(ref).any()), kind


def _five_stages(fam, shape, source=None, tmp=None):
    verify.install_launch_counter()
    fn = load_candidate(source or fam.starter(), tmp)
    v = verify.Verifier(fam, {"dtype": "float32", "shapes": [{"shape": list(shape)}]}, DEVICE,
                        DEVICE == "cpu")
    return [v.run_stage(fn, st) for st in verify.STAGES]


@pytest.mark.parametrize("model,inputs,name", [
    (Chain(), (torch.randn(4, 8), torch.randn(8)), "mul+add+leaky_relu+clamp"),
    (GemmEpilogue(), (torch.randn(3, 16),), "gemm+mul+gelu"),
    (Reductions(), (torch.randn(2, 6, 5),), "max"),
    (MaskedCumsum(), (torch.randn(3, 9), torch.rand(3, 9) > 0.5), "mul+cumsum+mul"),
    # attention pooling written by hand: weights [B, T, 1] over their sum [B, 1, 1], times
    # x [B, T, D], summed over T; the sum is read by outer index alone (a scalar a program)
    (Elementwise(lambda w, x: (w / w.sum(1, keepdim=True) * x).sum(1)),
     (torch.rand(3, 10, 1) + 0.5, torch.randn(3, 10, 6)), "div+mul+sum"),
], ids=["pointwise", "gemm_epilogue", "reduce_outer_dims", "masked_scan", "pool_middle_dim"])
def test_generated_starter_passes_all_five_stages(model, inputs, name, tmp_path):
    _, f = _found(model, *inputs)
    r = _by_name(f)[name]
    fam = kernels.get("region", r.spec)
    for st in _five_stages(fam, r.shape, tmp=tmp_path):
        assert st.status == "passed", (st.stage, st.failed_case, st.detail)


@pytest.mark.parametrize("fn,name", [
    (lambda x, y: torch.logaddexp(x * 3.0, y), "mul+logaddexp"),
    pytest.param(lambda x, y: F.logsigmoid(x * 4.0) + y, "mul+log_sigmoid+add", marks=pytest.mark.slow),
    pytest.param(lambda x, y: F.softshrink(x, 0.7) * y, "softshrink+mul", marks=pytest.mark.slow),
    pytest.param(lambda x, y: F.hardshrink(x) - y, "hardshrink+sub", marks=pytest.mark.slow),
    (lambda x, y: torch.frac(x * 5.0) + torch.trunc(y * 3.0), "mul+frac+mul+trunc+add"),
], ids=["logaddexp", "log_sigmoid", "softshrink", "hardshrink", "frac_trunc"])
def test_elementwise_ops_with_aten_kernels_of_their_own_pass_all_five_stages(fn, name, tmp_path):
    # ops an export keeps as one aten kernel of their own: region ops, their infinities and
    # NaN where torch puts them (the stability stage's NaN and Inf inputs)
    _, f = _found(Elementwise(fn), torch.randn(4, 33), torch.randn(4, 33))
    r = _by_name(f)[name]
    fam = kernels.get("region", r.spec)
    for st in _five_stages(fam, r.shape, tmp=tmp_path):
        assert st.status == "passed", (st.stage, st.failed_case, st.detail)


@pytest.mark.parametrize("name", [
    "sigmoid+mul+gt+mul+where+where+sub+mul+add+mul+mul+add+add",
    "rsub+mul+neg+softplus+neg+sub+mean",
    pytest.param("abs+abs+add+eq+log+mul+where+isnan+where", marks=pytest.mark.slow),
    "log+isinf+mul+isnan+where+isneginf+where+isposinf+where",
], ids=["glu_prelu_lerp_addcmul", "bce_with_logits", "xlogy", "nan_to_num"])
def test_ops_pytorch_decomposes_are_regions_that_pass_all_five_stages(name, tmp_path):
    # glu's halves are two strided views of its input (the region reads them where they lie),
    # nn.PReLU a where, BCE with logits a softplus and a mean, xlogy an isnan
    _, f = _found(Decomposed(), torch.randn(4, 16, 10), torch.randn(4, 8, 10), torch.rand(4, 8, 10))
    assert not [lf.why for lf in f.left if not lf.why.startswith(("slice", "view"))]
    r = _by_name(f)[name]
    fam = kernels.get("region", r.spec)
    for st in _five_stages(fam, r.shape, tmp=tmp_path):
        assert st.status == "passed", (st.stage, st.failed_case, st.detail)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["softmax+mul", "sub+abs+max", "group_norm+relu"])
def test_row_reductions_pass_all_five_stages_one_pass_and_looped(name, tmp_path):
    model, inputs = ((Norms(), (torch.randn(2, 4, 3, 5),)) if name == "group_norm+relu"
                     else (Reductions(), (torch.randn(2, 6, 5),)))
    _, f = _found(model, *inputs)
    r = _by_name(f)[name]
    fam = kernels.get("region", r.spec)
    for point in ({}, {"variant": "looped", "block": 64}):
        src = fam.render(point)
        for st in _five_stages(fam, r.shape, src, tmp_path):
            assert st.status == "passed", (point, st.stage, st.failed_case, st.detail)


def test_a_region_generated_wrong_is_rejected(tmp_path):
    _, f = _found(Chain(), torch.randn(4, 8), torch.randn(8))
    r = _by_name(f)["mul+add+leaky_relu+clamp"]
    fam = kernels.get("region", r.spec)
    # a missing epilogue op: the starter of the region without its clamp, judged as the region
    short = dict(r.spec, ops=r.spec["ops"][:-1], name="mul+add+leaky_relu")
    wrong = kernels.get("region", short).starter()
    stages = _five_stages(fam, r.shape, wrong, tmp_path)
    assert stages[0].status == "failed" and "wrong result" in stages[0].detail
    # a dropped tail: a grid of whole tiles only, so the last rows of most shapes go unwritten
    src = fam.starter().replace("grid = (_cdiv(n_rows, rows) *",
                                "grid = (max(1, n_rows // rows) *")
    assert src != fam.starter()
    bad = [s for s in _five_stages(fam, r.shape, src, tmp_path) if s.status != "passed"]
    assert bad and "NaN where the reference is finite" in bad[0].detail, bad


def test_graph_profile_gives_regions_their_time_and_targets_named_by_their_ops():
    from engine import profile as profiler
    m = GemmEpilogue().eval().to(DEVICE)
    cap = capture.capture(m, (torch.randn(32, 16, device=DEVICE),))
    ms = {g.index: match.find(g) for g in cap.graphs}
    regs = {g.index: regions.find(g, ms[g.index]).regions for g in cap.graphs}
    gp = profiler.profile_graph(cap, ms, regions=regs)
    rows = {r.family: r for r in gp.result.families}
    assert "gemm+mul+gelu" in rows and rows["gemm+mul+gelu"].has_kernel
    assert "matmul" not in rows                   # the GEMM's time is the region's, counted once
    assert abs(sum(r.time_us for r in gp.result.families) - gp.result.total_us) < 1e-6 * gp.result.total_us + 1e-9
    (t,) = gp.targets
    assert t.family == "region" and t.label == "gemm+mul+gelu"
    assert t.shapes == [{"shape": [32, 16, 24], "count": 1}]          # (M, K, N)
    nbytes, flops = kernels.get("region", t.spec).cost((32, 16, 24), "float32")
    assert nbytes == (32 * 16 + 24 * 16 + 24 + 32 * 24) * 4           # x, W, bias, out
    assert flops >= 2 * 32 * 16 * 24


class ConvBnRelu(nn.Module):        # ResNet's block head: one region, the convolution's epilogue fused
    def __init__(self, conv):
        super().__init__()
        self.conv, self.bn = conv, nn.BatchNorm1d(conv.out_channels) if isinstance(conv, nn.Conv1d) \
            else nn.BatchNorm2d(conv.out_channels)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)))


def test_convolution_and_its_epilogue_are_one_region_that_passes_all_five_stages(tmp_path):
    _, f = _found(ConvBnRelu(nn.Conv1d(3, 5, 3, dilation=2, padding=1)), torch.randn(2, 3, 11))
    (r,) = f.regions
    assert r.name == "conv+batch_norm+relu" and r.spec["conv"]["dilation"] == [2]
    assert list(r.shape) == [2, 3, 11]                   # the family shape: the conv's input
    fam = kernels.get("region", r.spec)
    x = fam.make_inputs((2, 3, 11), torch.float32, DEVICE, gen(0))
    assert tuple(fam.reference(**x).shape) == (2, 5, 9)       # 11 + 2*1 - 2*(3-1) - 1 + 1
    for st in _five_stages(fam, r.shape, tmp=tmp_path):
        assert st.status == "passed", (st.stage, st.failed_case, st.detail)


def test_a_models_tf32_setting_for_convolutions_is_the_regions_contract():
    """A model that turns cuDNN's TF32 off computes its fp32 convolutions in IEEE fp32: the
    region's spec says so (from the process that captured the model), its reference replays
    the convolution so, and TF32 is no opener; with torch's default nothing is recorded."""
    model, x = ConvBnRelu(nn.Conv2d(3, 4, 3, padding=1)), torch.randn(2, 3, 6, 6)
    old = torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cudnn.allow_tf32 = False
        (off,) = _found(model, x)[1].regions
    finally:
        torch.backends.cudnn.allow_tf32 = old
    (on,) = _found(model, x)[1].regions
    assert off.spec["conv"]["tf32"] is False and "tf32" not in on.spec["conv"]
    f_off, f_on = kernels.get("region", off.spec), kernels.get("region", on.spec)
    assert {"fp32_dot": "tf32"} not in f_off.openers
    assert ({"fp32_dot": "tf32"} in f_on.openers) == bool(torch.backends.cudnn.allow_tf32)
    seen = []
    real = torch.backends.cudnn.flags

    def spy(**kw):
        seen.append(kw["allow_tf32"])
        return real(**kw)
    torch.backends.cudnn.flags = spy
    try:
        inputs = f_off.make_inputs(tuple(off.shape), torch.float32, DEVICE, gen(0))
        ref_off = f_off.reference(**inputs)
        assert seen == [False]
        torch.testing.assert_close(ref_off, f_on.reference(**inputs))   # the same function
        assert seen == [False]                                         # the default: no flags
    finally:
        torch.backends.cudnn.flags = real
    assert torch.backends.cudnn.allow_tf32 == old


@pytest.mark.slow
@pytest.mark.parametrize("conv,shape", [
    (nn.Conv2d(4, 6, 3, stride=2, groups=2, bias=False), (1, 4, 9, 8)),
    (nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1), (1, 4, 5, 4)),
], ids=["grouped_strided", "transposed"])
def test_strided_grouped_and_transposed_convolutions_pass_all_five_stages(conv, shape, tmp_path):
    class Epi(nn.Module):
        def __init__(self):
            super().__init__()
            self.c = conv

        def forward(self, x):
            return torch.tanh(self.c(x)) * 2.0
    _, f = _found(Epi(), torch.randn(*shape))
    (r,) = f.regions
    fam = kernels.get("region", r.spec)
    for st in _five_stages(fam, r.shape, tmp=tmp_path):
        assert st.status == "passed", (st.stage, st.failed_case, st.detail)


def _region_kernel(r, tmp):
    """The region's generated starter, loaded as a runtime kernel verified for its shape."""
    import os
    from engine import kernel_runtime as rt
    import hashlib
    fam = kernels.get("region", r.spec)
    src = fam.starter()
    # a file per source: Triton reads a kernel's source from its file when it first compiles
    # it, so two regions of one name must not share a path
    path = os.path.join(str(tmp), f"region_{hashlib.sha256(src.encode()).hexdigest()[:16]}.py")
    with open(path, "w") as f:
        f.write(src)
    return rt.load_kernel_file(path, "region", r.dtype, DEVICE, [list(r.shape)],
                               fam.tolerance[getattr(torch, r.dtype)], f"region#{r.name}",
                               r.spec, fam.op_schema)


def test_a_pointwise_region_wider_than_a_tile_is_cut_over_a_two_dimensional_grid(tmp_path):
    # rows of 2,500 columns against tiles of 1,024: each program one [ROWS, 1024] tile, column
    # blocks of a row band on adjacent programs, the last block masked; the five stages pass
    _, f = _found(Chain(), torch.randn(3, 2500), torch.randn(2500))
    r = _by_name(f)["mul+add+leaky_relu+clamp"]
    fam = kernels.get("region", r.spec)
    # (the region's first opener is torch.compile's tile for a large pointwise kernel)
    assert fam.openers == ({"max_block": 1024, "max_tile": 1024, "num_warps": 4},)
    assert fam.for_target(r.shape, "float32").default == fam.default
    src = fam.render({**fam.default, "max_block": 1024, "max_tile": 2048})
    assert "c_start = (tl.program_id(0) % n_cblk) * BLOCK" in src and "_region_one_pass, MAX_BLOCK" in src
    for st in _five_stages(fam, r.shape, source=src, tmp=tmp_path):
        assert st.status == "passed", (st.stage, st.failed_case, st.detail)


@pytest.mark.parametrize("model,inputs", [
    (Chain(), (torch.randn(4, 8), torch.randn(8))),
    (GemmEpilogue(), (torch.randn(3, 16),)),
    (Reductions(), (torch.randn(2, 6, 5),)),
    (MaskedCumsum(), (torch.randn(3, 9), torch.rand(3, 9) > 0.5)),
    (IndexOf(torch.argmax, dim=1), (torch.randn(4, 37),)),
    (Pooled(nn.MaxPool2d(3, 2, 1)), (torch.randn(2, 3, 9, 9),)),
    (Composites(), (torch.randn(6, 16), torch.randn(6, 16), torch.randn(6, 16),
                    torch.tensor([1.0, -1.0, 1.0, 1.0, -1.0, -1.0]))),
    (Decomposed(), (torch.randn(4, 16, 10), torch.randn(4, 8, 10), torch.rand(4, 8, 10))),
], ids=["pointwise", "gemm_epilogue", "reductions", "masked_scan", "argmax", "max_pool",
        "composites", "decomposed"])
def test_region_kernels_are_placed_one_site_a_region(model, inputs, tmp_path):
    # Each region a kernel was verified for becomes one site_call in the rewritten graph; its
    # ops leave the graph, the rest (a GEMM with no kernel) stays, and the model agrees.
    from engine import integrate, place
    # on a GPU machine Triton compiles for the GPU: the model and its inputs go there
    model, inputs = model.to(DEVICE), tuple(t.to(DEVICE) for t in inputs)
    cap = capture.capture(model.eval(), inputs)
    g = cap.graphs[0]
    ms = match.find(g)
    found = regions.find(g, ms)
    assert found.regions
    ks = [_region_kernel(r, tmp_path) for r in found.regions]
    pl = place.place(cap, ks, {g.index: ms})
    assert sorted(s["pattern"] for s in pl.sites) == sorted(r.name for r in found.regions), pl.skipped
    new = pl.graphs[0]
    calls = [n for n in new.graph.nodes if n.op == "call_function"]
    assert sum(1 for n in calls if "site_call" in str(n.target)) == len(found.regions)
    region_ops = {n.target for r in found.regions for n in r.nodes}
    assert not [n for n in calls if n.target in region_ops], new.code
    assert not [n for n in calls if not n.users]
    opt = place.optimized(cap, pl)
    with torch.no_grad():
        ref, out = model(*inputs), opt(*inputs)
    assert opt.calls["placed"] == 1 and opt.calls["guard_miss"] == 0
    err, where = integrate.compare(integrate.flatten(out), integrate.flatten(ref))
    assert err <= 1e-5, where


REGION_MODEL = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):              # written as KernelBench writes its level-2 epilogues
    def __init__(self):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(64))

    def forward(self, x):
        return torch.clamp(F.leaky_relu(x * 2.0 + self.bias, 0.1), min=-1.0, max=1.0)


def get_inputs():
    return [torch.randn(8, 64)]


def get_init_inputs():
    return []
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU an 8x64 region's kernel does not "
                    "beat eager and is rightly not placed; the interpreter's timings do not rank")
def test_a_run_with_regions_places_their_kernels_in_the_model(tmp_path):
    # --families region: the region is a target, its starter is verified and kept, and the
    # end of the run places it (one site) and checks the rewritten model against the original;
    # the exported package places it too, in a process that cannot import the engine.
    from engine.cli import main as cli_main
    from engine.loop import RunConfig, execute
    from engine.store import Store
    from tests.test_integration import run_clean
    path = tmp_path / "chain.py"
    path.write_text(REGION_MODEL)
    db = tmp_path / "runs.db"
    run_id = execute(RunConfig(model=str(path), families=["region"], budget_experiments=1,
                               db=str(db)), log=lambda _: None)
    s = Store(db, readonly=True)
    (t,) = s.targets(run_id)
    assert t["family"] == "region" and t["best_experiment_id"], s.experiments(run_id)
    (check,) = s.e2e_checks(run_id)
    assert check["status"] == "passed", check
    used = {u["kernel"]: u["calls"] for u in check["kernels_used"]}
    assert any(k.startswith("region") and n >= 1 for k, n in used.items()), used
    out_dir = tmp_path / "export"
    assert cli_main(["export", run_id, "--out", str(out_dir), "--db", str(db)]) == 0
    manifest = json.loads((out_dir / "nightshift_kernels" / "manifest.json").read_text())
    (k,) = manifest["kernels"]
    assert k["family"] == "region" and k["spec"] == t["spec"] and k["schema"].startswith("(Tensor in0")
    torch.manual_seed(5)
    x = (torch.randn(8, 64),)
    out, stats = run_clean(out_dir, tmp_path, path, "(torch.manual_seed(1), m.Model())[1]", x)
    assert stats == {"placed": 1, "original": 0, "guard_miss": 0}
    torch.manual_seed(1)
    from engine import sources
    ref = sources.import_file(str(path)).Model()(*x)
    assert torch.allclose(out, ref, atol=1e-5, rtol=1e-5)


class Losses(nn.Module):             # the losses KernelBench and models write with their own aten op
    def __init__(self, which):
        super().__init__()
        self.which = which

    def forward(self, a, b, p):
        return {"smooth_l1": lambda: F.smooth_l1_loss(a, b),
                "smooth_l1_sum_beta": lambda: F.smooth_l1_loss(a, b, reduction="sum", beta=0.3),
                "huber": lambda: F.huber_loss(a, b, delta=0.5),
                "l1": lambda: F.l1_loss(a, b),
                "mse": lambda: F.mse_loss(a, b),
                "kl_div_batchmean": lambda: F.kl_div(torch.log(p), b.softmax(-1), reduction="batchmean"),
                "kl_div_log_target": lambda: F.kl_div(a, torch.log(p), reduction="sum", log_target=True),
                }[self.which]()


@pytest.mark.parametrize("which", ["smooth_l1", "smooth_l1_sum_beta", "huber", "l1", "mse",
                                   "kl_div_batchmean", "kl_div_log_target"])
def test_losses_with_their_own_aten_op_are_one_region_that_passes_all_five_stages(which, tmp_path):
    a, b = torch.randn(4, 24), torch.randn(4, 24)
    p = torch.softmax(torch.randn(4, 24), -1)
    model = Losses(which)
    _, f = _found(model, a, b, p)
    (r,) = [r for r in f.regions if any(op in r.name for op in ("loss", "kl_div"))]
    assert r.spec["red"] == [0, 1], r.spec
    fam = kernels.get("region", r.spec)
    with torch.no_grad():      # the region's reference is the model's own op
        ins = fam.make_inputs(r.shape, "float32", DEVICE, gen(2))
        assert torch.isfinite(fam.reference(**{k: v.double() for k, v in ins.items()})).all()
    for st in _five_stages(fam, r.shape, tmp=tmp_path):
        assert st.status == "passed", (which, st.stage, st.failed_case, st.detail)


POOLS = {
    "max1d_padded": (lambda: nn.MaxPool1d(3, 2, 1), (2, 3, 16)),
    "max2d_dilated": (lambda: nn.MaxPool2d(3, 2, 1, dilation=2), (2, 3, 12, 12)),
    "avg2d_without_pad": (lambda: nn.AvgPool2d(3, 2, 1, count_include_pad=False), (2, 3, 9, 9)),
    "avg1d_with_pad": (lambda: nn.AvgPool1d(3, 2, 1), (2, 4, 11)),
    "avg3d": (lambda: nn.AvgPool3d(2), (1, 2, 6, 6, 6)),
    "max3d_stride_1": (lambda: nn.MaxPool3d(2, 1), (1, 2, 5, 5, 5)),
}


@pytest.mark.parametrize("name", list(POOLS))
def test_pooling_and_its_epilogue_are_one_region_that_passes_all_five_stages(name, tmp_path):
    # max / avg pooling as a depthwise window with no weights (KernelBench level 1's 41-46,
    # DenseNet's transition layers): one region with what follows it
    make, shape = POOLS[name]
    _, f = _found(Pooled(make()), torch.randn(*shape))
    (r,) = f.regions
    assert r.name.endswith("pool" + name[3:5] + "+relu") and r.spec["conv"]["pool"] == name[:3]
    fam = kernels.get("region", r.spec)
    for st in _five_stages(fam, r.shape, tmp=tmp_path):
        assert st.status == "passed", (name, st.stage, st.failed_case, st.detail)


def test_a_pooling_with_ceil_mode_is_left_out_with_its_reason():
    _, f = _found(Pooled(nn.MaxPool2d(3, 2, ceil_mode=True)), torch.randn(1, 2, 8, 8))
    assert not [r for r in f.regions if "pool" in r.name]
    assert any("ceil_mode" in left.why for left in f.left), [(x.node.name, x.why) for x in f.left]


@pytest.mark.parametrize("fn, kw, shape", [
    # (the middle dim, one pass and looped over 40 x 5 columns, takes 90 s interpreted: slow)
    pytest.param(torch.argmax, {"dim": 1}, (3, 40, 5), marks=pytest.mark.slow),
    (torch.argmin, {"dim": -1}, (4, 300)),
    (torch.argmax, {}, (3, 7)), (torch.argmin, {"dim": 0, "keepdim": True}, (9, 4))],
    ids=["argmax_middle_dim", "argmin_last_dim", "argmax_flat", "argmin_keepdim"])
def test_argmax_and_argmin_are_regions_that_pass_all_five_stages_one_pass_and_looped(fn, kw, shape, tmp_path):
    # KernelBench level 1's 51 and 52: an int64 index, the first of the max (or of a NaN, which
    # torch ranks above everything), in one tile or chunk by chunk
    _, f = _found(IndexOf(fn, **kw), torch.randn(*shape))
    (r,) = f.regions
    assert r.name == fn.__name__ and r.spec["out_dtype"] == "int64"
    fam = kernels.get("region", r.spec)
    assert "nan" in fam.adversarial
    for variant in ("auto", "looped"):
        src = fam.render(dict(fam.default, variant=variant, block=64))
        for st in _five_stages(fam, r.shape, source=src, tmp=tmp_path):
            assert st.status == "passed", (variant, st.stage, st.failed_case, st.detail)


def test_an_index_of_a_computed_value_is_a_region_of_its_own():
    # fp32 rounding of x * 3 + 1 inside one kernel could move the index off torch's (which
    # rounds in x's dtype): the index reads the value the region before it wrote, as torch does
    _, f = _found(IndexOf(lambda x: torch.argmax(x * 3.0 + 1.0, dim=1)), torch.randn(4, 8))
    got = _by_name(f)
    assert set(got) == {"mul+add", "argmax"}
    assert got["argmax"].inputs == [got["mul+add"].output]


@pytest.mark.parametrize("fn, shapes, name, flips", [
    (lambda x: torch.cumsum(x.flip(1), 1).flip(1), [(4, 37)], "flip+cumsum+flip", ([[1]], [1])),
    (lambda x, y: torch.relu(x.flip(0) * 2.0 + y), [(5, 6), (5, 6)], "flip+mul+add+relu", ([[0], None], None)),
], ids=["reversed_cumsum", "flipped_input"])
def test_a_flip_of_an_input_or_the_output_is_read_or_written_reversed(fn, shapes, name, flips, tmp_path):
    # KernelBench level 1's 91 (a reverse cumsum: flip, cumsum, flip) is one region: its
    # flips cost no copy, the input is read and the output written with the index reversed
    _, f = _found(Flipped(fn), *[torch.randn(*s) for s in shapes])
    (r,) = f.regions
    assert r.name == name
    assert ([i.get("flip") for i in r.spec["inputs"]], r.spec.get("out_flip")) == flips
    fam = kernels.get("region", r.spec)
    for variant in ("auto", "looped"):
        src = fam.render(dict(fam.default, variant=variant, block=64))
        for st in _five_stages(fam, r.shape, source=src, tmp=tmp_path):
            assert st.status == "passed", (variant, st.stage, st.failed_case, st.detail)


def test_a_flip_between_two_values_splits_the_region():
    _, f = _found(Flipped(lambda x: torch.relu(torch.relu(x).flip(1) + 1.0)), torch.randn(3, 8))
    got = _by_name(f)
    assert set(got) == {"relu", "flip+add+relu"}
    assert got["flip+add+relu"].inputs == [got["relu"].output]


# ---- a GEMM and its epilogue: one region, one kernel --------------------------------------------

class Bmm(nn.Module):               # batched, b [B, K, N]
    def forward(self, a, b):
        return torch.relu(torch.bmm(a, b)) - 1.0


class Addmm(nn.Module):             # beta * c + alpha * (a @ b): no matmul spelling takes it
    def forward(self, c, a, b):
        return torch.sigmoid(torch.addmm(c, a, b, beta=0.5, alpha=2.0))


class WeightT(nn.Module):           # x @ W^T written out: b is a transposed view
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(10, 14))

    def forward(self, x):
        return torch.tanh(x @ self.w.t())


class Scores(nn.Module):            # q @ k^T over two batch dims, scaled and shifted
    def forward(self, q, k):
        return (q @ k.transpose(-1, -2)) * 0.125 + 1.0


class LinearResidual3d(nn.Module):  # a linear layer on [B, S, K] with its bias and a residual
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(12, 20)

    def forward(self, x, r):
        return F.silu(self.lin(x) + r)


class GemmLogsumexp(nn.Module):     # KernelBench's Gemm_Sigmoid_LogSumExp: a row reduction after
    def __init__(self, n):
        super().__init__()
        self.lin = nn.Linear(12, n)

    def forward(self, x):
        return torch.logsumexp(torch.sigmoid(self.lin(x)), dim=1, keepdim=True)


@pytest.mark.parametrize("model,inputs,name,layout,batch", [
    (GemmEpilogue(), (torch.randn(3, 16),), "gemm+mul+gelu", "nk", 0),
    (Bmm(), (torch.randn(3, 6, 9), torch.randn(3, 9, 7)), "gemm+relu+sub", "kn", 1),
    (Addmm(), (torch.randn(7), torch.randn(5, 8), torch.randn(8, 7)), "gemm+sigmoid", "kn", 0),
    (WeightT(), (torch.randn(6, 14),), "gemm+tanh", "kn", 0),
    (Scores(), (torch.randn(2, 3, 5, 8), torch.randn(2, 3, 6, 8)), "gemm+mul+add", "kn", 2),
    (LinearResidual3d(), (torch.randn(2, 5, 12), torch.randn(2, 5, 20)), "gemm+add+silu", "nk", 0),
    (GemmLogsumexp(20), (torch.randn(5, 12),), "gemm+sigmoid+logsumexp", "nk", 0),
], ids=["linear", "bmm", "addmm", "weight_t", "scores_4d", "linear_3d_residual", "row_logsumexp"])
def test_a_gemm_and_its_epilogue_are_one_region_that_passes_all_five_stages(model, inputs, name,
                                                                              layout, batch, tmp_path):
    ms, f = _found(model, *inputs)
    r = _by_name(f)[name]
    assert r.spec["gemm"]["layout"] == layout and r.spec["gemm"]["batch"] == batch
    assert not [m for m in ms if m.family == "matmul" and m not in f.absorbed]
    fam = kernels.get("region", r.spec)
    src = fam.starter()
    assert "_region_gemm" in src and "tl.dot" in src
    for dt in ("float32", "bfloat16"):
        fn = load_candidate(src, tmp_path)
        v = verify.Verifier(fam, {"dtype": dt, "shapes": [{"shape": list(r.shape)}]}, DEVICE, True)
        for stage in verify.STAGES:
            st = v.run_stage(fn, stage)
            assert st.status == "passed", (dt, st.stage, st.failed_case, st.detail)
    # the fp32 dot on tensor cores is a point of its space (tried first after the starter), in
    # the K loop or with the operands split once into TF32 parts (K tripled, in each operand's
    # own layout): the split point passes the five stages at every layout and batch
    assert fam.openers == ({"fp32_dot": "tf32x3", "k_major": True, "block_k": 64, "num_stages": 4},
                           {"fp32_dot": "tf32x3"})
    assert 'input_precision="tf32x3"' in fam.render({"fp32_dot": "tf32x3"})
    assert "contiguous()" in fam.render({"k_major": True}) and "contiguous()" not in src
    split = fam.render({"fp32_dot": "tf32x3_split"})
    assert 'input_precision="tf32"' in split and "_split3(a, -1, 2)" in split
    # the split operands (a batched row-major b) and the first opener's K-contiguous copies (a
    # transposed b) through the five stages
    kmajor = fam.render({"fp32_dot": "tf32x3", "k_major": True})
    points = {"gemm+relu+sub": [split], "gemm+tanh": [kmajor]}
    if name in points:
        v = verify.Verifier(fam, {"dtype": "float32", "shapes": [{"shape": list(r.shape)}]}, DEVICE, True)
        for point in points[name]:
            fn = load_candidate(point, tmp_path)
            for stage in verify.STAGES:
                st = v.run_stage(fn, stage)
                assert st.status == "passed", (point[:80], st.stage, st.failed_case, st.detail)


def test_a_reduction_wider_than_one_tile_after_a_gemm_stays_apart_and_the_gemm_the_familys():
    ms, f = _found(GemmLogsumexp(2000), torch.randn(5, 12))
    assert list(_by_name(f)) == ["sigmoid+logsumexp"] and not f.absorbed
    assert [m.family for m in ms] == ["matmul"]
    # a GEMM with nothing after it is the matmul family's target too
    ms, f = _found(Flipped(lambda x, w: x @ w), torch.randn(4, 8), torch.randn(8, 6))
    assert not f.regions and not f.absorbed and [m.family for m in ms] == ["matmul"]


def test_a_gemm_region_generated_wrong_is_rejected(tmp_path):
    _, f = _found(GemmEpilogue(), torch.randn(3, 16))
    r = _by_name(f)["gemm+mul+gelu"]
    fam = kernels.get("region", r.spec)
    # the epilogue's last op missing: the GEMM region without its GELU, judged as the region
    short = dict(r.spec, ops=r.spec["ops"][:-1], name="gemm+mul")
    stages = _five_stages(fam, r.shape, kernels.get("region", short).starter(), tmp_path)
    assert stages[0].status == "failed" and "wrong result" in stages[0].detail
    # the K tail dropped: only whole BLOCK_K steps are summed
    src = fam.starter().replace("range(0, tl.cdiv(k_len, BLOCK_K))", "range(0, k_len // BLOCK_K)")
    assert src != fam.starter()
    bad = [s for s in _five_stages(fam, r.shape, src, tmp_path) if s.status != "passed"]
    assert bad and "wrong result" in bad[0].detail, bad


def test_an_absorbed_gemm_is_placed_by_its_familys_kernel_when_its_region_has_none(tmp_path):
    import os
    from engine import integrate, kernel_runtime as rt, place
    model = GemmEpilogue().eval()
    x = torch.randn(3, 16)
    cap = capture.capture(model, (x,))
    g = cap.graphs[0]
    ms = match.find(g)
    mm = kernels.get("matmul")
    path = os.path.join(str(tmp_path), "mm.py")
    with open(path, "w") as fh:
        fh.write(mm.starter())
    k_mm = rt.load_kernel_file(path, "matmul", "float32", "cpu", [[3, 16, 24]],
                               mm.tolerance[torch.float32], "matmul#0", {}, mm.op_schema)
    (r,) = regions.find(g, ms).regions
    other = json.loads(json.dumps(r.spec))          # the same ops, another scale: another region
    assert other["ops"][1]["op"] == "aten.mul.Tensor" and other["ops"][1]["args"][1] == 0.5
    other["ops"][1]["args"][1] = 0.25
    for ks, sites in (([k_mm], ["matmul/linear"]),                          # no region kernel
                      ([k_mm, _region_kernel(r, tmp_path)], ["gemm+mul+gelu"]),
                      ([k_mm, _region_kernel(regions.Region(0, [], None, [], other, r.shape,
                                                            "float32"), tmp_path)],
                       ["matmul/linear"])):                                  # one for another region
        pl = place.place(cap, ks, {g.index: ms})
        assert [s["pattern"] for s in pl.sites] == sites, pl.skipped
        opt = place.optimized(cap, pl)
        with torch.no_grad():
            err, where = integrate.compare(integrate.flatten(opt(x)), integrate.flatten(model(x)))
        assert err <= 1e-5, where


class ConvSoftmax(nn.Module):       # a reduction over the channels after the convolution
    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(3, 20, 3)

    def forward(self, x):
        return torch.softmax(self.c(x), dim=1) + 1.0


@pytest.mark.parametrize("model,inputs", [
    (ConvBnRelu(nn.Conv1d(3, 5, 3, dilation=2, padding=1)), (torch.randn(2, 3, 11),)),
    # (the three below take 40-120 s each interpreted: slow; conv1d keeps both loops quick)
    pytest.param(ConvBnRelu(nn.Conv2d(4, 6, 3, stride=2, bias=False)), (torch.randn(1, 4, 9, 8),),
                 marks=pytest.mark.slow),
    pytest.param(ConvBnRelu(nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1)),
                 (torch.randn(1, 4, 5, 4),), marks=pytest.mark.slow),
    pytest.param(ConvSoftmax(), (torch.randn(2, 3, 6, 5),), marks=pytest.mark.slow),
], ids=["conv1d_dilated", "conv2d_strided", "transposed2d", "channel_softmax"])
def test_a_convolution_runs_as_an_implicit_gemm_and_as_a_tap_loop(model, inputs, tmp_path):
    # one group and weights: the starter is the implicit GEMM (tl.dot over BLOCK_K taps a step,
    # the input tile gathered); the tap loop stays a point of the space; both pass everything
    _, f = _found(model, *inputs)
    (r,) = f.regions
    fam = kernels.get("region", r.spec)
    assert fam.default["conv_loop"] == "dot" and fam.space["conv_loop"] == ["dot", "window", "taps"]
    # IEEE first (cuDNN runs small convolutions in IEEE fp32), TF32 the first move where
    # torch lets cuDNN use it
    assert fam.default["fp32_dot"] == "ieee"
    tf32 = ({"fp32_dot": "tf32"},) if torch.backends.cudnn.allow_tf32 else ()
    assert fam.openers == tf32 + ({"fp32_dot": "tf32x3"},)
    # (the window loop on the model's layout: the Ci = 32 starter's test below)
    for point, kernel in (({}, "_region_gemm"),
                          ({"conv_loop": "window", "conv_layout": "channels", "block_k": 16},
                           "_region_gemm"),
                          ({"conv_loop": "taps"}, "_region_one_pass")):
        src = fam.render(point)
        assert f"def {kernel}(" in src and ("tl.dot(" in src) == (kernel == "_region_gemm")
        for st in _five_stages(fam, r.shape, src, tmp_path):
            assert st.status == "passed", (point, st.stage, st.failed_case, st.detail)


def test_a_convolution_with_many_input_channels_starts_at_the_tap_major_loop(tmp_path):
    # Ci = 32 fills a K step with one tap's channels: the starter loops (tap, channel block)
    # over channels-last copies and passes everything, as does the same loop on the model's
    # layout; dropping a window bound reads outside x and is rejected
    _, f = _found(ConvBnRelu(nn.Conv2d(32, 6, 3, padding=1)), torch.randn(1, 32, 5, 4))
    (r,) = f.regions
    fam = kernels.get("region", r.spec)
    assert fam.default["conv_loop"] == "window" and fam.default["conv_layout"] == "channels"
    src = fam.starter()
    assert "tap-major" in src and "_channels_inner(" in src and "tl.dot(" in src
    for s in (src, fam.render({"conv_layout": "model"})):
        for st in _five_stages(fam, r.shape, s, tmp_path):
            assert st.status == "passed", (st.stage, st.failed_case, st.detail)
    bad_src = src.replace("(pq0 >= 0) & ", "")
    assert bad_src != src
    bad = [s for s in _five_stages(fam, r.shape, bad_src, tmp_path) if s.status != "passed"]
    assert bad and "wrong result" in bad[0].detail, bad


def test_grouped_convolutions_and_pooling_keep_the_tap_loop():
    for model, x in ((ConvBnRelu(nn.Conv2d(4, 6, 3, groups=2)), torch.randn(1, 4, 7, 7)),
                     (Pooled(nn.MaxPool2d(3, 2, 1)), torch.randn(2, 3, 9, 9))):
        _, f = _found(model, x)
        fam = kernels.get("region", f.regions[0].spec)
        assert "conv_loop" not in fam.space and "tl.dot(" not in fam.starter()


def test_an_implicit_gemm_convolution_generated_wrong_is_rejected(tmp_path):
    _, f = _found(ConvBnRelu(nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1)),
                  torch.randn(1, 4, 5, 4))
    (r,) = f.regions
    fam = kernels.get("region", r.spec)
    # the transposed convolution's stride test dropped: positions the stride skips are read
    src = fam.starter().replace(" & (pq0 * 2 == tq0)", "")
    assert src != fam.starter()
    bad = [s for s in _five_stages(fam, r.shape, src, tmp_path) if s.status != "passed"]
    assert bad and "wrong result" in bad[0].detail, bad


class GemmSigmoidSum(nn.Module):    # KernelBench's Matmul_Sigmoid_Sum: a family's sum after a GEMM
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(12, 20)

    def forward(self, x):
        return torch.sigmoid(self.lin(x)).sum(dim=1, keepdim=True)


def test_a_familys_lone_reduction_joins_a_gemm_region_and_no_other(tmp_path):
    ms, f = _found(GemmSigmoidSum(), torch.randn(6, 12))
    assert sorted(m.family for m in ms) == ["matmul", "reduce"]
    assert list(_by_name(f)) == ["gemm+sigmoid+sum"]            # the sum on the accumulator
    assert sorted(m.family for m in f.absorbed) == ["matmul", "reduce"]
    r = _by_name(f)["gemm+sigmoid+sum"]
    for st in _five_stages(kernels.get("region", r.spec), r.shape, tmp=tmp_path):
        assert st.status == "passed", (st.stage, st.failed_case, st.detail)
    # with no GEMM before them, the families keep their matches: the softmax family's softmax
    # and the region of what follows it
    ms, f = _found(Flipped(lambda x: torch.softmax(x, -1) * 2.0), torch.randn(4, 8))
    assert [m.family for m in ms] == ["softmax"] and not f.absorbed
    assert list(_by_name(f)) == ["mul"]
    ms, f = _found(Flipped(lambda x: torch.softmax(x, -1)), torch.randn(4, 8))
    assert not f.regions and not f.absorbed


_SM90_LAYOUT = r'''
import os, sys, importlib.util, tempfile
os.environ["TRITON_INTERPRET"] = "0"          # compile for a GPU that is not here, never run
sys.path.insert(0, sys.argv[1])
import torch, triton, kernels
from triton.backends.compiler import GPUTarget
from engine import capture, match, regions

class Amax(torch.nn.Module):
    def forward(self, x):
        return torch.amax(x, dim=1)

# which region: (module, input, the kernel compiled, the stride args of the contiguous dim)
CASES = {"reduce": (Amax(), torch.randn(4, 64, 63), "_region_looped", lambda a: a.startswith("s_") and a.endswith("_2")),
         "pool": (torch.nn.AvgPool1d(8, 1, 4), torch.randn(2, 128, 1000), "_region_one_pass",
                  lambda a: a in ("s_out_2", "cx_s2"))}
model, x, kernel, unit = CASES[sys.argv[2]]
g = capture.capture(model.eval(), (x,)).graphs[0]
(r,) = regions.find(g, match.find(g)).regions
fam = kernels.get("region", r.spec)
for order in ("auto", "flat"):
    path = os.path.join(tempfile.mkdtemp(), f"k_{order}.py")
    open(path, "w").write(fam.render(dict(fam.default, row_order=order)))
    spec = importlib.util.spec_from_file_location(f"k_{order}", path)
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
    k = getattr(mod, kernel)
    names = k.arg_names
    sig = {a: "*fp32" if a.endswith("_ptr") else "fp32" if a == "n_red" else "i64" for a in names}
    const = {(names.index("ROWS"),): 64, (names.index("BLOCK"),): 128}
    sig["ROWS"] = sig["BLOCK"] = "constexpr"
    for a in names:                  # the contiguous dim's stride 1, as Triton specializes it
        if unit(a):
            sig[a] = "constexpr"; const[(names.index(a),)] = 1
    ck = triton.compile(triton.compiler.ASTSource(fn=k, signature=sig, constexprs=const),
                        target=GPUTarget("cuda", 90, 32))
    first = next(l for l in ck.asm["ttgir"].splitlines() if l.startswith("#blocked"))
    print(order, first)
'''


def _sm90_layouts(case: str) -> dict:
    """{row order: the first blocked layout of the region's kernel compiled for sm_90}, or a
    skip where this Triton cannot compile for it here."""
    import subprocess
    import sys
    from pathlib import Path
    root = str(Path(__file__).resolve().parent.parent)
    res = subprocess.run([sys.executable, "-c", _SM90_LAYOUT, root, case], capture_output=True,
                         text=True, timeout=300)
    if res.returncode != 0 and "GPUTarget" in res.stderr + res.stdout:
        pytest.skip("this Triton cannot compile for sm_90 here")
    assert res.returncode == 0, res.stderr[-2000:]
    return dict(line.split(" ", 1) for line in res.stdout.splitlines() if line.startswith(("auto", "flat")))


@pytest.mark.slow
def test_a_reduction_keeping_the_inner_dim_reads_it_in_runs(tmp_path):
    """max over dim 1 of [B, R, I] (KernelBench 47-53): with row_order "auto" a program's rows
    are consecutive positions of the contiguous inner dim, and compiled for sm_90 (no GPU
    needed) Triton lays the tile's 32 lanes a warp along them; flat rows put the lanes along
    the reduced dim, I elements apart (on the H200: 24.7% of the copy rate, compile 96%).
    Both orders pass the five stages at odd sizes."""
    lay = _sm90_layouts("reduce")
    assert "threadsPerWarp = [32, 1]" in lay["auto"] and "order = [0, 1]" in lay["auto"], lay
    assert "threadsPerWarp = [1, 32]" in lay["flat"], lay

    _, f = _found(IndexOf(torch.amax, dim=1), torch.randn(3, 37, 21))
    (r,) = f.regions
    fam = kernels.get("region", r.spec)
    assert "n_iblk" in fam.starter() and "n_iblk" not in fam.render({"row_order": "flat"})
    for point in ({"variant": "looped", "block": 64, "rows_cap": 16}, {"row_order": "flat"}):
        src = fam.render(dict(fam.default, **point))
        for st in _five_stages(fam, r.shape, source=src, tmp=tmp_path):
            assert st.status == "passed", (point, st.stage, st.failed_case, st.detail)
    # a reduction over the last dim keeps flat rows (its cols are the contiguous run)
    _, f = _found(IndexOf(torch.amax, dim=-1), torch.randn(3, 37, 21))
    assert "n_iblk" not in kernels.get("region", f.regions[0].spec).starter()


class HingeLoss(nn.Module):          # KernelBench's hinge loss as its authors write it
    def forward(self, predictions, targets):
        return torch.mean(torch.clamp(1 - predictions * targets, min=0))


class AbsMax(nn.Module):             # a max of every element of a computed value
    def forward(self, x):
        return (x * 3.0).abs().amax()


def test_a_reduce_familys_mean_of_pointwise_terms_is_one_region_with_them():
    ms, f = _found(HingeLoss(), torch.randn(8, 40), torch.randn(40))
    assert [m.family for m in ms] == ["reduce"]
    assert list(_by_name(f)) == ["mul+rsub+clamp+mean"]           # the terms never written out
    assert [m.family for m in f.absorbed] == ["reduce"]
    # a reduction of the model's input has nothing to fuse: the family's target
    ms, f = _found(Flipped(lambda x: x.sum(-1)), torch.randn(4, 8))
    assert [m.family for m in ms] == ["reduce"] and not f.regions and not f.absorbed


@pytest.mark.parametrize("model,inputs,name", [
    (HingeLoss(), (torch.randn(8, 40), torch.randn(40)), "mul+rsub+clamp+mean"),
    (AbsMax(), (torch.randn(6, 50),), "mul+abs+max"),
], ids=["mean", "max"])
def test_few_long_rows_are_reduced_in_slices_on_several_programs(model, inputs, name, tmp_path):
    # a loss's mean over everything is one row: its slices go to several programs (fp32
    # partials, combined in slice order by a second kernel), which is what keeps a [1, 1e9]
    # row off a single SM and each lane's running sum short
    _, f = _found(model, *inputs)
    r = _by_name(f)[name]
    fam = kernels.get("region", r.spec)
    assert fam.default["split_progs"] > 0 and 0 in fam.space["split_progs"]
    looped = {"variant": "looped", "block": 64}
    src = fam.render(looped)
    assert "def _region_partial(" in src and "def _region_finish(" in src
    fn = load_candidate(src, tmp_path)
    ins = fam.make_inputs(r.shape, "float32", DEVICE, gen(3))
    verify.install_launch_counter()
    before = verify._STATE.launches
    out = fn(**ins)
    assert verify._STATE.launches - before == 2                   # slices, then their combination
    torch.testing.assert_close(out, fam.reference(**ins), rtol=1e-5, atol=1e-6)
    unsplit = fam.render({**looped, "split_progs": 0})
    assert "_region_partial[" not in unsplit
    for st in _five_stages(fam, r.shape, src, tmp_path):
        assert st.status == "passed", (st.stage, st.failed_case, st.detail)


@pytest.mark.slow
def test_a_pooling_window_reads_consecutive_output_positions_in_runs(tmp_path):
    """AvgPool1d over [B, C, L] (KernelBench 44: 65,536 positions): with row_order "auto" a
    program's rows are consecutive output positions and, compiled for sm_90 (no GPU needed),
    Triton lays a warp's lanes along them; flat rows put them along the channels, L elements
    apart (on the H200: 34% of the copy rate, compile 100%). Both orders pass the five stages."""
    lay = _sm90_layouts("pool")
    assert "threadsPerWarp = [32, 1]" in lay["auto"] and "order = [0, 1]" in lay["auto"], lay
    assert "threadsPerWarp = [1, 32]" in lay["flat"], lay
    _, f = _found(nn.AvgPool1d(3, 2, 1), torch.randn(2, 5, 37))
    (r,) = f.regions
    fam = kernels.get("region", r.spec)
    assert "n_iblk" in fam.starter()
    for point in ({"row_order": "flat"}, {"rows_cap": 8, "max_tile": 1024}):
        src = fam.render(dict(fam.default, **point))
        for st in _five_stages(fam, r.shape, source=src, tmp=tmp_path):
            assert st.status == "passed", (point, st.stage, st.failed_case, st.detail)


class ConvClampDiv(nn.Module):     # KernelBench level 2's ConvTranspose3d_Clamp_Min_Divide, in 2-D
    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(64, 8, 3)

    def forward(self, x):
        return torch.clamp(self.c(x), min=-0.5) / 2.0


def _tf32(t):
    """fp32 truncated to TF32's 10 mantissa bits, as a tensor core reads it."""
    return (t.float().contiguous().view(torch.int32) & ~0x1FFF).view(torch.float32)


def test_a_convolution_the_model_lets_run_in_tf32_is_judged_by_tf32s_error_and_a_dropped_tap_is_not():
    # cuDNN runs a small convolution in IEEE fp32 and a large one in TF32: the bound of a
    # region whose model allows TF32 convolutions admits TF32's rounding at every shape, and
    # not a kernel that leaves out one of the 576 taps; with TF32 turned off it admits neither
    from engine import verify
    _, f = _found(ConvClampDiv(), torch.randn(2, 64, 10, 10))
    (r,) = f.regions
    cv = r.spec["conv"]
    assert cv.get("tf32", True)
    gen = torch.Generator().manual_seed(3)
    ins = kernels.get("region", r.spec).make_inputs(r.shape, torch.float32, "cpu", gen)
    xk, wk = f"in{cv['x']}", f"in{cv['w']}"

    def judged(spec, inputs):
        fam = kernels.get("region", spec)
        f64 = {k: v.double() if v.is_floating_point() else v for k, v in ins.items()}
        want = fam.reference(**f64).float()
        atol, rtol = fam.tolerance[torch.float32]
        extra = fam.bound_tol[torch.float32] * fam.error_bound(**f64)
        got = fam.reference(**{k: v.double() if v.is_floating_point() else v
                               for k, v in inputs.items()}).float()
        return verify.compare(got, want, atol, rtol, extra)[0]
    tf32 = dict(ins, **{xk: _tf32(ins[xk]), wk: _tf32(ins[wk])})
    w1 = ins[wk].clone()
    w1[:, 5, 1, 1] = 0.0                                     # one tap of 64 x 3 x 3
    dropped = dict(ins, **{wk: w1})
    assert judged(r.spec, tf32)
    assert not judged(r.spec, dropped)
    ieee = {**r.spec, "conv": {**cv, "tf32": False}}
    assert not judged(ieee, tf32)


class _GroupAndInstance(nn.Module):
    def __init__(self):
        super().__init__()
        self.gn = nn.GroupNorm(2, 4)              # affine: its weight reads the channels alone

    def forward(self, x):
        return self.gn(x), F.instance_norm(x)


@pytest.mark.parametrize("name", ["group_norm", "instance_norm"])
def test_a_norms_columns_are_indexed_without_a_division_an_element_where_strides_allow(name, tmp_path):
    # a group norm's columns are [C/G, H, W], an instance norm's [H, W]: split into int64
    # indices an element they ran at 7.7% and 48.9% of the copy rate on the H200. The [H, W]
    # run (every tensor reads all of it or none) is one flat index times its innermost stride,
    # and a chunk of BLOCK columns from a multiple of BLOCK lies in one run, so the channel is
    # a scalar of the chunk. The launcher takes that path only where it holds (contiguous run,
    # BLOCK dividing it): H and W swapped in memory, or prime sizes, take the per-element path.
    _, f = _found(_GroupAndInstance(), torch.randn(2, 4, 8, 16))
    r = next(r for r in f.regions if r.name.startswith(name))
    fam = kernels.get("region", r.spec)
    src = fam.render({"variant": "looped", "block": 64, "loop_rows": 8})
    assert "if FLAT:" in src and "def _flat_cols(" in src
    mod = load_candidate(src, tmp_path)
    flags = []
    real = mod.__globals__["_region_looped"]

    class Spy:
        def __getitem__(self, grid):
            def launch(*a, **kw):
                flags.append(kw["FLAT"])
                return real[grid](*a, **kw)
            return launch
    mod.__globals__["_region_looped"] = Spy()
    ins = fam.make_inputs(r.shape, "float32", DEVICE, gen(5))
    torch.testing.assert_close(mod(**ins), fam.reference(**ins), rtol=1e-5, atol=1e-5)
    # channels-last still reads [H, W] as one run (its stride C); W before H in memory does not
    x = next(k for k, v in ins.items() if v.dim() == 4)
    for layout in (ins[x].contiguous(memory_format=torch.channels_last),
                   ins[x].transpose(2, 3).contiguous().transpose(2, 3)):
        other = dict(ins, **{x: layout})
        torch.testing.assert_close(mod(**other), fam.reference(**other), rtol=1e-5, atol=1e-5)
    assert flags == [True, True, False], flags
    mod.__globals__["_region_looped"] = real
    for st in _five_stages(fam, r.shape, src, tmp_path):
        assert st.status == "passed", (st.stage, st.failed_case, st.detail)
    # the launcher's check matters: taking the flat path whatever the strides and sizes is
    # rejected (a chunk across two runs reads the wrong channel's weight and rows)
    wrong = src.replace("    flat = ", "    flat = True or ")
    assert wrong != src
    bad = [s for s in _five_stages(fam, r.shape, wrong, tmp_path) if s.status != "passed"]
    assert bad, "forcing the flat index passed every stage"


class Casts(nn.Module):
    """Casts as models write them: rotary's ``cos.to(x.dtype)`` at the end, an fp32 table read
    with a position (``inv_freq.float() * pos``, the cast under ``to(device)``), RMSNorm's
    upcast before the residual, a router's softmax with its dtype as an argument."""
    def __init__(self):
        super().__init__()
        self.register_buffer("inv_freq", torch.rand(8))

    def forward(self, emb, pos, h, r):
        cos = (emb.cos() * 2.0).to(dtype=torch.float32)
        ang = self.inv_freq.float().to(pos.device) * pos
        y = (h * 0.5).to(torch.float32) + r
        return cos, ang, y, F.softmax(r @ r.t() * 0.5, dim=1, dtype=torch.float)


def test_a_dtype_the_model_casts_to_is_the_regions_output_dtype_in_every_dtype(tmp_path):
    # the reference returns float32 for float16 inputs where the model casts (x.float() and
    # anything promoted with it): so must the kernel, or the sweep's float16 cases fail
    _, f = _found(Casts(), torch.randn(4, 8), torch.randn(4, 1), torch.randn(4, 8), torch.randn(4, 8))
    by = _by_name(f)
    assert {"cos+mul", "mul", "gemm+mul+softmax"} <= set(by), sorted(by)
    fixed = [r for r in f.regions if r.spec["out_dtype"] == "float32"]
    assert len(fixed) >= 3 and by["gemm+mul+softmax"] in fixed, [(r.name, r.spec["out_dtype"]) for r in f.regions]
    verify.install_launch_counter()
    for r in fixed:
        fam = kernels.get("region", json.loads(json.dumps(r.spec)))
        fn = load_candidate(fam.starter(), tmp_path)
        v = verify.Verifier(fam, {"dtype": "float32", "dtypes": ["float32", "float16"],
                                  "shapes": [{"shape": list(r.shape)}]}, DEVICE, DEVICE == "cpu")
        for st in ("smoke", "shape_sweep"):
            res = v.run_stage(fn, st)
            assert res.status == "passed", (r.name, st, res.detail)
    # a region whose output follows its inputs keeps no dtype of its own
    plain = _by_name(_found(Chain(), torch.randn(4, 8), torch.randn(8))[1])["mul+add+leaky_relu+clamp"]
    assert plain.spec["out_dtype"] is None


class ScaleOfZeroDims(nn.Module):
    """DeBERTa's spelling: a 0-dim fp32 scale cast to the activations' dtype divides them; a
    0-dim tensor promotes no other tensor, so the output follows the activations' dtype."""
    def forward(self, k):
        scale = torch.sqrt(torch.tensor(k.size(-1), dtype=torch.float) * 2.0)
        return k * 3.0 / scale.to(dtype=k.dtype)


def test_a_zero_dim_cast_value_leaves_the_output_dtype_to_the_inputs(tmp_path):
    _, f = _found(ScaleOfZeroDims(), torch.randn(4, 8))
    r = next(r for r in f.regions if r.shape == (4, 8))
    assert r.spec["out_dtype"] is None, r.spec


class TransposedSecond(nn.Module):     # the model passes its second input transposed
    def forward(self, x, y):
        return torch.relu(x * 2.0 + y.transpose(-1, -2))


def test_an_input_the_model_passes_in_its_own_layout_is_verified_in_that_layout(tmp_path):
    # the spec records the strides the model passes (only where not contiguous); the edge
    # cases run the real shape in them, so a kernel that assumes the second input contiguous
    # (the verifier's own layouts relayout only the first) is rejected
    _, f = _found(TransposedSecond(), torch.randn(4, 8), torch.randn(8, 4))
    r = _by_name(f)["mul+add+relu"]
    assert [i.get("strides") for i in r.spec["inputs"]] == [None, [1, 4]]
    fam = kernels.get("region", json.loads(json.dumps(r.spec)))
    assert fam.model_strides == {"in1": (1, 4)}
    edge = verify.Verifier(fam, {"dtype": "float32", "shapes": [{"shape": [4, 8]}]}, DEVICE,
                           DEVICE == "cpu").cases("edge_cases")
    assert [c.shape for c in edge if c.layout == "model"] == [(4, 8)]
    inp = verify.case_inputs(fam, next(c for c in edge if c.layout == "model"), DEVICE)
    assert inp["in1"].stride() == (1, 4) and inp["in0"].is_contiguous()
    for st in _five_stages(fam, r.shape, tmp=tmp_path):
        assert st.status == "passed", (st.stage, st.failed_case, st.detail)
    src = fam.starter()
    wrong = src.replace("in1.stride(0), in1.stride(1)", "in1.shape[1], 1")
    assert wrong != src
    stages = _five_stages(fam, r.shape, source=wrong, tmp=tmp_path)
    assert [s.status for s in stages[:4]] == ["passed"] * 4, [(s.stage, s.detail) for s in stages]
    assert stages[4].status == "failed" and "layout=model" in str(stages[4].failed_case)
    # an expanded view (stride 0) repeats its first index; a gap the layout skips holds NaN
    t = torch.arange(6.0).view(2, 3)
    e = verify._restride(t, (0, 1))
    assert e.stride() == (0, 1) and torch.equal(e, t[:1].expand(2, 3))
    g = verify._restride(t, (4, 1))
    assert torch.equal(g, t) and torch.isnan(g.as_strided((7,), (1,))[3])
    # strides that would overlap at another shape leave the input as it was
    assert verify._restride(t, (1, 1)) is t


def test_a_reduce_familys_mean_between_a_prologue_and_an_epilogue_is_one_region():
    # an L1 norm, x / x.abs().mean(1): x read by one kernel, the abs never written out; a mean
    # of the raw input, or one after a GEMM, stays where it was (tests above)
    _, f = _found(Flipped(lambda x: x / torch.mean(torch.abs(x), dim=1, keepdim=True)),
                  torch.randn(4, 16))
    assert [r.name for r in f.regions] == ["abs+mean+div"]
    assert [m.family for m in f.absorbed] == ["reduce"]


@pytest.mark.parametrize("fn", [
    # KernelBench level 1's 92: the row narrowed by its last element, a zero column in front
    lambda x: torch.cat((torch.zeros_like(x.select(1, 0).unsqueeze(1)),
                         torch.cumsum(x.narrow(dim=1, start=0, length=x.size(1) - 1), dim=1)), dim=1),
    # sliced, a negative dim, zeros made from a shape
    lambda x: torch.cat([torch.zeros(x.shape[0], 1), x[:, :-1].cumsum(-1)], dim=-1),
], ids=["narrow_zeros_like", "slice_zeros"])
def test_an_exclusive_cumsum_spelled_as_a_shifted_cat_is_one_scan_region(fn, tmp_path):
    # cat([0, cumsum(x[:, :-1])]) is cumsum(x) - x: one scan region, x read once, the output
    # written once, where the spelling is a scan, a column of zeros and a copy into the cat
    x = torch.rand(4, 37)
    cap = capture.capture(Flipped(fn).eval(), (x,))
    got = cap.graphs[0].gm(x)
    torch.testing.assert_close(got[0] if isinstance(got, (tuple, list)) else got, fn(x))
    _, f = _found(Flipped(fn), x)
    (r,) = f.regions
    assert r.name == "cumsum+sub" and not f.left
    fam = kernels.get("region", r.spec)
    for st in _five_stages(fam, r.shape, tmp=tmp_path):
        assert st.status == "passed", (st.stage, st.failed_case, st.detail)


def test_a_cat_that_is_no_exclusive_scan_stays_a_cat():
    # ones in front (an exclusive product's spelling, which cumprod(x) / x is not), or the
    # scan of the whole row: the cat is left, with its reason
    for fn in (lambda x: torch.cat([torch.ones(4, 1), x[:, :-1].cumsum(1)], 1),
               lambda x: torch.cat([torch.zeros(4, 1), x.cumsum(1)], 1)):
        _, f = _found(Flipped(fn), torch.rand(4, 9))
        assert [r.name for r in f.regions] == ["cumsum"]
        assert "aten.cat.default" in [str(l.node.target) for l in f.left]


class _RowL2Norm(nn.Module):      # KernelBench level 1's 39_L2Norm: x / ||x||_2 over dim 1
    def forward(self, x):
        return x / torch.norm(x, p=2, dim=1, keepdim=True)


def test_a_long_rows_looped_kernel_takes_a_row_a_program_and_its_l2_points_pass(tmp_path):
    """A row wider than max_block is looped: a pass for the norm, a pass for the output. Its
    default takes one row a program (16 rows a program left a 32,768-row L2 norm 2,048 programs)
    and walks the output pass's chunks from the end; with cache hints the norm pass's loads
    evict_last and the output pass's evict_first; the persistent grid loops over row blocks. Each point passes the five stages."""
    _, f = _found(_RowL2Norm(), torch.randn(6, 1100))
    (r,) = f.regions
    fam = kernels.get("region", r.spec)
    assert fam.default["loop_rows"] == 1 and "loop_rows" in fam.space
    src = fam.render(dict(fam.default, variant="looped", block=256, cache_hints=True))
    assert "LOOP_ROWS if kernel is _region_looped" in src
    norm_pass, out_pass = src.split("def _region_looped(")[1].split("c0 = (tl.cdiv(n_cols, BLOCK) - 1) * BLOCK - cj")
    assert 'eviction_policy="evict_last"' in norm_pass and "evict_first" not in norm_pass
    assert 'eviction_policy="evict_first"' in out_pass.split("def kernel_fn")[0]
    persistent = fam.render(dict(fam.default, variant="looped", block=256, grid="persistent",
                                 progs_per_sm=1, loop_rows=2))
    assert "num_tiles = tl.cdiv(n_rows, ROWS)" in persistent
    assert "for tile in range(tl.program_id(0), num_tiles, tl.num_programs(0)):" in persistent
    plain = fam.render(dict(fam.default, variant="looped", block=256, cache_hints=False,
                            last_pass="forward"))
    assert "eviction_policy" not in plain and "cj" not in plain
    for source in (src, persistent):
        for st in _five_stages(fam, r.shape, source=source, tmp=tmp_path):
            assert st.status == "passed", (st.stage, st.failed_case, st.detail)
    # a pointwise region has no looped-reduction point
    _, f = _found(Chain(), torch.randn(4, 8), torch.randn(8))
    assert "loop_rows" not in kernels.get("region", f.regions[0].spec).space
