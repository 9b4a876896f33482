"""SGLang's native HTTP protocol: token ids in, token ids and log-probs out.

``POST /generate`` with ``input_ids`` and ``sampling_params`` returns, per sample,
``output_ids`` and ``meta_info.output_token_logprobs`` (``[logprob, token_id, text]``
triples). In SGLang 0.5.23 those log-probs are ``log_softmax(logits / temperature)``
of the sampled token, computed before top-k / top-p filtering
(``sglang/srt/layers/sampler.py``; ``SGLANG_RETURN_ORIGINAL_LOGPROB=1`` would
return them before temperature, and rlkit's launcher forces it off). With
``return_sampling_mask`` the server also returns
``output_token_sampling_logprobs``: the log-prob under the renormalised top-k /
top-p distribution that the token was actually drawn from, and
``output_token_sampling_mask``: the ids of that distribution's support.

**Top log-probs.** With ``top_logprobs_num: k`` the server adds
``meta_info.output_top_logprobs``: per output token, the ``k`` most likely tokens as
``[logprob, token_id, text]``. SGLang takes them from the same tensor as
``output_token_logprobs`` (the sampler's ``logprobs``, before its top-k / top-p
filter), so they are ``log_softmax(logits / temperature)`` too, ``log_softmax(logits)``
when greedy, and never the raw (temperature 1) log-probs while
``SGLANG_RETURN_ORIGINAL_LOGPROB`` is off. Measured on a CPU server (tiny Qwen2,
float32): they equal the trainer's ``log_softmax(logits / T)`` within 5e-7 at
T = 0.7 and 1.3 and differ from ``log_softmax(logits)`` by 0.16 to 0.48; the sampled
token's entry, when it is among the ``k``, is its ``output_token_logprobs`` value.
When top-k or top-p filter the sampling distribution and rlkit returns the
renormalised log-probs (``log_prob_mode="sampling"``), :func:`parse_samples` puts
the top log-probs on that scale as well: it keeps the tokens of the support and adds
each position's renormalisation, ``log Z = sampling log-prob - temperature log-prob``
of the sampled token, so that a row's top log-probs and its rollout log-probs always
come from one distribution.

**Reading weights back.** ``POST /get_weights_by_name`` with ``{"name", "truncate_size"}``
returns a parameter by its Hugging Face name as nested lists, converted to float32
from the server's dtype (so bfloat16 values come back exactly), cut to the first
``truncate_size`` entries of its *first dimension* (rows of a matrix, elements of a
vector). Which names can be read depends on the model class (see
:mod:`rlkit.rollout.sglang.engine`). SGLang's ``/weights_checker`` (action
``checksum``) is not used: it hashes each tensor of SGLang's internal layout (fused
``qkv_proj`` / ``gate_up_proj``, vocabulary padded, tensor-parallel shards) with
SHA-256 of its bytes on CPU but a Triton hash on GPUs, so the trainer could reproduce
a hash only by rebuilding that layout and kernel; one hash also says only "differs",
never which values.
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
    if params.top_logprobs > 0:
        body["top_logprobs_num"] = params.top_logprobs
    return body


def parse_samples(
    response: Any, n: int, want_filtered: bool, top_logprobs: int = 0
) -> list[Sample]:
    """``n`` :class:`Sample` from a ``/generate`` response (a dict for n=1, a list else).

    Args:
        response: the decoded JSON.
        n: samples expected.
        want_filtered: read the renormalised (top-k / top-p) log-probs, which a body
            with ``return_sampling_mask`` asked for.
        top_logprobs: the ``top_logprobs_num`` asked for (0: none); each sample then
            carries :attr:`Sample.top_log_probs` (see :func:`parse_top_log_probs`).

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
            top = parse_top_log_probs(meta, want_filtered) if top_logprobs > 0 else None
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise RequestError(
                f"malformed /generate response ({exc!r}): {str(item)[:300]}"
            ) from exc
        if len(lps) != len(ids):
            raise RequestError(f"/generate returned {len(ids)} tokens but {len(lps)} log-probs")
        if top is not None and len(top) != len(ids):
            raise RequestError(
                f"/generate returned {len(ids)} tokens but top log-probs for {len(top)}"
            )
        finish = "stop" if reason == "stop" else "length"
        out.append(
            Sample(ids, lps, finish, version, span_versions(meta, len(ids)), top_log_probs=top)
        )
    return out


