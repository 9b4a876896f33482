"""The trainable modules: the actor (log-probs + entropy) and the critic (values).

Both wrap a Hugging Face model at ``.backbone`` (what the FSDP backend shards)
and run only its decoder, then compute per-response-token quantities from the
hidden states: the actor through the fused chunked log-prob/entropy op, which
never materialises the (tokens x vocabulary) logits; the critic through a
scalar value head.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

import torch
from torch import nn
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, PreTrainedModel

from rlkit import ops

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _response_hidden(
    decoder: nn.Module, batch: dict[str, torch.Tensor], prompt_width: int
) -> torch.Tensor:
    """Hidden states that predict each response token: positions P-1 .. P+T-2. (B, T, H)."""
    out = decoder(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        position_ids=batch["position_ids"],
        use_cache=False,
    )
    t = batch["responses"].shape[1]
    return out.last_hidden_state[:, prompt_width - 1 : prompt_width - 1 + t]


class ActorModule(nn.Module):
    """Policy: per-token log pi(response_t | context) and entropy at temperature ``tau``."""

    def __init__(self, backbone: PreTrainedModel, *, chunk_size: int = 1024) -> None:
        super().__init__()
        self.backbone = backbone
        self.chunk_size = chunk_size

    def forward(
        self,
        batch: dict[str, torch.Tensor],
        prompt_width: int,
        temperature: float = 1.0,
        compute_entropy: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Return ``(log_probs, entropy)``, each (B, T) float32 (entropy None if not asked)."""
        hidden = _response_hidden(self.backbone.get_decoder(), batch, prompt_width)
        head = self.backbone.get_output_embeddings()
        logp, ent = ops.token_logprobs_and_entropy(
            hidden,
            head.weight,
            batch["responses"],
            temperature=temperature,
            chunk_size=self.chunk_size,
            compute_entropy=compute_entropy,
            lm_head_bias=getattr(head, "bias", None),
        )
        return logp.float(), None if ent is None else ent.float()

    def reference_context(self) -> AbstractContextManager:
        """With LoRA, the adapter-free model is the reference policy."""
        disable = getattr(self.backbone, "disable_adapter", None)
        return disable() if callable(disable) else nullcontext()


class CriticModule(nn.Module):
    """Value model: the backbone's decoder plus a scalar head on each position."""

    def __init__(self, backbone: PreTrainedModel) -> None:
        super().__init__()
        self.backbone = backbone
        hidden = backbone.config.hidden_size
        self.value_head = nn.Linear(hidden, 1, dtype=next(backbone.parameters()).dtype)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    def forward(self, batch: dict[str, torch.Tensor], prompt_width: int) -> torch.Tensor:
        """Values V(s_t) before each response token, (B, T) float32."""
        hidden = _response_hidden(self._decoder(), batch, prompt_width)
        return self.value_head(hidden).squeeze(-1).float()

    def _decoder(self) -> nn.Module:
        get = getattr(self.backbone, "get_decoder", None)
        return get() if callable(get) and get() is not None else self.backbone


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
    model = AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[dtype], gguf_file=gguf_file)
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def load_critic_backbone(
    path: str, *, dtype: str = "float32", gguf_file: str | None = None
) -> PreTrainedModel:
    """The critic's trunk: the base model without the language-model head."""
    check_model_dir(path)
    config = AutoConfig.from_pretrained(path, gguf_file=gguf_file)
    return AutoModel.from_pretrained(path, config=config, dtype=DTYPES[dtype], gguf_file=gguf_file)


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
