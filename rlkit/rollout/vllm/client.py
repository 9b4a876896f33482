"""vLLM's OpenAI-compatible completions protocol, as token ids in and token ids out.

``POST /v1/completions`` takes the prompt as a list of token ids; with
``return_token_ids`` and ``logprobs: 0`` each choice carries ``token_ids`` (the sampled
ids) and ``logprobs.token_logprobs`` (one log-prob per sampled id). Which log-prob is
returned is a server setting, ``--logprobs-mode``: rlkit launches servers with
``processed_logprobs``, the log-prob under the distribution the token was drawn from
(temperature, top-k and top-p applied), as the HF engine returns; an attached server
must be started the same way. ``prompt_logprobs`` scores a given sequence.
"""

from __future__ import annotations

from typing import Any

from rlkit.rollout.base import SamplingParams
from rlkit.rollout.servers.errors import RequestError
from rlkit.rollout.servers.sample import Sample


def completion_body(
    prompt: list[int],
    params: SamplingParams,
    extra_stop_ids: tuple[int, ...],
    seed: int | None,
) -> dict[str, Any]:
    """The JSON body of ``POST /v1/completions``: ``params.n`` samples after ``prompt``."""
    body: dict[str, Any] = {
        "prompt": prompt,
        "max_tokens": params.max_new_tokens,
        "n": params.n,
        "temperature": max(params.temperature, 0.0),
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k > 0 else -1,
        "logprobs": 0,
        "return_token_ids": True,
        "skip_special_tokens": False,
    }
    stops = sorted(set(params.stop_token_ids) | set(extra_stop_ids))
    if stops:
        body["stop_token_ids"] = stops
    if seed is not None:
        body["seed"] = seed
    return body


def parse_choices(response: Any, n: int, version: str) -> list[Sample]:
    """``n`` :class:`Sample` from a completions answer; ``version`` is the weight version
    the server held (vLLM's answer does not carry it).

    Raises:
        RequestError: the answer is malformed (counts as a failed request).
    """
    try:
        choices = sorted(response["choices"], key=lambda c: int(c["index"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise RequestError(
            f"malformed /v1/completions answer ({exc!r}): {str(response)[:300]}"
        ) from exc
    if len(choices) != n:
        raise RequestError(f"/v1/completions returned {len(choices)} choices, expected n={n}")
    out = []
    for choice in choices:
        try:
            ids = [int(t) for t in choice["token_ids"]]
            logprobs = choice.get("logprobs") or {}
            lps = [float(x) for x in logprobs.get("token_logprobs") or []]
            reason = choice.get("finish_reason")
        except (KeyError, TypeError, ValueError) as exc:
            raise RequestError(
                f"malformed /v1/completions choice ({exc!r}): {str(choice)[:300]}"
            ) from exc
        if len(lps) != len(ids):
            raise RequestError(
                f"/v1/completions returned {len(ids)} tokens but {len(lps)} log-probs"
            )
        out.append(Sample(ids, lps, "stop" if reason == "stop" else "length", version))
    return out


def prompt_log_probs_body(token_ids: list[int]) -> dict[str, Any]:
    """``POST /v1/completions`` body scoring ``token_ids`` (temperature 1, one new token)."""
    return {
        "prompt": token_ids,
        "max_tokens": 1,
        "temperature": 1.0,
        "prompt_logprobs": 0,
        "return_token_ids": True,
    }


def parse_prompt_log_probs(response: Any, token_ids: list[int]) -> list[float]:
    """The log-probs of ``token_ids[1:]`` from the answer to :func:`prompt_log_probs_body`.

    Raises:
        RequestError: the answer does not score every token.
    """
    try:
        per_position = response["choices"][0]["prompt_logprobs"]
        out = [
            float(per_position[i][str(token)]["logprob"])
            for i, token in enumerate(token_ids)
            if i > 0
        ]
    except (KeyError, TypeError, IndexError, ValueError) as exc:
        raise RequestError(
            f"malformed prompt_logprobs answer ({exc!r}): {str(response)[:300]}"
        ) from exc
    return out
