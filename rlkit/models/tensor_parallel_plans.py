"""Which module of each model family splits how under tensor parallelism.

A plan maps module paths of a decoder (``*`` matches one path segment) to one of rlkit's
split kinds; :mod:`rlkit.distributed.tensor_parallel` turns the kinds into torch's
DTensor parallel styles. The decoder's entries come from transformers' own plan
(``config.base_model_tp_plan``) where the family has one and every style in it has an
rlkit kind; :data:`WRITTEN_PLANS` holds plans rlkit writes itself. The embeddings and a
language-model head are split by vocabulary in every family
(:func:`rlkit.distributed.tensor_parallel.parallelize_backbone`); other heads (a critic's
value head, a reward model's score) stay replicated.

The kinds (Megatron-LM's split, Shoeybi et al. 2019, arXiv:1909.08053):

- ``colwise``: a linear layer's output features (q/k/v, gate/up) are split, so each
  process holds whole attention heads or a slice of the MLP's inner width;
- ``rowwise``: a linear layer's input features (o, down) are split to match; the partial
  outputs are summed over the processes (one all-reduce);
- ``head_norm``: a norm over ``head_dim`` that sees only this process's heads (Qwen3's
  ``q_norm``/``k_norm``): replicated weight, its gradient summed over the processes;
- ``vocab_embedding``: the embedding table split by vocabulary rows;
- ``vocab_head``: the LM head split by vocabulary rows. The trainer's log-probs read the
  local slice (:func:`rlkit.ops.vocab_parallel.vocab_parallel_token_logprobs`); a plain
  forward (generation) gathers the logits.

Mixture-of-experts layers: the router and the experts are replicated over the
tensor-parallel processes (each computes every expert of its tokens; FSDP2 still shards
them over data-parallel processes). transformers' expert entries (``experts``,
``experts.gate_up_proj``, ...) are therefore left out of the plan.
"""

from __future__ import annotations

from typing import Any

KINDS = ("colwise", "rowwise", "head_norm", "vocab_embedding", "vocab_head")

#: transformers' style names -> rlkit's kinds (styles not listed have no rlkit kind).
TRANSFORMERS_STYLES = {
    "colwise": "colwise",
    "rowwise": "rowwise",
    "replicated_with_grad_allreduce": "head_norm",
    "embedding_rowwise": "vocab_embedding",
}

#: Decoder plans rlkit writes for families whose transformers config has none. Paths are
#: relative to the decoder (``model.``), as transformers' own plans are.
WRITTEN_PLANS: dict[str, dict[str, str]] = {
    # Llama's layout with a per-head norm of queries and keys (as Qwen3's q_norm/k_norm).
    "hunyuan_v1_dense": {
        "layers.*.self_attn.q_proj": "colwise",
        "layers.*.self_attn.k_proj": "colwise",
        "layers.*.self_attn.v_proj": "colwise",
        "layers.*.self_attn.query_layernorm": "head_norm",
        "layers.*.self_attn.key_layernorm": "head_norm",
        "layers.*.self_attn.o_proj": "rowwise",
        "layers.*.mlp.gate_proj": "colwise",
        "layers.*.mlp.up_proj": "colwise",
        "layers.*.mlp.down_proj": "rowwise",
    },
}

#: Families refused although transformers has a plan, and why.
UNSUPPORTED: dict[str, str] = {
    "deepseek_v3": (
        "its multi-head latent attention (MLA) projections have no column/row split in "
        "rlkit's plans"
    ),
    "phi3": "its fused qkv and gate_up projections need a split that keeps q, k and v whole",
}

_EXPERT_PARTS = (".experts", ".shared_experts")


class TensorParallelPlanError(ValueError):
    """A model family rlkit has no tensor-parallel plan for."""


def _text_config(config: Any) -> Any:
    get = getattr(config, "get_text_config", None)
    return get() if callable(get) else config


def _decoder_plan(config: Any) -> dict[str, str]:
    model_type = getattr(config, "model_type", "?")
    if model_type in UNSUPPORTED:
        raise TensorParallelPlanError(
            f"tensor parallelism has no plan for {model_type!r}: {UNSUPPORTED[model_type]}; "
            "set ModelConfig.tensor_parallel_size = 1 (FSDP2 alone shards this model)"
        )
    if model_type in WRITTEN_PLANS:
        return dict(WRITTEN_PLANS[model_type])
    given = getattr(config, "base_model_tp_plan", None) or {}
    plan = {}
    for path, style in given.items():
        if any(part in path for part in _EXPERT_PARTS):
            continue  # experts stay replicated (module docstring)
        if style not in TRANSFORMERS_STYLES:
            raise TensorParallelPlanError(
                f"tensor parallelism has no plan for {model_type!r}: its transformers plan "
                f"splits {path!r} as {style!r}, which rlkit's plans do not cover; set "
                "ModelConfig.tensor_parallel_size = 1"
            )
        plan[path] = TRANSFORMERS_STYLES[style]
    if not plan:
        raise TensorParallelPlanError(
            f"tensor parallelism has no plan for model type {model_type!r} (transformers gives "
            "none and rlkit writes none); set ModelConfig.tensor_parallel_size = 1, or add "
            "the family to rlkit.models.tensor_parallel_plans.WRITTEN_PLANS"
        )
    return plan


def tensor_parallel_plan(config: Any) -> dict[str, str]:
    """The decoder's plan for a model with configuration ``config``: module path (relative
    to the decoder, transformers' ``base_model``) -> kind. The embeddings and an LM head
    are added by the caller, which knows where they are.

    Raises:
        TensorParallelPlanError: the family has no plan (vision-language models included).
    """
    if getattr(config, "vision_config", None) is not None:
        raise TensorParallelPlanError(
            f"tensor parallelism has no plan for the vision-language model "
            f"{getattr(config, 'model_type', '?')!r}; set ModelConfig.tensor_parallel_size = 1"
        )
    return _decoder_plan(_text_config(config))


def tensor_parallel_problem(config: Any, size: int) -> str | None:
    """Why a model with ``config`` cannot be split over ``size`` processes, or None."""
    if size == 1:
        return None
    try:
        tensor_parallel_plan(config)
    except TensorParallelPlanError as error:
        return str(error)
    text = _text_config(config)
    counts = {
        "attention heads (num_attention_heads)": getattr(text, "num_attention_heads", None),
        "key/value heads (num_key_value_heads)": getattr(text, "num_key_value_heads", None),
        "MLP width (intermediate_size)": getattr(text, "intermediate_size", None),
    }
    for what, count in counts.items():
        if count is not None and count % size:
            return (
                f"ModelConfig.tensor_parallel_size = {size} does not divide the model's {count} "
                f"{what}: each process must hold whole heads and an equal slice; choose a size "
                f"that divides {count}"
            )
    return None
