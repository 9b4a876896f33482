"""The trainable modules: the actor (log-probs + entropy) and the critic (values).

Both wrap a Hugging Face model at ``.backbone`` (what the FSDP backend shards)
and run only its decoder, then compute per-response-token quantities from the
hidden states: the actor through the fused chunked log-prob/entropy op, which
never materialises the (tokens x vocabulary) logits; the critic through a
scalar value head. Loading the backbones is :mod:`rlkit.models.loading`.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from transformers import PreTrainedModel

from rlkit import ops
from rlkit.distributed.collectives import world
from rlkit.distributed.sequence_parallel import SequenceParallel
from rlkit.distributed.tensor_parallel import vocab_slice
from rlkit.kernels.attention import GROUPED_SDPA, grouped_sdpa_attention
from rlkit.kernels.segmented_attention import AttentionSegments
from rlkit.modeling.prefix_sharing import shared_prefix_hidden, supports_prefix_sharing
from rlkit.modeling.ulysses import UlyssesPacking
from rlkit.models.attention_features import attention_features
from rlkit.models.vision_language import (
    image_embeddings,
    is_vision_language,
    rope_positions,
    vision_trunk,
)
from rlkit.ops.vocab_parallel import vocab_parallel_token_logprobs


def _response_hidden(
    backbone: nn.Module,
    batch: dict[str, Any],
    prompt_width: int,
    remove_padding: bool = False,
    share_prefix: bool = False,
) -> torch.Tensor:
    """Hidden states that predict each response token: positions P-1 .. P+T-2. (B, T, H).

    ``batch`` is :meth:`TrainBatch.model_inputs`: ids, masks, positions, responses and,
    for image rows, a ``multimodal`` dict of their image inputs (``pixel_values``,
    ``image_grid_thw``).
    ``share_prefix``: rows with the same prompt run it once (:mod:`prefix_sharing`), where
    the model and the batch allow it; else the plain rows.
    """
    multimodal = batch.get("multimodal")
    decoder = _decoder(backbone)
    # Under FSDP a vision-language model runs its vision tower on every process (even one
    # whose rows are text): every forward takes the vision-language path.
    in_step = is_vision_language(backbone.config) and world()[1] > 1
    if share_prefix and not in_step and supports_prefix_sharing(decoder, batch):
        return shared_prefix_hidden(decoder, batch, prompt_width)
    if multimodal or in_step:
        hidden = _vision_language_hidden(backbone, batch, prompt_width, remove_padding)
    elif remove_padding:
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


def _decoder(backbone: nn.Module) -> nn.Module:
    get = getattr(backbone, "get_decoder", None)
    decoder = get() if callable(get) else None
    return decoder if decoder is not None else backbone


def _vision_language_hidden(
    backbone: nn.Module, batch: dict[str, Any], prompt_width: int, remove_padding: bool
) -> torch.Tensor:
    """The language model over image rows: the vision tower's features in the image
    tokens' place, multimodal rotary positions (:mod:`rlkit.models.vision_language`, the
    rollout's own). With ``remove_padding`` the rows are packed into one as for text rows,
    each attended within its segment. Returns (B, L, H)."""
    trunk = vision_trunk(backbone)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    images = batch.get("multimodal")
    grid = images["image_grid_thw"] if images else None
    positions, _ = rope_positions(trunk, ids, mask, grid, prompt_width)
    embeds = image_embeddings(trunk, ids, images, prompt_width, keep_tower=images is None)
    language = trunk.language_model
    if not remove_padding:
        return language(
            inputs_embeds=embeds, attention_mask=mask, position_ids=positions, use_cache=False
        ).last_hidden_state
    keep = mask.bool()
    packed, rope = embeds[keep][None], positions[:, keep][:, None]
    if getattr(language.config, "_attn_implementation", None) == GROUPED_SDPA:
        segments = AttentionSegments.causal(keep.sum(dim=1).tolist(), keep.device)
        setting = "ModelConfig.use_remove_padding"
        out = segments.run_decoder(language, None, rope, setting, inputs_embeds=packed)
    else:
        # Text positions first (restarting per row): transformers reads the row
        # boundaries from them, as for packed text rows.
        text = batch["position_ids"][keep][None, None]
        out = language(
            inputs_embeds=packed, position_ids=torch.cat([text, rope]), use_cache=False
        ).last_hidden_state[0]
    hidden = out.new_zeros(*keep.shape, out.shape[-1])
    return hidden.index_put((keep,), out)


def _unpadded_hidden(decoder: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The decoder over the real tokens only, packed into one row (verl's remove-padding).

    Rows are concatenated without their padding into a (1, N) sequence whose position
    ids restart at 0 for each row; with no attention mask, transformers reads the row
    boundaries from the position ids (flash-attention: variable-length kernels; SDPA
    and eager: an N x N block-causal mask). Under rlkit's ``grouped_sdpa`` each row is a
    segment attended on its own (:mod:`rlkit.kernels.segmented_attention`), at the cost of
    the rows' own attention. Returns (B, L, H), zero on padding.
    """
    keep = batch["attention_mask"].bool()
    ids, positions = batch["input_ids"][keep][None], batch["position_ids"][keep][None]
    if getattr(decoder.config, "_attn_implementation", None) == GROUPED_SDPA:
        # rlkit's CPU attention attends within each row's segment instead.
        segments = AttentionSegments.causal(keep.sum(dim=1).tolist(), keep.device)
        packed = segments.run_decoder(decoder, ids, positions, "ModelConfig.use_remove_padding")
    else:
        packed = decoder(
            input_ids=ids, position_ids=positions, attention_mask=None, use_cache=False
        ).last_hidden_state[0]
    hidden = packed.new_zeros(*keep.shape, packed.shape[-1])
    return hidden.index_put((keep,), packed)  # out of place: gradients reach `packed`


