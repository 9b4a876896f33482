"""Peak dense FLOP/s per chip and matmul dtype, for model FLOP utilisation (MFU).

Figures are the vendors' datasheet numbers *without* structured sparsity (NVIDIA
quotes tensor-core throughput "with sparsity"; those are halved here). ``fp32``
means plain (non-tensor-core) float32; ``tf32`` is used for ``torch.float32``
when PyTorch is allowed to run float32 matmuls in TF32. A chip or dtype that is
not listed gives ``None`` rather than a guess, so MFU is not reported wrongly.
The Ascend 910B figure (354 TFLOP/s, fp16/bf16) is the one verl and VeOmni use.
"""

from __future__ import annotations

import re

import torch

# (pattern on the device name, {dtype key: FLOP/s}); the first match wins, so a
# more specific name must precede a name it contains (H100 PCIe before H100, H200
# before H20, L40S before L40).
_TABLE: tuple[tuple[str, dict[str, float]], ...] = (
    (r"B200", {"bf16": 2250e12, "fp16": 2250e12, "fp8": 4500e12}),
    (
        r"H200|GH200",
        {"bf16": 989.4e12, "fp16": 989.4e12, "tf32": 494.7e12, "fp32": 66.9e12, "fp8": 1978.9e12},
    ),
    (
        r"H100.*PCIe",
        {"bf16": 756.5e12, "fp16": 756.5e12, "tf32": 378e12, "fp32": 51.2e12, "fp8": 1513e12},
    ),
    (
        r"H100.*NVL",
        {"bf16": 835.5e12, "fp16": 835.5e12, "tf32": 417.5e12, "fp32": 60e12, "fp8": 1670.5e12},
    ),
    (
        r"H100|H800",
        {"bf16": 989.4e12, "fp16": 989.4e12, "tf32": 494.7e12, "fp32": 66.9e12, "fp8": 1978.9e12},
    ),
    (r"H20(?!0)", {"bf16": 148e12, "fp16": 148e12, "tf32": 74e12, "fp32": 44e12, "fp8": 296e12}),
    (r"A100|A800", {"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12}),
    (r"L40S", {"bf16": 362.05e12, "fp16": 362.05e12, "tf32": 183.2e12, "fp32": 91.6e12}),
    (r"L40(?!S)", {"bf16": 181.05e12, "fp16": 181.05e12, "tf32": 90.5e12, "fp32": 90.5e12}),
    (r"L20", {"bf16": 119.5e12, "fp16": 119.5e12}),
    (r"\bL4\b", {"bf16": 121e12, "fp16": 121e12, "tf32": 60e12, "fp32": 30.3e12}),
    (r"\bA10\b", {"bf16": 125e12, "fp16": 125e12, "tf32": 62.5e12, "fp32": 31.2e12}),
    (r"RTX 4090", {"bf16": 165.2e12, "fp16": 165.2e12, "fp32": 82.6e12}),
    (r"MI300X|MI325X", {"bf16": 1307.4e12, "fp16": 1307.4e12, "tf32": 653.7e12, "fp32": 163.4e12}),
    (r"910B|910_9", {"bf16": 354e12, "fp16": 354e12}),
)


def _dtype_key(dtype: torch.dtype) -> str | None:
    if dtype == torch.bfloat16:
        return "bf16"
    if dtype == torch.float16:
        return "fp16"
    if dtype == torch.float32:
        return "tf32" if torch.backends.cuda.matmul.allow_tf32 else "fp32"
    if dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return "fp8"
    return None


def peak_flops_for(device_name: str, dtype: torch.dtype) -> float | None:
    """Dense peak FLOP/s of the chip called ``device_name`` for matmuls in ``dtype``.

    Args:
        device_name: the driver's name, e.g. ``torch.cuda.get_device_name()``
            (``"NVIDIA H100 80GB HBM3"``) or ``torch.npu.get_device_name()``
            (``"Ascend910B2"``).
        dtype: the matmul input dtype.

    Returns:
        FLOP/s, or ``None`` when the chip or the dtype is not in the table.
    """
    key = _dtype_key(dtype)
    if key is None:
        return None
    for pattern, flops in _TABLE:
        if re.search(pattern, device_name):
            return flops.get(key)
    return None
