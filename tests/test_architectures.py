"""Architectures as their authors wrote them: transformers models built from small configs
(random weights, nothing downloaded), captured, matched and cut into regions; every target's
starter (family or generated) is placed at once and the rewritten model must agree with the
original. A model's spellings (rotary in four layouts, ALiBi, soft-capping, DeBERTa's 0-dim
scale, windowed attention, grouped convolutions, casts to float32 around norms) are what this
exercises, not our own test modules."""
from __future__ import annotations

import hashlib
import importlib.util

import pytest
import torch

pytestmark = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                reason="transformers is not installed (requirements-dev.txt)")

TXT = dict(vocab_size=128, hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
           intermediate_size=128, max_position_embeddings=64)
IMG = dict(hidden_size=64, num_hidden_layers=1, num_attention_heads=4, intermediate_size=128,
           image_size=32, patch_size=8)
# name: (config class, model class, config kwargs); text models take token ids [2, 16],
# vision models images [2, 3, 32, 32]
ARCH = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(TXT, num_key_value_heads=2)),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(TXT, num_key_value_heads=2, head_dim=16)),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(vocab_size=128, n_embd=64, n_layer=1, n_head=4,
                                                   n_positions=64)),
    "bloom": ("BloomConfig", "BloomForCausalLM", dict(vocab_size=128, hidden_size=64, n_layer=1,
                                                      n_head=4)),
    "deberta_v2": ("DebertaV2Config", "DebertaV2Model", dict(TXT)),
    "t5_encoder": ("T5Config", "T5EncoderModel", dict(vocab_size=128, d_model=64, d_kv=16, d_ff=128,
                                                     num_layers=1, num_heads=4)),
    "swin": ("SwinConfig", "SwinModel", dict(image_size=32, patch_size=4, embed_dim=16,
                                             depths=[1, 1], num_heads=[2, 2], window_size=4)),
    "resnet": ("ResNetConfig", "ResNetModel", dict(hidden_sizes=[16, 32], depths=[1, 1],
                                                   embedding_size=16, layer_type="basic")),
    # slow: the rest (docs/graph.md: all agree)
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(TXT, num_key_value_heads=2, head_dim=16)),
    "phi": ("PhiConfig", "PhiForCausalLM", dict(TXT)),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", dict(TXT)),
    "gptj": ("GPTJConfig", "GPTJForCausalLM", dict(vocab_size=128, n_embd=64, n_layer=1, n_head=4,
                                                   rotary_dim=8, n_positions=64)),
    "falcon": ("FalconConfig", "FalconForCausalLM", dict(vocab_size=128, hidden_size=64,
                                                         num_hidden_layers=1, num_attention_heads=4)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(TXT, num_key_value_heads=2,
                                                            num_local_experts=4, num_experts_per_tok=2)),
    "opt": ("OPTConfig", "OPTForCausalLM", dict(vocab_size=128, hidden_size=64, num_hidden_layers=1,
                                                num_attention_heads=4, ffn_dim=128,
                                                max_position_embeddings=64, word_embed_proj_dim=64)),
    "albert": ("AlbertConfig", "AlbertModel", dict(TXT, embedding_size=32)),
    "beit": ("BeitConfig", "BeitModel", dict(IMG)),
    "clip_vision": ("CLIPVisionConfig", "CLIPVisionModel", dict(IMG)),
    "segformer": ("SegformerConfig", "SegformerModel", dict(
        hidden_sizes=[16, 32], depths=[1, 1], num_encoder_blocks=2, num_attention_heads=[1, 2],
        sr_ratios=[2, 1], patch_sizes=[7, 3], strides=[4, 2], decoder_hidden_size=32)),
    "levit": ("LevitConfig", "LevitModel", dict(image_size=32, hidden_sizes=[32, 48, 64],
                                                num_attention_heads=[1, 2, 2], depths=[1, 1, 1],
                                                key_dim=[8, 8, 8])),
    "mobilenet_v2": ("MobileNetV2Config", "MobileNetV2Model", dict(image_size=32,
                                                                   depth_multiplier=0.25)),
    "convnext": ("ConvNextConfig", "ConvNextModel", dict(hidden_sizes=[16, 32], depths=[1, 1],
                                                         num_stages=2, image_size=32)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(TXT, num_key_value_heads=2)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(TXT, num_key_value_heads=2)),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", dict(TXT, num_key_value_heads=1, head_dim=16)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(TXT, num_key_value_heads=2, pad_token_id=0)),
    "stablelm": ("StableLmConfig", "StableLmForCausalLM", dict(TXT, num_key_value_heads=2)),
    "olmo": ("OlmoConfig", "OlmoForCausalLM", dict(TXT, pad_token_id=0)),
    "starcoder2": ("Starcoder2Config", "Starcoder2ForCausalLM", dict(TXT, num_key_value_heads=2)),
    "bert": ("BertConfig", "BertModel", dict(TXT)),
    "roberta": ("RobertaConfig", "RobertaModel", dict(TXT, pad_token_id=1)),
    "distilbert": ("DistilBertConfig", "DistilBertModel", dict(
        vocab_size=128, dim=64, n_layers=1, n_heads=4, hidden_dim=128, max_position_embeddings=64)),
    "electra": ("ElectraConfig", "ElectraModel", dict(TXT, embedding_size=32)),
    "vit": ("ViTConfig", "ViTModel", dict(IMG)),
    "deit": ("DeiTConfig", "DeiTModel", dict(IMG)),
    "dinov2": ("Dinov2Config", "Dinov2Model", dict(hidden_size=64, num_hidden_layers=1,
                                                   num_attention_heads=4, image_size=32, patch_size=8)),
    "mobilevit": ("MobileViTConfig", "MobileViTModel", dict(
        image_size=32, hidden_sizes=[16, 24, 32], neck_hidden_sizes=[8, 8, 16, 16, 24, 24, 32])),
    "regnet": ("RegNetConfig", "RegNetModel", dict(hidden_sizes=[16, 32], depths=[1, 1],
                                                   embedding_size=16, groups_width=8)),
    # state-space and recurrent mixers, mixtures of experts, encoder-decoders, audio, more
    # vision backbones (2026-12-04: all placed and agreeing)
    "mamba": ("MambaConfig", "MambaModel", dict(vocab_size=128, hidden_size=64, num_hidden_layers=1,
                                                 state_size=8, expand=2)),
    "mamba2": ("Mamba2Config", "Mamba2Model", dict(vocab_size=128, hidden_size=64, num_hidden_layers=1,
                                                    state_size=8, expand=2, num_heads=8, head_dim=16,
                                                    n_groups=1, chunk_size=8)),
    "rwkv": ("RwkvConfig", "RwkvModel", dict(vocab_size=128, hidden_size=64, num_hidden_layers=2,
                                              attention_hidden_size=64, intermediate_size=128,
                                              context_length=64)),
    "recurrent_gemma": ("RecurrentGemmaConfig", "RecurrentGemmaModel", dict(
        vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128, lru_width=64, attention_window_size=16,
        block_types=["recurrent", "attention"])),
    "jamba": ("JambaConfig", "JambaModel", dict(TXT, num_key_value_heads=2, num_experts=2,
                                                num_experts_per_tok=1, attn_layer_period=1,
                                                attn_layer_offset=0, expert_layer_period=1,
                                                expert_layer_offset=0, mamba_d_state=8,
                                                mamba_expand=2, use_mamba_kernels=False)),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeModel", dict(TXT, num_key_value_heads=2, num_experts=4,
                                                          num_experts_per_tok=2, moe_intermediate_size=32,
                                                          shared_expert_intermediate_size=64)),
    "olmoe": ("OlmoeConfig", "OlmoeModel", dict(TXT, num_key_value_heads=2, num_experts=4,
                                                num_experts_per_tok=2)),
    "bart": ("BartConfig", "BartModel", dict(vocab_size=128, d_model=64, encoder_layers=1,
                                             decoder_layers=1, encoder_attention_heads=4,
                                             decoder_attention_heads=4, encoder_ffn_dim=128,
                                             decoder_ffn_dim=128, max_position_embeddings=64)),
    "xlm_roberta": ("XLMRobertaConfig", "XLMRobertaModel", dict(TXT, pad_token_id=1)),
    "gpt_bigcode": ("GPTBigCodeConfig", "GPTBigCodeModel", dict(vocab_size=128, n_embd=64, n_layer=1,
                                                                n_head=4, n_positions=64)),
    "codegen": ("CodeGenConfig", "CodeGenModel", dict(vocab_size=128, n_embd=64, n_layer=1, n_head=4,
                                                      n_positions=64, rotary_dim=8)),
    "biogpt": ("BioGptConfig", "BioGptModel", dict(TXT)),
    "mpt": ("MptConfig", "MptModel", dict(vocab_size=128, d_model=64, n_layers=1, n_heads=4,
                                          max_seq_len=64)),
    "wav2vec2": ("Wav2Vec2Config", "Wav2Vec2Model", dict(
        hidden_size=64, num_hidden_layers=1, num_attention_heads=4, intermediate_size=128,
        conv_dim=[16, 16], conv_stride=[5, 2], conv_kernel=[10, 3], num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4, feat_extract_norm="group")),
    "bit": ("BitConfig", "BitModel", dict(hidden_sizes=[16, 32], depths=[1, 1], embedding_size=16,
                                          layer_type="bottleneck", num_groups=4)),
    "convnextv2": ("ConvNextV2Config", "ConvNextV2Model", dict(hidden_sizes=[16, 32], depths=[1, 1],
                                                               num_stages=2, image_size=32)),
    "poolformer": ("PoolFormerConfig", "PoolFormerModel", dict(
        hidden_sizes=[16, 32], depths=[1, 1], num_encoder_blocks=2, patch_sizes=[7, 3],
        strides=[4, 2], padding=[2, 1])),
    "focalnet": ("FocalNetConfig", "FocalNetModel", dict(image_size=32, patch_size=4, embed_dim=16,
                                                         depths=[1, 1], focal_levels=[2, 2],
                                                         focal_windows=[3, 3])),
    "siglip_vision": ("SiglipVisionConfig", "SiglipVisionModel", dict(IMG)),
    # more decoders (multi-head latent attention, sliding windows, QK norms, parallel blocks),
    # encoders with convolutions or relative positions, hierarchical vision, speech
    # (2026-12-05: all placed and agreeing)
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM", dict(
        TXT, num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=32, first_k_dense_replace=0, kv_lora_rank=16, q_lora_rank=32,
        qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, n_group=1, topk_group=1)),
    "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(TXT, num_key_value_heads=2, head_dim=16,
                                                                 sliding_window=8)),
    "cohere": ("CohereConfig", "CohereForCausalLM", dict(TXT, num_key_value_heads=2)),
    "nemotron": ("NemotronConfig", "NemotronForCausalLM", dict(TXT, num_key_value_heads=2, head_dim=16)),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", dict(TXT, num_key_value_heads=2, pad_token_id=0)),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(
        TXT, num_key_value_heads=2, head_dim=16, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=32)),
    "funnel": ("FunnelConfig", "FunnelBaseModel", dict(vocab_size=128, d_model=64, n_head=4, d_head=16,
                                                       d_inner=128, block_sizes=[1, 1],
                                                       num_decoder_layers=1)),
    "convbert": ("ConvBertConfig", "ConvBertModel", dict(TXT, embedding_size=64)),
    "esm": ("EsmConfig", "EsmModel", dict(TXT, pad_token_id=1, position_embedding_type="rotary")),
    "data2vec_vision": ("Data2VecVisionConfig", "Data2VecVisionModel", dict(
        IMG, use_relative_position_bias=True)),
    "swinv2": ("Swinv2Config", "Swinv2Model", dict(image_size=32, patch_size=4, embed_dim=16,
                                                   depths=[1, 1], num_heads=[2, 2], window_size=4)),
    "pvt_v2": ("PvtV2Config", "PvtV2Model", dict(image_size=32, hidden_sizes=[16, 32], depths=[1, 1],
                                                 num_encoder_blocks=2, num_attention_heads=[1, 2],
                                                 sr_ratios=[2, 1], patch_sizes=[7, 3], strides=[4, 2],
                                                 mlp_ratios=[2, 2])),
    "wavlm": ("WavLMConfig", "WavLMModel", dict(
        hidden_size=64, num_hidden_layers=1, num_attention_heads=4, intermediate_size=128,
        conv_dim=[16, 16], conv_stride=[5, 2], conv_kernel=[10, 3], num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4, num_buckets=32, max_bucket_distance=64)),
    # decoders of 2025-26 (QK norms, attention sinks, differential attention, hybrid short
    # convolutions, ternary weights, MoE routers, an encoder with alternating local attention),
    # hierarchical and mobile vision (2026-12-06: all placed and agreeing)
    "granite": ("GraniteConfig", "GraniteForCausalLM", dict(TXT, num_key_value_heads=2)),
    "glm": ("GlmConfig", "GlmForCausalLM", dict(TXT, pad_token_id=0, num_key_value_heads=2, head_dim=16)),
    "glm4": ("Glm4Config", "Glm4ForCausalLM", dict(TXT, pad_token_id=0, num_key_value_heads=2,
                                                   head_dim=16)),
    "helium": ("HeliumConfig", "HeliumForCausalLM", dict(TXT, num_key_value_heads=2, head_dim=16)),
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", dict(TXT, pad_token_id=0, num_key_value_heads=2)),
    "arcee": ("ArceeConfig", "ArceeForCausalLM", dict(TXT, num_key_value_heads=2)),
    "exaone4": ("Exaone4Config", "Exaone4ForCausalLM", dict(TXT, num_key_value_heads=2)),
    "ernie4_5": ("Ernie4_5Config", "Ernie4_5ForCausalLM", dict(TXT, num_key_value_heads=2, head_dim=16)),
    "diffllama": ("DiffLlamaConfig", "DiffLlamaForCausalLM", dict(TXT, num_key_value_heads=2)),
    "olmo3": ("Olmo3Config", "Olmo3ForCausalLM", dict(TXT, num_key_value_heads=2, pad_token_id=0)),
    "apertus": ("ApertusConfig", "ApertusForCausalLM", dict(TXT, num_key_value_heads=2)),
    "seed_oss": ("SeedOssConfig", "SeedOssForCausalLM", dict(TXT, num_key_value_heads=2, head_dim=16)),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM", dict(TXT, num_key_value_heads=2, head_dim=16,
                                                         num_local_experts=4, num_experts_per_tok=2,
                                                         sliding_window=8)),
    "llama4_text": ("Llama4TextConfig", "Llama4ForCausalLM", dict(
        TXT, num_key_value_heads=2, head_dim=16, num_local_experts=2, num_experts_per_tok=1,
        intermediate_size_mlp=128)),
    "doge": ("DogeConfig", "DogeForCausalLM", dict(TXT, num_key_value_heads=2)),
    "hunyuan_dense": ("HunYuanDenseV1Config", "HunYuanDenseV1ForCausalLM", dict(
        TXT, num_key_value_heads=2, head_dim=16)),
    "lfm2": ("Lfm2Config", "Lfm2ForCausalLM", dict(TXT, num_key_value_heads=2, num_hidden_layers=2,
                                                   layer_types=["conv", "full_attention"])),
    "bitnet": ("BitNetConfig", "BitNetForCausalLM", dict(TXT, num_key_value_heads=2)),
    "modernbert": ("ModernBertConfig", "ModernBertModel", dict(TXT, num_hidden_layers=2,
                                                               local_attention=8, pad_token_id=0)),
    "hiera": ("HieraConfig", "HieraModel", dict(
        image_size=[32, 32], patch_size=[4, 4], patch_stride=[2, 2], patch_padding=[1, 1],
        embed_dim=16, depths=[1, 1], num_heads=[1, 2], query_stride=[2, 2],
        masked_unit_size=[4, 4], num_query_pool=1, mlp_ratio=2.0)),
    "efficientnet": ("EfficientNetConfig", "EfficientNetModel", dict(
        image_size=32, width_coefficient=0.25, depth_coefficient=0.25, hidden_dim=320)),
}
QUICK = ("llama", "bloom", "deberta_v2", "t5_encoder", "resnet")
VISION = {"swin", "resnet", "beit", "clip_vision", "segformer", "levit", "mobilenet_v2", "convnext",
          "vit", "deit", "dinov2", "mobilevit", "regnet", "bit", "convnextv2", "poolformer",
          "focalnet", "siglip_vision", "data2vec_vision", "swinv2", "pvt_v2", "hiera",
          "efficientnet"}
