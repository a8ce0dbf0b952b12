"""A Gemma-2-2B-shaped causal LM whose forward returns the next-token loss alone, as a training
step computes it (KernelBench-style problem file: ``python -m engine run --model THIS_FILE``).

transformers' Gemma2ForCausalLM from the Gemma-2-2B config (hidden 2304, 8 heads of 256, 4 KV
heads, FFN 9216, vocabulary 256000, logits soft-capped at 30, attention scores at 50), random
weights, LOSS_LAYERS layers (default 2), inputs LOSS_BATCH x LOSS_SEQ tokens (default 1 x 2048),
the labels equal to the ids (the model shifts them). The capped logits are read by the loss
alone, so the engine can fuse the LM head, the cap and the upcast into the cross-entropy
(cross_entropy {"linear": true, "softcap": 30.0, "upcast": true}). LOSS_TINY=1 shrinks every
width (a CPU check).
"""
import os

import torch
import torch.nn as nn

LAYERS = int(os.environ.get("LOSS_LAYERS", "2"))
BATCH = int(os.environ.get("LOSS_BATCH", "1"))
SEQ = int(os.environ.get("LOSS_SEQ", "2048"))
TINY = os.environ.get("LOSS_TINY") == "1"
WIDTHS = (dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
               head_dim=16, vocab_size=1000) if TINY else
          dict(hidden_size=2304, intermediate_size=9216, num_attention_heads=8,
               num_key_value_heads=4, head_dim=256, vocab_size=256000))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        import transformers
        cfg = transformers.Gemma2Config(num_hidden_layers=LAYERS, max_position_embeddings=8192,
                                        final_logit_softcapping=30.0, attn_logit_softcapping=50.0,
                                        use_cache=False, **WIDTHS)
        self.lm = transformers.Gemma2ForCausalLM(cfg)

    def forward(self, ids, labels):
        return self.lm(input_ids=ids, labels=labels).loss


def get_inputs():
    ids = torch.randint(0, WIDTHS["vocab_size"], (BATCH, SEQ))
    return [ids, ids.clone()]


def get_init_inputs():
    return []
