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

from typing import Any

from rlkit.rollout.base import SamplingParams
from rlkit.rollout.servers.errors import RequestError
from rlkit.rollout.servers.sample import Sample

#: ``log_prob_mode`` values. ``sampling``: the distribution sampled from (temperature,
#: top-k, top-p), as the HF engine returns. ``temperature``: ``log_softmax(logits / T)``,
#: ignoring top-k / top-p. Identical when top-k and top-p are off.
LOG_PROB_MODES = ("sampling", "temperature")


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


def prompt_log_probs_body(token_ids: list[int]) -> dict[str, Any]:
    """``POST /generate`` body scoring ``token_ids`` (temperature 1, no new tokens)."""
    return {
        "input_ids": token_ids,
        "sampling_params": {"max_new_tokens": 0, "temperature": 1.0},
        "return_logprob": True,
        "logprob_start_len": 0,
    }


def parse_prompt_log_probs(response: Any) -> list[float]:
    """The log-probs of ``token_ids[1:]`` from the answer to :func:`prompt_log_probs_body`."""
    item = response[0] if isinstance(response, list) else response
    triples = item["meta_info"]["input_token_logprobs"]
    return [float(t[0]) for t in triples[1:]]