AUDIO = {"wav2vec2", "wavlm"}                # raw waveforms [2, 800]
# models whose initial weights make the output constant at these sizes (a comparison that
# proves nothing): their parameters get seeded noise
PERTURB = {"mobilevit", "efficientnet"}


def _build(name):
    import transformers
    cfg_cls, model_cls, kw = ARCH[name]
    if not hasattr(transformers, model_cls):      # newer than the transformers installed
        pytest.skip(f"{model_cls} is not in transformers {transformers.__version__}")
    cfg = getattr(transformers, cfg_cls)(**kw)
    if hasattr(cfg, "use_cache"):
        cfg.use_cache = False
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(cfg).eval()
    g = torch.Generator().manual_seed(1)
    if name in PERTURB:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.1 * torch.randn(p.shape, generator=g))
    if name in VISION:
        return model, (torch.randn(2, 3, 32, 32, generator=g),)
    if name in AUDIO:
        return model, (torch.randn(2, 800, generator=g),)
    return model, (torch.randint(0, 128, (2, 16), generator=g),)


def _starters(targets) -> list:
    """Each target's starter as a kept kernel would be recorded (verified for its shapes)."""
    import kernels
    from engine import integrate, verify
    out = []
    for i, t in enumerate(targets):
        fam = kernels.get(t.family, t.spec or None)
        src = fam.for_target(t.shapes[0]["shape"], t.dtype).starter()
        assert verify.static_check(src, fam.arg_names) is None, (t.label or t.family)
        out.append(integrate.KernelRecord(
            family=t.family, experiment_id=i, seq=i, source=src,
            source_hash=hashlib.sha256(src.encode()).hexdigest(), dtype=t.dtype,
            shapes=[list(s["shape"]) for s in t.shapes],
            tolerance=tuple(fam.tolerance[getattr(torch, t.dtype)]), device_type="cpu",
            spec=dict(t.spec or {})))
    return out


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n in QUICK else pytest.mark.slow)
                                  for n in ARCH])