def _split_sequences(backbone: nn.Module, sequence_parallel: SequenceParallel | None) -> bool:
    """Whether the forwards split sequences (Ulysses); if so, the backbone attends with
    rlkit's ``grouped_sdpa``, the attention that reads the split segments."""
    if sequence_parallel is None or not sequence_parallel.enabled:
        return False
    grouped_sdpa_attention(backbone)
    return True


class ActorModule(nn.Module):
    """Policy: per-token log pi(response_t | context) and entropy at temperature ``tau``."""

    def __init__(
        self,
        backbone: PreTrainedModel,
        *,
        chunk_size: int = 1024,
        remove_padding: bool = False,
        share_prefix: bool = False,
        sequence_parallel: SequenceParallel | None = None,
    ) -> None:
        super().__init__()
        self.backbone = backbone
        self.chunk_size = chunk_size
        self.remove_padding = remove_padding
        self.share_prefix = share_prefix
        self.sequence_parallel = sequence_parallel
        self.split = _split_sequences(backbone, sequence_parallel)
        # Gemma2 caps its output logits: the log-probs must see the same logits.
        self.logit_softcap = attention_features(backbone.config).final_logit_softcap

    def forward(
        self,
        batch: dict[str, Any],
        prompt_width: int,
        temperature: float = 1.0,
        compute_entropy: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Return ``(log_probs, entropy)``, each (B, T) float32 (entropy None if not asked).

        Under Ulysses (:mod:`rlkit.modeling.ulysses`) both are computed on this process's
        slice of the packed sequence, then gathered into whole rows."""
        if self.split:
            packing = UlyssesPacking(batch, self.sequence_parallel)
            hidden = packing.hidden(_decoder(self.backbone))[None]
            labels = packing.next_tokens[None]
        else:
            hidden = _response_hidden(
                self.backbone, batch, prompt_width, self.remove_padding, self.share_prefix
            )
            labels = batch["responses"]
        logp, ent = self._token_stats(hidden, labels, temperature, compute_entropy)
        if self.split:
            width = batch["responses"].shape[1]
            logp = packing.response_values(logp[0], prompt_width, width)
            ent = None if ent is None else packing.response_values(ent[0], prompt_width, width)
        return logp.float(), None if ent is None else ent.float()

    def _token_stats(
        self, hidden: torch.Tensor, labels: torch.Tensor, temperature: float, entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs and entropy from the hidden states through the LM head; a head split
        by vocabulary (tensor parallelism) is read slice by slice, never gathered."""
        head = self.backbone.get_output_embeddings()
        bias = getattr(head, "bias", None)
        if isinstance(head.weight, DTensor):
            weight, start, group = vocab_slice(head.weight)
            return vocab_parallel_token_logprobs(
                hidden,
                weight,
                labels,
                vocab_start=start,
                temperature=temperature,
                chunk_size=self.chunk_size,
                compute_entropy=entropy,
                bias=None if bias is None else bias.to_local(),
                logit_softcap=self.logit_softcap,
                group=group,
            )
        return ops.token_logprobs_and_entropy(
            hidden,
            head.weight,
            labels,
            temperature=temperature,
            chunk_size=self.chunk_size,
            compute_entropy=entropy,
            lm_head_bias=bias,
            logit_softcap=self.logit_softcap,
        )

    def reference_context(self) -> AbstractContextManager:
        """With LoRA, the adapter-free model is the reference policy."""
        disable = getattr(self.backbone, "disable_adapter", None)
        return disable() if callable(disable) else nullcontext()


class CriticModule(nn.Module):
    """Value model: the backbone's decoder plus a scalar head on each position."""

    def __init__(
        self,
        backbone: PreTrainedModel,
        *,
        remove_padding: bool = False,
        share_prefix: bool = False,
        sequence_parallel: SequenceParallel | None = None,
    ) -> None:
        super().__init__()
        self.backbone = backbone
        self.remove_padding = remove_padding
        self.share_prefix = share_prefix
        self.sequence_parallel = sequence_parallel
        self.split = _split_sequences(backbone, sequence_parallel)
        hidden = backbone.config.get_text_config().hidden_size  # a VL config: its text part
        self.value_head = nn.Linear(hidden, 1, dtype=next(backbone.parameters()).dtype)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    def forward(self, batch: dict[str, Any], prompt_width: int) -> torch.Tensor:
        """Values V(s_t) before each response token, (B, T) float32 (under Ulysses,
        computed on this process's slice, then gathered)."""
        if self.split:
            packing = UlyssesPacking(batch, self.sequence_parallel)
            local = self.value_head(packing.hidden(_decoder(self.backbone))).squeeze(-1)
            return packing.response_values(local, prompt_width, batch["responses"].shape[1]).float()
        hidden = _response_hidden(
            self.backbone, batch, prompt_width, self.remove_padding, self.share_prefix
        )
        return self.value_head(hidden).squeeze(-1).float()


class RewardModelModule(nn.Module):
    """A frozen sequence classifier: its single logit at each row's last real token.

    The trunk and the ``score`` head are run here rather than through the model's own
    forward, which finds the last token by searching for the pad id and so misreads
    a row whose text contains the pad token (often EOS).
    """

    def __init__(self, backbone: PreTrainedModel) -> None:
        super().__init__()
        head = getattr(backbone, "score", None)
        if not isinstance(head, nn.Linear):
            raise ValueError(
                f"{type(backbone).__name__} has no linear `score` head; a reward model is a "
                "transformers *ForSequenceClassification decoder (e.g. Qwen2, Llama)"
            )
        self.backbone = backbone

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
    ) -> torch.Tensor:
        """Scores (B,) float32 of right-padded rows (B, L)."""
        hidden = self.backbone.base_model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=False,
        ).last_hidden_state
        last = attention_mask.sum(-1).clamp(min=1) - 1
        pooled = hidden[torch.arange(len(hidden), device=hidden.device), last]
        return self.backbone.score(pooled).squeeze(-1).float()
