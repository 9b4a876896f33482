"""A step's batch metrics: the data (``critic/*``, lengths), how evenly processes were
loaded (``global_seqlen/*``), how fast the step ran and how much of the hardware it used
(``perf/*``, ``timing_s/*``)."""

from __future__ import annotations

from typing import Any

import torch

from rlkit.trainer.balancing import seqlen_balance_metrics
from rlkit.trainer.batch import TrainBatch
from rlkit.trainer.metrics import data_metrics
from rlkit.trainer.timing import PhaseTimer

MIXED = {"bf16": torch.bfloat16, "fp16": torch.float16}


def compute_dtype(mixed_precision: str, module: torch.nn.Module) -> torch.dtype:
    """The dtype a module's matmuls run in: the mixed-precision one if set, else its
    parameters' (bf16 compute over float32 parameters has bf16's peak, not fp32's)."""
    return MIXED.get(mixed_precision, next(module.parameters()).dtype)


def perf_metrics(
    batch: TrainBatch,
    timer: PhaseTimer,
    *,
    platform: Any,
    model_config: Any,
    dtype: torch.dtype,
    world: int,
    epochs: int,
) -> dict[str, float]:
    """Phase times, tokens, throughput per process, memory, and the actor update's MFU
    (model FLOPs of ``epochs`` passes over the batch against the platform's peak)."""
    responses = int(batch.response_lengths.sum())
    tokens = int(batch.prompt_lengths.sum()) + responses
    out = timer.metrics(tokens, responses)
    step_s = timer.seconds.get("step", 0.0)
    out["perf/total_num_tokens"] = float(tokens)
    out["perf/time_per_step"] = step_s
    if step_s > 0:
        out["perf/throughput"] = tokens / step_s / world
    out |= {f"perf/{k}": float(v) for k, v in platform.memory_stats().items()}
    peak = platform.peak_flops(dtype)
    update_s = timer.seconds.get("update_actor", 0.0)
    if peak and update_s > 0:
        from rlkit.metrics.flops import training_flops

        lengths = (batch.prompt_lengths + batch.response_lengths).tolist()
        flops = training_flops(model_config, lengths) * epochs
        out["perf/mfu/actor"] = flops / (update_s * peak * world)
    return out


def batch_metrics(
    batch: TrainBatch, timer: PhaseTimer, config: Any, shares: Any, actor: Any, platform: Any
) -> dict[str, float]:
    """Data, per-process sequence-length and performance metrics of a step that trained on
    ``batch``; ``shares``: the updater's ``(padded batch, rows per process)`` of it;
    ``actor``: the actor role (its module and Hugging Face config)."""
    out = data_metrics(
        batch,
        max_response_length=config.rollout.max_response_length,
        max_prompt_length=config.data.max_prompt_length,
    )
    padded, rows = shares
    lengths = (padded.prompt_lengths + padded.response_lengths).tolist()
    seqlen = seqlen_balance_metrics(lengths, rows)
    if not config.trainer.balance_batch:
        seqlen = {k: v for k, v in seqlen.items() if "/balanced_" not in k}
    return (
        out
        | seqlen
        | perf_metrics(
            batch,
            timer,
            platform=platform,
            model_config=actor.backbone.config,
            dtype=compute_dtype(config.trainer.mixed_precision, actor.module),
            world=len(rows),
            epochs=config.optim.ppo_epochs,
        )
    )
