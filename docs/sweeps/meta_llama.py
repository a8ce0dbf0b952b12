"""A LLaMA-3-8B-shaped decoder written the way Meta's reference code spells it (a problem file:
``python -m engine run --model THIS_FILE``): wq/wk/wv/wo projections, q and k rotated as
complex pairs times freqs_cis on [B, S, H, Dh] before the heads move forward (interleaved
RoPE), keys and values repeated for GQA, attention as matmul / masked softmax in fp32 /
matmul, an RMSNorm class, a SwiGLU feed-forward w2(silu(w1 x) * w3 x). Hidden 4096, 32 heads
of 128 over 8 KV heads, FFN 14336, vocabulary 128256, rope theta 500000; random weights,
META_LAYERS layers (default 2), inputs META_BATCH x META_SEQ tokens (default 8 x 2048), the
logits returned. META_TINY=1 shrinks every width (a CPU check).
"""
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

LAYERS = int(os.environ.get("META_LAYERS", "2"))
BATCH = int(os.environ.get("META_BATCH", "8"))
SEQ = int(os.environ.get("META_SEQ", "2048"))
TINY = os.environ.get("META_TINY") == "1"
DIM, HEADS, KV_HEADS, FFN, VOCAB = (64, 4, 2, 128, 1000) if TINY else (4096, 32, 8, 14336, 128256)
THETA = 500000.0


def precompute_freqs_cis(dim, end, theta):
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim))
    t = torch.arange(end, dtype=torch.float32)
    return torch.polar(torch.ones(end, dim // 2), torch.outer(t, freqs))    # [S, Dh/2] complex64


def apply_rotary_emb(xq, xk, freqs_cis):
    # xq [B, S, H, Dh], freqs_cis [S, Dh/2]: pairs (2i, 2i+1) as complex numbers, in fp32
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    f = freqs_cis.view(1, xq_.shape[1], 1, xq_.shape[-1])
    return (torch.view_as_real(xq_ * f).flatten(3).type_as(xq),
            torch.view_as_real(xk_ * f).flatten(3).type_as(xk))


def repeat_kv(x, n_rep):
    b, s, h, d = x.shape
    return x if n_rep == 1 else x[:, :, :, None, :].expand(b, s, h, n_rep, d).reshape(b, s, h * n_rep, d)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        y = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return y.type_as(x) * self.weight


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.head_dim = DIM // HEADS
        self.wq = nn.Linear(DIM, HEADS * self.head_dim, bias=False)
        self.wk = nn.Linear(DIM, KV_HEADS * self.head_dim, bias=False)
        self.wv = nn.Linear(DIM, KV_HEADS * self.head_dim, bias=False)
        self.wo = nn.Linear(HEADS * self.head_dim, DIM, bias=False)

    def forward(self, x, freqs_cis, mask):
        bsz, seqlen, _ = x.shape
        xq = self.wq(x).view(bsz, seqlen, HEADS, self.head_dim)
        xk = self.wk(x).view(bsz, seqlen, KV_HEADS, self.head_dim)
        xv = self.wv(x).view(bsz, seqlen, KV_HEADS, self.head_dim)
        xq, xk = apply_rotary_emb(xq, xk, freqs_cis)
        keys, values = repeat_kv(xk, HEADS // KV_HEADS), repeat_kv(xv, HEADS // KV_HEADS)
        xq, keys, values = xq.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2)
        scores = torch.matmul(xq, keys.transpose(2, 3)) / math.sqrt(self.head_dim) + mask
        scores = F.softmax(scores.float(), dim=-1).type_as(xq)
        out = torch.matmul(scores, values).transpose(1, 2).contiguous().view(bsz, seqlen, -1)
        return self.wo(out)


class FeedForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = nn.Linear(DIM, FFN, bias=False)
        self.w2 = nn.Linear(FFN, DIM, bias=False)
        self.w3 = nn.Linear(DIM, FFN, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention, self.feed_forward = Attention(), FeedForward()
        self.attention_norm, self.ffn_norm = RMSNorm(DIM), RMSNorm(DIM)

    def forward(self, x, freqs_cis, mask):
        h = x + self.attention(self.attention_norm(x), freqs_cis, mask)
        return h + self.feed_forward(self.ffn_norm(h))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(TransformerBlock() for _ in range(LAYERS))
        self.norm = RMSNorm(DIM)
        self.output = nn.Linear(DIM, VOCAB, bias=False)
        self.register_buffer("freqs_cis", precompute_freqs_cis(DIM // HEADS, 2 * SEQ, THETA),
                             persistent=False)

    def forward(self, tokens):
        seqlen = tokens.shape[1]
        h = self.tok_embeddings(tokens)
        freqs_cis = self.freqs_cis[:seqlen]
        mask = torch.full((seqlen, seqlen), float("-inf"), device=tokens.device).triu(1).type_as(h)
        for layer in self.layers:
            h = layer(h, freqs_cis, mask)
        return self.output(self.norm(h)).float()


def get_inputs():
    return [torch.randint(0, VOCAB, (BATCH, SEQ))]


def get_init_inputs():
    return []
