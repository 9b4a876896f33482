"""What a model's configuration says about its attention and its logits.

rlkit's fast paths (shared-prefix passes, attention within segments, the in-place and
shared-prefix KV caches, the chunked log-prob op) compute the same function as the
model's own forward only if they honour every feature that shapes it. This module reads
those features from a Hugging Face configuration, so each path can honour them or step
aside, and so a model whose forward rlkit cannot reproduce is refused before it loads.

=========================  =================================================  ===============
feature                    where rlkit honours it                             families
=========================  =================================================  ===============
sliding windows            segment masks (per layer, from the attention's     Mistral, Phi3,
(uniform or alternating    ``sliding_window``), shared-prefix 4D masks (one   Qwen2 (window),
local/global layers)       per layer type), decode: transformers' own cache   Gemma2, Gemma3
attention soft-capping     rlkit's attention kernels (plain math when set);   Gemma2
                           transformers' ``sdpa`` ignores it, so it is
                           replaced by ``eager``
final-logit soft-capping   the log-prob op (``logit_softcap``)                Gemma2
multi-head latent          the in-place KV cache holds the latents (their     DeepSeek-V2/V3
attention (MLA)            two parts differ in size); the shared-prefix
                           decode attention, which reads attention keys from
                           the cache, is off
mixture of experts         routing is a function of the hidden states, which  Qwen3-MoE,
                           every path computes alike; the router's auxiliary  DeepSeek-V3
                           loss is not added (the RL loss is the objective)
=========================  =================================================  ===============

Refused (:func:`check_supported`): bidirectional attention, attention layer kinds other
than full and sliding-window (chunked, linear, hybrid state-space), and logit scalings
the log-prob op does not apply (Cohere's ``logit_scale``, Granite's ``logits_scaling``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

FULL, SLIDING = "full_attention", "sliding_attention"


class UnsupportedModelError(ValueError):
    """A model whose forward rlkit cannot reproduce exactly; the message names the feature."""


@dataclass(frozen=True)
class AttentionFeatures:
    """The features of one model configuration that rlkit's fast paths must honour.

    Attributes:
        model_type: the configuration's ``model_type``.
        layer_windows: per decoder layer, its sliding window in tokens (a query sees
            itself and the ``window - 1`` keys before it) or ``None`` for full attention.
        layer_types: per decoder layer, ``"full_attention"`` or ``"sliding_attention"``
            when the configuration lists them (the model then takes one mask per layer
            type), else ``None`` (one mask for every layer).
        attention_softcap: ``c`` in ``c * tanh(scores / c)`` before the softmax, or None.
        final_logit_softcap: the same cap on the output logits, or None.
        value_head_dim: the value head size where it differs from the key's (MLA).
        latent_kv_cache: the KV cache holds compressed latents that each layer expands
            into keys and values after reading it (MLA), not the attention's keys.
        experts: routed experts per MoE layer (0: dense).
    """

    model_type: str
    layer_windows: tuple[int | None, ...]
    layer_types: tuple[str, ...] | None
    attention_softcap: float | None
    final_logit_softcap: float | None
    value_head_dim: int | None
    latent_kv_cache: bool
    experts: int

    @property
    def windowed(self) -> bool:
        """Whether any layer attends within a sliding window."""
        return any(w is not None for w in self.layer_windows)

    def windows_by_layer_type(self) -> dict[str, int | None]:
        """``{layer type: window}`` for a model that takes one mask per layer type."""
        return dict(zip(self.layer_types or (), self.layer_windows))

    def notes(self) -> list[str]:
        """One line per feature that changes how rlkit runs this model (for the log)."""
        lines = []
        if self.windowed:
            windows = sorted({w for w in self.layer_windows if w is not None})
            lines.append(
                f"{self.model_type}: sliding-window attention ({windows} tokens) is honoured "
                f"in the shared-prefix and segment masks; the decode loop keeps transformers' "
                f"own KV cache for it (the in-place and shared-prefix caches hold full layers)"
            )
        if self.latent_kv_cache:
            lines.append(
                f"{self.model_type}: multi-head latent attention caches latents, not keys; "
                f"the decode loop's shared-prefix attention is off for it"
            )
        if self.attention_softcap is not None or self.final_logit_softcap is not None:
            lines.append(
                f"{self.model_type}: soft-capping (attention {self.attention_softcap}, final "
                f"logits {self.final_logit_softcap}) is applied by rlkit's attention and "
                f"log-prob kernels; torch sdpa attention, which ignores it, is replaced by eager"
            )
        if self.experts:
            lines.append(
                f"{self.model_type}: mixture of {self.experts} experts; the router's auxiliary "
                f"load-balancing loss is not added to the RL loss"
            )
        return lines


def text_config(config: Any) -> Any:
    """The decoder's configuration (a vision-language model's ``text_config``)."""
    get = getattr(config, "get_text_config", None)
    return get() if callable(get) else config


def attention_features(config: Any) -> AttentionFeatures:
    """Read :class:`AttentionFeatures` from a Hugging Face (text) configuration.

    Windows follow the masks transformers builds: with ``layer_types``, the layers of
    type ``sliding_attention`` use ``sliding_window``; without, every layer does when
    ``sliding_window`` is set (Mistral, Phi3, Qwen3-MoE).
    """
    config = text_config(config)
    layers = int(getattr(config, "num_hidden_layers", 0) or 0)
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if types is not None:
        types = tuple(types)[:layers]
        windows = tuple(window if t == SLIDING else None for t in types)
    else:
        windows = (window,) * layers
    key_dim = (getattr(config, "qk_nope_head_dim", 0) or 0) + (
        getattr(config, "qk_rope_head_dim", 0) or 0
    )
    value_dim = getattr(config, "v_head_dim", None)
    experts = next(
        (
            int(getattr(config, name))
            for name in ("num_experts", "n_routed_experts", "num_local_experts")
            if getattr(config, name, None)
        ),
        0,
    )
    return AttentionFeatures(
        model_type=str(getattr(config, "model_type", "")),
        layer_windows=windows,
        layer_types=types,
        attention_softcap=getattr(config, "attn_logit_softcapping", None),
        final_logit_softcap=getattr(config, "final_logit_softcapping", None),
        value_head_dim=value_dim if value_dim and key_dim and value_dim != key_dim else None,
        latent_kv_cache=bool(getattr(config, "kv_lora_rank", None)),
        experts=experts,
    )


def check_supported(config: Any, setting: str = "ModelConfig.path") -> AttentionFeatures:
    """:func:`attention_features`, after refusing what rlkit cannot reproduce exactly.

    Raises:
        UnsupportedModelError: the configuration has a feature rlkit's forward passes do
            not compute as the model's own forward does; the message names it.
    """
    config = text_config(config)
    model_type = getattr(config, "model_type", "?")
    problems = []
    if getattr(config, "use_bidirectional_attention", False):
        problems.append("bidirectional attention (use_bidirectional_attention=True)")
    kinds = sorted(set(getattr(config, "layer_types", None) or ()) - {FULL, SLIDING})
    if kinds:
        problems.append(f"attention layer kinds {kinds} (rlkit runs full and sliding-window)")
    if getattr(config, "attention_chunk_size", None):
        problems.append(f"chunked attention (attention_chunk_size={config.attention_chunk_size})")
    for name in ("logit_scale", "logits_scaling"):
        value = getattr(config, name, None)
        if value not in (None, 1, 1.0):
            problems.append(f"output-logit scaling ({name}={value})")
    if problems:
        raise UnsupportedModelError(
            f"{setting}: a {model_type} model with {'; '.join(problems)} cannot be trained "
            f"exactly: rlkit's log-prob and attention paths do not compute it as the model's "
            f"own forward does. Supported families are listed in docs/models.md"
        )
    return attention_features(config)


def keep_exact_attention(model: Any) -> str | None:
    """Replace transformers' ``sdpa`` attention by ``eager`` on a model that soft-caps its
    attention scores (Gemma2): SDPA has no cap, so transformers' ``sdpa`` path drops it,
    while ``eager`` (and flash-attention, and rlkit's ``grouped_sdpa``) apply it.

    Returns the line logged when it switched, else None.
    """
    config = getattr(model, "config", None)
    if config is None or attention_features(config).attention_softcap is None:
        return None
    if getattr(config, "_attn_implementation", None) != "sdpa":
        return None
    model.set_attn_implementation("eager")
    note = (
        f"{type(model).__name__}: attention soft-capping is set, which torch sdpa attention "
        f"ignores; using eager attention instead"
    )
    logger.info(note)
    return note
