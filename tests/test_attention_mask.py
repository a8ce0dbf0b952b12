"""Attention's widened contracts: a runtime mask (spec "mask", "mask_dims", "fill"), a soft
cap ("softcap") and v's own head dim ("v_head_dim", multi-head latent attention). The mask argument: the rendered kernels against the float64 reference with realistic and adversarial
masks, the five verifier stages, and models whose mask is computed from their inputs (a padding
mask by hand, SDPA's attn_mask, a tiny BERT called with attention_mask) matched, placed, and
agreeing with the original. CPU, Triton's interpreter, tiny shapes."""
from __future__ import annotations

import importlib.util
import math
import sys

import pytest
import torch
import torch.nn.functional as F

import kernels
from engine import integrate, place, verify
from kernels import attention
from tests.kernel_helpers import DEVICE, as_f64, gen, load_candidate, passes_every_stage
from tests.test_graph import Fn, families, found, one_attention_placed_and_agreeing, place_starters

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
SHAPE = (2, 4, 20, 16, 2, 0)           # (B, H, S, D, Hkv, causal): GQA, a key tail past 16

SDPA_BIAS = {"mask": "bias", "mask_dims": "b11k"}                   # HF's padding bias
SDPA_BOOL = {"mask": "keep", "mask_dims": "b1qk"}                   # BERT's bool mask
HAND_HIDE = {"written": "by_hand", "mask": "hide", "mask_dims": "11qk", "fill": -1e9}
HAND_BIAS = {"written": "by_hand", "mask": "bias", "mask_dims": "1hqk"}   # T5-style bias
HAND_KEEP = {"written": "by_hand", "mask": "keep", "mask_dims": "b11k"}


@pytest.fixture(scope="session")
def cand_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("candidates_mask")


def tol_ratio(fam, out, inputs) -> float:
    """The verifier's comparison (engine/verify.py compare: NaN placement, then the bound) as a
    ratio to the allowed error: > 1 rejects, inf where NaN or Inf placement differs."""
    f64 = as_f64(inputs)
    expected = fam.reference(**f64).to(out.dtype)
    dt = inputs["q"].dtype
    (atol, rtol), stol = fam.tolerance[dt], fam.bound_tol[dt]
    if out.shape != expected.shape:                # the judge refuses another shape first
        return math.inf
    extra = stol * fam.error_bound(**f64)
    ok, _, why = verify.compare(out, expected, atol, rtol, extra)
    if not ok:
        return math.inf
    o, e = out.double(), expected.double()
    fin = e.isfinite() & o.isfinite()
    atol = max(atol, torch.finfo(dt).tiny) if dt != torch.float16 else atol
    bound = atol + rtol * e.abs() + extra
    return float(((o - e).abs()[fin] / bound[fin]).max()) if fin.any() else 0.0


# ---- the contract -------------------------------------------------------------------------------

def test_mask_contract_signature_schema_and_spec_checks():
    fam = kernels.get("attention", SDPA_BIAS)
    assert fam.arg_names == attention.ARG_NAMES + ("mask",)
    names = [a.strip().split(" ")[-1] for a in fam.op_schema[1:fam.op_schema.index(")")].split(",")]
    assert tuple(names) == fam.arg_names and "Tensor mask" in fam.op_schema
    assert fam.signature == "kernel_fn(q, k, v, causal, scale, mask)"
    assert all(s[5] == 0 for s in fam.sweep_shapes + fam.edge_shapes + fam.bench_shapes)
    assert set(attention.MASK_ADVERSARIAL["bias"]) <= set(fam.adversarial)
    # the plain contracts are what they were: no mask argument, the same starter
    assert kernels.get("attention") is attention.FAMILY
    assert kernels.get("attention", {"written": "by_hand"}).arg_names == attention.ARG_NAMES
    assert "mask" not in attention.FAMILY.starter().split("def kernel_fn(")[1].split(")")[0]
    for bad in ({"mask": "soft"}, {"mask": "bias", "mask_dims": "bx1k"},
                {"mask": "bias", "fill": -1e9, "written": "by_hand"},    # a bias has no fill
                {"mask": "keep", "fill": -1e9},                         # SDPA has none either
                {"written": "by_hand", "mask": "hide", "fill": 0.0},    # not a hiding fill
                {"mask_dims": "b11k"}, {"mask": "bias", "other": 1}):
        with pytest.raises(ValueError):
            attention.configure(bad)
    # bytes: the mask is read once, in its own (broadcast) shape
    plain = attention.cost(SHAPE, torch.float16)[0]
    assert attention._masked_cost("b11k", "bias")(SHAPE, torch.float16)[0] == plain + 2 * 20 * 2
    assert attention._masked_cost("b1qk", "keep")(SHAPE, torch.float16)[0] == plain + 2 * 20 * 20


