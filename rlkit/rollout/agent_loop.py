"""Agent loops: how a prompt becomes a trajectory, in one turn or in several.

An agent loop is registered by name in :data:`rlkit.registry.AGENT_LOOPS` and
called by the trainer as::

    loop(engine, requests, params, *, tokenizer, config, policy_version)
        -> (list[Trajectory], metrics)

with ``requests`` the prompts of this process (:class:`AgentRequest`) and
``params.n`` responses wanted per prompt, grouped contiguously as engines do.

* ``single_turn`` (the default): one call of the engine; every response token is
  the policy's (loss mask 1).
* ``tool_agent``: the policy may write tool calls in the Qwen/Hermes format
  (``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``); they are run
  (:mod:`rlkit.tools`), their results appended as ``tool`` messages rendered to ids
  once (:class:`~rlkit.rollout.observations.ObservationRenderer`, loss mask 0), and
  the policy continues, until it answers without a tool call, reaches
  ``max_turns``, or runs out of its response token budget. A malformed call, an
  unknown tool, bad arguments, a tool that raises or times out: the error text is
  the tool's answer (the policy's problem, never the trainer's), and it is counted.

Every turn of ``tool_agent`` passes each row's whole context (prompt, earlier turns,
tool results) to the engine as token ids, so the policy's own ids are never
re-tokenised; the engine prefills that context again each turn.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from rlkit.registry import AGENT_LOOPS
from rlkit.rollout.base import RolloutEngine, SamplingParams
from rlkit.rollout.observations import ObservationRenderer
from rlkit.rollout.trajectory import NOT_GENERATED, Trajectory, trajectories_from_rollout


@dataclass(frozen=True)
class AgentRequest:
    """One prompt for an agent loop.

    Attributes:
        prompt_ids: the rendered prompt (tools included in it when the loop uses tools).
        messages: the prompt's chat messages (the start of the conversation).
    """

    prompt_ids: list[int]
    messages: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class AgentConfig:
    """Settings of the multi-turn loops (``RolloutConfig.agent`` in gin).

    Attributes:
        tools: names of registered tools (or ``pkg.module:fn`` paths) the policy may call.
        max_turns: policy turns per trajectory, at least 1.
        max_turn_tokens: new tokens per policy turn; ``None`` = the remaining budget.
        tool_timeout_s: wall-clock limit of one tool call.
        max_parallel_tools: tool calls run at once (over all rows of a turn).
        max_tool_output_chars: a tool answer longer than this is cut (marked).
    """

    tools: tuple[str, ...] = ()
    max_turns: int = 4
    max_turn_tokens: int | None = None
    tool_timeout_s: float = 5.0
    max_parallel_tools: int = 8
    max_tool_output_chars: int = 2000

    def problems(self) -> list[str]:
        """What is wrong with these settings, one line each (empty when valid)."""
        out = []
        if self.max_turns < 1:
            out.append(f"RolloutConfig.agent max_turns must be >= 1, got {self.max_turns}")
        if self.max_turn_tokens is not None and self.max_turn_tokens < 1:
            out.append(
                f"RolloutConfig.agent max_turn_tokens must be >= 1, got {self.max_turn_tokens}"
            )
        if not self.tool_timeout_s > 0:
            out.append(f"RolloutConfig.agent tool_timeout_s must be > 0, got {self.tool_timeout_s}")
        if self.max_parallel_tools < 1:
            out.append(
                f"RolloutConfig.agent max_parallel_tools must be >= 1, got {self.max_parallel_tools}"
            )
        return out


AgentLoop = Callable[..., tuple[list[Trajectory], dict[str, float]]]


@AGENT_LOOPS.register("single_turn")
def single_turn(
    engine: RolloutEngine,
    requests: Sequence[AgentRequest],
    params: SamplingParams,
    *,
    tokenizer: Any,
    config: AgentConfig,
    policy_version: int,
) -> tuple[list[Trajectory], dict[str, float]]:
    """One response per sample, all of it the policy's: today's RL with verifiable rewards."""
    rollout = engine.generate([r.prompt_ids for r in requests], params)
    return trajectories_from_rollout(rollout, policy_version=policy_version), dict(rollout.metrics)


@dataclass
class _Row:
    """A trajectory being built."""

    prompt_index: int
    prompt_ids: list[int]
    conversation: list[dict[str, Any]]
    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish: str = ""
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    tool_timeouts: int = 0
    tool_latency_s: float = 0.0

    def append(self, ids: Sequence[int], log_probs: Sequence[float] | None, version: int) -> None:
        self.ids += ids
        if log_probs is None:  # inserted by the environment
            self.mask += [0] * len(ids)
            self.log_probs += [0.0] * len(ids)
            self.versions += [NOT_GENERATED] * len(ids)
        else:
            self.mask += [1] * len(ids)
            self.log_probs += [float(x) for x in log_probs]
            self.versions += [version] * len(ids)

    def trajectory(self) -> Trajectory:
        return Trajectory(
            prompt_ids=self.prompt_ids,
            response_ids=self.ids,
            loss_mask=self.mask,
            rollout_log_probs=self.log_probs,
            policy_version=self.versions,
            prompt_index=self.prompt_index,
            finish_reason=self.finish,
            conversation=self.conversation,
            stats={
                "num_turns": float(self.turns),
                "tool_calls": float(self.tool_calls),
                "tool_errors": float(self.tool_errors),
                "tool_timeouts": float(self.tool_timeouts),
                "tool_latency_s": self.tool_latency_s,
                "truncated": float(self.finish == "length"),
            },
        )


@AGENT_LOOPS.register("tool_agent")
def tool_agent(
    engine: RolloutEngine,
    requests: Sequence[AgentRequest],
    params: SamplingParams,
    *,
    tokenizer: Any,
    config: AgentConfig,
    policy_version: int,
) -> tuple[list[Trajectory], dict[str, float]]:
    """Turns of policy text and tool results until an answer, ``max_turns`` or the budget.

    ``params.max_new_tokens`` is the budget of the whole response (policy and tool
    tokens together), as ``RolloutConfig.max_response_length`` is for one turn.
    """
    from rlkit.tools import parse_tool_calls, run_tool_calls, schemas

    renderer = ObservationRenderer(tokenizer, schemas(config.tools) if config.tools else None)
    rows = [
        _Row(i, list(r.prompt_ids), [dict(m) for m in r.messages])
        for i, r in enumerate(requests)
        for _ in range(params.n)
    ]
    budget = params.max_new_tokens
    metrics: dict[str, float] = {}
    for turn in range(config.max_turns):
        active = [row for row in rows if not row.finish]
        if not active:
            break
        samples = _policy_turn(engine, requests, active, params, config, turn == 0)
        for key, value in samples.metrics.items():
            metrics[key] = metrics.get(key, 0.0) + value
        pending = []
        for row, ids, log_probs, reason in zip(
            active, samples.response_ids, samples.rollout_log_probs, samples.finish_reasons
        ):
            row.append(ids, log_probs, policy_version)
            row.turns += 1
            text = tokenizer.decode(ids, skip_special_tokens=True)
            row.conversation.append({"role": "assistant", "content": text})
            calls, errors = parse_tool_calls(text)
            if reason == "length" or not (calls or errors):
                row.finish = "length" if reason == "length" else "stop"
            elif turn == config.max_turns - 1:
                row.finish = "max_turns"
            else:
                pending.append((row, ids, calls, errors))
        _answer_tool_calls(pending, renderer, tokenizer, config, budget, run_tool_calls)
    for row in rows:
        row.finish = row.finish or "max_turns"
    return [row.trajectory() for row in rows], metrics


@dataclass
class _Turn:
    """One policy turn of every active row, in row order."""

    response_ids: list[list[int]]
    rollout_log_probs: list[list[float]]
    finish_reasons: list[str]
    metrics: dict[str, float]


def _policy_turn(
    engine: RolloutEngine,
    requests: Sequence[AgentRequest],
    active: list[_Row],
    params: SamplingParams,
    config: AgentConfig,
    first: bool,
) -> _Turn:
    """One policy turn for every active row.

    The first turn asks for ``n`` samples per prompt (the engine shares each prompt's
    prefill; rows of a prompt are contiguous). Later turns continue each row's own
    context with one sample, one engine call per distinct remaining budget.
    """
    per_turn = config.max_turn_tokens or params.max_new_tokens
    if first:
        got = engine.generate(
            [r.prompt_ids for r in requests],
            replace(params, max_new_tokens=min(per_turn, params.max_new_tokens)),
        )
        return _Turn(got.response_ids, got.rollout_log_probs, got.finish_reasons, got.metrics)
    by_budget: dict[int, list[int]] = {}
    for i, row in enumerate(active):
        by_budget.setdefault(min(per_turn, params.max_new_tokens - len(row.ids)), []).append(i)
    turn = _Turn([[]] * len(active), [[]] * len(active), [""] * len(active), {})
    for max_new, members in by_budget.items():
        got = engine.generate(
            [active[i].prompt_ids + active[i].ids for i in members],
            replace(params, n=1, max_new_tokens=max_new),
        )
        for k, v in got.metrics.items():
            turn.metrics[k] = turn.metrics.get(k, 0.0) + v
        for j, i in enumerate(members):
            turn.response_ids[i] = got.response_ids[j]
            turn.rollout_log_probs[i] = got.rollout_log_probs[j]
            turn.finish_reasons[i] = got.finish_reasons[j]
    return turn


def _answer_tool_calls(
    pending: list[tuple[_Row, list[int], list[Any], list[str]]],
    renderer: ObservationRenderer,
    tokenizer: Any,
    config: AgentConfig,
    budget: int,
    run_tool_calls: Callable[..., Any],
) -> None:
    """Run every pending row's tool calls together, then append each row's answers."""
    flat = [call for _, _, calls, _ in pending for call in calls]
    results = iter(
        run_tool_calls(
            flat,
            tools=config.tools,
            timeout_s=config.tool_timeout_s,
            max_concurrency=config.max_parallel_tools,
            max_output_chars=config.max_tool_output_chars,
        )
        if flat
        else []
    )
    for row, ids, calls, errors in pending:
        answers = [f"error: {e}" for e in errors]
        row.tool_calls += len(calls) + len(errors)
        row.tool_errors += len(errors)
        for _ in calls:
            result = next(results)
            answers.append(result.text)
            row.tool_errors += result.status == "error"
            row.tool_timeouts += result.status == "timeout"
            row.tool_latency_s += result.latency_s
        messages = [{"role": "tool", "content": a} for a in answers]
        tail = tokenizer.decode(ids[-4:], skip_special_tokens=False)
        observation = renderer.observation_ids(messages, policy_text_tail=tail)
        if len(row.ids) + len(observation) >= budget:  # no room left for the policy to answer
            row.finish = "length"
            continue
        row.append(observation, None, NOT_GENERATED)
        row.conversation += messages


def loop_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """``num_turns/*``, ``tool_calls/*``, ``tool/*`` and the number of trajectories the
    token budget cut (``num_truncated_trajectories``), over trajectories with rollout stats."""
    stats = [t.stats for t in trajectories if t.stats]
    if not stats:
        return {}
    turns = [s["num_turns"] for s in stats]
    calls = [s["tool_calls"] for s in stats]
    total_calls = sum(calls)
    return {
        "num_turns/mean": sum(turns) / len(turns),
        "num_turns/max": max(turns),
        "num_turns/min": min(turns),
        "tool_calls/mean": total_calls / len(calls),
        "tool_calls/max": max(calls),
        "tool/errors": sum(s["tool_errors"] for s in stats),
        "tool/timeouts": sum(s["tool_timeouts"] for s in stats),
        "tool/latency_s": sum(s["tool_latency_s"] for s in stats) / max(total_calls, 1),
        "num_truncated_trajectories": sum(s["truncated"] for s in stats),
    }


def agent_config(options: Mapping[str, Any] | None) -> AgentConfig:
    """An :class:`AgentConfig` from the gin dict ``RolloutConfig.agent``; unknown keys raise."""
    options = dict(options or {})
    known = set(AgentConfig.__dataclass_fields__)
    unknown = sorted(set(options) - known)
    if unknown:
        raise ValueError(
            f"RolloutConfig.agent has unknown key(s) {unknown}; known: {sorted(known)}"
        )
    if "tools" in options:
        tools = options["tools"]
        options["tools"] = (tools,) if isinstance(tools, str) else tuple(tools)
    return AgentConfig(**options)


__all__ = [
    "AgentConfig",
    "AgentLoop",
    "AgentRequest",
    "agent_config",
    "loop_metrics",
    "single_turn",
    "tool_agent",
]
