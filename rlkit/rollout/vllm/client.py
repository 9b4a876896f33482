"""vLLM's OpenAI-compatible completions protocol, as token ids in and token ids out.

``POST /v1/completions`` takes the prompt as a list of token ids; with
``return_token_ids`` and ``logprobs: 0`` each choice carries ``token_ids`` (the sampled
ids) and ``logprobs.token_logprobs`` (one log-prob per sampled id). Which log-prob is
returned is a server setting, ``--logprobs-mode``: rlkit launches servers with
``processed_logprobs``, the log-prob under the distribution the token was drawn from
(temperature, top-k and top-p applied), as the HF engine returns; an attached server
must be started the same way. ``prompt_logprobs`` scores a given sequence.

With ``SamplingParams.top_logprobs = k > 0`` the request asks for ``logprobs: k`` and
``return_tokens_as_token_ids``: ``logprobs.top_logprobs`` then holds, per sampled token,
``{"token_id:<id>": log-prob}`` for the ``k`` most likely tokens and the sampled one (the
token strings vLLM would use as keys otherwise are not unique: several ids decode to the
same text). The server refuses ``k`` above its ``--max-logprobs``.
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
    if params.top_logprobs > 0:
        body["logprobs"] = params.top_logprobs
        body["return_tokens_as_token_ids"] = True
    stops = sorted(set(params.stop_token_ids) | set(extra_stop_ids))
    if stops:
        body["stop_token_ids"] = stops
    if seed is not None:
        body["seed"] = seed
    return body


#: The log-prob vLLM writes for ``-inf`` (JSON has no infinity): a token that top-k or
#: top-p filtered out.
FILTERED_LOGPROB = -9999.0
#: How ``return_tokens_as_token_ids`` writes a token.
TOKEN_ID_PREFIX = "token_id:"


def parse_choices(response: Any, n: int, version: str, top_logprobs: int = 0) -> list[Sample]:
    """``n`` :class:`Sample` from a completions answer; ``version`` is the weight version
    the server held (vLLM's answer does not carry it). With ``top_logprobs > 0`` each
    sample's ``top_log_probs`` is read too (:func:`parse_top_log_probs`).

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
            top = parse_top_log_probs(logprobs.get("top_logprobs")) if top_logprobs else None
        except (KeyError, TypeError, ValueError) as exc:
            raise RequestError(
                f"malformed /v1/completions choice ({exc!r}): {str(choice)[:300]}"
            ) from exc
        if len(lps) != len(ids):
            raise RequestError(
                f"/v1/completions returned {len(ids)} tokens but {len(lps)} log-probs"
            )
        if top is not None and len(top) != len(ids):
            raise RequestError(
                f"/v1/completions returned {len(ids)} tokens but top log-probs of {len(top)}"
            )
        finish = "stop" if reason == "stop" else "length"
        out.append(Sample(ids, lps, finish, version, top_log_probs=top))
    return out


def parse_top_log_probs(per_position: Any) -> list[dict[int, float]]:
    """``logprobs.top_logprobs`` as ``{token id: log-prob}`` per position.

    Entries at :data:`FILTERED_LOGPROB` are left out: they stand for ``-inf`` (tokens
    that top-k or top-p removed), and which of the many such ids vLLM lists is arbitrary.

    Raises:
        ValueError: a position is missing, or a key is not ``token_id:<id>`` (the server
            ignored ``return_tokens_as_token_ids``).
    """
    if not isinstance(per_position, list):
        raise ValueError(f"no top_logprobs list in the answer (got {type(per_position).__name__})")
    out = []
    for entries in per_position:
        if not isinstance(entries, dict):
            raise ValueError(f"a position without top log-probs: {entries!r}")
        position = {}
        for key, value in entries.items():
            if not key.startswith(TOKEN_ID_PREFIX):
                raise ValueError(
                    f"top log-prob key {key!r} is not {TOKEN_ID_PREFIX}<id>: the server "
                    f"ignored return_tokens_as_token_ids"
                )
            logprob = float(value)
            if logprob > FILTERED_LOGPROB or logprob != logprob:  # NaN is kept, to be seen
                position[int(key.removeprefix(TOKEN_ID_PREFIX))] = logprob
        out.append(position)
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
