"""A LLaMA-3-8B-shaped causal LM whose forward returns the next-token loss alone, as a training
step computes it (KernelBench-style problem file: ``python -m engine run --model THIS_FILE``).

transformers' LlamaForCausalLM from the LLaMA-3-8B config (hidden 4096, 32 heads, 8 KV heads,
FFN 14336, vocabulary 128256), random weights, LOSS_LAYERS layers (default 2), inputs
LOSS_BATCH x LOSS_SEQ tokens (default 1 x 2048) with the labels equal to the ids (the model
shifts them). The logits are read by the loss alone, so the engine can fuse the LM head into the
cross-entropy (cross_entropy {"linear": true}). LOSS_TINY=1 shrinks every width (a CPU check).
"""
import os

import torch
import torch.nn as nn

LAYERS = int(os.environ.get("LOSS_LAYERS", "2"))
BATCH = int(os.environ.get("LOSS_BATCH", "1"))
SEQ = int(os.environ.get("LOSS_SEQ", "2048"))
TINY = os.environ.get("LOSS_TINY") == "1"
WIDTHS = (dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
               vocab_size=1000) if TINY else
          dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
               num_key_value_heads=8, vocab_size=128256))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        import transformers
        cfg = transformers.LlamaConfig(num_hidden_layers=LAYERS, max_position_embeddings=8192,
                                       rope_theta=500000.0, use_cache=False, **WIDTHS)
        self.lm = transformers.LlamaForCausalLM(cfg)

    def forward(self, ids, labels):
        return self.lm(input_ids=ids, labels=labels).loss


def get_inputs():
    ids = torch.randint(0, WIDTHS["vocab_size"], (BATCH, SEQ))
    return [ids, ids.clone()]


def get_init_inputs():
    return []
