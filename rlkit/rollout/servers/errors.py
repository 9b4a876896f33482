"""What can go wrong talking to rollout servers, one exception per way."""

from __future__ import annotations


class ServerStartError(RuntimeError):
    """A server exited or did not become healthy in time."""


class RequestError(RuntimeError):
    """A request failed in a way worth retrying elsewhere (timeout, connection, 5xx)."""


class BadRequestError(RuntimeError):
    """The server rejected the request itself (HTTP 4xx): retrying cannot help."""


class RolloutError(RuntimeError):
    """Prompts could not be completed: retries used up, or no server left."""


class NoHealthyServerError(RolloutError):
    """Every endpoint is down or out of restarts."""


class WeightSyncError(RuntimeError):
    """A server refused or failed a weight update."""


class WeightMismatchError(WeightSyncError):
    """After a sync, a server's weights are not the trainer's: the sync did not take
    effect (or took effect in part). A run stops with this one message."""


class ProbeMismatchError(WeightSyncError):
    """After a sync, a server's log-probs of a fixed sequence are not the trainer's, beyond
    the tolerance: the weights did not arrive (where they could not be compared directly)
    or the server computes with them differently (dtype, model configuration). A run stops
    with this one message; ``rlkit diagnose`` tells the two apart."""
