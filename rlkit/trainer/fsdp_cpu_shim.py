"""The CPU shim that lets Accelerate's own FSDP2 path run on CPU processes (gloo).

Accelerate (checked on 1.15) never selects FSDP without an accelerator, in two ways:

1. Device detection. A process started by ``accelerate launch --multi_gpu`` (torchrun) on a
   machine without CUDA/NPU/XPU/... is classified ``DistributedType.NO`` unless ``cpu=True``
   reaches ``Accelerator``: every process then trains alone, silently. :func:`has_accelerator`
   lets the backend pass ``cpu=True`` exactly when accelerate would find no device, which makes
   accelerate initialise a gloo process group (``DistributedType.MULTI_CPU``).
2. FSDP selection. ``AcceleratorState`` switches to ``DistributedType.FSDP`` only from the
   multi-accelerator states (``MULTI_GPU``, ``MULTI_NPU``, ...); from ``MULTI_CPU`` it keeps
   ``MULTI_CPU``, drops the plugin and ``prepare`` wraps the model in DDP.
   :func:`enable_fsdp_on_cpu` performs the same three assignments that ``AcceleratorState``
   performs on the accelerator path (distributed type, plugin, mixed precision on the plugin),
   and nothing else, so ``accelerator.prepare`` then takes its normal ``_prepare_fsdp2`` route.

FSDP2 itself (``fully_shard``, DTensor, reduce-scatter) works on CPU with gloo; only the
selection logic above is device-bound. On CUDA/NPU the state is already ``FSDP`` and the shim
returns without touching anything.
"""

from __future__ import annotations

import torch
from accelerate import Accelerator, PartialState
from accelerate.utils import (
    DistributedType,
    FullyShardedDataParallelPlugin,
    is_hpu_available,
    is_mlu_available,
    is_musa_available,
    is_npu_available,
    is_sdaa_available,
    is_torch_xla_available,
    is_xpu_available,
)


def has_accelerator() -> bool:
    """Whether accelerate would find a device to run on (CUDA, NPU, XPU, MLU, MUSA, ...).

    ``torch.accelerator`` only knows out-of-tree devices (NPU, MLU, ...) once their torch
    extension is imported; accelerate's probes import them, so both are asked.

    Returns:
        ``True`` if any accelerator (or XLA) is available to this process.
    """
    probes = (
        is_npu_available,
        is_mlu_available,
        is_musa_available,
        is_sdaa_available,
        is_hpu_available,
        is_xpu_available,
        is_torch_xla_available,
    )
    return torch.accelerator.is_available() or any(probe() for probe in probes)


def enable_fsdp_on_cpu(accelerator: Accelerator, plugin: FullyShardedDataParallelPlugin) -> bool:
    """Select FSDP on a CPU-only multi-process Accelerator, as accelerate does for GPUs.

    Mirrors the branch of ``AcceleratorState.__init__`` that sets ``DistributedType.FSDP``
    for multi-GPU states. Must be called right after ``Accelerator(...)`` and before
    ``prepare``. It does nothing unless the state is ``MULTI_CPU`` (gloo processes); in
    particular it never triggers on CUDA/NPU, where accelerate selected FSDP itself.

    Args:
        accelerator: the freshly built Accelerator (built with ``fsdp_plugin=plugin``).
        plugin: the FSDP2 plugin that accelerate dropped.

    Returns:
        ``True`` if the shim switched the state to FSDP, ``False`` if it left it alone.
    """
    state = accelerator.state
    if state.distributed_type != DistributedType.MULTI_CPU:
        return False
    state.distributed_type = DistributedType.FSDP
    state.fsdp_plugin = plugin
    if state.mixed_precision != "no":
        plugin.set_mixed_precision(state.mixed_precision)
    # AcceleratorState ends its own init with this line; PartialState-level helpers
    # (gather, reduce, ...) read the type from there.
    PartialState._shared_state["distributed_type"] = state.distributed_type
    return True
