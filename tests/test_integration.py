"""Any model in, a verified faster model out: model sources, the kernel runtime (interception,
probed module swaps, fall-through, torch.compile), end-to-end checks, export to a package used in
a clean process, and KernelBench scoring. CPU only, under Triton's interpreter, where one kernel
call takes 0.1-1 s: models and budgets are tiny."""
import hashlib
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import kernels
from engine import integrate, kernel_runtime as rt, sources
from engine.cli import main as cli_main
from engine.loop import ConfigError, RunConfig, execute
from engine.store import Store

ROOT = Path(__file__).resolve().parent.parent
PROBLEMS = ROOT / "tests" / "kernelbench_problems"
OWN = ROOT / "tests" / "models" / "own_rmsnorm.py"
HAS_TRANSFORMERS = sources.importlib.util.find_spec("transformers") is not None


def starter(family, shapes, dtype="float32", source=None):
    """A runtime kernel from the family's starter (or ``source``), verified for ``shapes``."""
    fam = kernels.get(family)
    src = source or fam.starter()
    rec = integrate.KernelRecord(family, 0, 1, src, hashlib.sha256(src.encode()).hexdigest(), dtype,
                                 [list(s) for s in shapes], tuple(fam.tolerance[getattr(torch, dtype)]),
                                 "cpu")
    return integrate.load([rec])[0]


# ---- model sources ------------------------------------------------------------------------------

def test_every_model_source_builds_and_runs():
    for spec, kind, shape in [("llama-tiny", "zoo", (2, 32)),
                              (f"{OWN}:TinyNet", "file", (2, 4, 64)),
                              (f"{OWN}:build", "file", (2, 4, 64)),
                              (str(PROBLEMS / "level1" / "1_Softmax.py"), "file", (8, 96))]:
        loaded = sources.load(spec)
        assert loaded.source.kind == kind and tuple(loaded.inputs[0].shape) == shape, spec
        fresh = loaded.new_inputs(7)
        assert fresh[0].shape == loaded.inputs[0].shape and not torch.equal(fresh[0], loaded.inputs[0])
    # the public entry point the dashboard calls; --input-shape replaces get_inputs()
    model, inputs = __import__("engine.models").models.load_source(
        f"{OWN}:TinyNet", dtype=torch.bfloat16, input_shape="3x64")
    assert inputs[0].shape == (3, 64) and inputs[0].dtype == torch.bfloat16
    assert next(model.parameters()).dtype == torch.bfloat16
    # get_init_inputs() is used: TinyNet(64, 96, 2) has two blocks, build() one
    assert len(sources.load(f"{OWN}:TinyNet").model.blocks) == 2
    assert len(sources.load(f"{OWN}:build").model.blocks) == 1


def test_a_complex_buffer_keeps_its_imaginary_parts_when_the_model_is_cast(monkeypatch):
    """A model with RoPE's freqs_cis as a complex buffer (torchtitan's way), loaded in bf16: the
    floating-point tensors are cast, the complex buffer is not (Module.to(dtype) would drop its
    imaginary parts, and every rotation would be wrong), and its rotations are found as RoPE
    fused into the q and k projections."""
    for k, v in dict(META_TINY="1", META_SEQ="16", META_BATCH="2", META_LAYERS="1").items():
        monkeypatch.setenv(k, v)
    path = str(ROOT / "docs" / "sweeps" / "meta_llama.py")
    loaded = sources.load(path, dtype=torch.bfloat16)
    m = loaded.model
    assert m.freqs_cis.dtype == torch.complex64 and m.freqs_cis.imag.abs().max() > 0.5
    assert m.output.weight.dtype == torch.bfloat16
    f32 = sources.load(path)
    from engine import capture, match
    cap = capture.capture(f32.model.eval(), f32.inputs)
    assert cap.ok, cap.note
    rot = [mm for g in cap.graphs for mm in match.find(g) if mm.family == "rotary"]
    assert [r.fit.spec for r in rot] == [{"linear": True, "style": "interleaved"}] * 2


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="transformers is not installed (requirements-dev.txt)")
def test_hf_preset_builds_from_config_without_download(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")                 # nothing may be fetched
    loaded = sources.load("hf:llama", input_shape="1x8", n_layer=1)
    assert type(loaded.model).__name__ == "LlamaForCausalLM"
    assert loaded.model.config.num_hidden_layers == 1 and loaded.model.config.hidden_size == 64
    assert loaded.inputs[0].shape == (1, 8)


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="transformers is not installed (requirements-dev.txt)")
def test_the_llama3_8b_preset_has_its_shape_on_the_meta_device(monkeypatch):
    """hf:llama3-8b, the end-to-end target's model, built on the meta device (no memory):
    LLaMA-3-8B's widths, 8 KV heads, its vocabulary and RoPE base, 8 x 2048 tokens."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    loaded = sources.load("hf:llama3-8b", dtype=torch.bfloat16, device="meta", check=False)
    m, cfg = loaded.model, loaded.model.config
    assert loaded.inputs[0].shape == (8, 2048) and len(m.model.layers) == 2
    assert m.model.layers[0].self_attn.k_proj.weight.shape == (1024, 4096)
    assert m.model.layers[0].mlp.gate_proj.weight.shape == (14336, 4096)
    assert m.lm_head.weight.shape == (128256, 4096)
    theta = getattr(cfg, "rope_parameters", None) or {"rope_theta": cfg.rope_theta}
    assert theta["rope_theta"] == 500000.0


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="transformers is not installed (requirements-dev.txt)")
def test_gpt2_small_and_bert_base_presets_are_the_published_shapes(monkeypatch):
    """hf:gpt2-small and hf:bert-base on the meta device: 12 layers of 768, the published
    vocabularies, 8 x 1024 and 8 x 512 tokens by default."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    gpt2 = sources.load("hf:gpt2-small", dtype=torch.bfloat16, device="meta", check=False)
    assert gpt2.inputs[0].shape == (8, 1024) and len(gpt2.model.transformer.h) == 12
    assert gpt2.model.lm_head.weight.shape == (50257, 768)
    assert sum(p.numel() for p in gpt2.model.parameters()) == 124_439_808
    bert = sources.load("hf:bert-base", dtype=torch.bfloat16, device="meta", check=False)
    assert bert.inputs[0].shape == (8, 512) and len(bert.model.bert.encoder.layer) == 12
    assert bert.model.bert.encoder.layer[0].intermediate.dense.weight.shape == (3072, 768)


