"""Prompt data: load prompt datasets into rlkit's schema, render them, name the shared sets.

- :func:`load_prompt_dataset` / :func:`write_parquet`: JSON Lines, Parquet or hub
  datasets to ``id``, ``prompt`` (chat messages), ``ground_truth``, ``data_source``,
  ``extra_info``;
- :func:`render_prompt`: messages to model text (chat template or plain);
- :data:`CHAT_TEMPLATES` / :func:`resolve_chat_template`: templates that replace a
  tokenizer's own (``ModelConfig.chat_template``), e.g. SmolLM2's with tools;
- :data:`SHARED_DATASETS` / :func:`load_shared_dataset`: the dataset presets (GSM8K,
  MATH-500, AIME 2024/2025, DAPO-Math-17k) with their rewards, read from
  ``$RLKIT_DATA_DIR`` when set (:func:`shared_dataset_path`), else from the hub.
"""

from rlkit.data.chat_rendering import render_prompt
from rlkit.data.chat_templates import CHAT_TEMPLATES, resolve_chat_template
from rlkit.data.instructions import BOXED_INSTRUCTION, GSM8K_INSTRUCTION
from rlkit.data.prompt_dataset import (
    DataUnavailableError,
    LoadReport,
    PromptDataError,
    load_prompt_dataset,
    load_report,
    prompt_dataset_from_rows,
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
    HubSource,
    SharedDataset,
    UnknownSharedDatasetError,
    gsm8k_final_answer,
    hub_rows,
    load_shared_dataset,
    local_data_dir,
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
    "DataUnavailableError",
    "HubSource",
    "LoadReport",
    "PromptDataError",
    "SharedDataset",
    "UnknownSharedDatasetError",
    "build_messages",
    "decode_extra_info",
    "encode_extra_info",
    "gsm8k_final_answer",
    "hub_rows",
    "load_prompt_dataset",
    "load_report",
    "load_shared_dataset",
    "local_data_dir",
    "prompt_dataset_from_rows",
    "render_prompt",
    "resolve_chat_template",
    "shared_dataset",
    "shared_dataset_path",
    "write_parquet",
]
