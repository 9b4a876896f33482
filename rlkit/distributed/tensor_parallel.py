"""Tensor parallelism: the process mesh and a model split by its family's plan.

The processes form a 2-D mesh ``dp x tp`` (data-parallel x tensor-parallel), row-major:
the ``t`` consecutive ranks ``g t .. g t + t - 1`` are tensor-parallel group ``g``. They
hold the same rows of the batch and split every layer of the model
(:mod:`rlkit.models.tensor_parallel_plans`); FSDP2 shards over the ``dp`` axis.

The split is torch's own DTensor tensor parallelism (``torch.distributed.tensor.parallel``):
a plan's kinds become ``ColwiseParallel`` / ``RowwiseParallel`` styles, the vocabulary
split of the embeddings is ``RowwiseParallel`` on ``nn.Embedding``, and the LM head is
``ColwiseParallel`` gathering its logits for a plain forward (generation). rlkit's one
style of its own, :class:`HeadNormParallel`, runs a per-head norm on DTensors so that its
replicated weight gets the gradient summed over the heads of every process.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    parallelize_module,
)

from rlkit.distributed.collectives import world
from rlkit.models.tensor_parallel_plans import tensor_parallel_plan


class TensorParallelError(ValueError):
    """A tensor-parallel size the run cannot use."""


@dataclass(frozen=True)
class TensorParallel:
    """This process's place in the ``dp x tp`` grid.

    Attributes:
        size: ``t``, the processes that split each layer.
        rank: this process's index in its tensor-parallel group, 0 .. t-1.
        mesh: the 2-D ``("dp", "tp")`` device mesh (``None`` when ``size`` is 1).
        dp_rank: the index of this process's group among the data-parallel groups.
        dp_size: the number of data-parallel groups (processes / t).
    """

    size: int
    rank: int
    mesh: DeviceMesh | None
    dp_rank: int
    dp_size: int

    @property
    def enabled(self) -> bool:
        return self.size > 1


def process_count_problem(size: int, num_processes: int) -> str | None:
    """Why ``size`` cannot split layers over ``num_processes`` processes, or None."""
    if size < 1:
        return f"ModelConfig.tensor_parallel_size must be >= 1, got {size}"
    if num_processes % size:
        return (
            f"ModelConfig.tensor_parallel_size = {size} does not divide the {num_processes} "
            f"processes of this run: launch a multiple of {size} processes "
            f"(accelerate launch --num_processes) or choose a size that divides {num_processes}"
        )
    return None


def combined_parallelism_problem(tensor_size: int, sequence_size: int) -> str | None:
    """Why layers and sequences cannot both be split over process groups, or None."""
    if tensor_size > 1 and sequence_size > 1:
        return (
            f"ModelConfig.tensor_parallel_size = {tensor_size} and "
            f"ModelConfig.ulysses_sequence_parallel_size = {sequence_size}: rlkit splits "
            "either layers or sequences over a process group, not both (a 3-D mesh); set "
            "one of them to 1"
        )
    return None


def build_tensor_parallel(size: int, device_type: str) -> TensorParallel:
    """Create the ``dp x tp`` mesh (every process must call this, in the same order).

    Raises:
        TensorParallelError: ``size`` does not divide the number of processes.
    """
    rank, num = world()
    problem = process_count_problem(size, num)
    if problem:
        raise TensorParallelError(problem)
    if size == 1:
        return TensorParallel(1, 0, None, rank, num)
    mesh = init_device_mesh(device_type, (num // size, size), mesh_dim_names=("dp", "tp"))
    return TensorParallel(size, rank % size, mesh, rank // size, num // size)


class HeadNormParallel(ParallelStyle):
    """A norm over ``head_dim`` applied to this process's heads (Qwen3's ``q_norm``).

    The weight is replicated; input and output are this process's heads, so the forward
    needs no exchange. It runs on DTensors sharded on the heads axis (dim -2): the weight's
    gradient is then a sum over all heads, over the processes, which DTensor's backward
    reduces to the replicated weight's gradient.
    """

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        for name, param in list(module.named_parameters(recurse=False)):
            shared = nn.Parameter(
                distribute_tensor(param.data, device_mesh, [Replicate()]),
                requires_grad=param.requires_grad,
            )
            module.register_parameter(name, shared)

        def to_dtensor(_: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
            x = args[0]
            heads = Shard(x.dim() - 2)
            return (DTensor.from_local(x, device_mesh, [heads], run_check=False), *args[1:])

        def to_local(_: nn.Module, __: Any, out: torch.Tensor) -> torch.Tensor:
            return out.to_local() if isinstance(out, DTensor) else out

        module.register_forward_pre_hook(to_dtensor)
        module.register_forward_hook(to_local)
        return module


def _style(kind: str) -> ParallelStyle:
    if kind == "colwise":
        return ColwiseParallel()
    if kind == "rowwise":
        return RowwiseParallel()
    if kind == "head_norm":
        return HeadNormParallel()
    if kind == "vocab_embedding":
        return RowwiseParallel(input_layouts=Replicate())
    if kind == "vocab_head":
        return ColwiseParallel(output_layouts=Replicate())
    raise ValueError(f"unknown tensor-parallel kind {kind!r}")


def _path_of(root: nn.Module, module: nn.Module | None) -> str | None:
    for name, candidate in root.named_modules():
        if candidate is module:
            return name
    return None


def backbone_plan(backbone: nn.Module) -> dict[str, str]:
    """Module path in ``backbone`` -> kind: the decoder's plan under transformers'
    ``base_model``, the embeddings, and a language-model head where there is one."""
    base = backbone.base_model
    prefix = "" if base is backbone else f"{_path_of(backbone, base)}."
    plan = {prefix + path: kind for path, kind in tensor_parallel_plan(backbone.config).items()}
    plan[_path_of(backbone, backbone.get_input_embeddings())] = "vocab_embedding"
    head = backbone.get_output_embeddings() if hasattr(backbone, "get_output_embeddings") else None
    if head is not None:
        plan[_path_of(backbone, head)] = "vocab_head"
    return plan


def parallelize_backbone(backbone: nn.Module, tp: TensorParallel) -> nn.Module:
    """Split a Hugging Face decoder model over ``tp``'s processes by its family's plan, in
    place (:func:`backbone_plan`).

    Tied embeddings stay one parameter: both the embedding and the LM head split the
    (vocab, hidden) matrix by rows, so the head is re-pointed at the split embedding.

    Returns:
        ``backbone``, its planned parameters now ``DTensor`` shards on the ``tp`` mesh.
    """
    if not tp.enabled:
        return backbone
    embed = backbone.get_input_embeddings()
    head = backbone.get_output_embeddings() if hasattr(backbone, "get_output_embeddings") else None
    tied = head is not None and head.weight is embed.weight
    plan = {path: _style(kind) for path, kind in backbone_plan(backbone).items()}
    parallelize_module(backbone, tp.mesh["tp"], plan)
    if tied:
        head.weight = embed.weight
    return backbone


def vocab_slice(weight: torch.Tensor) -> tuple[torch.Tensor, int, Any]:
    """``(local rows, first vocabulary id, process group)`` of a row-split LM head weight.

    Raises:
        ValueError: ``weight`` is not split by rows over one mesh axis.
    """
    if not isinstance(weight, DTensor) or weight.placements != (Shard(0),):
        raise ValueError(
            "expected the LM head weight split by vocabulary rows over the tensor-parallel "
            f"mesh (placements (Shard(0),)), got {getattr(weight, 'placements', type(weight))}"
        )
    mesh = weight.device_mesh
    rows = -(-weight.shape[0] // mesh.size())  # DTensor's even split: the last may be short
    return weight.to_local(), rows * mesh.get_local_rank(), mesh.get_group()