def test_reference_rows_with_every_key_masked_follow_the_model():
    """SDPA's output on a row whose keys are all masked is 0 (bool or -inf bias), a softmax
    written by hand gives NaN (-inf) or uniform weights (a finite fill); finfo.min as a bias
    (HF's padding) gives uniform weights in both."""
    g = gen(0)
    q, k, v = (torch.randn(1, 2, 4, 8, generator=g, dtype=torch.float64) for _ in range(3))
    keep = torch.ones(1, 1, 4, 4, dtype=torch.bool)
    keep[0, 0, 1] = False
    bias = torch.zeros(1, 1, 4, 4, dtype=torch.float64).masked_fill(~keep, float("-inf"))
    lowest = torch.zeros(1, 1, 4, 4, dtype=torch.float64).masked_fill(~keep, torch.finfo(torch.float32).min)
    uniform = v.mean(-2)
    assert attention.sdpa_masked("keep")(q, k, v, False, 0.3, keep)[:, :, 1].abs().max() == 0
    assert attention.sdpa_masked("hide")(q, k, v, False, 0.3, ~keep)[:, :, 1].abs().max() == 0
    assert attention.sdpa_masked("bias")(q, k, v, False, 0.3, bias)[:, :, 1].abs().max() == 0
    assert torch.allclose(attention.sdpa_masked("bias")(q, k, v, False, 0.3, lowest)[:, :, 1], uniform)
    assert attention.by_hand_masked("hide", None)(q, k, v, False, 0.3, ~keep)[:, :, 1].isnan().all()
    assert attention.by_hand_masked("bias", None)(q, k, v, False, 0.3, bias)[:, :, 1].isnan().all()
    fin = attention.by_hand_masked("keep", -1e9)(q, k, v, False, 0.3, keep)
    assert torch.allclose(fin[:, :, 1], uniform)
    # rows with a visible key agree between the two
    ok = attention.by_hand_masked("keep", None)(q, k, v, False, 0.3, keep)
    ref = attention.sdpa_masked("keep")(q, k, v, False, 0.3, keep)
    assert torch.allclose(ok[:, :, [0, 2, 3]], ref[:, :, [0, 2, 3]])


def test_make_mask_shapes_content_and_adversarial_kinds():
    fam = kernels.get("attention", SDPA_BIAS)
    inp = fam.make_inputs(SHAPE, torch.bfloat16, DEVICE, gen(1))
    m = inp["mask"]
    assert m.shape == (2, 1, 1, 20) and m.dtype == torch.bfloat16 and inp["causal"] is False
    lowest = torch.finfo(torch.bfloat16).min
    assert not (m[0] == lowest).any() and (m[1] == lowest).any()   # row 0 full, row 1 padded
    again = fam.make_inputs(SHAPE, torch.bfloat16, DEVICE, gen(1))["mask"]
    assert torch.equal(m, again)
    empty = fam.make_inputs(SHAPE, torch.float32, DEVICE, gen(1), "empty_rows")["mask"]
    assert torch.isneginf(empty[-1]).all()
    one = fam.make_inputs(SHAPE, torch.float32, DEVICE, gen(1), "one_key")["mask"]
    assert (torch.isfinite(one).sum(-1) == 1).all()
    mb = fam.make_inputs(SHAPE, torch.float16, DEVICE, gen(1), "min_bias")["mask"]
    assert (mb[-1] == torch.finfo(torch.float16).min).all() and torch.isfinite(mb).all()
    keep = kernels.get("attention", SDPA_BOOL).make_inputs(SHAPE, torch.float32, DEVICE, gen(2))["mask"]
    assert keep.shape == (2, 1, 20, 20) and keep.dtype == torch.bool and keep[..., 0].all()
    t5 = kernels.get("attention", HAND_BIAS).make_inputs(SHAPE, torch.float32, DEVICE, gen(2))["mask"]
    assert t5.shape == (1, 4, 20, 20)


# ---- the kernels ----------------------------------------------------------------------------------

POINTS = ({}, {"use_exp2": True, "causal_blocks": "split", "block_m": 16, "block_n": 16},
          {"loads": "tma", "block_m": 16, "block_n": 16, "causal_blocks": "mask_all"})


@pytest.mark.parametrize("spec", [SDPA_BIAS, SDPA_BOOL, HAND_HIDE, HAND_BIAS, HAND_KEEP],
                         ids=["sdpa_bias", "sdpa_bool", "hand_hide_fill", "hand_bias_t5", "hand_keep"])
def test_masked_kernels_agree_with_the_reference_on_every_mask_kind(spec, cand_dir):
    """Pointer, exp2 with the split loop, and TMA points; realistic and adversarial masks (one
    key left, rows with none, -1e9 padding and finfo.min rows) in fp32, fp16 and bf16; NaN
    exactly where the reference has it (a hand-written softmax over a row of -inf)."""
    fam = kernels.get("attention", spec)
    for i, params in enumerate(POINTS):
        fn = load_candidate(fam.render(params), cand_dir)
        kinds = ("normal",) + tuple(attention.MASK_ADVERSARIAL[spec["mask"]])
        for kind in (kinds if i == 0 else kinds[:1] + kinds[-2:]):
            for dt in DTYPES:
                inp = fam.make_inputs(SHAPE, dt, DEVICE, gen(3), kind)
                before = inp["mask"].clone()
                r = tol_ratio(fam, fn(**inp), inp)
                assert r <= 1.0, (params, kind, dt, r)
                assert torch.equal(before, inp["mask"])


