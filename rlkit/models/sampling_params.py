"""How a causal LM samples a response: :class:`SamplingParams`, what every rollout engine
(:mod:`rlkit.rollout`) is asked for.

It sits with the models, below the rollout engines, because code of a lower layer asks
an engine for text too: the generative judge (:mod:`rewards.generative_judge`) builds
its engine by name and passes these settings.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SamplingParams:
    """How to sample. ``n`` responses are drawn for every prompt.

    ``top_k <= 0`` and ``top_p == 1`` disable those filters; ``temperature == 0``
    means greedy decoding. ``stop_token_ids`` end a response (the stop token is
    kept in the response, as EOS is). ``top_logprobs > 0`` asks the engine for the
    ``top_logprobs`` most likely tokens at every sampled position with their log-probs
    (:attr:`rlkit.rollout.sampling.RolloutBatch.top_log_probs`), which ``rlkit diagnose``
    compares with the trainer's distribution; engines that cannot report them leave
    the field ``None``.
    """

    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    n: int = 1
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    top_logprobs: int = 0
