"""Built-in model zoo: GPT-2, a LLaMA-style decoder and BERT, plus tiny versions for CPU runs.

These are our own small, readable implementations. They exist so the profiler has real
workloads whose structure we control; they are written the way models in the wild are written
(eager PyTorch, composite RMSNorm, explicit softmax attention) because that is what the
optimizer is meant to find and replace.

Conventions: shapes are written [B, S, D] (batch, sequence, model width); H heads of width Dh;
Hkv key/value heads (grouped-query attention); V vocabulary; F the MLP's inner width.

Public API: MODEL_NAMES, build(), example_inputs(), describe(), parse_input_shape(), UnknownModel,
BadInputShape, the config dataclasses GPT2Config, LlamaConfig, BertConfig, and load_source(), which
takes any model spec (built-in, hf:NAME, path/to/file.py[:Name]; engine/sources.py).
"""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

MODEL_NAMES = ("gpt2", "gpt2-tiny", "llama", "llama-tiny", "bert", "bert-tiny")


class UnknownModel(ValueError):
    """A model name not in MODEL_NAMES."""


class BadInputShape(ValueError):
    """An input shape that is malformed, not positive, or longer than the model's context."""


# ---- configs --------------------------------------------------------------------------------

@dataclass
class GPT2Config:
    n_layer: int = 12
    n_head: int = 12
    d_model: int = 768
    vocab_size: int = 50257
    n_ctx: int = 1024          # learned position embeddings: the longest sequence, in tokens
    ln_eps: float = 1e-5

    def __post_init__(self):
        _check_heads(self.d_model, self.n_head)

    @property
    def max_seq(self) -> int:
        return self.n_ctx