def test_transformers_builds_its_models_beside_our_kernels_package():
    """Hugging Face's own package named ``kernels`` (a dependency of transformers >= 5.25) is
    shadowed by ours in the engine's process: transformers is told its hub kernels are
    unavailable, in a fresh interpreter that imports the engine first, as the CLI does."""
    if not HAS_TRANSFORMERS:
        pytest.skip("transformers is not installed (requirements-dev.txt)")
    code = ("import engine.sources, kernels, transformers\n"
            "from transformers.utils import import_utils\n"
            "assert not import_utils.is_kernels_available()\n"
            "cfg = transformers.BloomConfig(hidden_size=16, n_layer=1, n_head=2, vocab_size=32)\n"
            "print(type(transformers.BloomForCausalLM(cfg)).__name__, kernels.FAMILY_NAMES[0])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["BloomForCausalLM", "rmsnorm"], out.stdout


BAD = {
    "no_class.py": ("import torch\n", ":Net", "no class or function named 'Net'"),
    "kb_no_model.py": ("import torch\nclass Other(torch.nn.Module):\n    pass\n", "",
                       "has no class model"),
    "syntax.py": ("def f(:\n", ":f", "cannot parse"),
    "ctor_raises.py": ("import torch\nclass Net(torch.nn.Module):\n    def __init__(self):\n"
                       "        super().__init__()\n        raise ValueError('needs a config')\n"
                       "def get_inputs():\n    return [torch.randn(2, 4)]\n", ":Net",
                       "constructing net from ctor_raises.py failed: valueerror: needs a config"),
    "wrong_shape.py": ("import torch\nclass Net(torch.nn.Module):\n    def __init__(self):\n"
                       "        super().__init__()\n        self.lin = torch.nn.Linear(16, 4)\n"
                       "    def forward(self, x):\n        return self.lin(x)\n"
                       "def get_inputs():\n    return [torch.randn(2, 8)]\n", ":Net",
                       "forward pass failed on inputs (float32[2x8])"),
    "not_module.py": ("import torch\ndef make():\n    return 3\ndef get_inputs():\n"
                      "    return [torch.randn(2)]\n", ":make", "returned int, not an nn.module"),
    "constant.py": ("import torch\nNet = 3\ndef get_inputs():\n    return [torch.randn(2)]\n", ":Net",
                    "is a int, not an nn.module class"),
    "plain_class.py": ("import torch\nclass Net:\n    pass\ndef get_inputs():\n"
                       "    return [torch.randn(2)]\n", ":Net", "not an nn.module subclass"),
    "no_inputs.py": ("import torch\nclass Net(torch.nn.Module):\n    pass\n", ":Net",
                     "no get_inputs(): pass --input-shape"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_model_file_one_clear_message(tmp_path, name):
    text, suffix, words = BAD[name]
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(sources.SourceError) as e:
        sources.load(f"{path}{suffix}")
    msg = str(e.value)
    assert "\n" not in msg and words.lower() in msg.lower(), msg


def test_runconfig_validates_specs(tmp_path):
    RunConfig(model=f"{OWN}:TinyNet").validate()
    RunConfig(model=str(PROBLEMS / "level1" / "2_LayerNorm.py")).validate()
    for spec, words in [("nope", "unknown model"), ("hf:gpt9", "unknown model 'hf:gpt9'"),
                        (str(tmp_path / "missing.py"), "no such model file"),
                        (f"{OWN}:Nope", "no class or function named 'Nope'")]:
        with pytest.raises(ConfigError, match=words):
            RunConfig(model=spec).validate()
    with pytest.raises(ConfigError, match="bad input shape"):
        RunConfig(model=f"{OWN}:TinyNet", input_shape="2xfoo").validate()


@pytest.mark.parametrize("name", ["no_class.py", "ctor_raises.py", "wrong_shape.py",
                                  "not_module.py"])
@pytest.mark.parametrize("existing", [False, True], ids=["new-db", "existing-db"])
def test_cli_bad_model_exit_2_and_no_run(tmp_path, capsys, name, existing):
    text, suffix, words = BAD[name]
    path = tmp_path / name
    path.write_text(text)
    db = tmp_path / "sub" / "runs.db"
    if existing:
        db.parent.mkdir()
        Store(db).close()
    rc = cli_main(["run", "--model", f"{path}{suffix}", "--budget-experiments", "1", "--db", str(db)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("error:") and words.lower() in err[0].lower(), err
    # a usage error leaves nothing behind: a database this call would have created (and its
    # folder) is gone, one that existed holds no new run
    if existing:
        assert Store(db, readonly=True).list_runs() == []
    else:
        assert not db.exists() and not db.parent.exists()


def test_an_unknown_compile_mode_is_one_usage_error_and_a_known_one_is_the_only_mode(
        tmp_path, capsys, monkeypatch):
    """NIGHTSHIFT_COMPILE_MODE misspelled: one line and exit 2 before anything is written (not
    a failed torch.compile in every timing row at the end of a run); --compile-mode names the
    one mode the end-to-end stage times, for its isolated process as well."""
    from engine import cli
    monkeypatch.setenv("NIGHTSHIFT_COMPILE_MODE", "max_autotune")
    db = tmp_path / "runs.db"
    rc = cli_main(["run", "--model", "llama-tiny", "--budget-experiments", "1", "--db", str(db)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "'max_autotune' is not a torch.compile mode" in err[0], err
    assert not db.exists()
    assert cli_main(["e2e", "latest", "--db", str(db)]) == 2 and not db.exists()
    monkeypatch.delenv("NIGHTSHIFT_COMPILE_MODE")
    monkeypatch.setattr(integrate, "COMPILE_MODE", "")
    cli.compile_mode("reduce-overhead")
    assert os.environ.pop("NIGHTSHIFT_COMPILE_MODE") == "reduce-overhead"
    assert integrate.compile_modes(torch.device("cuda")) == ("reduce-overhead",)
    cli.compile_mode()
    assert integrate.compile_modes(torch.device("cuda")) == integrate.COMPILE_MODES


# ---- the runtime: interception, fall-through, probes, torch.compile ---------------------------

class Functional(nn.Module):
    """Every intercepted functional route on [2, 4, 16] activations."""

    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(16)
        self.rms = nn.RMSNorm(16, eps=1e-6)
        self.head = nn.Linear(16, 16)

    def forward(self, x, targets):
        a = torch.softmax(x, dim=-1) + F.softmax(x, dim=2) + x.softmax(-1)
        h = self.head(self.rms(self.ln(a)))
        return h, F.cross_entropy(h.view(-1, 16), targets.view(-1))


def test_functional_ops_intercepted_only_where_verified():
    torch.manual_seed(0)
    model = Functional().eval()
    with torch.no_grad():
        model.ln.weight.add_(0.1 * torch.randn(16))
        model.rms.weight.add_(0.1 * torch.randn(16))
    x, t = torch.randn(2, 4, 16), torch.randint(0, 16, (2, 4))
    ks = [starter("softmax", [(8, 16)]), starter("layernorm", [(2, 4, 16)]),
          starter("rmsnorm", [(8, 16)]), starter("cross_entropy", [(8, 16)])]
    with torch.no_grad():
        ref = model(x, t)
        applied = rt.apply(model, ks)
        out = model(x, t)
        stats = applied.stats()
        assert {f: s["calls"] for f, s in stats.items()} == {
            "softmax": 3, "layernorm": 1, "rmsnorm": 1, "cross_entropy": 1}
        for o, r in zip(out, ref):
            assert torch.allclose(o, r, atol=1e-5, rtol=1e-5)
        applied.reset_stats()
        model(torch.randn(3, 4, 16), torch.randint(0, 16, (3, 4)))      # 12 rows: never verified
        assert all(s["calls"] == 0 and s["fallthrough"] > 0 for s in applied.stats().values())
        applied.reset_stats()
        torch.softmax(x, -1)                                           # outside forward: untouched
        assert applied.stats()["softmax"]["fallthrough"] == 0
    applied.reset_stats()
    model(x, t)                  # weights that need gradients: PyTorch (x itself needs none)
    assert {f: s["calls"] for f, s in applied.stats().items()} == {
        "softmax": 3, "layernorm": 0, "rmsnorm": 0, "cross_entropy": 0}
    applied.remove()
    assert "forward" not in model.__dict__
    with torch.no_grad():
        bf = Functional().eval().to(torch.bfloat16)
        a2 = rt.apply(bf, ks)
        bf(x.to(torch.bfloat16), t)                                     # float32 kernels, bf16 calls
        assert all(s["calls"] == 0 for s in a2.stats().values())


class WrongEps(nn.Module):
    """Looks like an RMSNorm (weight, eps) but adds eps outside the root."""

    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = 1e-6

    def forward(self, x):
        return x / (x.pow(2).mean(-1, keepdim=True).sqrt() + self.eps) * self.weight


class CenteredNorm(WrongEps):
    """Subtracts the mean: a LayerNorm without bias, not an RMSNorm."""

    def forward(self, x):
        x = x - x.mean(-1, keepdim=True)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def test_module_swapped_only_after_probe():
    sys.path.insert(0, str(OWN.parent))
    try:
        from own_rmsnorm import T5StyleLayerNorm
    finally:
        sys.path.pop(0)
    model = nn.Sequential(T5StyleLayerNorm(32), WrongEps(32), CenteredNorm(32)).eval()
    k = starter("rmsnorm", [(2, 3, 32)])
    applied = rt.apply(model, [k])
    assert applied.swapped == {"rmsnorm": ["0"]}
    x = torch.randn(2, 3, 32)
    with torch.no_grad():
        out = model(x)
        applied.remove()
        assert torch.allclose(out, model(x), atol=1e-5, rtol=1e-5)
    assert applied.stats()["rmsnorm"]["calls"] == 1


def test_torch_compile_traces_the_optimized_model_in_one_graph():
    from engine.models import RMSNorm
    torch.manual_seed(0)
    model = nn.Sequential(RMSNorm(16, 1e-5), nn.Linear(16, 16), nn.Softmax(dim=-1)).eval()
    ks = [starter("rmsnorm", [(4, 16)]), starter("softmax", [(4, 16)])]
    x = torch.randn(4, 16)
    with torch.no_grad():
        ref = model(x)
        applied = rt.apply(model, ks)
        torch._dynamo.reset()
        explained = torch._dynamo.explain(model)(x)
        assert explained.graph_count == 1 and explained.graph_break_count == 0
        out = torch.compile(model, backend="aot_eager")(x)   # fake impls trace, kernels run
    assert torch.allclose(out, ref, atol=1e-5, rtol=1e-5)
    applied.remove()


def rope_interleaved(x, cos, sin):
    """A rotary embedding in the interleaved (GPT-J) convention: named like one, takes (x, cos,
    sin), but rotates pairs (2i, 2i+1), so the rotate-half probe must reject it."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    c, s = cos[..., 0::2], sin[..., 0::2]
    return torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).flatten(-2)


class WithDecoy(nn.Module):
    """A model whose class lives in this test module, so rope_interleaved is a candidate for the
    rotary function swap beside engine.models.apply_rotary."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, idx):
        return self.inner(idx)


def test_rotary_function_swapped_after_probe_only_inside_the_optimized_forward():
    from engine import models
    loaded = sources.load("llama-tiny", dtype="float32", device="cpu", input_shape="2x16", check=False)
    model = WithDecoy(loaded.model).eval()
    cfg = loaded.model.cfg
    dh = cfg.d_model // cfg.n_head
    idx = loaded.check_inputs(7)[0][0]                       # token ids [2, 16]: logits out
    q_shape, k_shape = (2, cfg.n_head, 16, dh), (2, cfg.n_kv_head, 16, dh)
    k = starter("rotary", [q_shape, k_shape])
    original = models.apply_rotary
    with torch.no_grad():
        ref = loaded.model(idx)
        applied = rt.apply(model, [k])
        assert applied.swapped == {"rotary": ["engine.models.apply_rotary"]}   # not the decoy
        assert models.apply_rotary is not original
        out = model(idx)
        assert applied.stats()["rotary"]["calls"] == 2 * cfg.n_layer           # q and k per layer
        assert torch.allclose(out, ref, atol=1e-5, rtol=1e-5)
        applied.reset_stats()
        cos, sin = loaded.model.rope_cos[:16], loaded.model.rope_sin[:16]
        x = torch.randn(q_shape)
        assert torch.equal(models.apply_rotary(x, cos, sin), original(x, cos, sin))   # outside
        assert applied.stats()["rotary"] == dict(calls=0, fallthrough=0, kernel=k.name,
                                                 swapped=["engine.models.apply_rotary"])
        applied.remove()
    assert models.apply_rotary is original


class DeepNorms(nn.Module):
    """48 residual layers of a composite bf16 RMSNorm and a linear map: the original's own
    rounding drifts ~2% from its float32 run, about as far as a correct kernel lands from it."""

    def __init__(self, d=256, n=48):
        super().__init__()
        from engine.models import RMSNorm
        self.norms = nn.ModuleList(RMSNorm(d) for _ in range(n))
        self.lins = nn.ModuleList(nn.Linear(d, d, bias=False) for _ in range(n))

    def forward(self, x):
        for norm, lin in zip(self.norms, self.lins):
            x = x + lin(norm(x))
        return x


def _rms_fp32(x, w, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


def test_bf16_check_accepts_a_kernel_more_accurate_than_the_original_and_rejects_a_wrong_one():
    torch.manual_seed(1)
    model = DeepNorms().eval().to(torch.bfloat16)
    inputs = [(torch.randn(4, 32, 256, dtype=torch.bfloat16),) for _ in range(2)]
    tol = tuple(kernels.get("rmsnorm").tolerance[torch.bfloat16])

    def kernel(fn, name):
        return rt.Kernel("rmsnorm", fn, "bfloat16", "cpu", [[4, 32, 256]], tol, name=name)

    good = integrate.check(model, inputs, [kernel(_rms_fp32, "fp32-accumulating")], "bfloat16")
    assert good.status == "passed" and good.max_error > integrate.E2E_TOLERANCE["bfloat16"]
    assert "against a float32 run of the model" in good.detail and "no less accurate" in good.detail
    wrong = integrate.check(model, inputs, [kernel(lambda x, w, eps: (_rms_fp32(x, w, eps).float()
                                                                       * 1.05).to(x.dtype), "5% off")],
                            "bfloat16")
    assert wrong.status == "failed" and wrong.family_flags == {"rmsnorm": "responsible"}


def test_kernels_the_model_runs_slower_with_are_left_out():
    """drop_slower (the GPU end-to-end stage's keep-or-revert at the model level), here with
    wall-clock timings on the CPU: a kernel that costs 50 ms a call goes first. (Whether the
    near-free one stays depends on its Python overhead against this box's noise: not asserted.)"""
    import time as _time
    model = Functional().eval()
    x, t = torch.randn(2, 4, 16), torch.randint(0, 16, (2, 4))

    def slow_softmax(x):
        _time.sleep(0.05)
        return torch.softmax(x, -1)

    slow = rt.Kernel("softmax", slow_softmax, "float32", "cpu", [[8, 16]], (1e-6, 1e-6), name="slow")
    free = rt.Kernel("layernorm", lambda x, w, b, eps: F.layer_norm(x, (16,), w, b, eps), "float32",
                     "cpu", [[8, 16]], (1e-6, 1e-6), name="free")
    kept, dropped = integrate.drop_slower(model, (x, t), [slow, free], reps=3)
    assert "slow" not in [k.name for k in kept]
    assert dropped[0][0].name == "slow" and "without" in dropped[0][1]
    assert "forward" not in model.__dict__                        # every trial was removed


BAD_SOFTMAX = textwrap.dedent('''
    import torch
    import triton
    import triton.language as tl


    @triton.jit
    def _k(x_ptr, y_ptr, D, stride, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * stride + cols, mask=cols < D, other=-float("inf"))
        e = tl.exp((x - tl.max(x, 0)) * 1.05)          # a temperature no one asked for
        tl.store(y_ptr + row * D + cols, e / tl.sum(e, 0), mask=cols < D)


    def kernel_fn(x):
        x2 = x.reshape(-1, x.shape[-1])
        y = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
        _k[(x2.shape[0],)](x2, y, x2.shape[1], x2.stride(0), BLOCK=triton.next_power_of_2(x2.shape[1]))
        return y.view(x.shape)
''')


def test_check_finds_the_responsible_kernel_and_keeps_the_rest():
    from engine.models import RMSNorm
    torch.manual_seed(0)
    model = nn.Sequential(RMSNorm(16, 1e-5), nn.Softmax(dim=-1)).eval()
    good, bad = starter("rmsnorm", [(4, 16)]), starter("softmax", [(4, 16)], source=BAD_SOFTMAX)
    res = integrate.check(model, [(torch.randn(4, 16),)], [good, bad], "float32")
    assert res.status == "partial" and res.family_flags == {"rmsnorm": "ok", "softmax": "responsible"}
    assert [k.family for k in res.usable] == ["rmsnorm"] and res.max_error <= res.tolerance
    assert "softmax#1 alone" in res.detail
    res = integrate.check(model, [(torch.randn(4, 16),)], [bad], "float32")
    assert res.status == "failed" and res.usable == []


# ---- end to end: run, check, report, export, clean process --------------------------------------

CLEAN = textwrap.dedent('''
    import importlib.util, json, sys
    import torch
    try:
        import engine  # noqa: F401
        sys.exit("engine is importable: not a clean process")
    except ImportError:
        pass
    import nightshift_kernels as nk
    spec = importlib.util.spec_from_file_location("user_model", sys.argv[1])
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    model = eval(sys.argv[2], {"m": m, "torch": torch})
    inputs = torch.load(sys.argv[3])
    with torch.no_grad():
        fast = nk.apply(model)          # the rewritten graph: a new module, the model untouched
        out = fast(*inputs)
    out = out.logits if hasattr(out, "logits") else out
    torch.save(out, sys.argv[4])
    print(json.dumps(fast.stats()))
''')


def run_clean(export_dir, tmp_path, model_file, build_expr, inputs):
    """Apply the exported package in a fresh interpreter that can see only the export folder
    (plus site-packages); returns (output, stats)."""
    torch.save(inputs, tmp_path / "inputs.pt")
    script = tmp_path / "clean.py"
    script.write_text(CLEAN)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRITON_INTERPRET")}
    env["PYTHONPATH"] = str(export_dir)
    env["HF_HUB_OFFLINE"] = "1"
    r = subprocess.run([sys.executable, str(script), str(model_file), build_expr,
                        str(tmp_path / "inputs.pt"), str(tmp_path / "out.pt")],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return torch.load(tmp_path / "out.pt"), json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.slow   # two minutes: a run, its check, export and a clean process applying it
def test_own_rmsnorm_file_optimized_checked_exported_and_applied_in_a_clean_process(tmp_path):
    db = tmp_path / "runs.db"
    lines = []
    run_id = execute(RunConfig(model=f"{OWN}:TinyNet", families=["rmsnorm"], budget_experiments=2,
                               db=str(db), worker_timeout_s=300), log=lines.append)
    s = Store(db, readonly=True)
    prof = {p["family"]: p for p in s.profile(run_id)}
    assert prof["rmsnorm"]["calls"] == 3                       # T5StyleLayerNorm, by its graph
    assert any("captured by export" in e["message"] for e in s.events(run_id))
    check = s.e2e_checks(run_id)[0]
    assert check["status"] == "passed", check
    assert check["device"]["name"] == s.get_run(run_id)["device"]["name"]   # the machine that timed it
    # the second and third norms read residual sums: the fused contract's target, ranked first
    # and the one the two experiments go to; the first norm's plain target gets none
    assert check["family_flags"] == {'rmsnorm {"residual": true}': "ok"}, check["family_flags"]
    assert check["detail"].startswith("graph road")
    used = check["kernels_used"][0]
    assert used["calls"] == 2 and len(used["swapped"]) == 2     # two placed sites
    timings = {t["variant"]: t for t in s.e2e_timings(check["id"])}
    assert set(timings) == set(integrate.VARIANTS)
    assert timings["eager"]["latency_us"] > 0 and timings["optimized"]["latency_us"] > 0
    assert "interpreter timing" in timings["optimized"]["note"]
    assert timings["compile"]["latency_us"] is None and "skipped" in timings["compile"]["note"]
    assert any(l.startswith("end-to-end: passed") for l in lines)
    assert cli_main(["report", run_id, "--db", str(db), "--out", str(tmp_path / "r.md")]) == 0
    report = (tmp_path / "r.md").read_text()
    assert "End to end (check): **passed**" in report and "Amdahl projection" in report
    # the e2e command checks and times the same run again, as a new row; the first is kept
    assert cli_main(["e2e", run_id, "--db", str(db), "--compile", "off"]) == 0
    checks = Store(db, readonly=True).e2e_checks(run_id)
    assert [c["status"] for c in checks] == ["passed", "passed"] and checks[1]["id"] == check["id"]
    assert cli_main(["e2e", "no-such-run", "--db", str(db)]) == 2

    out_dir = tmp_path / "export"
    assert cli_main(["export", run_id, "--out", str(out_dir), "--db", str(db)]) == 0
    pkg = out_dir / "nightshift_kernels"
    best = s.experiment(s.targets(run_id)[0]["best_experiment_id"])
    kfile = f"rmsnorm_{best['seq']}.py"
    assert sorted(p.name for p in pkg.iterdir()) == sorted(
        ["README.md", "__init__.py", "_runtime.py", "manifest.json", kfile, "graph_0.py",
         "graph_0_specs.pkl"])
    assert (pkg / kfile).read_text() == best["source"]                    # verbatim
    for f in ("__init__.py", "_runtime.py", "graph_0.py"):                 # standalone
        assert not re.search(r"^\s*(from|import)\s+(engine|kernels)\b", (pkg / f).read_text(), re.M)
    assert 'OP_NAMESPACE = "nightshift_kernels"' in (pkg / "_runtime.py").read_text()
    manifest = json.loads((pkg / "manifest.json").read_text())
    assert manifest["kernels"][0]["shapes"] == [[2, 4, 64]] and manifest["kernels"][0]["dtype"] == "float32"
    (graph,) = manifest["graphs"]
    assert len(graph["sites"]) == 2 and graph["sites"][0]["args"][0][0] == [2, 4, 64]
    assert "site_call" in (pkg / "graph_0.py").read_text()
    assert "interpreter timings" in (pkg / "README.md").read_text().lower()
    assert cli_main(["export", run_id, "--out", str(out_dir), "--db", str(db)]) == 2   # exists

    # a fresh instance, in a process that cannot import the engine
    mod = sources.import_file(str(OWN))
    torch.manual_seed(123)
    fresh = mod.TinyNet(*mod.get_init_inputs()).eval()
    x = (torch.randn(2, 4, 64),)
    torch.manual_seed(123)
    with torch.no_grad():
        ref = fresh(*x)
        applied = integrate.optimize(fresh, db, run_id)
        ours = fresh(*x)
        applied.remove()
    out, stats = run_clean(out_dir, tmp_path, OWN, "(torch.manual_seed(123), m.TinyNet(*m.get_init_inputs()).eval())[1]", x)
    assert stats == {"placed": 1, "original": 0, "guard_miss": 0}
    # the graph road in this process too: a module for this signature, the original for others;
    # the same kernels as the clean process's, the same bits (the interception road above serves
    # plain contracts only: the residual norm's kernel is the graph road's)
    with torch.no_grad():
        fast = integrate.optimize(fresh, db, run_id, example_inputs=x)
        assert torch.equal(fast(*x), out) and fast.calls["placed"] == 1
        fast(torch.randn(3, 4, 64))
        assert fast.calls["original"] == 1
    assert torch.allclose(ours, ref, atol=1e-5, rtol=1e-5)
    assert torch.allclose(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.slow   # two minutes: HF LLaMA captured twice, checked, exported, applied
@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="transformers is not installed (requirements-dev.txt)")
def test_hf_llama_profiled_optimized_checked_and_exported(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    db = tmp_path / "runs.db"
    run_id = execute(RunConfig(model="hf:llama", input_shape="1x8", families=["rmsnorm"],
                               budget_experiments=1, db=str(db)), log=lambda s: None)
    s = Store(db, readonly=True)
    prof = {p["family"]: p for p in s.profile(run_id)}
    # the run asked for rmsnorm: LlamaRMSNorm (fp32 upcast) matched by the graph, five times
    assert prof["rmsnorm"]["calls"] == 5 and prof["rmsnorm"]["shapes"][0]["shape"] == [1, 8, 64]
    # with every family asked for, the same graph holds the gated MLP, SDPA with its repeat_kv
    # and the folded causal mask, rotate_half's rotary (q and k per layer), the projections
    from engine import capture, match
    loaded = sources.load("hf:llama", input_shape="1x8")
    cap = capture.capture(loaded.model, loaded.inputs)
    found = {}
    for g in cap.graphs:
        for m in match.find(g):
            found[m.family] = found.get(m.family, 0) + 1
    assert found["rmsnorm"] == 5 and found["fused_mlp"] == 2 and found["attention"] == 2
    # the q and k projections joined their rotations (rotary linear): v, o and the LM head stay
    assert found["rotary"] == 4 and found["matmul"] == 5, found
    check = s.e2e_checks(run_id)[0]
    # one experiment: the residual norms' target (four norms read residual sums), the first
    # layer's plain norm left to the original
    assert check["status"] == "passed" and check["kernels_used"][0]["calls"] == 4, check

    out_dir = tmp_path / "export"
    assert cli_main(["export", "latest", "--out", str(out_dir), "--db", str(db)]) == 0
    model_file = tmp_path / "hf_llama.py"
    cfg = sources.HF_PRESETS["llama"][2]
    model_file.write_text("import torch, transformers\n"
                          f"def build():\n    torch.manual_seed(5)\n"
                          f"    cfg = transformers.LlamaConfig(use_cache=False, **{cfg!r})\n"
                          f"    return transformers.LlamaForCausalLM(cfg).eval()\n")
    ids = (torch.randint(0, 256, (1, 8)),)
    mod = sources.import_file(str(model_file))
    fresh = mod.build()
    with torch.no_grad():
        ref = fresh(*ids).logits
    out, stats = run_clean(out_dir, tmp_path, model_file, "m.build()", ids)
    assert stats["placed"] == 1
    assert integrate.compare([out], [ref])[0] <= integrate.E2E_TOLERANCE["float32"]


@pytest.mark.slow   # two minutes: three KernelBench problems run, checked and scored
def test_kernelbench_three_problems(tmp_path, capsys):
    db = tmp_path / "kb.db"
    rc = cli_main(["kernelbench", str(PROBLEMS), "--level", "1", "--budget-experiments", "1",
                   "--trials", "2", "--db", str(db), "--out", str(tmp_path / "kb.md")])
    assert rc == 0
    text = (tmp_path / "kb.md").read_text()
    assert "Interpreter timings" in text
    rows = [l for l in text.splitlines() if l.startswith("| ") and ".py |" in l]
    assert len(rows) == 3
    for row, kernel in zip(rows, ("softmax#1", "layernorm#1", "rmsnorm#1")):
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[1] == kernel.split("#")[0] and cells[2] == "yes" and cells[3] == kernel, row
        assert float(cells[-1]) > 0                                   # seconds per problem
    assert "| vs eager | 0.00 | 0.00 | 0.00 |" in text          # interpreted kernels are slow
    assert "| vs torch.compile (best mode) | n/a | n/a | n/a | n/a |" in text
    s = Store(db, readonly=True)
    assert len(s.list_runs()) == 3
    assert all(s.e2e_checks(r["id"])[0]["kind"] == "kernelbench" for r in s.list_runs())


def test_kernelbench_fast_p_arithmetic():
    from engine.kernelbench import ProblemResult, fast_p, geomean
    rs = [ProblemResult("a", correct=True, eager_us=300, optimized_us=100, compile_us=150),
          ProblemResult("b", correct=True, eager_us=120, optimized_us=100, compile_us=90),
          ProblemResult("c", correct=False, eager_us=500, optimized_us=100, compile_us=500),
          ProblemResult("d", correct=True, eager_us=100, optimized_us=100)]
    assert fast_p(rs, "eager", 1.0) == 0.5 and fast_p(rs, "eager", 1.5) == 0.25
    assert fast_p(rs, "eager", 2.0) == 0.25 and fast_p(rs, "compile", 1.0) == 0.25
    assert fast_p(rs, "compile", 1.5) == 0.0
    assert geomean(rs, "eager") == pytest.approx((3.0 * 1.2 * 1.0) ** (1 / 3))
    assert geomean(rs, "compile") == pytest.approx((1.5 * 0.9) ** 0.5)
    # what the run hands back: b ships torch.compile (90 us), so against the faster baseline it
    # is 1x, not the 0.9x of its own kernels; a is 1.5x either way
    assert geomean(rs, "best") == pytest.approx((1.5 * 0.9) ** 0.5)
    assert geomean(rs, "best", handed_back=True) == pytest.approx(1.5 ** 0.5)
    assert fast_p(rs, "best", 1.0, handed_back=True) == 0.25


def test_reports_of_the_recorded_gpu_runs_say_where_the_kernels_help():
    """data/recorded_h200_e2e.db: the H200 end-to-end runs of docs/benchmarks.md."""
    from engine.report import run_markdown
    s = Store(ROOT / "data" / "recorded_h200_e2e.db", readonly=True)
    gpt2 = run_markdown(s, "20261201-055031-5fea85")
    assert "Under torch.compile the kernels give 0.882x: for this input, compile the original" in gpt2
    llama_b1 = run_markdown(s, "20261201-061548-5e6356")
    assert "Under torch.compile the kernels give 1.06x." in llama_b1
    assert "no less accurate" in llama_b1                   # the bf16 check against float32
    bert = run_markdown(s, "20261201-055237-305ba2")
    assert "Left out of the optimized model (it ran slower with them): softmax, layernorm." in bert


def test_recorded_gpt2_bert_checks_timed_on_an_h100_say_so_and_beat_compile():
    """data/recorded_h200_gpt2_bert.db: the runs' kernels were found on the H200, the end-to-end
    stage timed again on an H100 in every compile mode (docs/benchmarks.md): each such check
    names its GPU, gives no compiled projection across machines, and ships compile of the
    optimized model at >= 1.1x the fastest compile mode of the same process."""
    from app import data
    from engine.report import run_markdown
    s = Store(ROOT / "data" / "recorded_h200_gpt2_bert.db", readonly=True)
    try:
        for run_id in ("20261205-171950-baaacc", "20261205-172403-26b958"):
            text = run_markdown(s, run_id)
            assert ("This check was timed on NVIDIA H100 80GB HBM3 (torch 2.11.0+cu130, triton "
                    "3.6.0); the run's kernels were found and tuned on NVIDIA H200.") in text
            assert "(the projection is from the run's GPU)" in text
            assert "Amdahl over compile's forward" not in text
            h100 = [c for c in s.e2e_checks(run_id) if c.get("device")]
            assert h100
            for c in h100:
                by = {t["variant"]: t["latency_us"] for t in s.e2e_timings(c["id"])}
                assert by["compile"] / by["compile_optimized"] >= 1.1, (run_id, c["id"], by)
            frame = data.e2e_frame(s, run_id)
            assert frame.iloc[-1]["elsewhere"].startswith("timed on NVIDIA H100")
            assert frame.iloc[0]["elsewhere"] == ""               # the run's own H200 check
            assert "timed on NVIDIA H100" in frame.iloc[-1]["label"]
    finally:
        s.close()


def test_recorded_llama3_8b_1x2048_run_ships_compile_max_autotune():
    """data/recorded_h100_llama3_8b_1x2048.db (docs/benchmarks.md): transformers' LLaMA at
    LLaMA-3-8B's widths, 1x2048, on an H100: no kernel beat compile's op by more than the noise
    but RMSNorm's, compile of the optimized model ran slower than compile, and compile ships."""
    from engine.report import run_markdown
    s = Store(ROOT / "data" / "recorded_h100_llama3_8b_1x2048.db", readonly=True)
    try:
        text = run_markdown(s, s.list_runs()[0]["id"])
    finally:
        s.close()
    assert ("Never placed (slower than their baseline, the faster of eager and torch.compile): "
            "matmul, fused_mlp, attention, rotary.") in text
    assert "| compile | 6124.5 | 1.27x | shipped: the fastest variant; best mode max-autotune;" in text
    assert "Under torch.compile the kernels give 0.977x: for this input, compile the original" in text


def test_kernelbench_says_when_no_experiment_ran(tmp_path):
    """A target with zero experiments (the scoring's reserve took the problem's budget) is not
    "no candidate passed the verifier": the two call for different fixes."""
    from engine.kernelbench import _why_nothing
    s = Store(tmp_path / "kb.db")
    run = s.create_run("p.py", {}, {}, "interpreter", None)
    s.add_target(run, "matmul", "float32", [{"shape": [64, 64, 64]}], 1.0)
    note = "the scoring was estimated at 65 s of the 60 s budget, the run got 0 s"
    assert _why_nothing(s, run, [], None, note) == "no experiment ran: " + note
    assert _why_nothing(s, run, [], None) == "no experiment ran: the budget ended first"
    # candidates that ran and failed: the stage and the first one's reason, in the one line
    tid = s.targets(run)[0]["id"]
    for i in range(2):
        s.record_experiment(dict(run_id=run, target_id=tid, family="matmul", proposer="search",
                                 hypothesis="h", source="def kernel_fn(): pass", source_hash=f"h{i}",
                                 state="failed", failed_stage="shape_sweep", timing_mode="interpreter",
                                 error="out of memory at shape=[9, 9]\ndetail"), [])
    assert _why_nothing(s, run, [], None) == ("no candidate passed the verifier: 2 failed "
                                              "(shape sweep), the first: out of memory at shape=[9, 9]")


def test_recorded_bert_run_ships_compile_and_places_nothing_slower():
    """data/recorded_h200_bert.db: the H200 run of docs/benchmarks.md (hf:bert-1b, 8x512)."""
    from engine.report import run_markdown
    s = Store(ROOT / "data" / "recorded_h200_bert.db", readonly=True)
    text = run_markdown(s, s.list_runs()[0]["id"])
    assert "Never placed (slower than their baseline, the faster of eager and torch.compile): attention, matmul." in text
    assert "shipped: the fastest variant; best mode reduce-overhead" in text


def test_recorded_fp32_gemm_runs_place_only_kernels_that_passed_and_beat_their_baseline():
    """data/recorded_h200_kernelbench_gemm.db: KernelBench level 1's fp32 GEMM problems at
    2.5-minute budgets on the H200 (docs/benchmarks.md). Six place the tf32x3 matmul and pass
    KernelBench's check (5 fresh trials, 1e-4); small-K 7 places nothing: its best was slower
    than its baseline."""
    from engine.report import run_markdown
    s = Store(ROOT / "data" / "recorded_h200_kernelbench_gemm.db", readonly=True)
    texts = {r["model"].rsplit("/", 1)[-1]: run_markdown(s, r["id"]) for r in s.list_runs()}
    assert len(texts) == 7
    placed = [p for p, t in texts.items() if "graph road: kernels served matmul#" in t]
    assert sorted(placed) == sorted(p for p in texts if not p.startswith("7_"))
    for p in placed:
        assert "End to end (kernelbench): **passed**" in texts[p], p
        err = float(re.search(r"passed\*\*, max error ([0-9.e+-]+)", texts[p]).group(1))
        assert err < 1e-5, (p, err)          # tf32x3: fp32's accuracy, not TF32's ~1e-3
    assert "nothing placed: the optimized model is the original" in texts["7_Matmul_with_small_K_dimension_.py"]
