"""Test setup: with no GPU, every Triton kernel runs under Triton's CPU interpreter.

TRITON_INTERPRET must be set before triton is first imported, so it is set here, at collection.
"""
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _has_gpu() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:
        return False


if not _has_gpu():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