def test_a_kernel_that_ignores_the_mask_or_its_rows_is_rejected(cand_dir):
    for spec, src_from, src_to, kind in [
        (SDPA_BIAS, "s = s + mk.to(tl.float32)", "s = s + 0.0 * mk.to(tl.float32)", "normal"),
        (SDPA_BOOL, "s = tl.where(mk != 0, s, fill)", "s = s", "normal"),
        # without the guard an all-masked row is 0 / 0, where SDPA gives 0
        (SDPA_BOOL, "o = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]", "o = acc / l_i[:, None]",
         "empty_rows")]:
        fam = kernels.get("attention", spec)
        src = fam.render({})
        bad = src.replace(src_from, src_to)
        assert bad != src
        inp = fam.make_inputs(SHAPE, torch.float32, DEVICE, gen(4), kind)
        assert tol_ratio(fam, load_candidate(src, cand_dir)(**inp), inp) <= 1.0
        assert tol_ratio(fam, load_candidate(bad, cand_dir)(**inp), inp) > 1.0, (spec, src_from)


def test_the_mask_is_read_through_its_strides_never_copied(cand_dir):
    """An expanded mask (stride 0 where HF expands [B, 1, 1, Sk] to [B, 1, Sq, Sk]) and a
    rank-2 mask go in as they are: the candidate allocates only its output."""
    fam = kernels.get("attention", SDPA_BOOL)
    fn = load_candidate(fam.render({}), cand_dir)
    inp = fam.make_inputs(SHAPE, torch.float32, DEVICE, gen(5))
    pad = inp["mask"][:, :, :1, :].expand(2, 1, 20, 20)
    assert pad.stride(2) == 0
    allocs = []
    real = torch.empty

    def spy(*a, **k):
        allocs.append(a)
        return real(*a, **k)
    torch.empty = spy
    try:
        out = fn(**dict(inp, mask=pad))
    finally:
        torch.empty = real
    assert len(allocs) == 1                                   # the output alone
    assert tol_ratio(fam, out, dict(inp, mask=pad)) <= 1.0
    two = inp["mask"][0, 0]                                   # [Sq, Sk]
    assert tol_ratio(fam, fn(**dict(inp, mask=two)), dict(inp, mask=two)) <= 1.0


def test_masked_launch_clamps_count_the_mask_tile(cand_dir):
    mod = sys.modules[load_candidate(kernels.get("attention", SDPA_BIAS).starter(), cand_dir).__module__]
    for bd in (16, 64, 128, 256):
        for bm in (16, 64, 128):
            for bn in (16, 64, 128):
                for warps in (2, 4, 8):
                    m, n, s = mod._fit_attn(bm, bn, bd, 2, warps, 4096, 4096, 2, 232448, 1, 1)
                    assert m * (bd + 2 * n) <= 192 * 32 * warps or (m == 16 and n == 16)
                    assert (m * bd + s * 2 * n * bd + m * n) * 2 <= 232448 or m == n == 16
    # no mask: the clamp is the one it was
    assert mod._fit_attn(128, 64, 128, 2, 8, 4096, 4096, 4, 232448) == (128, 64, 2)


def starter_passes_the_five_stages(fam, shape, cand_dir) -> verify.Verifier:
    """The family's starter through every verifier stage at ``shape`` (fp32); the verifier."""
    return passes_every_stage(fam, load_candidate(fam.starter(), cand_dir), shape, "float32")


@pytest.mark.parametrize("spec", [SDPA_BIAS, HAND_HIDE], ids=["sdpa_bias", "hand_hide_fill"])
def test_masked_starter_passes_the_five_verifier_stages(spec, cand_dir):
    fam = kernels.get("attention", spec)
    v = starter_passes_the_five_stages(fam, [2, 4, 24, 16, 2, 0], cand_dir)
    assert {c.kind for c in v.cases("stability")} >= set(attention.MASK_ADVERSARIAL[spec["mask"]])


# ---- models: matched, placed, and the rewritten model agrees ------------------------------------

def _padding_keep(lengths, s):
    return torch.arange(s)[None, :] < lengths[:, None]                  # [B, S] True = token


def _hand_masked_fill(self, q, k, v, lengths):
    keep = _padding_keep(lengths, k.shape[-2])[:, None, None, :]         # [B, 1, 1, S]
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
    att = att.masked_fill(keep == 0, float("-inf"))
    return F.softmax(att, dim=-1) @ v


def _hand_additive(self, q, k, v, attention_mask):
    # HF's eager attention: (1 - mask) * finfo.min as a [B, 1, 1, S] bias, softmax in fp32
    bias = (1.0 - attention_mask[:, None, None, :].to(q.dtype)) * torch.finfo(q.dtype).min
    s = torch.matmul(q, k.transpose(2, 3)) * 0.25 + bias
    return torch.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype) @ v


def _hand_where_finite(self, q, k, v, keep):
    s = q @ k.transpose(-2, -1) / 4.0
    return torch.softmax(torch.where(keep, s, -1e9), -1) @ v


