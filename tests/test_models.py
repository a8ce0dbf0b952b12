"""The model zoo: tiny models build and run on CPU, inputs and errors are right."""
import dataclasses

import pytest
import torch

from engine import models
from engine.models import BadInputShape, UnknownModel, build, parse_input_shape

TINY = ("gpt2-tiny", "llama-tiny", "bert-tiny")
VOCAB = {"gpt2-tiny": 256, "llama-tiny": 256, "bert-tiny": 512}


@pytest.mark.parametrize("name", TINY)
def test_tiny_forward_with_and_without_targets(name):
    model, (ids, targets) = build(name)
    assert not model.training
    assert ids.shape == targets.shape == (2, 32) and ids.dtype == targets.dtype == torch.int64
    with torch.no_grad():
        logits = model(ids)
        loss = model(ids, targets)
    assert logits.shape == (2, 32, VOCAB[name]) and logits.dtype == torch.float32
    assert loss.shape == () and torch.isfinite(loss)
    # random init, so the loss is near ln(V): a sanity check that the loss is a mean over tokens
    assert abs(loss.item() - torch.log(torch.tensor(float(VOCAB[name]))).item()) < 1.0


@pytest.mark.parametrize("name", TINY)
def test_deterministic_with_seed(name):
    m1, in1 = build(name, seed=3)
    m2, in2 = build(name, seed=3)
    m3, in3 = build(name, seed=4)
    assert all(torch.equal(a, b) for a, b in zip(in1, in2))
    with torch.no_grad():
        assert torch.equal(m1(*in1), m2(*in2))
        assert not torch.equal(m1(in1[0]), m3(in1[0]))
    assert not torch.equal(in1[0], in3[0])


def test_input_shape_and_dtype():
    model, (ids, targets) = build("gpt2-tiny", input_shape=(3, 7), dtype=torch.bfloat16)
    assert ids.shape == (3, 7)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    with torch.no_grad():
        assert model(ids).shape == (3, 7, 256) and model(ids).dtype == torch.bfloat16
    _, (ids, _) = build("bert-tiny", input_shape="1x64")   # exactly the context: allowed
    assert ids.shape == (1, 64)


def test_bert_labels_ignore_index():
    _, (_, labels) = build("bert-tiny")
    ignored = (labels == -100)
    assert ignored.any() and (~ignored).any()
    assert ((labels[~ignored] >= 0) & (labels[~ignored] < 512)).all()


def test_bert_attention_mask_changes_output():
    model, (ids, _) = build("bert-tiny")
    mask = torch.ones_like(ids)
    mask[:, 20:] = 0
    with torch.no_grad():
        full, masked = model(ids), model(ids, attention_mask=mask)
    assert not torch.allclose(full[:, :20], masked[:, :20])


def test_llama_sdpa_matches_eager():
    m_eager, inputs = build("llama-tiny")
    m_sdpa, _ = build("llama-tiny", attn_impl="sdpa")
    with torch.no_grad():
        torch.testing.assert_close(m_eager(inputs[0]), m_sdpa(inputs[0]), atol=1e-5, rtol=1e-4)


def test_llama_tiny_structure():
    model, _ = build("llama-tiny")
    cfg = model.cfg
    assert (cfg.n_head, cfg.n_kv_head, cfg.d_model) == (4, 2, 64)
    attn = model.layers[0].attn
    assert attn.k_proj.out_features == 2 * 16 and attn.q_proj.out_features == 4 * 16   # GQA
    assert type(model.norm).__name__ == "RMSNorm"


def test_rotary_rotate_half():
    from engine.models import apply_rotary, rotary_tables
    cos, sin = rotary_tables(8, 16, 10000.0)
    x = torch.randn(1, 2, 16, 8)
    y = apply_rotary(x, cos, sin)
    torch.testing.assert_close(y[:, :, 0], x[:, :, 0])                    # position 0: no rotation
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))            # rotations keep the norm
    # rotate-half pairs dim i with i + Dh/2
    i, half = 1, 4
    a, b, c, s = x[..., 3, i], x[..., 3, i + half], cos[3, i], sin[3, i]
    torch.testing.assert_close(y[..., 3, i], a * c - b * s)
    torch.testing.assert_close(y[..., 3, i + half], b * c + a * s)


def test_unknown_model():
    with pytest.raises(UnknownModel) as e:
        build("gpt3")
    msg = str(e.value)
    assert "gpt3" in msg and all(n in msg for n in models.MODEL_NAMES) and "\n" not in msg
    with pytest.raises(ValueError):       # UnknownModel is a ValueError
        models.describe("nope")


@pytest.mark.parametrize("text,expected", [("2x32", (2, 32)), ("2,32", (2, 32)), (" 1 X 2048 ", (1, 2048))])
def test_parse_input_shape(text, expected):
    assert parse_input_shape(text) == expected


@pytest.mark.parametrize("text", ["", "2", "2x", "x32", "0x32", "2x0", "-1x32", "2x-3", "2.5x32", "axb",
                                  "2x32x4", "2 32"])
def test_parse_input_shape_rejects(text):
    with pytest.raises(BadInputShape) as e:
        parse_input_shape(text)
    assert "BATCHxSEQ" in str(e.value) and "\n" not in str(e.value)


def test_build_rejects_bad_shapes():
    with pytest.raises(BadInputShape, match="context of 64"):
        build("gpt2-tiny", input_shape=(1, 65))
    with pytest.raises(BadInputShape, match="context of 1024"):
        build("gpt2", input_shape=(1, 1025))          # raised before any weight is made
    for bad in [(0, 4), (2,), (2, 3, 4), (2, -1), "0x4"]:
        with pytest.raises(BadInputShape):
            build("llama-tiny", input_shape=bad)


def test_overrides():
    model, _ = build("llama-tiny", n_layer=1, attn_impl="sdpa")
    assert len(model.layers) == 1 and model.cfg.attn_impl == "sdpa"
    with pytest.raises(ValueError, match="valid keys: .*n_layer") as e:
        build("llama-tiny", n_layers=1)
    assert "n_layers" in str(e.value)
    with pytest.raises(ValueError, match="attn_impl"):
        build("llama-tiny", attn_impl="flash")
    with pytest.raises(ValueError, match="n_kv_head"):
        build("llama-tiny", n_kv_head=3)


def test_configs_are_dataclasses():
    for name in models.MODEL_NAMES:
        assert dataclasses.is_dataclass(models.config(name))


def test_full_size_param_counts_on_meta():
    # Full-size models are only counted, on the meta device: no memory, no compute.
    assert abs(models.count_params("gpt2") - 124.44e6) < 0.1e6          # GPT-2 small, tied head
    assert abs(models.count_params("bert") - 109.5e6) < 0.5e6           # BERT-base + MLM head
    d, f, v, kv = 4096, 14336, 32000, 1024
    per_layer = 2 * d * d + 2 * d * kv + 3 * d * f + 2 * d
    assert models.count_params("llama") == 2 * per_layer + 2 * v * d + d
    model, (ids, _) = build("llama", device="meta")
    assert ids.shape == (1, 2048) and ids.device.type == "meta"


def test_describe_one_line():
    for name in models.MODEL_NAMES:
        line = models.describe(name)
        assert line.startswith(name + ":") and "\n" not in line and "params" in line
