"""Score a batch of responses: one score per input, in order, whatever happens.

:func:`score_batch` is what the trainer and the evaluation harness call. Every
reward call runs under a time limit; a call that raises, returns something
that is not a finite number (or a dict with one under ``"score"``), or runs out
of time scores ``0.0`` and is counted, so a bad answer or a buggy reward never
stops a run and never silently drops a row.

A batched reward (:mod:`rewards.batched_reward`) is called once for the whole batch,
``fn(contexts, **options)``; its failures are counted the same way, for every row
it was to score.
"""

from __future__ import annotations

import atexit
import faulthandler
import logging
import math
import numbers
import pickle
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rewards import hang_report
from rewards.batched_reward import resolve_reward
from rewards.context import RewardContext, context_kwargs, fields_read
from rewards.exit_guard import exit_message, exits_refused
from rewards.time_limit import RewardTimeout, call_with_time_limit
from rewards.verl_signature import VerlReward, is_verl_reward
from rewards.worker_pool import DEADLINE_MESSAGE, CallResult, RewardWorkerPool
from rlkit import crash_note

logger = logging.getLogger(__name__)

# Worker pools outlive a call (starting processes takes seconds); a few are kept.
_MAX_CACHED_POOLS = 4
_pools: OrderedDict[tuple[bytes, int], RewardWorkerPool] = OrderedDict()
_pools_lock = threading.Lock()  # rollouts generated ahead score from several threads


@dataclass
class BatchScores:
    """Scores of a batch and what went wrong while computing them.

    Attributes:
        scores: one float per input, in input order; ``0.0`` for failed calls.
        infos: one dict per input: the extra fields a reward returned next to
            ``"score"``, or ``{"error": message}`` for a failed call.
        num_errors: calls that raised, returned an invalid value, or lost their worker.
        num_timeouts: calls that ran out of time.
        num_past_deadline: the timeouts the batch's deadline caused (calls cut off or
            never started when ``deadline_s`` passed).
    """

    scores: list[float]
    infos: list[dict[str, Any]] = field(default_factory=list)
    num_errors: int = 0
    num_timeouts: int = 0
    num_past_deadline: int = 0

    def metrics(self) -> dict[str, float]:
        """Numbers to log.

        Returns:
            ``reward/num_errors``, ``reward/num_timeouts``, ``reward/num_past_deadline``;
            for a non-empty batch
            also ``reward/mean``, ``reward/min``, ``reward/max``; and
            ``reward/<field>``, the mean of every numeric extra field over the
            rows that have it (strings such as ``error`` are not averaged).
        """
        out = {
            "reward/num_errors": float(self.num_errors),
            "reward/num_timeouts": float(self.num_timeouts),
            "reward/num_past_deadline": float(self.num_past_deadline),
        }
        if self.scores:
            out["reward/mean"] = sum(self.scores) / len(self.scores)
            out["reward/min"] = min(self.scores)
            out["reward/max"] = max(self.scores)
        for key, values in _numeric_fields(self.infos).items():
            out[f"reward/{key}"] = sum(values) / len(values)
        return out


def _numeric_fields(infos: Sequence[Mapping[str, Any]]) -> dict[str, list[float]]:
    fields: dict[str, list[float]] = {}
    for info in infos:
        for key, value in info.items():
            if isinstance(value, numbers.Real) and math.isfinite(value):
                fields.setdefault(key, []).append(float(value))
    return fields


MAX_ABS_SCORE = 1e6
"""The largest score magnitude a reward may return."""


def _to_score(value: Any) -> tuple[float, dict[str, Any]]:
    """Split a reward's return value into (score, extra fields); raise if invalid."""
    info: dict[str, Any] = {}
    if isinstance(value, Mapping):
        if "score" not in value:
            raise ValueError(f"reward returned a dict without a 'score' key: {sorted(value)}")
        info = {k: v for k, v in value.items() if k != "score"}
        value = value["score"]
    if isinstance(value, str | bytes) or not hasattr(value, "__float__"):
        raise TypeError(f"reward returned {type(value).__name__}; expected a float")
    score = float(value)
    # Past the bound, sums of scores overflow to inf and advantages turn NaN: an error,
    # counted like any other, never a silently skipped update.
    if not math.isfinite(score) or abs(score) > MAX_ABS_SCORE:
        raise ValueError(
            f"reward returned a non-finite or out-of-range score {score} "
            f"(|score| must be <= {MAX_ABS_SCORE:g})"
        )
    return score, info


