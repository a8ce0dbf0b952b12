"""A Gemma-7B-shaped causal LM (KernelBench-style problem file: ``python -m engine run
--model THIS_FILE``): transformers' GemmaForCausalLM from the Gemma-7B config (hidden 3072,
16 heads of 256 over 16 KV heads, FFN 24576, vocabulary 256000), random weights, GEMMA_LAYERS
layers (default 2), inputs GEMMA_BATCH x GEMMA_SEQ tokens (default 2 x 4096), the logits
returned. Head dim 256 is the attention family's split-ring case (K and V in rings of their
own, 3 K and 2 V blocks of 64 keys). GEMMA_TINY=1 shrinks every width (a CPU check).
"""
import os

import torch
import torch.nn as nn

LAYERS = int(os.environ.get("GEMMA_LAYERS", "2"))
BATCH = int(os.environ.get("GEMMA_BATCH", "2"))
SEQ = int(os.environ.get("GEMMA_SEQ", "4096"))
TINY = os.environ.get("GEMMA_TINY") == "1"
WIDTHS = (dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=4,
               head_dim=32, vocab_size=1000) if TINY else
          dict(hidden_size=3072, intermediate_size=24576, num_attention_heads=16,
               num_key_value_heads=16, head_dim=256, vocab_size=256000))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        import transformers
        cfg = transformers.GemmaConfig(num_hidden_layers=LAYERS, max_position_embeddings=8192,
                                       use_cache=False, **WIDTHS)
        self.lm = transformers.GemmaForCausalLM(cfg)

    def forward(self, ids):
        return self.lm(input_ids=ids).logits


def get_inputs():
    return [torch.randint(0, WIDTHS["vocab_size"], (BATCH, SEQ))]


def get_init_inputs():
    return []
