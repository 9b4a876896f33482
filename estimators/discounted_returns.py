"""Discounted returns over valid tokens: G_t = r_t + gamma * G_{t'}, t' the next valid token.

REINFORCE++ and ReMax use them. :func:`discounted_returns` is the textbook reverse
loop over time; :func:`discounted_returns_fused` gives the same numbers without a
loop (``discounted_scan``) and runs by default; ``estimators.set_math("plain")``
selects the loop.

Mask-0 tokens are skipped, not reset: the return at a valid token sums the later
valid tokens, discounted by the number of valid tokens between them (verl's
treatment of multi-turn observation spans in GAE), and rewards on mask-0 tokens
are ignored.
"""

from __future__ import annotations

import torch

from estimators.discounted_scan import masked_reverse_discounted_cumsum


def discounted_returns(rewards: torch.Tensor, mask: torch.Tensor, *, gamma: float) -> torch.Tensor:
    """G_t = r_t + gamma * G_{t'} over valid tokens, by the reverse loop over time.

    Args:
        rewards: (B, T) token rewards (ignored on mask-0 tokens).
        mask: (B, T) bool valid-token mask.
        gamma: discount per valid token, in [0, 1].

    Returns:
        (B, T) G_t on valid tokens, 0 on mask-0 tokens.
    """
    returns = torch.zeros_like(rewards)
    running = rewards.new_zeros(rewards.shape[0])  # G_{t'}: 0 past the last valid token
    for t in reversed(range(rewards.shape[1])):
        valid = mask[:, t]
        # A mask-0 token leaves the running return as it is (skipped, not reset).
        running = torch.where(valid, rewards[:, t] + gamma * running, running)
        returns[:, t] = torch.where(valid, running, 0.0)
    return returns


def discounted_returns_fused(
    rewards: torch.Tensor, mask: torch.Tensor, *, gamma: float
) -> torch.Tensor:
    """:func:`discounted_returns` without a loop over time: same arguments, same numbers.

    Valid tokens are packed to the front of each row and scanned by chunked matmuls
    (``discounted_scan.masked_reverse_discounted_cumsum``).

    Returns:
        (B, T) G_t on valid tokens, 0 on mask-0 tokens.
    """
    return masked_reverse_discounted_cumsum(rewards, mask, mask.to(rewards.dtype), gamma)