def _check_inputs(
    responses: Sequence[str], ground_truths: Sequence[str], extras: Sequence[Mapping] | None
) -> list[Mapping[str, Any]]:
    for name, seq in (("responses", responses), ("ground_truths", ground_truths)):
        if isinstance(seq, str) or not isinstance(seq, Sequence):
            raise TypeError(f"{name} must be a list of strings, got {type(seq).__name__}")
    if len(responses) != len(ground_truths):
        raise ValueError(
            f"{len(responses)} responses but {len(ground_truths)} ground truths; "
            f"pass one ground truth per response (repeat it for grouped samples)"
        )
    bad = next((i for i, r in enumerate(responses) if not isinstance(r, str)), None)
    if bad is not None:
        raise TypeError(f"responses[{bad}] is {type(responses[bad]).__name__}; decode it first")
    if extras is None:
        return [{}] * len(responses)
    if len(extras) != len(responses):
        raise ValueError(f"{len(extras)} extras for {len(responses)} responses; pass one each")
    return list(extras)


def _shared_pool(reward: str | Callable[..., Any], num_workers: int) -> RewardWorkerPool:
    try:
        key = (pickle.dumps(reward), num_workers)
    except Exception:  # unpicklable: let the pool raise its explanatory error
        return RewardWorkerPool(reward, num_workers)
    with _pools_lock:
        if key in _pools:
            _pools.move_to_end(key)
            return _pools[key]
        pool = RewardWorkerPool(reward, num_workers)
        _pools[key] = pool
        if len(_pools) > _MAX_CACHED_POOLS:
            _pools.popitem(last=False)[1].close()
        return pool


@atexit.register
def close_pools() -> None:
    """Stop the worker processes :func:`score_batch` keeps between calls."""
    while _pools:
        _pools.popitem()[1].close()


PHASE_DEADLINE_MESSAGE = "the batch's deadline passed before this call ran"
_DEADLINE_MESSAGES = (PHASE_DEADLINE_MESSAGE, DEADLINE_MESSAGE)


def _score_inline(
    fn: Callable[..., Any],
    calls: list[tuple[str, str, Mapping]],
    timeout_s: float | None,
    deadline: float | None = None,
    hard_limit_s: float | None = None,
    label: str = "",
) -> list[CallResult]:
    # With a deadline, one watchdog covers the batch (deadline + hard limit): arming one per
    # call costs more than a rule reward's call itself.
    batch_watchdog = deadline is not None and hard_limit_s is not None and bool(calls)
    if batch_watchdog:
        hang_report.arm(deadline - time.monotonic() + hard_limit_s)
    try:
        return _score_calls(
            fn, calls, timeout_s, deadline, None if batch_watchdog else hard_limit_s, label
        )
    finally:
        crash_note.clear()
        if batch_watchdog:
            faulthandler.cancel_dump_traceback_later()


def _score_calls(
    fn: Callable[..., Any],
    calls: list[tuple[str, str, Mapping]],
    timeout_s: float | None,
    deadline: float | None,
    hard_limit_s: float | None,
    label: str = "",
) -> list[CallResult]:
    results = []
    for row, (response, ground_truth, extra) in enumerate(calls):
        limit = timeout_s
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:  # the batch's time is up: the rest are not even started
                results.append(CallResult("timeout", message=PHASE_DEADLINE_MESSAGE))
                continue
            limit = remaining if limit is None else min(limit, remaining)
        crash_note.mark(label, row, extra, response)
        try:
            with exits_refused():
                value = call_with_time_limit(
                    fn, limit, response, ground_truth, _hard_limit_s=hard_limit_s, **extra
                )
            results.append(CallResult("ok", value))
        except RewardTimeout:
            results.append(CallResult("timeout", message="time limit exceeded"))
        except SystemExit as exc:  # sys.exit / os._exit: the row's error, not the run's end
            results.append(CallResult("error", message=exit_message(exc)))
        except Exception as exc:
            results.append(CallResult("error", message=f"{type(exc).__name__}: {exc}"))
    return results


