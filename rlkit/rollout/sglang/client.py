"""SGLang's native HTTP protocol: token ids in, token ids and log-probs out.

``POST /generate`` with ``input_ids`` and ``sampling_params`` returns, per sample,
``output_ids`` and ``meta_info.output_token_logprobs`` (``[logprob, token_id, text]``
triples). In SGLang 0.5.23 those log-probs are ``log_softmax(logits / temperature)``
of the sampled token, computed before top-k / top-p filtering
(``sglang/srt/layers/sampler.py``; ``SGLANG_RETURN_ORIGINAL_LOGPROB=1`` would
return them before temperature, and rlkit's launcher forces it off). With
``return_sampling_mask`` the server also returns
``output_token_sampling_logprobs``: the log-prob under the renormalised top-k /
top-p distribution that the token was actually drawn from.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import aiohttp

from rlkit.rollout.base import SamplingParams

#: ``log_prob_mode`` values. ``sampling``: the distribution sampled from (temperature,
#: top-k, top-p), as the HF engine returns. ``temperature``: ``log_softmax(logits / T)``,
#: ignoring top-k / top-p. Identical when top-k and top-p are off.
LOG_PROB_MODES = ("sampling", "temperature")


class RequestError(RuntimeError):
    """A request failed in a way worth retrying elsewhere (timeout, connection, 5xx)."""


class BadRequestError(RuntimeError):
    """The server rejected the request itself (HTTP 4xx): retrying cannot help."""


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


def uses_filters(params: SamplingParams) -> bool:
    """True if top-k or top-p truncate the sampling distribution."""
    return params.temperature > 0 and (params.top_k > 0 or params.top_p < 1.0)


def sampling_payload(
    params: SamplingParams, extra_stop_ids: tuple[int, ...], vocab_size: int | None
) -> dict[str, Any]:
    """SGLang ``sampling_params`` for ``params``.

    Greedy (``temperature == 0``) is sent as SGLang's greedy. When top-p is on
    without top-k, ``top_k`` is sent as the vocabulary size: identical sampling,
    but SGLang then can return the renormalised log-probs (it needs a finite top-k).
    """
    out: dict[str, Any] = {
        "max_new_tokens": params.max_new_tokens,
        "temperature": max(params.temperature, 0.0),
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k > 0 else -1,
        "n": params.n,
    }
    if params.top_p < 1.0 and params.top_k <= 0 and vocab_size:
        out["top_k"] = vocab_size
    stops = sorted(set(params.stop_token_ids) | set(extra_stop_ids))
    if stops:
        out["stop_token_ids"] = stops
    return out


def generate_body(
    prompt: list[int], params: SamplingParams, payload: dict[str, Any], log_prob_mode: str
) -> dict[str, Any]:
    """The JSON body of ``POST /generate`` for one prompt (``n`` samples)."""
    body: dict[str, Any] = {
        "input_ids": prompt,
        "sampling_params": payload,
        "return_logprob": True,
    }
    if log_prob_mode == "sampling" and uses_filters(params):
        body["return_sampling_mask"] = True
    return body


def parse_samples(response: Any, n: int, want_filtered: bool) -> list[Sample]:
    """``n`` :class:`Sample` from a ``/generate`` response (a dict for n=1, a list else).

    Raises:
        RequestError: the response is malformed (counts as a failed request).
    """
    items = response if isinstance(response, list) else [response]
    if len(items) != n:
        raise RequestError(f"/generate returned {len(items)} samples, expected n={n}")
    out = []
    for item in items:
        try:
            meta = item["meta_info"]
            ids = [int(t) for t in item["output_ids"]]
            if want_filtered:
                lps = [float(x) for x in meta["output_token_sampling_logprobs"]]
            else:
                lps = [float(x[0]) for x in meta["output_token_logprobs"]]
            reason = meta["finish_reason"]["type"]
            version = str(meta.get("weight_version", ""))
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise RequestError(
                f"malformed /generate response ({exc!r}): {str(item)[:300]}"
            ) from exc
        if len(lps) != len(ids):
            raise RequestError(f"/generate returned {len(ids)} tokens but {len(lps)} log-probs")
        finish = "stop" if reason == "stop" else "length"
        out.append(Sample(ids, lps, finish, version, span_versions(meta, len(ids))))
    return out


def span_versions(meta: dict[str, Any], length: int) -> list[int | None] | None:
    """Per-token versions from a response's ``weight_versions`` spans (``[{"version",
    "start", "end"}]`` over its output tokens); ``None`` when one version sampled all.

    Raises:
        RequestError: spans that do not cover the tokens exactly once.
    """
    spans = meta.get("weight_versions")
    if not spans or len(spans) == 1:
        return None
    out: list[int | None] = []
    for span in spans:
        version = str(span["version"])
        if int(span["start"]) != len(out):
            raise RequestError(f"weight_versions spans leave a gap or overlap: {spans}")
        out += [int(version) if version.isdigit() else None] * (int(span["end"]) - len(out))
    if len(out) != length:
        raise RequestError(f"weight_versions spans cover {len(out)} of {length} tokens: {spans}")
    return out


class SGLangClient:
    """Async JSON over HTTP to SGLang servers (one aiohttp session, reused).

    Args:
        request_timeout_s: total time allowed for one request.
    """

    def __init__(self, request_timeout_s: float) -> None:
        self.request_timeout_s = request_timeout_s
        self._session: aiohttp.ClientSession | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0), trust_env=False
            )
        return self._session

    async def post(
        self, url: str, path: str, body: dict[str, Any], timeout_s: float | None = None
    ) -> Any:
        """``POST url+path`` with a JSON body; the decoded JSON answer.

        Raises:
            RequestError: timeout, connection failure or HTTP 5xx.
            BadRequestError: HTTP 4xx (the server's message included).
        """
        return await self._request("POST", url + path, body, timeout_s)

    async def get(self, url: str, path: str, timeout_s: float | None = None) -> Any:
        """``GET url+path``; the decoded JSON answer (see :meth:`post` for errors)."""
        return await self._request("GET", url + path, None, timeout_s)

    async def _request(self, method: str, full_url: str, body: Any, timeout_s: float | None) -> Any:
        timeout = aiohttp.ClientTimeout(total=timeout_s or self.request_timeout_s)
        try:
            async with self._get_session().request(
                method, full_url, json=body, timeout=timeout
            ) as resp:
                text = await resp.text()
        except TimeoutError as exc:
            raise RequestError(f"{method} {full_url} timed out after {timeout.total} s") from exc
        except aiohttp.ClientError as exc:
            raise RequestError(f"{method} {full_url} failed: {exc!r}") from exc
        if resp.status >= 500:
            raise RequestError(f"{method} {full_url} -> HTTP {resp.status}: {text[:500]}")
        if resp.status >= 400:
            raise BadRequestError(f"{method} {full_url} -> HTTP {resp.status}: {text[:500]}")
        try:
            return json.loads(text) if text else None
        except json.JSONDecodeError:
            return text  # a few control endpoints (e.g. /flush_cache) answer in plain text

    async def prompt_log_probs(self, url: str, token_ids: list[int]) -> list[float]:
        """Log-probs of ``token_ids[1:]`` given their prefixes (temperature 1), from the server.

        Returns a list of ``len(token_ids) - 1`` floats.
        """
        body = {
            "input_ids": token_ids,
            "sampling_params": {"max_new_tokens": 0, "temperature": 1.0},
            "return_logprob": True,
            "logprob_start_len": 0,
        }
        resp = await self.post(url, "/generate", body)
        item = resp[0] if isinstance(resp, list) else resp
        triples = item["meta_info"]["input_token_logprobs"]
        return [float(t[0]) for t in triples[1:]]

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
