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


# The matmul rates a run may need: fp32 as torch multiplies it by default (no TF32), TF32 (when
# torch.backends.cuda.matmul.allow_tf32 or set_float32_matmul_precision("high") let the model use
# it), bf16 and fp16 on the tensor cores. An fp32 GEMM judged against the bf16 rate would sit at
# "3% of SOL" when it is at cuBLAS's speed.
RATE_KEYS = ("float32", "tf32", "bfloat16", "float16")


def measure_ceilings(rates=RATE_KEYS) -> dict:
    """Copy bandwidth (bytes read + written per second) and the matmul rate per dtype, measured now.

    {"copy_gbps", "matmul_tflops" (bf16, as before), "matmul_tflops_by": {"float32", "tf32",
    "bfloat16", "float16"}}. About a second per rate on a large GPU (an fp32 8192^3 product
    without TF32 takes ~25 ms). Returns {} with no GPU: interpreter timings have no roof.
    """
    import torch
    if not torch.cuda.is_available():
        return {}
    from engine.bench import device_time_ms
    n = 1 << 28  # 256 Mi bf16 elements = 512 MiB each way: far past any L2
    src = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    copy_ms = device_time_ms(lambda: dst.copy_(src), reps=20)
    del src, dst
    by = {}
    m = 8192
    for key in rates:
        dtype = torch.float32 if key in ("float32", "tf32") else getattr(torch, key)
        a = torch.randn(m, m, device="cuda", dtype=dtype)
        b = torch.randn(m, m, device="cuda", dtype=dtype)
        old = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = key == "tf32"
        try:
            ms = device_time_ms(lambda: a @ b, reps=5 if key == "float32" else 10)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = old
        by[key] = round(2 * m**3 / (ms * 1e-3) / 1e12, 1)
        del a, b
    torch.cuda.empty_cache()
    out = {"copy_gbps": round(2 * n * 2 / (copy_ms * 1e-3) / 1e9, 1), "matmul_tflops_by": by}
    if "bfloat16" in by:
        out["matmul_tflops"] = by["bfloat16"]
    return out


def tf32_allowed() -> bool:
    """Does torch multiply fp32 matrices in TF32 in this process (the model's own setting)?"""
    import torch
    return bool(torch.backends.cuda.matmul.allow_tf32) or torch.get_float32_matmul_precision() != "highest"


def matmul_rate(ceilings: dict, dtype, tf32: bool = False) -> float | None:
    """TFLOP/s a product in ``dtype`` can reach on the measured machine: fp16/bf16 at their
    rates; fp32 at the TF32 rate when ``tf32`` (the model lets torch use it), else at the
    fastest fp32-grade path: the fp32 units, or three TF32 products on the tensor cores (what
    the matmul family's "tf32x3" computes; on the H200 354 / 3 = 118 against 51 TFLOP/s). A
    ceilings row from before the per-dtype rates has the bf16 rate only, which stands in for
    the 16-bit types alone."""
    name = str(dtype).removeprefix("torch.")
    key = "tf32" if name == "float32" and tf32 else name
    by = (ceilings or {}).get("matmul_tflops_by") or {}
    if key == "float32" and key in by:
        return max(by[key], by.get("tf32", 0.0) / 3)
    if key in by:
        return by[key]
    if name in ("bfloat16", "float16"):
        return (ceilings or {}).get("matmul_tflops")
    return None


def floor_us(nbytes: float, flops: float, ceilings: dict) -> float | None:
    """What no kernel can beat, whatever arithmetic it uses: the copy time, or the flops at the
    machine's fastest measured matmul rate (the judge rejects a candidate timed below it; the
    reports' speed of light is ``sol_us``, at the dtype's own rate)."""
    if not ceilings or not ceilings.get("copy_gbps"):
        return None
    rates = list((ceilings.get("matmul_tflops_by") or {}).values())
    rates += [ceilings["matmul_tflops"]] if ceilings.get("matmul_tflops") else []
    t_flop = flops / (max(rates) * 1e6) if rates else 0.0
    return max(nbytes / (ceilings["copy_gbps"] * 1e3), t_flop)


def sol_us(nbytes: float, flops: float, dtype, ceilings: dict, tf32: bool = False) -> float | None:
    """Speed of light of an op that must move ``nbytes`` and do ``flops`` in ``dtype``: the
    longer of the copy time and the matmul time at that dtype's rate (microseconds); None without
    measured ceilings. Ops of a dtype with no measured rate are bounded by memory alone."""
    if not ceilings or not ceilings.get("copy_gbps"):
        return None
    t_mem = nbytes / (ceilings["copy_gbps"] * 1e3)
    rate = matmul_rate(ceilings, dtype, tf32)
    t_flop = flops / (rate * 1e6) if rate else 0.0
    return max(t_mem, t_flop)


def timed_elsewhere(run_device: dict | None, check_device: dict | None) -> str:
    """A line for an end-to-end check timed on another machine than its run (``engine e2e`` again
    elsewhere), naming both GPUs: its figures belong to the machine that timed them, the
    kernels were tuned on the run's. Empty when both are the same GPU or either is unknown."""
    if not run_device or not check_device:
        return ""
    name, ran = check_device.get("name"), run_device.get("name")
    if not name or not ran or name == ran:
        return ""
    versions = ", ".join(f"{k} {check_device[k]}" for k in ("torch", "triton") if check_device.get(k))
    return (f"timed on {name}" + (f" ({versions})" if versions else "")
            + f"; the run's kernels were found and tuned on {ran}")