def _sdpa_bool(self, q, k, v, attention_mask):
    keep = attention_mask.bool()[:, None, None, :].expand(-1, 1, q.shape[2], -1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=keep)


def _sdpa_bias_gqa(self, q, k, v, bias):
    return F.scaled_dot_product_attention(q, k[:, :2], v[:, :2], attn_mask=bias, enable_gqa=True)


def _t5_bias(self, q, k, v, pos_bias):
    return torch.softmax(q @ k.transpose(-2, -1) + pos_bias, dim=-1) @ v


def _lengths():
    return torch.tensor([8, 5])


def _mask01():
    m = torch.ones(2, 8)
    m[1, 6:] = 0
    return m


_QKV = lambda: tuple(torch.randn(2, 4, 8, 16) for _ in range(3))  # noqa: E731
MODELS = {
    "by_hand_masked_fill_padding": (_hand_masked_fill, lambda: _QKV() + (_lengths(),),
                                    {"written": "by_hand", "mask": "hide", "mask_dims": "b11k"}),
    "by_hand_hf_additive_padding": (_hand_additive, lambda: _QKV() + (_mask01(),),
                                    {"written": "by_hand", "mask": "bias", "mask_dims": "b11k"}),
    "by_hand_where_finite_fill": (_hand_where_finite,
                                  lambda: _QKV() + (torch.rand(8, 8, generator=gen(7)) > 0.3,),
                                  {"written": "by_hand", "mask": "keep", "mask_dims": "11qk",
                                   "fill": -1e9}),
    "by_hand_t5_position_bias": (_t5_bias, lambda: _QKV() + (torch.randn(1, 4, 8, 8),),
                                 {"written": "by_hand", "mask": "bias", "mask_dims": "1hqk"}),
    # the expanded query dim reads at stride 0: sliced to one row, the kernel broadcasts it
    "sdpa_bool_padding_expanded": (_sdpa_bool, lambda: _QKV() + (_mask01(),),
                                   {"mask": "keep", "mask_dims": "b11k"}),
    "sdpa_float_bias_gqa": (_sdpa_bias_gqa, lambda: _QKV() + (torch.randn(2, 1, 8, 8),),
                            {"mask": "bias", "mask_dims": "b1qk"}),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_a_model_with_a_runtime_mask_is_matched_placed_and_agrees(name):
    fwd, make, want = MODELS[name]
    model = Fn(fwd).eval()
    inputs = make()
    cap, ms = found(model, *inputs)
    att = [m for g in ms.values() for m in g if m.family == "attention"]
    assert len(att) == 1 and att[0].placeable, families(ms)
    assert att[0].fit.spec == want and att[0].probe == "agrees with the family reference"
    assert att[0].fit.shape[5] == 0
    pl, _ = place_starters(cap, ms)
    assert any(s["family"] == "attention" for s in pl.sites), pl.skipped
    opt = place.optimized(cap, pl)
    with torch.no_grad():
        ref, out = model(*inputs), opt(*inputs)
        # other inputs of the same shapes: the placed mask is read afresh each call
        again = make()
        ref2, out2 = model(*again), opt(*again)
    assert opt.calls["placed"] == 2 and opt.calls["guard_miss"] == 0
    for o, r in ((out, ref), (out2, ref2)):
        err, where = integrate.compare(integrate.flatten(o), integrate.flatten(r))
        assert err <= 1e-4, (name, where)


def test_a_mask_multiplied_into_the_probabilities_is_not_attention():
    """Dropping keys after the softmax (weights no longer sum to 1) is not a masked softmax."""
    def fwd(s, q, k, v, keep):
        p = torch.softmax(q @ k.transpose(-2, -1) * 0.25, -1) * keep
        return p @ v
    _, ms = found(Fn(fwd), *_QKV(), (torch.rand(2, 1, 1, 8) > 0.3).float())
    assert "attention" not in [f for f, _, _ in families(ms)], families(ms)


def test_a_runtime_mask_with_the_causal_flag_or_another_dtype_has_no_contract():
    def both(s, q, k, v, keep):
        s_ = (q @ k.transpose(-2, -1) * 0.25).masked_fill(~keep, float("-inf"))
        return torch.softmax(s_, -1) @ v
    # a runtime mask is served; one in another float dtype than q is recognized, not served
    _, ms = found(Fn(both), *_QKV(), torch.rand(2, 1, 1, 8) > 0.3)
    (att,) = [m for g in ms.values() for m in g if m.family == "attention"]
    assert att.placeable and att.fit.spec["mask"] == "hide"

    def wide(s, q, k, v, bias):
        return torch.softmax(q @ k.transpose(-2, -1) * 0.25 + bias, -1).to(q.dtype) @ v
    _, ms = found(Fn(wide), *(t.half() for t in _QKV()), torch.randn(2, 1, 1, 8))
    att = [m for g in ms.values() for m in g if m.family == "attention"]
    assert att and not att[0].placeable and "dtype" in att[0].why_not, families(ms)


class Hidden(torch.nn.Module):
    """A transformers encoder called as a user calls it: ids and a padding mask in, the last
    hidden state out."""
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, ids, attention_mask):
        return self.m(input_ids=ids, attention_mask=attention_mask).last_hidden_state


