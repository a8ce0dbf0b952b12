"""Profiler attribution on CPU: families found, time counted once, model left unchanged."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from engine.models import build
from engine.profile import FAMILIES, ProfileResult, module_family, profile_model
from kernels import FAMILY_NAMES


@pytest.fixture(scope="module")
def llama_profile():
    model, inputs = build("llama-tiny")
    return profile_model(model, inputs)


def _fams(result: ProfileResult) -> dict:
    return {f.family: f for f in result.families}


def _check_invariants(r: ProfileResult):
    assert r.families == sorted(r.families, key=lambda f: -f.time_us)
    assert abs(sum(f.fraction for f in r.families) - 1.0) < 1e-9
    # The independent total (top-level op spans) equals the attributed sum: nothing counted twice.
    assert sum(f.time_us for f in r.families) == pytest.approx(r.total_us, rel=1e-3)
    assert len({f.family for f in r.families}) == len(r.families)
    for f in r.families:
        assert f.family in FAMILIES or f.family == "other"
        assert f.has_kernel == (f.family in FAMILY_NAMES)
        assert f.time_us >= 0 and f.calls >= 0
        assert all(set(o) >= {"name", "time_us"} for o in f.top_ops)


def test_llama_tiny_families(llama_profile):
    r = llama_profile
    _check_invariants(r)
    fams = _fams(r)
    for fam in ("rmsnorm", "softmax", "cross_entropy", "matmul", "rotary", "fused_mlp", "other"):
        assert fam in fams and fams[fam].time_us > 0, fam
    assert r.device == "cpu"
    # per forward pass: 2 layers x 2 norms + final norm; q and k rotated in each of 2 layers
    assert fams["rmsnorm"].calls == 5 and fams["rotary"].calls == 4
    assert fams["softmax"].calls == 2 and fams["cross_entropy"].calls == 1
    # 2 layers x (q, k, v, o, gate, up, down, q@k^T, p@v) + lm_head
    assert fams["matmul"].calls == 19
    assert "attention" not in fams         # eager attention is matmul + softmax


def test_llama_tiny_composite_rmsnorm_ops(llama_profile):
    rms = _fams(llama_profile)["rmsnorm"]
    names = {o["name"] for o in rms.top_ops}
    assert names & {"aten::pow", "aten::mean", "aten::rsqrt", "aten::mul"}
    assert rms.shapes == [{"shape": [2, 32, 64], "dtype": "float32", "count": 5}]
    other = {o["name"] for o in _fams(llama_profile)["other"].top_ops}
    assert not other & {"aten::pow", "aten::rsqrt"}


def test_llama_tiny_shapes(llama_profile):
    fams = _fams(llama_profile)
    assert fams["softmax"].shapes == [{"shape": [2, 4, 32, 32], "dtype": "float32", "count": 2}]
    assert fams["cross_entropy"].shapes == [{"shape": [64, 256], "dtype": "float32", "count": 1}]
    rot = {tuple(s["shape"]): s["count"] for s in fams["rotary"].shapes}
    assert rot == {(2, 4, 32, 16): 2, (2, 2, 32, 16): 2}                 # q [B, H, S, Dh], k [B, Hkv, S, Dh]
    mm = {(tuple(s["shape"]), s.get("batch", 1)): s["count"] for s in fams["matmul"].shapes}
    assert mm[((64, 64, 128), 1)] == 4                                   # gate, up: [M=B*S, K=D, N=F]
    assert mm[((32, 16, 32), 8)] == 2                                    # q @ k^T per (B, H)
    assert sum(mm.values()) == 19
    assert fams["fused_mlp"].shapes == [{"shape": [2, 32, 64], "dtype": "float32", "count": 2,
                                         "d_model": 64, "ffn_dim": 128}]


def test_fused_mlp_keeps_matmuls_out(llama_profile):
    mlp = {o["name"] for o in _fams(llama_profile)["fused_mlp"].top_ops}
    assert {"aten::silu", "aten::mul"} <= mlp
    assert not mlp & {"aten::mm", "aten::matmul", "aten::linear", "aten::addmm"}


def test_other_names_its_top_ops(llama_profile):
    other = _fams(llama_profile)["other"]
    assert other.top_ops and all(o["name"].startswith("aten::") for o in other.top_ops)
    assert other.shapes == [] and not other.has_kernel


def test_llama_sdpa_is_attention():
    model, inputs = build("llama-tiny", attn_impl="sdpa")
    r = profile_model(model, inputs, iters=2)
    _check_invariants(r)
    fams = _fams(r)
    att = fams["attention"]
    assert att.calls == 2 and "softmax" not in fams
    # is_causal=True and no mask: the call's causal flag is recorded
    assert att.shapes == [{"shape": [2, 4, 32, 16], "dtype": "float32", "count": 2, "kv_heads": 2,
                           "causal": 1}]
    assert fams["matmul"].calls == 15                                    # no q@k^T, p@v any more


@pytest.mark.parametrize("name", ["gpt2-tiny", "bert-tiny"])
def test_gpt2_bert_families(name):
    model, inputs = build(name)
    r = profile_model(model, inputs, iters=2)
    _check_invariants(r)
    fams = _fams(r)
    for fam in ("layernorm", "softmax", "cross_entropy", "matmul", "other"):
        assert fam in fams and fams[fam].time_us > 0, fam
    assert fams["layernorm"].calls == (5 if name == "gpt2-tiny" else 6)
    assert fams["layernorm"].shapes[0]["shape"] == [2, 32, 64]
    assert "rmsnorm" not in fams and "fused_mlp" not in fams
    # GELU isn't a family: it is what "other" names
    assert "aten::gelu" in {o["name"] for o in fams["other"].top_ops}


class _OnlyLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(256, 128))
        self.b = nn.Parameter(torch.randn(256))

    def forward(self, x):
        return F.linear(x, self.w, self.b)


def test_linear_counted_once():
    # F.linear runs aten::linear -> aten::addmm: one call, its time once, all of it matmul.
    r = profile_model(_OnlyLinear(), (torch.randn(64, 128),), iters=3)
    _check_invariants(r)
    fams = _fams(r)
    mm = fams["matmul"]
    assert mm.calls == 1
    assert mm.shapes == [{"shape": [64, 128, 256], "dtype": "float32", "count": 1}]
    assert mm.time_us == pytest.approx(r.total_us, rel=1e-3)
    assert set(fams) <= {"matmul", "other"}
    names = {o["name"] for o in mm.top_ops}
    # (linear's own self time rounds to 0 us on a busy machine, and ops of no time are not
    # listed: addmm, where the time is, must be)
    assert "aten::addmm" in names, names
    # the per-op self times add up to the family's time: linear's time doesn't include addmm's
    assert sum(o["time_us"] for o in mm.top_ops) <= mm.time_us * (1 + 1e-6)


class _Funcs(nn.Module):
    def forward(self, x):
        y = torch.softmax(x, dim=-1).sum(-1)
        with torch.profiler.record_function("family::rotary"):
            z = x * 2.0
        return y, z


def test_functional_and_code_scope():
    r = profile_model(_Funcs(), torch.randn(4, 8, 16), iters=2)
    _check_invariants(r)
    fams = _fams(r)
    assert fams["softmax"].shapes == [{"shape": [4, 8, 16], "dtype": "float32", "count": 1}]
    assert fams["reduce"].shapes == [{"shape": [4, 8, 16], "dtype": "float32", "count": 1}]
    assert fams["rotary"].shapes == [{"shape": [4, 8, 16], "dtype": "float32", "count": 1}]


def test_hooks_removed_and_model_unchanged():
    model, inputs = build("llama-tiny")
    with torch.no_grad():
        before = model(*inputs)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    profile_model(model, inputs, warmup=0, iters=1)
    for m in model.modules():
        assert not m._forward_hooks and not m._forward_pre_hooks
        assert not getattr(m, "_forward_hooks_always_called", {})
    with torch.no_grad():
        assert torch.equal(model(*inputs), before)
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert model.training is False


class _Boom(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(8)

    def forward(self, x):
        self.norm(x)
        raise RuntimeError("boom")


def test_hooks_removed_when_forward_raises():
    model = _Boom()
    with pytest.raises(RuntimeError, match="boom"):
        profile_model(model, torch.randn(2, 8))
    assert not model.norm._forward_hooks and not model.norm._forward_pre_hooks


def test_module_family_recognition():
    class LlamaRMSNorm(nn.Module):
        pass

    class MyRotaryEmbedding(nn.Module):
        pass

    class GatedMLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj, self.up_proj, self.down_proj = nn.Linear(2, 4), nn.Linear(2, 4), nn.Linear(4, 2)

    class PlainMLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.proj = nn.Linear(2, 4), nn.Linear(4, 2)

    assert module_family(nn.LayerNorm(4)) == "layernorm"
    assert module_family(LlamaRMSNorm()) == "rmsnorm"
    if hasattr(nn, "RMSNorm"):
        assert module_family(nn.RMSNorm(4)) == "rmsnorm"
    assert module_family(MyRotaryEmbedding()) == "rotary"
    assert module_family(GatedMLP()) == "fused_mlp"
    assert module_family(PlainMLP()) is None
    assert module_family(nn.Linear(2, 2)) is None


def test_nn_rmsnorm_module_counts_as_rmsnorm():
    if not hasattr(nn, "RMSNorm"):
        pytest.skip("torch without nn.RMSNorm")
    r = profile_model(nn.Sequential(nn.RMSNorm(32), nn.Linear(32, 8)), torch.randn(4, 32), iters=2)
    _check_invariants(r)
    fams = _fams(r)
    assert fams["rmsnorm"].calls == 1 and fams["rmsnorm"].shapes[0]["shape"] == [4, 32]


def test_bfloat16_dtype_recorded():
    model, inputs = build("llama-tiny", dtype=torch.bfloat16)
    r = profile_model(model, inputs, iters=1)
    fams = _fams(r)
    assert fams["rmsnorm"].shapes[0]["dtype"] == "bfloat16"
    assert fams["softmax"].shapes[0]["dtype"] == "bfloat16"


def test_dtypes_recovered_without_function_event_dtypes():
    # torch 2.11 (the H200's) has no FunctionEvent.input_dtypes: they come from the kineto events.
    from engine.profile import _fill_input_dtypes
    x = torch.randn(4, 8, dtype=torch.bfloat16)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        torch.softmax(x.float(), -1)
    events = prof.events()
    if hasattr(events[0], "input_dtypes"):       # newer torch: remove them to take the 2.11 path
        expected = {e.id: e.input_dtypes for e in events}
        for e in events:
            del e.input_dtypes
        _fill_input_dtypes(prof, events)
        assert {e.id: e.input_dtypes for e in events} == expected
    else:
        _fill_input_dtypes(prof, events)
    assert next(e for e in events if e.name == "aten::softmax").input_dtypes[0] == "float"


# ---- GPU only (CUDA or ROCm): device-time attribution -----------------------------------------

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


@gpu
def test_gpu_llama_tiny_device_time():
    model, inputs = build("llama-tiny", dtype=torch.bfloat16, device="cuda")
    r = profile_model(model, inputs)
    _check_invariants(r)
    assert r.device.startswith("cuda:")
    fams = _fams(r)
    for fam in ("rmsnorm", "softmax", "cross_entropy", "matmul", "rotary", "fused_mlp"):
        assert fams[fam].time_us > 0, fam
    assert fams["rmsnorm"].shapes == [{"shape": [2, 32, 64], "dtype": "bfloat16", "count": 5}]
    # profiler scopes also appear on the GPU timeline; they are not kernels and must not be timed
    names = {o["name"] for f in r.families for o in f.top_ops}
    assert not any(n.startswith(("family::", "engine::")) for n in names)


@gpu
def test_gpu_triton_kernel_in_family_module():
    # A Triton kernel launched straight from a family module (no aten op around it) still counts
    # for that family: it is matched to its launch call (cuLaunchKernelEx / hipModuleLaunchKernel).
    import triton
    import triton.language as tl

    @triton.jit
    def _double(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        off = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y_ptr + off, tl.load(x_ptr + off, mask=off < n) * 2.0, mask=off < n)

    class TritonRMSNorm(nn.Module):
        def forward(self, x):
            y = torch.empty_like(x)
            _double[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
            return y

    net = nn.Sequential(TritonRMSNorm(), nn.Linear(1024, 1024)).cuda()
    r = profile_model(net, (torch.randn(4096, 1024, device="cuda"),))
    _check_invariants(r)
    fams = _fams(r)
    assert fams["rmsnorm"].time_us > 0 and fams["rmsnorm"].top_ops[0]["name"] == "_double"
    assert "other" not in fams or fams["other"].time_us < 0.05 * r.total_us
