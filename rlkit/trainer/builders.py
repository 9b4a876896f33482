"""What a run builds before its first step, apart from the roles' models: the tokenizer,
the prompt sets, optimizers and their schedules, seeds, host-memory settings."""

from __future__ import annotations

import contextlib
import math
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from rlkit.trainer.optimizer import adamw
from rlkit.trainer.prompts import PromptSet, tokenize_prompts


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's generators."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def load_tokenizer(model: Any) -> Any:
    """The policy's tokenizer (``ModelConfig``): its pad token falls back to EOS, and
    ``chat_template`` replaces its template."""
    from transformers import AutoTokenizer

    path = model.tokenizer_path or model.path
    tok = AutoTokenizer.from_pretrained(
        path, gguf_file=None if model.tokenizer_path else model.gguf_file
    )
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    if model.chat_template is not None:
        from rlkit.data.chat_templates import resolve_chat_template

        tok.chat_template = resolve_chat_template(model.chat_template)
    return tok


def tool_schemas(agent: Any) -> list[dict[str, Any]] | None:
    """The schemas of the agent loop's tools, rendered into every prompt."""
    if not agent.tools:
        return None
    from rlkit.tools import schemas

    return schemas(agent.tools)


def load_prompts(
    data: Any,
    split: str,
    tokenizer: Any,
    tools: list[dict[str, Any]] | None,
    images: Any = None,
) -> tuple[PromptSet, int]:
    """The ``train`` or ``val`` prompts of ``DataConfig`` ``data``, tokenized, and how many
    malformed rows were skipped (``on_error="skip"``). ``images``: the vision-language
    model's :class:`~rlkit.data.image_prompts.ImagePromptRenderer` (``None``: text-only)."""
    from rlkit.data import load_report

    options = {
        "question_key": data.question_key,
        "answer_key": data.answer_key,
        "system_prompt": data.system_prompt,
        "on_error": data.on_error,
    }
    if data.instruction is not None:
        options["instruction"] = data.instruction
    source = data.train_files if split == "train" else data.val_files
    if data.dataset_fn is not None:
        dataset, skipped = data.dataset_fn(split), None
    else:
        dataset, skipped = _load_sources(source, split, options)
    if skipped is None:
        try:
            skipped = load_report(dataset).num_skipped
        except ValueError:  # a dataset_fn's own dataset carries no load report
            skipped = 0
    if split == "val" and data.val_limit:
        dataset = dataset.select(range(min(data.val_limit, len(dataset))))
    prompts = tokenize_prompts(
        dataset,
        tokenizer,
        max_prompt_length=data.max_prompt_length,
        truncation=data.truncation,
        use_chat_template=data.use_chat_template,
        name=split,
        tools=tools,
        images=images,
    )
    if data.reward in ("by_data_source", "default"):  # stop before the model loads
        from rewards.by_data_source import check_data_sources

        check_data_sources(prompts.data_sources, prompts.ground_truths, reward=data.reward)
    return prompts, skipped


def _load_sources(source: str | list[str], split: str, options: dict[str, Any]) -> tuple[Any, int]:
    """The prompts of one file or shared set, or of a list of them (concatenated in order,
    as verl reads ``data.train_files``), and how many malformed rows were skipped."""
    import datasets

    from rlkit.data import SHARED_DATASETS, load_prompt_dataset, load_report, load_shared_dataset
    from rlkit.data.file_lists import data_sources

    parts, skipped = [], 0
    for one in data_sources(source):
        if one in SHARED_DATASETS:  # e.g. "gsm8k": the preset, with its instruction
            preset_splits = SHARED_DATASETS[one].splits
            wanted = "train" if split == "train" or "test" not in preset_splits else "test"
            part = load_shared_dataset(one, wanted, **options)
        else:
            # A folder or hub val source reads its validation (or test) split, not train.
            wanted = "train" if split == "train" else "validation"
            part = load_prompt_dataset(one, split=wanted, **options)
        with contextlib.suppress(ValueError):  # a set without a load report skipped nothing
            skipped += load_report(part).num_skipped
        parts.append(part)
    if len(parts) == 1:
        return parts[0], skipped
    return datasets.concatenate_datasets(parts), skipped


