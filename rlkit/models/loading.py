"""Loading local Hugging Face models: the causal LM, the critic's trunk, the reward model,
LoRA adapters."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForImageTextToText,
    PreTrainedModel,
)

from rlkit.models.attention_features import check_supported, keep_exact_attention
from rlkit.models.vision_language import is_vision_language

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def check_model_dir(path: str) -> Path:
    p = Path(path)
    if not p.is_dir():
        raise FileNotFoundError(
            f"model path {path!r} is not a directory; set ModelConfig.path to a local "
            f"Hugging Face model directory (config.json + weights)"
        )
    if not (p / "config.json").exists() and not any(p.glob("*.gguf")):
        raise FileNotFoundError(f"model directory {path!r} has no config.json (nor a .gguf file)")
    return p


def check_model_family(path: str, setting: str = "ModelConfig.path") -> None:
    """Refuse, before loading, a model whose forward rlkit cannot reproduce exactly
    (:func:`rlkit.models.attention_features.check_supported`); a GGUF-only directory is
    checked when it loads.

    Raises:
        UnsupportedModelError: the message names the feature.
    """
    if (Path(path) / "config.json").is_file():
        check_supported(AutoConfig.from_pretrained(path), setting)


def load_causal_lm(
    path: str,
    *,
    dtype: str = "float32",
    gguf_file: str | None = None,
    gradient_checkpointing: bool = False,
) -> PreTrainedModel:
    """Load a local causal LM (``gguf_file`` dequantises a GGUF checkpoint)."""
    check_model_dir(path)
    if dtype not in DTYPES:
        raise ValueError(f"ModelConfig.dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    config = AutoConfig.from_pretrained(path, gguf_file=gguf_file)
    model = causal_lm_class(config).from_pretrained(
        path, config=config, dtype=DTYPES[dtype], gguf_file=gguf_file
    )
    check_supported(model.config)
    keep_exact_attention(model)
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def _vision_language_dir(path: str) -> bool:
    """Whether the model directory holds a vision-language model (Qwen2-VL, Qwen2.5-VL)."""
    config = Path(path) / "config.json"
    return config.is_file() and is_vision_language(AutoConfig.from_pretrained(path))


def load_image_processor(path: str) -> Any | None:
    """The image processor of a vision-language model directory (saved beside exported
    weights, so they render image prompts again); ``None`` for a text-only model."""
    if not _vision_language_dir(path):
        return None
    from transformers import AutoImageProcessor

    return AutoImageProcessor.from_pretrained(path)


def causal_lm_class(config: Any) -> Any:
    """The transformers auto class a model directory of ``config`` loads with."""
    return AutoModelForImageTextToText if is_vision_language(config) else AutoModelForCausalLM


def load_critic_backbone(
    path: str, *, dtype: str = "float32", gguf_file: str | None = None
) -> PreTrainedModel:
    """The critic's trunk: the base model without the language-model head."""
    check_model_dir(path)
    config = AutoConfig.from_pretrained(path, gguf_file=gguf_file)
    check_supported(config, "ModelConfig.critic_path")
    model = AutoModel.from_pretrained(path, config=config, dtype=DTYPES[dtype], gguf_file=gguf_file)
    keep_exact_attention(model)
    return model


def add_lora(
    model: PreTrainedModel, *, rank: int, alpha: int, target_modules: str | tuple[str, ...]
) -> nn.Module:
    """Wrap ``model`` with peft LoRA adapters (only they train)."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as exc:  # pragma: no cover - peft is a declared extra
        raise ImportError("LoRA needs peft: pip install 'rlkit[lora]'") from exc
    targets = target_modules if isinstance(target_modules, str) else list(target_modules)
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets, task_type="CAUSAL_LM")
    return get_peft_model(model, config)


def check_reward_model_dir(path: str) -> Path:
    """Check that ``path`` holds a one-label sequence classifier, before it is loaded.

    Raises:
        FileNotFoundError: not a directory, or no ``config.json``.
        ValueError: no ``*ForSequenceClassification`` architecture, or not one label.
    """
    p = Path(path)
    if not (p / "config.json").is_file():
        raise FileNotFoundError(
            f"RewardModelConfig.path {path!r} is not a Hugging Face model directory "
            "(no config.json); give a local AutoModelForSequenceClassification directory"
        )
    config = AutoConfig.from_pretrained(path)
    architectures = list(getattr(config, "architectures", None) or [])
    if not any(a.endswith("ForSequenceClassification") for a in architectures):
        raise ValueError(
            f"RewardModelConfig.path {path!r} has no classification head (architectures: "
            f"{architectures}); a reward model is an AutoModelForSequenceClassification "
            "with num_labels=1, e.g. one trained with TRL's RewardTrainer"
        )
    if config.num_labels != 1:
        raise ValueError(
            f"RewardModelConfig.path {path!r} has {config.num_labels} labels; a reward model "
            "has 1 (a single score per sequence)"
        )
    return p


def load_reward_model(path: str, *, dtype: str = "float32") -> PreTrainedModel:
    """A frozen one-label sequence classifier (the reward model), in eval mode."""
    from transformers import AutoModelForSequenceClassification

    check_reward_model_dir(path)
    model = AutoModelForSequenceClassification.from_pretrained(path, dtype=DTYPES[dtype])
    keep_exact_attention(model)
    model.requires_grad_(False)
    return model.eval()
