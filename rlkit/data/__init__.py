"""Prompt data: load prompt datasets into rlkit's schema, render them, name the shared sets.

- :func:`load_prompt_dataset` / :func:`write_parquet`: JSON Lines, Parquet or hub
  datasets to ``id``, ``prompt`` (chat messages), ``ground_truth``, ``data_source``,
  ``extra_info``;
- :func:`render_prompt`: messages to model text (chat template or plain);
- :data:`CHAT_TEMPLATES` / :func:`resolve_chat_template`: templates that replace a
  tokenizer's own (``ModelConfig.chat_template``), e.g. SmolLM2's with tools;
- :data:`SHARED_DATASETS` / :func:`shared_dataset_path` / :func:`load_shared_dataset`:
  GSM8K, AIME 2024/2025 and MATH-500 from the shared data folder, with their rewards.
"""

from rlkit.data.chat_rendering import render_prompt
from rlkit.data.chat_templates import CHAT_TEMPLATES, resolve_chat_template
from rlkit.data.instructions import BOXED_INSTRUCTION, GSM8K_INSTRUCTION
from rlkit.data.prompt_dataset import (
    LoadReport,
    PromptDataError,
    load_prompt_dataset,
    load_report,
    write_parquet,
)
from rlkit.data.prompt_schema import (
    COLUMNS,
    FEATURES,
    build_messages,
    decode_extra_info,
    encode_extra_info,
)
from rlkit.data.shared_datasets import (
    SHARED_DATASETS,
    SharedDataset,
    UnknownSharedDatasetError,
    load_shared_dataset,
    shared_data_dir,
    shared_dataset,
    shared_dataset_path,
)

__all__ = [
    "BOXED_INSTRUCTION",
    "CHAT_TEMPLATES",
    "COLUMNS",
    "FEATURES",
    "GSM8K_INSTRUCTION",
    "SHARED_DATASETS",
    "LoadReport",
    "PromptDataError",
    "SharedDataset",
    "UnknownSharedDatasetError",
    "build_messages",
    "decode_extra_info",
    "encode_extra_info",
    "load_prompt_dataset",
    "load_report",
    "load_shared_dataset",
    "render_prompt",
    "resolve_chat_template",
    "shared_data_dir",
    "shared_dataset",
    "shared_dataset_path",
    "write_parquet",
]
