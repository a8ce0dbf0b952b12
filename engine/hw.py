"""What machine we are on, and how fast it can possibly go.

Vendor detection covers NVIDIA (CUDA builds of torch) and AMD (ROCm builds, where torch.cuda is the
HIP device and ``torch.version.hip`` is set). Datasheet peaks are leads only: a run prefers the
ceilings it measures at its start (``measure_ceilings``), and stores them with the run.
"""
from __future__ import annotations

import platform

# Dense peaks by the vendors' datasheets: memory bandwidth in GB/s, bf16 dense matrix TFLOP/s.
DATASHEET = {
    "A100": {"hbm_gbps": 2039, "bf16_tflops": 312},
    "H100": {"hbm_gbps": 3350, "bf16_tflops": 989},
    "H200": {"hbm_gbps": 4800, "bf16_tflops": 989},
    "L40S": {"hbm_gbps": 864, "bf16_tflops": 362},
    "RTX 4090": {"hbm_gbps": 1008, "bf16_tflops": 165},
    "MI300X": {"hbm_gbps": 5300, "bf16_tflops": 1307},
    "MI325X": {"hbm_gbps": 6000, "bf16_tflops": 1307},
    "MI355X": {"hbm_gbps": 8000, "bf16_tflops": 2300},
}


def datasheet_for(name: str) -> dict | None:
    """Datasheet entry whose key appears in the device name ('NVIDIA H200' -> H200)."""
    upper = name.upper()
    for key in sorted(DATASHEET, key=len, reverse=True):
        if key.upper() in upper:
            return dict(DATASHEET[key], part=key)
    return None


def detect() -> dict:
    """Device facts for the run record. Imports torch and triton lazily."""
    import torch
    try:
        import triton
        triton_version = triton.__version__
    except Exception:  # the engine can profile without triton; the worker needs it
        triton_version = None
    info = {"torch": torch.__version__, "triton": triton_version, "python": platform.python_version()}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        vendor = "amd" if getattr(torch.version, "hip", None) else "nvidia"
        info.update(
            vendor=vendor, name=props.name, timing_mode="gpu",
            sm_count=props.multi_processor_count,
            memory_gb=round(props.total_memory / 2**30, 1),
            l2_bytes=getattr(props, "L2_cache_size", 0) or 50 * 2**20,
            capability=f"{props.major}.{props.minor}",
            runtime=torch.version.hip if vendor == "amd" else torch.version.cuda,
            datasheet=datasheet_for(props.name),
        )
    else:
        info.update(vendor="cpu", name=platform.processor() or platform.machine(),
                    timing_mode="interpreter", sm_count=0, l2_bytes=0, datasheet=None)
    return info


def measure_ceilings() -> dict:
    """Copy bandwidth (bytes read + written per second) and bf16 matmul rate, measured now.

    Takes about a second on a large GPU. Returns {} with no GPU: interpreter timings have no roof.
    """
    import torch
    if not torch.cuda.is_available():
        return {}
    from engine.bench import device_time_ms
    n = 1 << 28  # 256 Mi bf16 elements = 512 MiB each way: far past any L2
    src = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    copy_ms = device_time_ms(lambda: dst.copy_(src), reps=20)
    m = 8192
    a = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
    mm_ms = device_time_ms(lambda: a @ b, reps=10)
    del src, dst, a, b
    torch.cuda.empty_cache()
    return {
        "copy_gbps": round(2 * n * 2 / (copy_ms * 1e-3) / 1e9, 1),
        "matmul_tflops": round(2 * m**3 / (mm_ms * 1e-3) / 1e12, 1),
    }
