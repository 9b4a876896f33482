"""Deliberately broken components, reached by dotted path from trainer tests."""

import torch


def nan_loss(old_log_prob, log_prob, advantages, response_mask, **kwargs):
    """A policy loss whose value is NaN (but still has a gradient path)."""
    loss = (log_prob * response_mask).sum() * float("nan")
    return loss, {
        "pg_clipfrac": torch.tensor(0.0),
        "ppo_kl": torch.tensor(0.0),
        "pg_clipfrac_lower": torch.tensor(0.0),
    }


def raising_reward(response, ground_truth, **extra):
    """A reward function that always fails."""
    raise RuntimeError("reward server unavailable")


def sleepy_reward(response, ground_truth, **extra):
    """A reward that hangs (in Python: time limits interrupt it)."""
    import time

    time.sleep(30)
    return 1.0
