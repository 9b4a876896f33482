"""The prompts a run trains on and how their responses are rewarded.

The section registers with gin under ``rlkit.trainer.config``, the package that exports
it, so a binding's full name does not depend on which module defines the section.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import gin

from rlkit.trainer.config.rules import (
    COUNT,
    NON_NEGATIVE_INT,
    POSITIVE,
    Choice,
    Number,
    checked,
)


@gin.configurable(module="rlkit.trainer.config")
@dataclass
class DataConfig:
    """Prompts and how they become token ids."""

    train_files: str | list[str] = ""
    """JSON Lines / Parquet file, a shared set name (``gsm8k``), a list of them (read in
    order and concatenated, as verl's ``data.train_files``), or empty when ``dataset_fn``
    is given."""
    val_files: str | list[str] = ""
    dataset_fn: Any = None
    """A gin-configurable callable ``(split) -> datasets.Dataset`` in rlkit's prompt schema
    (columns id, prompt, ground_truth, data_source); overrides the files."""
    question_key: str = "question"
    answer_key: str = "answer"
    instruction: str | None = None
    system_prompt: str | None = None
    use_chat_template: bool = True
    train_batch_size: int = checked(8, COUNT)
    """Prompts per training step (global, across processes)."""
    gen_batch_size: int | None = checked(None, Number(integer=True, ge=1, optional=True))
    """DAPO dynamic sampling (``AlgorithmConfig.filter_groups``): prompts drawn per
    generation round (verl's ``data.gen_batch_size``; its DAPO recipe uses 3 x
    ``train_batch_size``); ``None`` = ``train_batch_size``. At least ``train_batch_size``.
    Without ``filter_groups`` every step draws ``train_batch_size`` prompts."""
    # 0 = all, as None
    val_limit: int | None = checked(None, Number(integer=True, ge=0, optional=True))
    """Use only the first N validation prompts."""
    max_prompt_length: int = checked(512, COUNT)
    truncation: str = checked("error", Choice(("error", "left", "filter")))
    """Prompt longer than ``max_prompt_length``: error | left (keep the end) | filter (drop)."""
    shuffle: bool = True
    on_error: str = checked("raise", Choice(("raise", "skip")))
    """A malformed data row (bad JSON, no question or answer, duplicate id): ``raise`` names
    it and stops; ``skip`` drops it (the run prints how many, per split)."""
    reward: str = "default"
    """Reward function name (``rlkit list rewards``), ``package.module:function`` or
    ``path/to/file.py:function`` (relative to the working directory); see docs/rewards.md.
    ``default`` picks a scorer per row from its ``data_source``, as verl's default does
    (GSM8K, MATH, AIME, ...), and scores a row of any other source by ``gsm8k``;
    ``by_data_source`` is the same without that fallback.
    A function with verl's signature ``(data_source, solution_str, ground_truth,
    extra_info)`` is called by keyword."""
    custom_reward_path: str = ""
    """verl's ``custom_reward_function.path``: a Python file holding the reward; sets
    ``reward`` to ``"<custom_reward_path>:<custom_reward_name>"``."""
    custom_reward_name: str = "compute_score"
    """verl's ``custom_reward_function.name``: the function in ``custom_reward_path``."""
    reward_options: dict[str, Any] = field(default_factory=dict)
    reward_timeout_s: float = checked(10.0, POSITIVE)
    """Time limit of one reward call (a batched reward: this times its rows)."""
    reward_workers: int = checked(0, NON_NEGATIVE_INT)
    """0 = score in the trainer's process (``SIGALRM`` limits, and a watchdog that ends
    the run when a C call hangs past ``reward_timeout_s + 5``); >= 1 = worker processes,
    whose hung calls are killed."""
    reward_deadline_s: float | None = checked(60.0, Number(gt=0, optional=True))
    """One limit for a step's whole reward phase in each process (its rows of a generation
    batch): calls unfinished then score 0 as timeouts and the run warns how many. A reward
    that hangs on every response so costs a step this, not ``reward_timeout_s`` once per
    response. At least ``reward_timeout_s``; raise it for slow rewards scored in the
    trainer's process, or score them in parallel (``reward_workers``). ``None``: no limit."""
    max_reward_failure_rate: float = checked(1.0, Number(gt=0, le=1))
    """Stop the run when at least this fraction of a batch's reward calls failed (raised or
    timed out); 1.0 = when every call failed."""

    def __post_init__(self) -> None:
        if self.custom_reward_path:
            chosen = f"{self.custom_reward_path}:{self.custom_reward_name}"
            if self.reward not in ("default", chosen):  # "default": reward left unset
                raise ValueError(
                    f"DataConfig.custom_reward_path names the reward {chosen!r} but "
                    f"DataConfig.reward is {self.reward!r}: set one of the two"
                )
            self.reward = chosen