class StepsConflict(ValueError):
    """``TrainerConfig.total_epochs`` and ``total_steps`` give different run lengths."""


def check_batch_fits(data: Any, num_prompts: int) -> None:
    """Refuse a training set smaller than one batch: every batch would hold the same
    prompts more than once (GRPO's groups of one prompt split over several groups).

    Raises:
        PromptDataError: ``num_prompts < DataConfig.train_batch_size``.
    """
    from rlkit.data.prompt_dataset import PromptDataError

    if num_prompts < data.train_batch_size:
        raise PromptDataError(
            f"the training set has {num_prompts} prompts, fewer than DataConfig."
            f"train_batch_size = {data.train_batch_size}: every batch would repeat prompts. "
            f"Lower train_batch_size to at most {num_prompts}, or add prompts"
        )


def total_steps_of(trainer: Any, data: Any, num_prompts: int) -> int:
    """``TrainerConfig.total_steps``, or the steps of ``total_epochs`` passes over
    ``num_prompts`` training prompts when that is set (verl's ``trainer.total_epochs``).

    Raises:
        StepsConflict: ``total_steps`` was changed from its default to another number.
    """
    if trainer.total_epochs is None:
        return trainer.total_steps
    steps = trainer.total_epochs * num_prompts // data.train_batch_size
    if trainer.total_steps not in (10, steps):  # 10: total_steps left at its default
        raise StepsConflict(
            f"TrainerConfig.total_epochs = {trainer.total_epochs} makes {steps} steps "
            f"({num_prompts} prompts, {data.train_batch_size} per step) but "
            f"TrainerConfig.total_steps = {trainer.total_steps}: set one of the two"
        )
    return steps


def optimizer_factory(optim: Any, lr: float) -> Callable[[Any], torch.optim.Optimizer]:
    """``params -> AdamW`` with ``OptimConfig`` ``optim``'s settings at rate ``lr``."""

    def make(params: Any) -> torch.optim.Optimizer:
        return adamw(
            params,
            lr=lr,
            betas=tuple(optim.betas),
            weight_decay=optim.weight_decay,
            implementation=optim.optimizer_implementation,
        )

    return make


def scheduler(
    optimizer: torch.optim.Optimizer, optim: Any, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up over ``warmup_steps``, then constant or cosine decay to
    ``min_lr_ratio`` (``OptimConfig.lr_schedule``), one scheduler step per RL step."""
    total = max(1, total_steps)

    def factor(step: int) -> float:
        if step < optim.warmup_steps:
            return (step + 1) / max(1, optim.warmup_steps)
        if optim.lr_schedule == "constant":
            return 1.0
        progress = min(1.0, (step - optim.warmup_steps) / max(1, total - optim.warmup_steps))
        return optim.min_lr_ratio + (1 - optim.min_lr_ratio) * 0.5 * (
            1 + math.cos(math.pi * progress)
        )

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def computes_in_low_precision(cfg: Any) -> bool:
    """Whether any model of experiment ``cfg`` runs bf16 or fp16 products: mixed precision,
    or a policy or reward model loaded in that dtype."""
    dtypes = [cfg.model.dtype] + ([cfg.reward_model.dtype] if cfg.reward_model.path else [])
    return cfg.trainer.mixed_precision != "no" or any(d != "float32" for d in dtypes)


def configure_host_memory(
    keep_freed: bool, platform: Any, low_precision: bool = False
) -> str | None:
    """Apply ``TrainerConfig.keep_freed_host_memory`` where tensors live in host memory;
    returns why it could not be applied, if it could not. With bf16 or fp16 products on a
    CPU (``low_precision``, :func:`computes_in_low_precision`), also cap the caches of
    compiled low-precision kernels (:mod:`rlkit.device.onednn_cache`)."""
    if platform.device_type != "cpu":
        return None
    if low_precision:
        from rlkit.device.onednn_cache import cap_onednn_kernel_caches

        cap_onednn_kernel_caches()
    if not keep_freed:
        return None
    from rlkit.device.host_allocator import keep_freed_host_memory

    reason = keep_freed_host_memory()
    return None if reason is None else f"not applied: {reason}"
