"""A Phi-3-mini-shaped causal LM (KernelBench-style problem file: ``python -m engine run
--model THIS_FILE``): transformers' Phi3ForCausalLM from the Phi-3-mini config (hidden 3072,
32 heads of 96, FFN 8192, vocabulary 32064), random weights, PHI_LAYERS layers (default 2),
inputs PHI_BATCH x PHI_SEQ tokens (default 2 x 4096), the logits returned. Its head dim, 96, is
no power of 2: one tile pads it to 128, the attention family's split_d computes it as 64 + 32.
PHI_TINY=1 shrinks every width (a CPU check).
"""
import os

import torch
import torch.nn as nn

LAYERS = int(os.environ.get("PHI_LAYERS", "2"))
BATCH = int(os.environ.get("PHI_BATCH", "2"))
SEQ = int(os.environ.get("PHI_SEQ", "4096"))
TINY = os.environ.get("PHI_TINY") == "1"
WIDTHS = (dict(hidden_size=96, intermediate_size=128, num_attention_heads=4, vocab_size=1000) if TINY else
          dict(hidden_size=3072, intermediate_size=8192, num_attention_heads=32, vocab_size=32064))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        import transformers
        cfg = transformers.Phi3Config(num_hidden_layers=LAYERS, max_position_embeddings=8192,
                                      use_cache=False, pad_token_id=0, **WIDTHS)
        self.lm = transformers.Phi3ForCausalLM(cfg)

    def forward(self, ids):
        return self.lm(input_ids=ids).logits


def get_inputs():
    return [torch.randint(0, WIDTHS["vocab_size"], (BATCH, SEQ))]


def get_init_inputs():
    return []
