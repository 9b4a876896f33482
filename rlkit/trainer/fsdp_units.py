"""FSDP2 units over a mesh axis: one per decoder layer, the wrapper as root.

Accelerate's ``fsdp2_prepare_model`` shards over its own mesh; with tensor parallelism the
FSDP2 axis is the ``dp`` axis of rlkit's ``dp x tp`` mesh, so the same units are made here
with the plugin's settings.
"""

from __future__ import annotations

import torch
from accelerate.utils import FullyShardedDataParallelPlugin
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

_INNER = "_checkpoint_wrapped_module"  # activation checkpointing's wrapper holds the layer


def shard_layers_and_root(
    model: nn.Module,
    mesh: DeviceMesh,
    plugin: FullyShardedDataParallelPlugin,
    *,
    upcast: bool,
    reshard_after_forward: bool,
) -> None:
    """Shard ``model`` in place over ``mesh``: each layer of the plugin's
    ``transformer_cls_names_to_wrap`` (or its checkpointing wrapper) one unit, the rest in
    the root. ``upcast``: mixed precision, so trainable weights are kept in float32."""
    if upcast:
        for param in model.parameters():
            if param.requires_grad and param.dtype != torch.float32:
                param.data = param.data.to(torch.float32)
    options = {"mesh": mesh, "mp_policy": plugin.mixed_precision_policy or MixedPrecisionPolicy()}
    layers = set(plugin.transformer_cls_names_to_wrap)
    modules = list(model.modules())
    wrapped = {id(getattr(m, _INNER)) for m in modules if hasattr(m, _INNER)}
    for module in modules:
        layer = getattr(module, _INNER, module)
        if type(layer).__name__ in layers and id(module) not in wrapped:
            fully_shard(module, reshard_after_forward=reshard_after_forward, **options)
    fully_shard(model, **options)