def padded_specs_placed_agree(encoder, seed: int, pad_from: int) -> list:
    """The placeable attention contracts of ``encoder`` called on two sequences of 12, the
    second padded from ``pad_from``; asserts one attention site placed and the rewritten
    model agreeing with the original."""
    model = Hidden(encoder.eval()).eval()
    ids = torch.randint(0, 64, (2, 12), generator=gen(seed))
    am = torch.ones(2, 12, dtype=torch.long)
    am[1, pad_from:] = 0
    with torch.no_grad():
        cap, ms = found(model, ids, am)
    att = [m for g in ms.values() for m in g if m.family == "attention"]
    pl, _ = place_starters(cap, ms)
    assert [s["family"] for s in pl.sites].count("attention") == 1, pl.skipped
    opt = place.optimized(cap, pl)
    with torch.no_grad():
        ref, out = model(ids, am), opt(ids, am)
    assert opt.calls["placed"] == 1 and opt.calls["guard_miss"] == 0
    err, where = integrate.compare(integrate.flatten(out), integrate.flatten(ref))
    assert err <= 1e-4, where
    return [m.fit.spec for m in att if m.placeable]


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                    reason="transformers is not installed")
@pytest.mark.parametrize("impl, want", [
    ("sdpa", {"mask": "keep", "mask_dims": "b1qk"}),
    ("eager", {"written": "by_hand", "mask": "bias", "mask_dims": "b1qk"}),
])
def test_bert_with_a_padding_attention_mask_is_matched_placed_and_agrees(impl, want):
    import transformers
    cfg = transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=64, vocab_size=64, max_position_embeddings=32,
                                  attn_implementation=impl)
    torch.manual_seed(0)
    assert padded_specs_placed_agree(transformers.BertModel(cfg), 8, 7) == [want]


def _t5_encoder():
    import transformers
    cfg = transformers.T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=1,
                                num_heads=4, relative_attention_num_buckets=8)
    return transformers.T5EncoderModel(cfg)


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                    reason="transformers is not installed")
def test_t5_relative_position_bias_is_a_runtime_bias_matched_placed_and_agrees():
    # T5 adds a relative-position bias computed from the sequence length (and, padded, the
    # mask folded into it) to unscaled scores: a bias mask [B, H, S, S] read in every key block
    torch.manual_seed(0)
    specs = padded_specs_placed_agree(_t5_encoder(), 9, 9)
    assert [s.get("mask") for s in specs] == ["bias"]


# ---- a soft-capped attention (Gemma 2: cap * tanh(scores / cap) before the mask) -------------

CAPPED = {"written": "by_hand", "softcap": 5.0}                     # a low cap: most scores bend
CAPPED_BIAS = {"written": "by_hand", "mask": "bias", "mask_dims": "b11k", "softcap": 5.0}


def _gemma2(self, q, k, v, bias):
    w = (q @ k.transpose(2, 3)) * 0.25
    w = w / 50.0                                   # Gemma 2's attn_logit_softcapping, written out
    w = torch.tanh(w)
    w = w * 50.0
    w = w + bias
    return torch.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype) @ v


def test_a_soft_capped_attention_is_matched_with_its_cap_and_a_wrong_cap_is_not():
    q, k, v = (torch.randn(2, 4, 8, 16, generator=gen(i)) for i in range(3))
    causal = torch.full((8, 8), float("-inf")).triu(1)
    _, ms = found(Fn(lambda s, q, k, v: _gemma2(s, q, k, v, causal)), q, k, v)
    assert families(ms) == [("attention", {"written": "by_hand", "softcap": 50.0}, False)]
    pad = torch.zeros(2, 1, 1, 8)
    pad[1, ..., 6:] = float("-inf")
    _, ms = found(Fn(_gemma2), q, k, v, pad)
    assert families(ms) == [("attention", {"written": "by_hand", "softcap": 50.0, "mask": "bias",
                                           "mask_dims": "b11k"}, False)]

    def two_caps(s, q, k, v):                     # tanh(s / 50) * 30 is no soft cap of one number
        return torch.softmax(torch.tanh((q @ k.transpose(2, 3)) / 50.0) * 30.0, -1) @ v
    _, ms = found(Fn(two_caps), q, k, v)
    att = [m for g in ms.values() for m in g if m.family == "attention"]
    assert not att or not att[0].placeable


