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
    decoder: nn.Module,
    batch: dict[str, torch.Tensor],
    prompt_width: int,
    remove_padding: bool = False,
) -> torch.Tensor:
    """Hidden states that predict each response token: positions P-1 .. P+T-2. (B, T, H)."""
    if remove_padding:
        hidden = _unpadded_hidden(decoder, batch)
    else:
        hidden = decoder(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            position_ids=batch["position_ids"],
            use_cache=False,
        ).last_hidden_state
    t = batch["responses"].shape[1]
    return hidden[:, prompt_width - 1 : prompt_width - 1 + t]


def _unpadded_hidden(decoder: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The decoder over the real tokens only, packed into one row (verl's remove-padding).

    Rows are concatenated without their padding into a (1, N) sequence whose position
    ids restart at 0 for each row; with no attention mask, transformers reads the row
    boundaries from the position ids (flash-attention: variable-length kernels; SDPA
    and eager: an N x N block-causal mask). Returns (B, L, H), zero on padding.
    """
    keep = batch["attention_mask"].bool()
    packed = decoder(
        input_ids=batch["input_ids"][keep][None],
        position_ids=batch["position_ids"][keep][None],
        attention_mask=None,
        use_cache=False,
    ).last_hidden_state[0]
    hidden = packed.new_zeros(*keep.shape, packed.shape[-1])
    return hidden.index_put((keep,), packed)  # out of place: gradients reach `packed`


class ActorModule(nn.Module):
    """Policy: per-token log pi(response_t | context) and entropy at temperature ``tau``."""

    def __init__(
        self, backbone: PreTrainedModel, *, chunk_size: int = 1024, remove_padding: bool = False
    ) -> None:
        super().__init__()
        self.backbone = backbone
        self.chunk_size = chunk_size
        self.remove_padding = remove_padding

    def forward(
        self,
        batch: dict[str, torch.Tensor],
        prompt_width: int,
        temperature: float = 1.0,
        compute_entropy: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Return ``(log_probs, entropy)``, each (B, T) float32 (entropy None if not asked)."""
        decoder = self.backbone.get_decoder()
        hidden = _response_hidden(decoder, batch, prompt_width, self.remove_padding)
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

    def __init__(self, backbone: PreTrainedModel, *, remove_padding: bool = False) -> None:
        super().__init__()
        self.backbone = backbone
        self.remove_padding = remove_padding
        hidden = backbone.config.hidden_size
        self.value_head = nn.Linear(hidden, 1, dtype=next(backbone.parameters()).dtype)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    def forward(self, batch: dict[str, torch.Tensor], prompt_width: int) -> torch.Tensor:
        """Values V(s_t) before each response token, (B, T) float32."""
        hidden = _response_hidden(self._decoder(), batch, prompt_width, self.remove_padding)
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