def test_every_starter_placed_at_once_keeps_the_models_output(name):
    from engine import capture, integrate, match, place, regions
    from engine import profile as profiler
    model, inputs = _build(name)
    cap = capture.capture(model, inputs)
    assert cap.ok, cap.note
    matches = {g.index: match.find(g) for g in cap.graphs}
    regs = {g.index: regions.find(g, matches[g.index]).regions for g in cap.graphs}
    gp = profiler.profile_graph(cap, matches, warmup=0, iters=1, regions=regs)
    assert gp.targets
    kernels = integrate.load(_starters(gp.targets))
    pl = place.place(cap, kernels, matches)
    # every target's kernel took at least one site (a target stands for its top shapes only)
    placed = {(s["family"], s["pattern"]) for s in pl.sites}
    assert len(pl.sites) >= len(gp.targets), pl.skipped
    assert {t.label or t.family for t in gp.targets if t.family == "region"} <= {
        p for f, p in placed if f == "region"}
    opt = place.optimized(cap, pl)
    with torch.no_grad():
        ref, got = model(*inputs), opt(*inputs)
    assert opt.calls == {"placed": 1, "original": 0, "guard_miss": 0}
    err, where = integrate.compare(integrate.flatten(got), integrate.flatten(ref))
    assert err <= 2e-5, where
    assert all(float(t.std()) > 0 for t in integrate.flatten(ref)
               if t.is_floating_point() and t.numel() > 1), "a constant output compares nothing"
