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


def pytest_configure(config):
    # "slow": tests that run several interpreted kernels (seconds each on a 2-core machine); they
    # run by default, and `-m "not slow"` leaves them out for a quick pass
    config.addinivalue_line("markers", "slow: runs interpreted Triton kernels; seconds each")