@pytest.mark.slow
@pytest.mark.parametrize("spec", [CAPPED, CAPPED_BIAS], ids=["causal", "padding_bias"])
def test_soft_capped_kernels_agree_and_pass_the_five_stages(spec, cand_dir):
    fam = kernels.get("attention", spec)
    assert fam.reference is not attention.reference           # SDPA has no cap: the model's own
    shape = [2, 4, 24, 16, 2, 0 if "mask" in spec else 1]
    for params in POINTS:
        src = fam.render(params)
        assert "soft cap" in src
        fn = load_candidate(src, cand_dir)
        for dt in DTYPES:
            inp = fam.make_inputs(shape, dt, DEVICE, gen(7))
            assert tol_ratio(fam, fn(**inp), inp) <= 1.0, (params, dt)
        # the uncapped kernel is wrong here: the cap is part of the contract
        plain = kernels.get("attention", {k: v for k, v in spec.items() if k != "softcap"})
        inp = fam.make_inputs(shape, torch.float32, DEVICE, gen(8))
        assert tol_ratio(fam, load_candidate(plain.render(params), cand_dir)(**inp), inp) > 1.0
    starter_passes_the_five_stages(fam, shape, cand_dir)


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                    reason="transformers is not installed")
def test_gemma2_soft_capped_attention_is_matched_placed_and_agrees():
    import transformers
    cfg = transformers.Gemma2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                    vocab_size=64, max_position_embeddings=64)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.Gemma2ForCausalLM(cfg).eval()
    ids = torch.randint(0, 64, (2, 12), generator=gen(9))
    (att,) = one_attention_placed_and_agreeing(model, ids, out=lambda o: o.logits)
    assert att.fit.spec["softcap"] == cfg.attn_logit_softcapping


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                    reason="transformers is not installed")
def test_t5_without_a_mask_two_biases_read_as_one_and_a_constant_bias_is_read_at_run_time():
    # with no attention_mask, transformers 5.x adds T5's relative-position bias and then its
    # (empty) mask to the scores, one after the other; both are constants of the model (the
    # bias comes from its weights): the capture adds the biases first, and the kernel reads
    # the sum as it reads a runtime bias
    torch.manual_seed(0)
    model = Hidden(_t5_encoder().eval()).eval()

    class NoMask(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, ids):
            return self.m.m(input_ids=ids).last_hidden_state
    model = NoMask(model).eval()
    ids = torch.randint(0, 64, (2, 12), generator=gen(10))
    (att,) = one_attention_placed_and_agreeing(model, ids)
    assert att.fit.spec["mask"] == "bias"

    # a bias a model keeps as a buffer (ALiBi-like slopes times distances), added by hand
    class BufferBias(torch.nn.Module):
        def __init__(self):
            super().__init__()
            pos = torch.arange(8.0)
            self.register_buffer("bias", -(pos[None, :] - pos[:, None]).abs()[None, None]
                                 * torch.tensor([0.5, 0.25, 0.125, 0.0625])[None, :, None, None])

        def forward(self, q, k, v):
            return torch.softmax(q @ k.transpose(-2, -1) * 0.25 + self.bias, -1) @ v
    _, ms = found(BufferBias(), *(torch.randn(2, 4, 8, 16, generator=gen(i)) for i in range(3)))
    assert families(ms) == [("attention", {"written": "by_hand", "mask": "bias", "mask_dims": "1hqk"},
                             False)]


# ---- a bias, then the causal mask (ALiBi as MPT writes it) -----------------------------------

BIAS_CAUSAL = {"written": "by_hand", "mask": "bias", "mask_dims": "1h1k", "causal": True}


class AlibiCausal(torch.nn.Module):
    """MPT's attention: scaled scores, the ALiBi bias [1, H, 1, S] added, the future hidden by
    masked_fill(finfo.min), softmax in fp32."""
    def __init__(self, h=4, s=8):
        super().__init__()
        slopes = 2.0 ** -torch.arange(1.0, h + 1)
        self.register_buffer("alibi", (slopes[:, None, None] * torch.arange(float(s)))[None])
        self.register_buffer("future", torch.ones(s, s, dtype=torch.bool).triu(1))

    def forward(self, q, k, v):
        s = torch.matmul(q, k.transpose(-1, -2)) * 0.25 + self.alibi
        s = s.masked_fill(self.future, torch.finfo(q.dtype).min)
        return torch.softmax(s.float(), dim=-1).to(v.dtype) @ v


def test_a_bias_then_the_causal_mask_is_one_contract_and_another_mask_is_refused():
    q, k, v = (torch.randn(2, 4, 8, 16, generator=gen(i)) for i in range(3))
    (att,) = one_attention_placed_and_agreeing(AlibiCausal(), q, k, v)
    assert att.fit.spec == BIAS_CAUSAL and att.fit.shape[-1] == 1

    class BiasThenOther(AlibiCausal):
        def __init__(self):
            super().__init__()
            self.future = torch.ones(8, 8, dtype=torch.bool).triu(2)      # not the causal mask
    _, ms = found(BiasThenOther(), q, k, v)
    att = [m for g in ms.values() for m in g if m.family == "attention"]
    assert att and not att[0].placeable and "causal" in att[0].why_not