def score_batch(
    reward: str | Callable[..., Any],
    responses: Sequence[str],
    ground_truths: Sequence[str],
    extras: Sequence[Mapping[str, Any]] | None = None,
    *,
    timeout_s: float | None = 5.0,
    num_workers: int = 0,
    contexts: Sequence[RewardContext] | None = None,
    deadline_s: float | None = None,
    hard_limit_s: float | None = None,
) -> BatchScores:
    """Score ``responses`` against ``ground_truths`` with one reward.

    Args:
        reward: a registered name (``"gsm8k"``), a ``"pkg.module:function"`` or
            ``"path/to/file.py:function"`` path, or a callable ``fn(response,
            ground_truth, **extra)`` returning a float or a dict with a ``"score"``
            key. A batched reward (``batched=True`` where registered, or
            ``@rewards.batched``) is called once instead, ``fn(contexts, **options)``,
            and must return one result per context: ``contexts`` are the given ones
            (else built from the responses, ground truths and the extras'
            ``data_source`` / ``response_length``) and ``options`` the other extras'
            keys, which must be the same in every row (the trainer's
            ``reward_options``). Its time limit is ``timeout_s`` times the batch
            size (what the per-response calls could take in all); it runs in this
            process whatever ``num_workers`` is. If it raises, times out or returns
            the wrong number of results, every row scores 0 and counts as an error
            (or a timeout).
        responses: the decoded responses, length B.
        ground_truths: the reference answers, length B.
        extras: per-row keyword arguments for the reward (length B), e.g.
            ``{"response_length": 812}`` for length shaping; ``None`` for none.
        contexts: per-row :class:`~rewards.context.RewardContext` (length B); the
            reward receives the fields its signature names (``prompt``, ``messages``,
            ``conversation``, ``extra_info``, ``context``), see :mod:`rewards.context`.
        timeout_s: time limit of each call in seconds; ``None`` for none.
        num_workers: ``0`` scores in this process, each call limited by
            ``SIGALRM`` (interrupts Python code, not one long C call; main
            thread only). ``>= 1`` scores in that many worker processes, kept
            between calls; an overrunning call's worker is killed and replaced,
            which bounds any hang. Use ``>= 1`` for untrusted model output at scale.
        deadline_s: a limit on the whole batch in seconds (``None``: none). Calls not
            finished when it passes are timeouts (in flight: their worker is killed;
            not started: never run), so a reward that hangs on every response costs
            the batch at most ``deadline_s``, not ``timeout_s`` once per response. With
            workers it counts from when the first worker is ready.
        hard_limit_s: ``num_workers == 0`` only: a watchdog that ends this process
            (status 1, the stuck reward's traceback on stderr) when one call runs this
            many seconds past its limit: a C call that ``SIGALRM`` cannot interrupt
            would otherwise hang the process forever. With ``deadline_s`` one watchdog
            covers the whole batch instead, ending it ``hard_limit_s`` after the deadline
            (a watchdog per call costs more than a rule reward's call). ``None``: no
            watchdog. The trainer sets it; worker processes (``num_workers >= 1``) need none.

    Returns:
        :class:`BatchScores` with exactly B scores and B infos, in input order.

    Raises:
        TypeError, ValueError: the inputs do not line up (lengths, types),
            ``timeout_s`` / ``num_workers`` are invalid, or a batched reward's extras
            differ between rows in a key that is not a context field.
        UnknownNameError: ``reward`` names no registered reward, or a path that
            does not import (the message says why).
    """
    if timeout_s is not None and not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0 seconds or None (no limit), got {timeout_s!r}")
    if deadline_s is not None and not deadline_s > 0:
        raise ValueError(f"deadline_s must be > 0 seconds or None, got {deadline_s!r}")
    deadline = None if deadline_s is None else time.monotonic() + deadline_s
    if not isinstance(num_workers, int) or num_workers < 0:
        raise ValueError(f"num_workers must be an int >= 0, got {num_workers!r}")
    fn, is_batch = resolve_reward(reward)
    reads: tuple[str, ...] | None = None
    if not is_batch and is_verl_reward(fn):
        # verl's signature: called by keyword, always with the row's extra_info.
        reward = fn = VerlReward(reward if isinstance(reward, str) else fn)
        reads = ("extra_info",)
    rows = _check_inputs(responses, ground_truths, extras)
    if contexts is not None and len(contexts) != len(rows):
        raise ValueError(f"{len(contexts)} contexts for {len(rows)} responses; pass one each")
    if is_batch:
        return _gather(
            _score_batched(fn, reward, responses, ground_truths, rows, contexts, timeout_s)
        )
    if contexts is not None:
        if reads is None:
            reads = fields_read(fn)  # once: a signature costs more than most rewards
        rows = [{**extra, **context_kwargs(reads, c)} for extra, c in zip(rows, contexts)]
    calls = list(zip(responses, ground_truths, rows))
    if num_workers == 0 or not calls:
        label = _reward_label(reward)
        results = _score_inline(fn, calls, timeout_s, deadline, hard_limit_s, label)
    else:
        results = _shared_pool(reward, num_workers).map(calls, timeout_s, deadline_s=deadline_s)
    batch = _gather(results)
    if batch.num_past_deadline:
        logger.warning(
            "the batch's reward deadline (%g s) passed: %d of %d calls scored 0 unfinished; "
            "raise the deadline (DataConfig.reward_deadline_s) or score in parallel "
            "(DataConfig.reward_workers)",
            deadline_s,
            batch.num_past_deadline,
            len(results),
        )
    return batch


