"""One generated response as a server engine receives it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Sample:
    """One generated response."""

    response_ids: list[int]
    log_probs: list[float]
    finish_reason: str  # "stop" | "length"
    weight_version: str  # the server's version when the response finished
    token_versions: list[int | None] | None = None
    """Per token, the version that sampled it, when the server's weights changed under
    the request (SGLang's ``weight_versions`` spans; ``None`` for its initial weights)."""
    top_log_probs: list[dict[int, float]] | None = None
    """Per token, the server's most likely tokens and their log-probs (``{id: log-prob}``),
    when ``SamplingParams.top_logprobs > 0`` asked for them."""
