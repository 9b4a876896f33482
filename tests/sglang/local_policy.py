"""A :class:`rlkit.rollout.base.PolicyWeights` around a local transformers model (tests only).

The trainer provides the real one (``rlkit.trainer.policy_weights``); the SGLang tests
sync weights from a plain ``Qwen2ForCausalLM`` with the trainer's own frozen-weights
class, as a sync running beside the trainer's update does.
"""

from __future__ import annotations

import torch

from rlkit.trainer.policy_weights import FrozenPolicyWeights


def LocalPolicyWeights(model: torch.nn.Module, version: int) -> FrozenPolicyWeights:  # noqa: N802 - used as a class
    """Weights of ``model`` at optimizer step ``version``."""
    return FrozenPolicyWeights(model, None, version)
