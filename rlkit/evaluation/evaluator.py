"""Evaluate a model through any rollout engine: generate, score, and summarise.

:func:`evaluate` is engine-agnostic: it renders and tokenises the prompts,
asks a :class:`~rlkit.rollout.base.RolloutEngine` for ``n`` responses per
problem, scores them with a registered reward through
:func:`rewards.score_batch` (time limits, errors scored 0 and counted), and
reports accuracy (mean@n) and the unbiased pass@k estimator of Chen et al.
2021 (arXiv:2107.03374). ``rlkit eval`` (:mod:`rlkit.evaluation.harness`) wraps it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from rlkit.evaluation.eval_report import EvalReport, ProblemResult
from rlkit.metrics.pass_at_k import mean_and_pass_at_k
from rlkit.rollout.base import RolloutEngine, SamplingParams

#: ``progress(done_problems, total_problems, correct_so_far, responses_so_far)``.
ProgressFn = Callable[[int, int, int, int], None]


def check_sampling(n: int, temperature: float) -> None:
    """Raise ``ValueError`` for sampling settings that cannot give a meaningful pass@k.

    Args:
        n: responses per problem (>= 1).
        temperature: 0 for greedy decoding, else > 0.
    """
    if n < 1:
        raise ValueError(f"n (responses per problem) must be >= 1, got {n}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    if n > 1 and temperature == 0:
        raise ValueError(
            f"n={n} responses per problem with greedy decoding (temperature 0) would be "
            f"{n} identical responses, making pass@k meaningless; pass a temperature > 0 "
            f"(e.g. --temperature 0.6 or 1.0) or use n=1"
        )


def _question(messages: Sequence[Mapping[str, str]]) -> str:
    users = [m["content"] for m in messages if m["role"] == "user"]
    return users[-1] if users else messages[-1]["content"]


def _tokenize(
    dataset: Sequence[Mapping[str, Any]], tokenizer: Any, use_chat_template: bool
) -> tuple[list[str], list[list[int]]]:
    from rlkit.data import render_prompt

    texts = [
        render_prompt(row["prompt"], tokenizer, use_chat_template=use_chat_template)
        for row in dataset
    ]
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    empty = next((i for i, x in enumerate(ids) if not x), None)
    if empty is not None:
        raise ValueError(f"problem {empty} renders to an empty prompt; check its messages")
    return texts, ids


def _length_sorted_batches(ids: list[list[int]], batch_size: int) -> list[list[int]]:
    # Prompts of similar length share a batch, so left padding wastes little compute;
    # results are put back in dataset order afterwards.
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    return [order[s : s + batch_size] for s in range(0, len(order), batch_size)]


def evaluate(
    engine: RolloutEngine,
    tokenizer: Any,
    dataset: Sequence[Mapping[str, Any]],
    *,
    reward: str | Callable[..., Any],
    n: int = 1,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = -1,
    max_new_tokens: int = 512,
    batch_size: int = 16,
    use_chat_template: bool = True,
    ks: Sequence[int] | None = None,
    seed: int | None = 0,
    reward_options: Mapping[str, Any] | None = None,
    reward_timeout_s: float | None = 10.0,
    reward_workers: int = 0,
    progress: ProgressFn | None = None,
) -> EvalReport:
    """Generate ``n`` responses per problem, score them, and compute mean@n and pass@k.

    Args:
        engine: any rollout engine (``ROLLOUT_ENGINES.get("hf" | "sglang")(...)``).
        tokenizer: the model's Hugging Face tokenizer (renders, encodes, decodes).
        dataset: rows in rlkit's prompt schema (``id``, ``prompt`` chat messages,
            ``ground_truth``, ``data_source``), e.g. from
            :func:`rlkit.data.load_shared_dataset`; a ``datasets.Dataset`` or a list.
        reward: a registered reward name (``rlkit list rewards``), a
            ``"pkg.module:function"`` path, or a callable with the reward contract.
        n: responses per problem (pass@k needs ``n >= k``).
        temperature: 0 = greedy (only with ``n == 1``), else the sampling temperature.
        top_p: nucleus sampling threshold (1 = off).
        top_k: top-k sampling (<= 0 = off).
        max_new_tokens: the response length limit in tokens.
        batch_size: problems per ``engine.generate`` call (prompts are grouped by
            length, so a batch's padding is small).
        use_chat_template: render prompts with the tokenizer's chat template.
        ks: the k of pass@k (default 1, 2, 4, ... up to n, and n).
        seed: seeds torch's generator and ``SamplingParams.seed`` (``None``: no seeding).
        reward_options: extra keyword arguments for every reward call
            (e.g. ``{"method": "flexible"}`` for ``gsm8k``).
        reward_timeout_s: time limit per reward call (``None``: none).
        reward_workers: reward worker processes (0 = score in this process).
        progress: called after every batch as ``progress(done, total, correct, responses)``.

    Returns:
        An :class:`EvalReport`: one :class:`ProblemResult` per problem (dataset
        order) and the metrics listed there; ``accuracy`` equals ``mean@n``.

    Raises:
        ValueError: an empty dataset, ``n``/``temperature`` that do not fit
            (:func:`check_sampling`), ``batch_size`` or ``max_new_tokens`` < 1,
            a k outside ``1..n``, or an engine that returned the wrong number of rows.
        UnknownNameError: ``reward`` names no registered reward (raised before
            anything is generated; the message lists the known rewards).
    """
    rows = list(dataset)
    _check_arguments(rows, reward, n=n, temperature=temperature, batch_size=batch_size,
                     max_new_tokens=max_new_tokens, ks=ks)  # fmt: skip
    if seed is not None:
        torch.manual_seed(seed)
    params = SamplingParams(
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        n=n,
        seed=seed,
    )
    started = time.perf_counter()
    texts, ids = _tokenize(rows, tokenizer, use_chat_template)
    results: list[ProblemResult | None] = [None] * len(rows)
    counters = {"generate": 0.0, "score": 0.0, "errors": 0, "timeouts": 0, "correct": 0}
    done = 0
    scoring = _Scoring(reward, dict(reward_options or {}), reward_timeout_s, reward_workers)
    for batch in _length_sorted_batches(ids, batch_size):
        prompts = [(rows[i], ids[i], texts[i]) for i in batch]
        for i, result in zip(
            batch, _run_batch(engine, tokenizer, prompts, params, scoring, counters)
        ):
            results[i] = result
        done += len(batch)
        if progress is not None:
            progress(done, len(rows), int(counters["correct"]), done * n)
    problems = [r for r in results if r is not None]
    metrics = _metrics(problems, n, ks, counters, time.perf_counter() - started)
    settings = {
        **asdict(params),
        "batch_size": batch_size,
        "use_chat_template": use_chat_template,
        "reward": reward if isinstance(reward, str) else getattr(reward, "__name__", repr(reward)),
        "reward_options": dict(reward_options or {}),
    }
    return EvalReport(problems, metrics, settings)


def _check_arguments(
    rows: list[Any],
    reward: str | Callable[..., Any],
    *,
    n: int,
    temperature: float,
    batch_size: int,
    max_new_tokens: int,
    ks: Sequence[int] | None,
) -> None:
    """Everything that can be wrong before any generation starts (see :func:`evaluate`)."""
    from rlkit.registry import REWARDS

    check_sampling(n, temperature)
    if batch_size < 1 or max_new_tokens < 1:
        raise ValueError(
            f"batch_size and max_new_tokens must be >= 1, got {batch_size} and {max_new_tokens}"
        )
    if not rows:
        raise ValueError("the dataset has no problems to evaluate")
    if ks is not None and any(not 1 <= k <= n for k in ks):
        raise ValueError(f"every k of pass@k must be within 1..n={n}, got {list(ks)}")
    if isinstance(reward, str):
        REWARDS.entry(reward)  # an unknown name fails now, not after the first batch


@dataclass(frozen=True)
class _Scoring:
    reward: str | Callable[..., Any]
    options: dict[str, Any]
    timeout_s: float | None
    workers: int


def _run_batch(
    engine: RolloutEngine,
    tokenizer: Any,
    prompts: list[tuple[Mapping[str, Any], list[int], str]],
    params: SamplingParams,
    scoring: _Scoring,
    counters: dict[str, float],
) -> list[ProblemResult]:
    """Generate and score one batch of ``(row, token ids, rendered text)`` problems.

    Returns:
        Their results, in batch order.
    """
    import rewards

    rows, ids, texts = (list(x) for x in zip(*prompts))
    n = params.n
    t0 = time.perf_counter()
    out = engine.generate(ids, params)
    counters["generate"] += time.perf_counter() - t0
    if len(out) != len(ids) * n:
        raise ValueError(
            f"the rollout engine returned {len(out)} responses for {len(ids)} prompts x n={n}; "
            f"an engine must return exactly n responses per prompt"
        )
    responses = tokenizer.batch_decode(out.response_ids, skip_special_tokens=True)
    truths = [str(rows[p]["ground_truth"]) for p in out.prompt_index]
    contexts = _contexts(rows, texts, responses, out)
    # The same keywords and context as in training, so a reward scores alike in both.
    extras = [
        {**scoring.options, "data_source": c.data_source, "response_length": c.response_length}
        for c in contexts
    ]
    t0 = time.perf_counter()
    scored = rewards.score_batch(
        scoring.reward,
        responses,
        truths,
        extras,
        timeout_s=scoring.timeout_s,
        num_workers=scoring.workers,
        contexts=contexts,
    )
    counters["score"] += time.perf_counter() - t0
    counters["errors"] += scored.num_errors
    counters["timeouts"] += scored.num_timeouts
    correct = [bool(info.get("acc", s > 0)) for s, info in zip(scored.scores, scored.infos)]
    counters["correct"] += sum(correct)
    # Each prompt's response rows (engines group them contiguously; do not rely on it).
    rows_of: list[list[int]] = [[] for _ in rows]
    for j, p in enumerate(out.prompt_index):
        rows_of[p].append(j)
    results = []
    for p, (row, mine) in enumerate(zip(rows, rows_of)):
        results.append(
            ProblemResult(
                id=str(row.get("id", p)),
                data_source=str(row.get("data_source") or ""),
                question=_question(row["prompt"]),
                prompt=texts[p],
                ground_truth=str(row["ground_truth"]),
                responses=[responses[j] for j in mine],
                scores=[float(scored.scores[j]) for j in mine],
                correct=[correct[j] for j in mine],
                finish_reasons=[out.finish_reasons[j] for j in mine],
                response_lengths=[len(out.response_ids[j]) for j in mine],
                reward_infos=[dict(scored.infos[j]) for j in mine],
            )
        )
    return results


def _contexts(
    rows: list[Mapping[str, Any]], texts: list[str], responses: list[str], out: Any
) -> list[Any]:
    """One :class:`rewards.RewardContext` per response, as the trainer builds them."""
    from rewards import RewardContext
    from rlkit.data import decode_extra_info

    contexts = []
    for j, p in enumerate(out.prompt_index):
        row = rows[p]
        contexts.append(
            RewardContext(
                response=responses[j],
                ground_truth=str(row["ground_truth"]),
                prompt=texts[p],
                messages=tuple(row["prompt"]),
                data_source=str(row.get("data_source") or ""),
                extra_info=decode_extra_info(row.get("extra_info")),
                response_length=len(out.response_ids[j]),
            )
        )
    return contexts


def _metrics(
    problems: list[ProblemResult],
    n: int,
    ks: Sequence[int] | None,
    counters: Mapping[str, float],
    total_s: float,
) -> dict[str, float]:
    stats = mean_and_pass_at_k([p.correct for p in problems], ks)
    lengths = np.array([x for p in problems for x in p.response_lengths], dtype=np.float64)
    cut = np.array([r == "length" for p in problems for r in p.finish_reasons], dtype=np.float64)
    scores = np.array([s for p in problems for s in p.scores], dtype=np.float64)
    return {
        "accuracy": stats[f"mean@{n}"],
        **stats,
        "score/mean": float(scores.mean()),
        "response_length/mean": float(lengths.mean()),
        "response_length/clip_ratio": float(cut.mean()),
        "reward/num_errors": float(counters["errors"]),
        "reward/num_timeouts": float(counters["timeouts"]),
        "timing_s/generate": float(counters["generate"]),
        "timing_s/score": float(counters["score"]),
        "timing_s/total": float(total_s),
        "num_problems": float(len(problems)),
        "n": float(n),
    }