def parse_top_log_probs(meta: dict[str, Any], want_filtered: bool) -> list[dict[int, float]]:
    """Per output token, ``{token id: log-prob}`` of ``meta["output_top_logprobs"]``.

    SGLang's values are ``log_softmax(logits / T)`` before top-k / top-p. With
    ``want_filtered`` (the rollout log-probs are the renormalised ones) they are moved to
    the sampling distribution: tokens outside the position's support
    (``output_token_sampling_mask``) are left out, and the rest are shifted by the
    position's ``log Z``, read off the sampled token as its sampling log-prob minus its
    temperature log-prob. A ``null`` value (how orjson writes ``-inf``) is ``-inf``.
    """
    per_position = meta["output_top_logprobs"]
    top = [
        {int(e[1]): float("-inf") if e[0] is None else float(e[0]) for e in entries}
        for entries in per_position
    ]
    if not want_filtered:
        return top
    shifts = [
        float(s) - float(t[0])
        for s, t in zip(meta["output_token_sampling_logprobs"], meta["output_token_logprobs"])
    ]
    supports = [set(ids) for ids in meta["output_token_sampling_mask"]]
    if not len(shifts) == len(supports) == len(top):
        raise ValueError(
            f"{len(top)} positions of top log-probs but {len(shifts)} sampling log-probs "
            f"and {len(supports)} sampling masks"
        )
    return [
        {i: v + shift for i, v in entries.items() if i in support}
        for entries, shift, support in zip(top, shifts, supports)
    ]


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


def weights_by_name_body(name: str, rows: int) -> dict[str, Any]:
    """``POST /get_weights_by_name`` body: the first ``rows`` entries of ``name``'s first
    dimension (rows of a matrix, elements of a vector)."""
    return {"name": name, "truncate_size": rows}


def parse_weight_rows(response: Any) -> tuple[list[float], int]:
    """The numbers of a ``/get_weights_by_name`` answer, flattened in row-major order,
    and how many numbers one entry of the first dimension holds (1 for a vector, the row
    length for a matrix), from which the rows needed for ``length`` elements follow.

    Raises:
        RequestError: the answer is not a non-empty nested list of numbers.
    """
    if not isinstance(response, list) or not response:
        raise RequestError(f"/get_weights_by_name returned {str(response)[:200]}")
    flat: list[float] = []
    stack: list[Any] = [response]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(reversed(item))
        elif isinstance(item, (int, float)) and not isinstance(item, bool):
            flat.append(float(item))
        else:
            raise RequestError(f"/get_weights_by_name returned a non-number: {item!r}")
    return flat, max(len(flat) // len(response), 1)


_DTYPES = {"float32": "float32", "float": "float32", "bfloat16": "bfloat16"}
_DTYPES |= {"float16": "float16", "half": "float16"}


def served_dtype(launch_dtype: str | None, config: dict[str, Any] | None) -> str | None:
    """The dtype a server holds its weights in, which read-back slices come in: its
    ``--dtype`` (``/server_info``'s ``dtype``), or for ``auto`` SGLang's own choice from the
    model's ``config.json`` (its ``dtype`` / ``torch_dtype``, float32 when absent; a
    float32 checkpoint is served in float16, Gemma's in bfloat16). ``None`` when it cannot
    be known (``auto`` without the config).
    """
    name = str(launch_dtype or "auto").lower()
    if name in _DTYPES:
        return _DTYPES[name]
    if name != "auto" or config is None:
        return None
    configured = str(config.get("dtype") or config.get("torch_dtype") or "float32")
    resolved = _DTYPES.get(configured.removeprefix("torch."))
    if resolved == "float32":
        return "bfloat16" if str(config.get("model_type", "")).startswith("gemma") else "float16"
    return resolved