@pytest.mark.slow
def test_bias_with_causal_kernels_agree_and_pass_the_five_stages(cand_dir):
    fam = kernels.get("attention", BIAS_CAUSAL)
    assert all(s[-1] == 1 for s in fam.bench_shapes + fam.sweep_shapes + fam.edge_shapes)
    shape = [2, 4, 24, 16, 2, 1]
    for params in POINTS:
        fn = load_candidate(fam.render(params), cand_dir)
        for dt in DTYPES:
            inp = fam.make_inputs(shape, dt, DEVICE, gen(11))
            assert inp["causal"] is True
            assert tol_ratio(fam, fn(**inp), inp) <= 1.0, (params, dt)
    starter_passes_the_five_stages(fam, shape, cand_dir)


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                    reason="transformers is not installed")
def test_mpt_alibi_attention_is_matched_placed_and_agrees():
    import transformers
    cfg = transformers.MptConfig(d_model=32, n_heads=2, n_layers=1, vocab_size=64, max_seq_len=64)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.MptForCausalLM(cfg).eval()
    ids = torch.randint(0, 64, (2, 12), generator=gen(12))
    (att,) = one_attention_placed_and_agreeing(model, ids, out=lambda o: o.logits)
    assert att.fit.spec["mask"] == "bias" and att.fit.spec["causal"] is True


# ---- queries and keys of different lengths (cross-attention, pooled keys) ----------------------

def test_a_shape_with_fewer_keys_than_queries_makes_its_inputs_and_cost_so_and_is_never_causal():
    shape = (2, 4, 24, 16, 2, 0, 9)                        # Sk = 9 keys for 24 queries
    inp = attention.make_inputs(shape, "float32", "cpu", gen(1))
    assert inp["q"].shape == (2, 4, 24, 16) and inp["k"].shape == inp["v"].shape == (2, 2, 9, 16)
    assert attention.keys_len(shape) == 9 and attention.keys_len(shape[:6]) == 24
    (byts, flops), (_, sq_f) = attention.cost(shape, "float32"), attention.cost(shape[:6], "float32")
    assert byts == (2 * 2 * 4 * 24 * 16 + 2 * 2 * 2 * 9 * 16) * 4 and flops * 24 == sq_f * 9
    fam = kernels.get("attention", SDPA_BIAS)
    assert fam.make_inputs(shape, "float32", "cpu", gen(2))["mask"].shape == (2, 1, 1, 9)
    with pytest.raises(ValueError, match="causal"):
        attention.problem((2, 4, 24, 16, 2, 1, 9))


@pytest.mark.parametrize("spec, shape", [({}, (1, 2, 24, 16, 1, 0, 9)),
                                         (SDPA_BIAS, (2, 4, 20, 16, 2, 0, 37))],
                         ids=["plain_fewer_keys", "padding_bias_more_keys"])
def test_cross_attention_starters_pass_the_five_stages(spec, shape, cand_dir):
    starter_passes_the_five_stages(kernels.get("attention", spec or None), shape, cand_dir)


