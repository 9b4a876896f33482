"""The response length that length-shaping rewards read from their extra fields."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def response_length(extra: Mapping[str, Any], reward_name: str) -> int:
    """The ``response_length`` field (tokens) of a reward call's extra fields.

    Args:
        extra: the per-sample keyword arguments the reward received.
        reward_name: the asking reward, named in the error.

    Returns:
        The response's length in tokens.

    Raises:
        ValueError: the field is missing or negative.
    """
    if "response_length" not in extra:
        raise ValueError(
            f"{reward_name} needs response_length (the response's token count) among the "
            f"reward's extra fields; the trainer passes it, score_batch takes it in extras"
        )
    length = int(extra["response_length"])
    if length < 0:
        raise ValueError(f"{reward_name}: response_length must be >= 0, got {length}")
    return length