@dataclass
class LlamaConfig:
    n_layer: int = 2           # the full 32-layer stack is ~7B params; 2 layers keep the same shapes
    n_head: int = 32
    n_kv_head: int = 8         # grouped-query attention: each K/V head serves n_head // n_kv_head q heads
    d_model: int = 4096
    ffn_dim: int = 14336
    vocab_size: int = 32000
    max_seq: int = 4096        # length of the precomputed rotary cos/sin tables, in tokens
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5
    attn_impl: str = "eager"   # "eager": q @ k^T, softmax, @ v;  "sdpa": F.scaled_dot_product_attention

    def __post_init__(self):
        _check_heads(self.d_model, self.n_head)
        if self.n_kv_head < 1 or self.n_head % self.n_kv_head:
            raise ValueError(f"n_head ({self.n_head}) must be a multiple of n_kv_head ({self.n_kv_head})")
        if (self.d_model // self.n_head) % 2:
            raise ValueError(f"rotary embeddings need an even head width, got {self.d_model // self.n_head}")
        if self.attn_impl not in ("eager", "sdpa"):
            raise ValueError(f"attn_impl must be 'eager' or 'sdpa', got {self.attn_impl!r}")


@dataclass
class BertConfig:
    n_layer: int = 12
    n_head: int = 12
    d_model: int = 768
    ffn_dim: int = 3072
    vocab_size: int = 30522
    max_pos: int = 512         # learned position embeddings: the longest sequence, in tokens
    type_vocab_size: int = 2
    ln_eps: float = 1e-12

    def __post_init__(self):
        _check_heads(self.d_model, self.n_head)

    @property
    def max_seq(self) -> int:
        return self.max_pos


def _check_heads(d_model: int, n_head: int) -> None:
    if n_head < 1 or d_model % n_head:
        raise ValueError(f"d_model ({d_model}) must be a multiple of n_head ({n_head})")


def _init_weights(module: nn.Module) -> None:
    # GPT-2/BERT style init (normal, std 0.02) keeps activations at realistic magnitudes, so
    # softmax and cross-entropy inputs look like a trained model's rather than saturating.
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


# ---- GPT-2 ----------------------------------------------------------------------------------

class GPT2Attention(nn.Module):
    def __init__(self, cfg: GPT2Config):
        super().__init__()
        self.n_head = cfg.n_head
        self.c_attn = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.c_proj = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor, causal: torch.Tensor) -> torch.Tensor:
        B, S, D = x.shape
        q, k, v = self.c_attn(x).split(D, dim=-1)
        # [B, S, D] -> [B, H, S, Dh]
        q, k, v = (t.view(B, S, self.n_head, D // self.n_head).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D // self.n_head))  # [B, H, S, S]
        scores = scores.masked_fill(causal[:S, :S], float("-inf"))
        probs = F.softmax(scores, dim=-1)
        out = (probs @ v).transpose(1, 2).reshape(B, S, D)
        return self.c_proj(out)


class GPT2MLP(nn.Module):
    def __init__(self, cfg: GPT2Config):
        super().__init__()
        self.c_fc = nn.Linear(cfg.d_model, 4 * cfg.d_model)
        self.act = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * cfg.d_model, cfg.d_model)

    def forward(self, x):
        return self.c_proj(self.act(self.c_fc(x)))


class GPT2Block(nn.Module):
    def __init__(self, cfg: GPT2Config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps)
        self.attn = GPT2Attention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps)
        self.mlp = GPT2MLP(cfg)

    def forward(self, x, causal):
        x = x + self.attn(self.ln_1(x), causal)   # pre-LN
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    def __init__(self, cfg: GPT2Config):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.wpe = nn.Embedding(cfg.n_ctx, cfg.d_model)
        self.h = nn.ModuleList(GPT2Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.apply(_init_weights)
        self.lm_head.weight = self.wte.weight      # tied input/output embeddings
        # True above the diagonal = future positions to hide. Non-persistent: not a weight.
        self.register_buffer("causal", torch.ones(cfg.n_ctx, cfg.n_ctx, dtype=torch.bool).triu(1),
                             persistent=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """idx [B, S] int64 -> logits [B, S, V], or the mean cross-entropy when targets [B, S] given."""
        S = idx.shape[1]
        pos = torch.arange(S, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x, self.causal)
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


# ---- LLaMA-style decoder --------------------------------------------------------------------

class RMSNorm(nn.Module):
    """Composite RMSNorm, as most model code writes it: several small elementwise/reduction ops.

    Computed in the input's dtype (no fp32 upcast), so the op sequence is exactly the formula.
    The profiler recognizes it by its class name, since no single aten op says "rmsnorm".
    """

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotary_tables(head_dim: int, max_seq: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin tables [max_seq, Dh] for the rotate-half convention (frequencies repeated twice)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(max_seq, dtype=torch.float32), inv_freq)   # [S, Dh/2]
    angles = torch.cat((angles, angles), dim=-1)                                   # [S, Dh]
    return angles.cos(), angles.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding: x [B, H, S, Dh], cos/sin [S, Dh] -> [B, H, S, Dh].

    A plain function has no module for the profiler to hook, so it marks itself with a
    "family::rotary" profiler scope (free when no profiler is running).
    """
    with torch.profiler.record_function("family::rotary"):
        return x * cos + rotate_half(x) * sin


class SwiGLUMLP(nn.Module):
    """down(silu(gate(x)) * up(x)): the gated MLP of LLaMA/Mistral."""

    def __init__(self, d_model: int, ffn_dim: int):
        super().__init__()
        self.gate = nn.Linear(d_model, ffn_dim, bias=False)
        self.up = nn.Linear(d_model, ffn_dim, bias=False)
        self.down = nn.Linear(ffn_dim, d_model, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class LlamaAttention(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.n_head, self.n_kv_head = cfg.n_head, cfg.n_kv_head
        self.head_dim = cfg.d_model // cfg.n_head
        self.attn_impl = cfg.attn_impl
        self.q_proj = nn.Linear(cfg.d_model, cfg.n_head * self.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.d_model, cfg.n_kv_head * self.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.d_model, cfg.n_kv_head * self.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.n_head * self.head_dim, cfg.d_model, bias=False)

    def forward(self, x, cos, sin, causal):
        B, S, _ = x.shape
        q = self.q_proj(x).view(B, S, self.n_head, self.head_dim).transpose(1, 2)      # [B, H, S, Dh]
        k = self.k_proj(x).view(B, S, self.n_kv_head, self.head_dim).transpose(1, 2)   # [B, Hkv, S, Dh]
        v = self.v_proj(x).view(B, S, self.n_kv_head, self.head_dim).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if self.attn_impl == "sdpa":
            # enable_gqa lets the fused kernel read the Hkv heads directly (no copies).
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                 enable_gqa=self.n_kv_head != self.n_head)
        else:
            rep = self.n_head // self.n_kv_head
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)   # [B, H, S, Dh]
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))      # [B, H, S, S]
            scores = scores.masked_fill(causal[:S, :S], float("-inf"))
            # Softmax in the activations' native dtype (bf16 in bf16 runs): PyTorch's softmax
            # kernels accumulate in fp32 internally, and the profiled call then has the same
            # input/output dtype as the softmax family's contract.
            probs = torch.softmax(scores, dim=-1)
            out = probs @ v
        return self.o_proj(out.transpose(1, 2).reshape(B, S, self.n_head * self.head_dim))


class LlamaBlock(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.input_norm = RMSNorm(cfg.d_model, cfg.rms_eps)
        self.attn = LlamaAttention(cfg)
        self.post_attn_norm = RMSNorm(cfg.d_model, cfg.rms_eps)
        self.mlp = SwiGLUMLP(cfg.d_model, cfg.ffn_dim)

    def forward(self, x, cos, sin, causal):
        x = x + self.attn(self.input_norm(x), cos, sin, causal)
        return x + self.mlp(self.post_attn_norm(x))


class Llama(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(LlamaBlock(cfg) for _ in range(cfg.n_layer))
        self.norm = RMSNorm(cfg.d_model, cfg.rms_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)   # untied, as in LLaMA
        self.apply(_init_weights)
        cos, sin = rotary_tables(cfg.d_model // cfg.n_head, cfg.max_seq, cfg.rope_theta)
        # Non-persistent buffers: they follow .to(device/dtype) but are not weights.
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.register_buffer("causal", torch.ones(cfg.max_seq, cfg.max_seq, dtype=torch.bool).triu(1)
                             if cfg.attn_impl == "eager" else torch.empty(0, 0, dtype=torch.bool),
                             persistent=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """idx [B, S] int64 -> logits [B, S, V], or the mean cross-entropy when targets [B, S] given."""
        S = idx.shape[1]
        cos, sin = self.rope_cos[:S], self.rope_sin[:S]
        x = self.embed(idx)
        for layer in self.layers:
            x = layer(x, cos, sin, self.causal)
        logits = self.lm_head(self.norm(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


# ---- BERT -----------------------------------------------------------------------------------

class BertSelfAttention(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.query = nn.Linear(cfg.d_model, cfg.d_model)
        self.key = nn.Linear(cfg.d_model, cfg.d_model)
        self.value = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, x, mask_bias):
        B, S, D = x.shape
        q, k, v = (lin(x).view(B, S, self.n_head, D // self.n_head).transpose(1, 2)
                   for lin in (self.query, self.key, self.value))                   # [B, H, S, Dh]
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D // self.n_head))   # [B, H, S, S]
        if mask_bias is not None:
            scores = scores + mask_bias                                          # [B, 1, 1, S]
        probs = F.softmax(scores, dim=-1)    # bidirectional: no causal mask
        return (probs @ v).transpose(1, 2).reshape(B, S, D)


class BertLayer(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.attn = BertSelfAttention(cfg)
        self.attn_out = nn.Linear(cfg.d_model, cfg.d_model)
        self.attn_norm = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps)
        self.intermediate = nn.Linear(cfg.d_model, cfg.ffn_dim)
        self.output = nn.Linear(cfg.ffn_dim, cfg.d_model)
        self.out_norm = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps)

    def forward(self, x, mask_bias):
        x = self.attn_norm(x + self.attn_out(self.attn(x, mask_bias)))            # post-LN
        return self.out_norm(x + self.output(F.gelu(self.intermediate(x))))


class Bert(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.cfg = cfg
        self.word_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.max_pos, cfg.d_model)
        self.type_emb = nn.Embedding(cfg.type_vocab_size, cfg.d_model)
        self.emb_norm = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps)
        self.layers = nn.ModuleList(BertLayer(cfg) for _ in range(cfg.n_layer))
        # MLM head: transform (dense, GELU, LayerNorm), then decode against the word embeddings.
        self.mlm_dense = nn.Linear(cfg.d_model, cfg.d_model)
        self.mlm_norm = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps)
        self.decoder = nn.Linear(cfg.d_model, cfg.vocab_size)
        self.apply(_init_weights)
        self.decoder.weight = self.word_emb.weight  # tied

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids [B, S] -> MLM logits [B, S, V], or the mean cross-entropy over labels [B, S]
        (positions labelled -100 are ignored). attention_mask [B, S]: 1 = token, 0 = padding."""
        B, S = input_ids.shape
        pos = torch.arange(S, device=input_ids.device)
        types = torch.zeros_like(input_ids)
        x = self.emb_norm(self.word_emb(input_ids) + self.pos_emb(pos) + self.type_emb(types))
        mask_bias = None
        if attention_mask is not None:
            # 0 for tokens, a large negative number for padding, broadcast over heads and queries.
            mask_bias = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        for layer in self.layers:
            x = layer(x, mask_bias)
        logits = self.decoder(self.mlm_norm(F.gelu(self.mlm_dense(x))))
        if labels is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)


# ---- registry -------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Entry:
    cls: type                   # the nn.Module
    config: object              # a config dataclass instance with the defaults of this name
    default_shape: tuple        # (batch, seq) of the example inputs
    summary: str


_REGISTRY: dict[str, _Entry] = {
    "gpt2": _Entry(GPT2, GPT2Config(), (1, 1024), "GPT-2 small (124M)"),
    "gpt2-tiny": _Entry(GPT2, GPT2Config(n_layer=2, n_head=4, d_model=64, vocab_size=256, n_ctx=64),
                        (2, 32), "GPT-2 tiny, for CPU tests"),
    "llama": _Entry(Llama, LlamaConfig(), (1, 2048), "LLaMA-style decoder (Mistral-7B widths)"),
    "llama-tiny": _Entry(Llama, LlamaConfig(n_layer=2, n_head=4, n_kv_head=2, d_model=64, ffn_dim=128,
                                            vocab_size=256, max_seq=64), (2, 32),
                         "LLaMA-style decoder tiny, for CPU tests"),
    "bert": _Entry(Bert, BertConfig(), (1, 512), "BERT-base with an MLM head"),
    "bert-tiny": _Entry(Bert, BertConfig(n_layer=2, n_head=4, d_model=64, ffn_dim=128, vocab_size=512,
                                         max_pos=64), (2, 32), "BERT tiny, for CPU tests"),
}


def _entry(name: str) -> _Entry:
    if name not in _REGISTRY:
        raise UnknownModel(f"unknown model {name!r}; valid models: {', '.join(MODEL_NAMES)}")
    return _REGISTRY[name]


def config(name: str, **overrides):
    """The config dataclass of ``name`` with ``overrides`` applied; unknown keys raise ValueError."""
    base = _entry(name).config
    valid = [f.name for f in dataclasses.fields(base)]
    unknown = sorted(set(overrides) - set(valid))
    if unknown:
        raise ValueError(f"unknown config key(s) {', '.join(unknown)} for model {name!r}; "
                         f"valid keys: {', '.join(valid)}")
    return dataclasses.replace(base, **overrides)


_SHAPE_RE = re.compile(r"^\s*(\d+)\s*[xX,]\s*(\d+)\s*$")


def parse_input_shape(text: str) -> tuple[int, ...]:
    """'2x32' or '2,32' -> (2, 32): batch size and sequence length, both positive integers."""
    m = _SHAPE_RE.match(text) if isinstance(text, str) else None
    if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
        raise BadInputShape(f"bad input shape {text!r}: expected BATCHxSEQ with positive integers, "
                            f"e.g. '2x32' or '2,32'")
    return int(m.group(1)), int(m.group(2))


def _check_shape(name: str, shape, max_seq: int) -> tuple[int, int]:
    if isinstance(shape, str):
        shape = parse_input_shape(shape)
    try:
        shape = tuple(shape)
        ok = len(shape) == 2 and all(int(d) == d and d >= 1 for d in shape)
    except TypeError:
        ok = False
    if not ok:
        raise BadInputShape(f"bad input shape {shape!r}: expected (batch, seq) with positive integers, "
                            f"e.g. (2, 32) or '2x32'")
    batch, seq = int(shape[0]), int(shape[1])
    if seq > max_seq:
        raise BadInputShape(f"sequence length {seq} exceeds {name}'s context of {max_seq} tokens")
    return batch, seq


def build(name: str, dtype: torch.dtype = torch.float32, device="cpu", input_shape=None, seed: int = 0,
          **overrides) -> tuple[nn.Module, tuple]:
    """Model ``name`` in eval mode with seeded random weights on device/dtype, and example inputs.

    Returns (model, inputs): inputs = (ids [B, S], targets [B, S]), int64 on ``device``; call
    ``model(*inputs)`` for the loss or ``model(inputs[0])`` for logits. For BERT the targets are
    MLM labels: about 15% of positions hold a token id, the rest -100 (ignored).
    input_shape: (batch, seq) or "BxS"; default: (2, 32) for tiny models, (1, 1024) gpt2,
    (1, 2048) llama, (1, 512) bert. ``overrides`` replace config fields, e.g. n_layer=2, attn_impl="sdpa".
    device="meta" builds without allocating (for counting parameters).
    """
    entry = _entry(name)
    cfg = config(name, **overrides)
    batch, seq = _check_shape(name, entry.default_shape if input_shape is None else input_shape, cfg.max_seq)
    device = torch.device(device)
    torch.manual_seed(seed)          # seeds CPU and every CUDA/ROCm device
    # Build directly on the target device: a full-size model would take seconds to init on CPU.
    with device:
        model = entry.cls(cfg)
    model = model.to(dtype=dtype).eval()
    return model, example_inputs(name, (batch, seq), seed=seed, device=device, **overrides)


def example_inputs(name: str, input_shape=None, seed: int = 0, device="cpu", **overrides) -> tuple:
    """The (ids, targets) ``build(name, seed=seed)`` returns, without building the model: fresh
    inputs for a model already built (end-to-end checks draw them with another seed)."""
    entry = _entry(name)
    cfg = config(name, **overrides)
    batch, seq = _check_shape(name, entry.default_shape if input_shape is None else input_shape, cfg.max_seq)
    gen = torch.Generator().manual_seed(seed + 1)     # inputs on CPU first: same ids on every device
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=gen, dtype=torch.int64)
    targets = torch.randint(0, cfg.vocab_size, (batch, seq), generator=gen, dtype=torch.int64)
    if entry.cls is Bert:
        keep = torch.rand(batch, seq, generator=gen) < 0.15
        keep[:, 0] = True              # never all-ignored: the mean loss would be NaN
        targets = torch.where(keep, targets, torch.full_like(targets, -100))
    return ids.to(device), targets.to(device)