def _cross(self, x, mem, keep):
    # a decoder's cross-attention written by hand: queries from x [B, 6, 16], keys and values
    # from an encoder's memory [B, 11, 16] with its padding, 2 heads of 8
    b = x.shape[0]
    q = x.view(b, -1, 2, 8).transpose(1, 2)
    k = mem.view(b, -1, 2, 8).transpose(1, 2)
    v = (mem * 0.5).view(b, -1, 2, 8).transpose(1, 2)
    s = (q @ k.transpose(-2, -1)) / math.sqrt(8)
    s = s.masked_fill(~keep[:, None, None, :], float("-inf"))
    return (torch.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(b, -1, 16)


def test_cross_attention_by_hand_is_matched_placed_and_agrees_and_a_causal_one_is_refused():
    x, mem = torch.randn(2, 6, 16, generator=gen(3)), torch.randn(2, 11, 16, generator=gen(4))
    keep = torch.ones(2, 11, dtype=torch.bool)
    keep[1, 7:] = False
    (att,) = one_attention_placed_and_agreeing(Fn(_cross), x, mem, keep)
    assert tuple(att.fit.shape) == (2, 2, 6, 8, 2, 0, 11), att.fit.shape

    def causal(s, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    q, kv = torch.randn(1, 2, 6, 8), torch.randn(1, 2, 11, 8)
    _, ms = found(Fn(causal), q, kv, kv)
    (m,) = [m for g in ms.values() for m in g if m.family == "attention"]
    assert not m.placeable and "causal" in m.why_not, m.why_not


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                    reason="transformers is not installed (requirements-dev.txt)")
def test_segformer_attention_over_pooled_keys_is_matched_placed_and_agrees():
    # SegFormer reduces its keys and values spatially (a strided convolution, sr_ratio 2): 81
    # queries attend to 16 keys
    import transformers
    cfg = transformers.SegformerConfig(num_encoder_blocks=1, depths=[1], sr_ratios=[2],
                                       hidden_sizes=[16], num_attention_heads=[2],
                                       patch_sizes=[4], strides=[4], decoder_hidden_size=16)
    torch.manual_seed(0)
    model = transformers.SegformerModel(cfg).eval()
    # batch 1: the graph's fake values gave a reshape's size-1 dim another stride than the real
    # run, a convolution read that as channels-last, and every guard after it missed (the
    # original ran: correct, no faster); capture now keeps the real run's strides
    px = torch.randn(1, 3, 32, 32, generator=gen(5))
    (att,) = one_attention_placed_and_agreeing(model, px, out=lambda o: o.last_hidden_state)
    assert tuple(att.fit.shape) == (1, 2, 81, 8, 2, 0, 16), att.fit.shape


# ---- v's own head dim (multi-head latent attention: DeepSeek-V2/V3, Kimi K2) -------------------

MLA = {"v_head_dim": 32}      # q, k 48 wide (the shapes' D): with split_d 32 + 16, v one part
MLA_HAND_BIAS = {"written": "by_hand", "mask": "bias", "mask_dims": "b11k", "v_head_dim": 8}
MLA_SHAPES = ((2, 4, 20, 48, 2, 1), (1, 2, 33, 48, 1, 0))


def test_v_head_dim_contract_inputs_cost_baseline_and_spec_checks():
    fam = kernels.get("attention", MLA)
    inp = fam.make_inputs((2, 4, 20, 48, 2, 1), torch.float32, DEVICE, gen(1))
    assert inp["q"].shape[-1] == inp["k"].shape[-1] == 48 and inp["v"].shape[-1] == 32
    assert fam.reference(**inp).shape == (2, 4, 20, 32)
    # bytes: q and o once, k and v once (D + Dv per row); flops: 2*D + 2*Dv + 5 a score
    byts, flops = fam.cost((2, 4, 20, 48, 2, 1), torch.float32)
    assert byts == (2 * 4 * 20 + 2 * 2 * 20) * (48 + 32) * 4
    assert flops == 2 * 4 * (20 * 21 // 2) * (2 * 48 + 2 * 32 + 5)
    assert fam.baseline_op() is attention.reference                  # an SDPA call's baseline is SDPA
    assert kernels.get("attention", dict(MLA, written="by_hand")).baseline_op() is attention.by_hand
    masked = kernels.get("attention", MLA_HAND_BIAS)
    assert masked.make_inputs(SHAPE, torch.float32, DEVICE, gen(1))["v"].shape[-1] == 8
    assert masked.cost(SHAPE, torch.float32)[0] < kernels.get(
        "attention", {k: v for k, v in MLA_HAND_BIAS.items() if k != "v_head_dim"}).cost(SHAPE, torch.float32)[0]
    for bad in (0, 257, 16.0, True, "16"):
        with pytest.raises(ValueError, match="v_head_dim"):
            kernels.get("attention", {"v_head_dim": bad})


@pytest.mark.parametrize("spec", [MLA, MLA_HAND_BIAS], ids=["sdpa", "hand_bias"])
def test_kernels_with_v_s_own_head_dim_agree_and_a_kernel_that_reads_v_at_q_s_width_is_rejected(spec, cand_dir):
    """Pointer, exp2 with the split loop, and TMA points, fp32/fp16/bf16: o [B, H, S, Dv] within
    the bound. A kernel that returns o at q's head dim (as a one-head-dim kernel does) is
    rejected."""
    fam = kernels.get("attention", spec)
    shapes = MLA_SHAPES if "mask" not in spec else (SHAPE,)
    for params in POINTS + ({"split_d": True}, {"loads": "tma", "split_d": True, "block_m": 16}):
        fn = load_candidate(fam.render(params), cand_dir)
        for shape in shapes:
            for dt in DTYPES:
                inp = fam.make_inputs(shape, dt, DEVICE, gen(5))
                out = fn(**inp)
                assert out.shape[-1] == spec["v_head_dim"]
                assert tol_ratio(fam, out, inp) <= 1.0, (params, shape, dt)
    src = fam.render({})
    bad = src.replace("o = torch.empty((B, SQ, H, v.shape[3])", "o = torch.empty((B, SQ, H, D)")
    assert bad != src
    inp = fam.make_inputs(shapes[0], torch.float32, DEVICE, gen(6))
    assert tol_ratio(fam, load_candidate(bad, cand_dir)(**inp), inp) > 1.0


@pytest.mark.slow
def test_v_head_dim_starter_passes_the_five_stages(cand_dir):
    starter_passes_the_five_stages(kernels.get("attention", MLA), [2, 4, 24, 24, 2, 1], cand_dir)


def _mla_by_hand(self, q, k, v):
    # DeepSeek's eager attention: q and k carry a rotary part v does not
    w = torch.matmul(q, k.transpose(2, 3)) * 0.2
    w = w + self.causal
    return torch.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype) @ v


def test_attention_with_v_s_own_head_dim_is_matched_placed_and_agrees():
    q, k = (torch.randn(2, 4, 8, 12, generator=gen(i)) for i in range(2))
    v = torch.randn(2, 4, 8, 8, generator=gen(2))
    for model, spec in (
            (Fn(lambda s, q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)), {"v_head_dim": 8}),
            (Fn(_mla_by_hand, causal=torch.full((8, 8), float("-inf")).triu(1)),
             {"written": "by_hand", "v_head_dim": 8})):
        (att,) = one_attention_placed_and_agreeing(model, q, k, v)
        assert att.fit.spec == spec and tuple(att.fit.shape[:4]) == (2, 4, 8, 12), att.fit