# Per-row fields a batched reward reads from its contexts rather than from its options.
_CONTEXT_FIELDS = ("data_source", "response_length")


def _reward_label(reward: str | Callable[..., Any]) -> str:
    if isinstance(reward, str):
        return reward
    inner = getattr(reward, "func", reward)  # a functools.partial: name what it wraps
    return getattr(inner, "__qualname__", None) or repr(reward)


def _shared_options(rows: Sequence[Mapping[str, Any]], label: str) -> dict[str, Any]:
    """The extras' keys other than context fields, which must be the same in every row."""

    def options_of(row: Mapping[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in row.items() if k not in _CONTEXT_FIELDS}

    options = options_of(rows[0]) if rows else {}
    for i, row in enumerate(rows[1:], start=1):
        mine = options_of(row)
        if mine != options:
            differs = sorted(
                k
                for k in {*mine, *options}
                if k not in mine or k not in options or mine[k] != options[k]
            )
            raise ValueError(
                f"batched reward {label!r} takes one set of options for the whole batch, but "
                f"extras[{i}] differs from extras[0] in {differs}; pass per-row data in the "
                f"contexts (extra_info) instead"
            )
    return options


def _score_batched(
    fn: Callable[..., Any],
    reward: str | Callable[..., Any],
    responses: Sequence[str],
    ground_truths: Sequence[str],
    rows: Sequence[Mapping[str, Any]],
    contexts: Sequence[RewardContext] | None,
    timeout_s: float | None,
) -> list[CallResult]:
    """One call of a batched reward for every row; one :class:`CallResult` per row."""
    label, count = _reward_label(reward), len(responses)
    options = _shared_options(rows, label)
    if count == 0:
        return []
    if contexts is None:
        contexts = [
            RewardContext(
                response=response,
                ground_truth=ground_truth,
                data_source=str(row.get("data_source", "")),
                response_length=int(row.get("response_length", 0)),
            )
            for response, ground_truth, row in zip(responses, ground_truths, rows)
        ]
    limit = None if timeout_s is None else timeout_s * count
    crash_note.mark(label, 0, {"data_source": f"all {count} rows, in one batched call"}, "")
    try:
        with exits_refused():
            values = call_with_time_limit(fn, limit, list(contexts), **options)
    except RewardTimeout:
        message = f"batched reward {label!r} ran past its limit of {limit:g} s ({count} rows)"
        return [CallResult("timeout", message=message)] * count
    except SystemExit as exc:
        return [
            CallResult("error", message=f"batched reward {label!r}: {exit_message(exc)}")
        ] * count
    except Exception as exc:
        message = f"batched reward {label!r} raised {type(exc).__name__}: {exc}"
        return [CallResult("error", message=message)] * count
    finally:
        crash_note.clear()
    if isinstance(values, str | bytes | Mapping) or not hasattr(values, "__len__"):
        message = (
            f"batched reward {label!r} returned {type(values).__name__}; it must return a "
            f"list with one result (a float or a dict with 'score') per context"
        )
        return [CallResult("error", message=message)] * count
    if len(values) != count:
        message = (
            f"batched reward {label!r} returned {len(values)} results for {count} contexts; "
            f"it must return one result per context, in order"
        )
        return [CallResult("error", message=message)] * count
    return [CallResult("ok", value) for value in values]


def _gather(results: list[CallResult]) -> BatchScores:
    batch = BatchScores(scores=[], infos=[])
    failures = []
    for result in results:
        status, message = result.status, result.message
        if status == "ok":
            try:
                score, info = _to_score(result.value)
            except (TypeError, ValueError) as exc:
                status, message = "error", f"{type(exc).__name__}: {exc}"
        if status != "ok":
            score, info = 0.0, {"error": message}
            batch.num_timeouts += status == "timeout"
            batch.num_errors += status == "error"
            batch.num_past_deadline += message in _DEADLINE_MESSAGES
            failures.append(message)
        batch.scores.append(score)
        batch.infos.append(info)
    if failures:
        logger.warning(
            "%d of %d reward calls scored 0 (%d errors, %d timeouts); first: %s",
            len(failures),
            len(results),
            batch.num_errors,
            batch.num_timeouts,
            failures[0],
        )
    return batch