def load_source(spec: str, dtype=torch.float32, device="cpu", input_shape=None, seed: int = 0,
                **overrides) -> tuple[nn.Module, tuple]:
    """Any model spec -> (model, inputs), ready for ``model(*inputs)``: a built-in name, ``hf:NAME``
    (transformers, small config, random weights), ``path/to/file.py:Name`` or a KernelBench
    problem ``path/to/problem.py``. Runs one forward pass; raises engine.sources.SourceError (a
    ValueError) with one clear message on bad input. See engine/sources.py."""
    from engine import sources
    loaded = sources.load(spec, dtype=dtype, device=device, input_shape=input_shape, seed=seed,
                          **overrides)
    return loaded.model, loaded.inputs


def count_params(name: str, **overrides) -> int:
    """Number of distinct parameters (tied weights once), counted on the meta device: no memory."""
    model, _ = build(name, device="meta", input_shape=(1, 1), **overrides)
    return sum(p.numel() for p in model.parameters())


def describe(name: str) -> str:
    """One line: what the model is, its sizes, parameter count and default input shape."""
    entry = _entry(name)
    c = entry.config
    if isinstance(c, LlamaConfig):
        dims = (f"{c.n_layer} layers, d {c.d_model}, {c.n_head} heads ({c.n_kv_head} KV), FFN {c.ffn_dim}, "
                f"vocab {c.vocab_size}, RoPE theta {c.rope_theta:g}, {c.attn_impl} attention")
    elif isinstance(c, BertConfig):
        dims = (f"{c.n_layer} layers, d {c.d_model}, {c.n_head} heads, FFN {c.ffn_dim}, vocab {c.vocab_size}, "
                f"max pos {c.max_pos}")
    else:
        dims = (f"{c.n_layer} layers, d {c.d_model}, {c.n_head} heads, vocab {c.vocab_size}, ctx {c.n_ctx}")
    b, s = entry.default_shape
    n = count_params(name)
    size = f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.0f}K"
    return f"{name}: {entry.summary}; {dims}; {size} params; default input {b}x{s}"
