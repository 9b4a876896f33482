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

Every trajectory of ``tool_agent`` is its own coroutine: it asks the engine for its
next turn with its whole context as token ids (so the policy's own ids are never
re-tokenised) and waits for its tools in worker threads while other trajectories
decode (:mod:`rlkit.rollout.turns`). The embedded engine continues each
trajectory's KV cache across its turns; SGLang sends each turn as its own request.
With an ``interaction`` (:mod:`rlkit.interactions`), a simulated user answers every
policy turn that calls no tool, and its scores become token rewards.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlkit.interactions import make_interaction
from rlkit.registry import AGENT_LOOPS
from rlkit.rollout.base import RolloutEngine, SamplingParams
from rlkit.rollout.observations import ObservationRenderer
from rlkit.rollout.trajectory import (
    NOT_GENERATED,
    Trajectory,
    token_versions,
    trajectories_from_rollout,
)
from rlkit.rollout.turns import run_turns


@dataclass(frozen=True)
class AgentRequest:
    """One prompt for an agent loop.

    Attributes:
        prompt_ids: the rendered prompt (tools included in it when the loop uses tools).
        messages: the prompt's chat messages (the start of the conversation).
        ground_truth, data_source, extra_info: the dataset row's, for an interaction.
        multimodal_inputs: an image prompt's model inputs (``pixel_values``,
            ``image_grid_thw``); ``None`` for a text prompt.
    """

    prompt_ids: list[int]
    messages: list[dict[str, Any]] = field(default_factory=list)
    ground_truth: str = ""
    data_source: str = ""
    extra_info: Mapping[str, Any] = field(default_factory=dict)
    multimodal_inputs: Mapping[str, Any] | None = None


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
        interaction: a registered interaction (or ``pkg.module:factory``) that answers
            as the user whenever the policy answers without a tool call; ``None``: the
            first such answer ends the trajectory.
        interaction_options: keyword arguments of the interaction's factory.
    """

    tools: tuple[str, ...] = ()
    max_turns: int = 4
    max_turn_tokens: int | None = None
    tool_timeout_s: float = 5.0
    max_parallel_tools: int = 8
    max_tool_output_chars: int = 2000
    interaction: str | None = None
    interaction_options: Mapping[str, Any] = field(default_factory=dict)

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
        if "search" in self.tools:  # found before training, not as failed tool calls
            from rlkit.tools.retrieval import corpus_problem

            problem = corpus_problem()
            if problem is not None:
                out.append(f"RolloutConfig.agent tools: {problem}")
        if self.interaction is not None:
            try:
                make_interaction(self.interaction, self.interaction_options)
            except (TypeError, ValueError, LookupError, ImportError) as exc:
                out.append(f"RolloutConfig.agent interaction: {exc}")
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
    multimodal = [r.multimodal_inputs for r in requests]
    # Only image prompts pass images: an engine that cannot take them is never asked to.
    images = {"multimodal": multimodal} if any(m is not None for m in multimodal) else {}
    rollout = engine.generate([r.prompt_ids for r in requests], params, **images)
    trajectories = trajectories_from_rollout(rollout, policy_version=policy_version)
    for trajectory in trajectories:
        trajectory.multimodal_inputs = multimodal[trajectory.prompt_index]
    return trajectories, dict(rollout.metrics)


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
    user_turns: int = 0
    rewards: dict[int, float] = field(default_factory=dict)  # position -> token reward

    def score_last_token(self, score: float) -> None:
        """Give ``score`` to the last token (the end of the turn just taken)."""
        self.rewards[len(self.ids) - 1] = self.rewards.get(len(self.ids) - 1, 0.0) + score

    def append(
        self,
        ids: Sequence[int],
        log_probs: Sequence[float] | None,
        version: int,
        reported: Sequence[int | None] | None = None,
    ) -> None:
        """``ids`` sampled by the policy (their ``log_probs``; weights ``version``, or per
        token as an engine ``reported`` them) or inserted (``log_probs`` None)."""
        self.ids += ids
        if log_probs is None:  # inserted by the environment
            self.mask += [0] * len(ids)
            self.log_probs += [0.0] * len(ids)
            self.versions += [NOT_GENERATED] * len(ids)
        else:
            self.mask += [1] * len(ids)
            self.log_probs += [float(x) for x in log_probs]
            self.versions += token_versions(reported or [None] * len(ids), version)

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
            token_rewards=[self.rewards.get(i, 0.0) for i in range(len(self.ids))]
            if self.rewards
            else None,
            stats={
                "num_turns": float(self.turns),
                "tool_calls": float(self.tool_calls),
                "tool_errors": float(self.tool_errors),
                "tool_timeouts": float(self.tool_timeouts),
                "tool_latency_s": self.tool_latency_s,
                "user_turns": float(self.user_turns),
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
    """Turns of policy text and tool (or user) messages until an answer, ``max_turns`` or
    the budget; every trajectory runs as its own coroutine.

    ``params.max_new_tokens`` is the budget of the whole response (policy and inserted
    tokens together), as ``RolloutConfig.max_response_length`` is for one turn.
    """
    images = any(r.multimodal_inputs is not None for r in requests)
    episode = _Episode(engine, params, tokenizer, config, policy_version, images)
    rows = [
        _Row(i, list(r.prompt_ids), [dict(m) for m in r.messages])
        for i, r in enumerate(requests)
        for _ in range(params.n)
    ]

    async def everyone() -> None:
        await asyncio.gather(
            *(episode.run(key, row, requests[row.prompt_index]) for key, row in enumerate(rows))
        )

    try:
        run_turns(episode.turns, everyone())
    finally:
        episode.close()
    trajectories = [row.trajectory() for row in rows]
    for trajectory in trajectories:
        trajectory.multimodal_inputs = requests[trajectory.prompt_index].multimodal_inputs
    return trajectories, dict(episode.turns.metrics)


class _Episode:
    """What every trajectory of one ``tool_agent`` call shares: engine turns, tools, user."""

    def __init__(
        self,
        engine: RolloutEngine,
        params: SamplingParams,
        tokenizer: Any,
        config: AgentConfig,
        policy_version: int,
        images: bool = False,
    ) -> None:
        from rlkit.tools import Toolbox

        self.params, self.tokenizer, self.config = params, tokenizer, config
        self.version = policy_version
        self.toolbox = Toolbox(config.tools) if config.tools else None
        self.renderer = ObservationRenderer(
            tokenizer, self.toolbox.schemas() if self.toolbox else None
        )
        self.interaction = (
            make_interaction(config.interaction, config.interaction_options)
            if config.interaction
            else None
        )
        self.turns = engine.image_turns(params) if images else engine.turns(params)
        # Tools and the user run in worker threads, so decoding goes on meanwhile.
        self.workers = concurrent.futures.ThreadPoolExecutor(
            config.max_parallel_tools, thread_name_prefix="tool"
        )
        self.per_turn = config.max_turn_tokens or params.max_new_tokens

    def close(self) -> None:
        self.workers.shutdown(wait=False, cancel_futures=True)

    async def run(self, key: int, row: _Row, request: AgentRequest) -> None:
        """One trajectory, turn by turn, until it finishes."""
        try:
            for turn in range(self.config.max_turns):
                room = self.params.max_new_tokens - len(row.ids)
                images = {"images": request.multimodal_inputs} if request.multimodal_inputs else {}
                got = await self.turns.generate(
                    key, row.prompt_ids + row.ids, min(self.per_turn, room), **images
                )
                row.append(got.response_ids, got.log_probs, self.version, got.versions)
                row.turns += 1
                text = self.tokenizer.decode(got.response_ids, skip_special_tokens=True)
                row.conversation.append({"role": "assistant", "content": text})
                if got.finish_reason == "length":
                    row.finish = "length"
                    return
                messages = await self._respond(row, request, text)
                if not messages:
                    row.finish = row.finish or "stop"
                    return
                if turn == self.config.max_turns - 1:
                    row.finish = "max_turns"
                    return
                tail = self.tokenizer.decode(got.response_ids[-4:], skip_special_tokens=False)
                observation = self.renderer.observation_ids(messages, policy_text_tail=tail)
                if len(row.ids) + len(observation) >= self.params.max_new_tokens:
                    row.finish = "length"  # no room left for the policy to answer
                    return
                row.append(observation, None, NOT_GENERATED)
                row.conversation += messages
            row.finish = "max_turns"
        finally:
            self.turns.release(key)

    async def _respond(self, row: _Row, request: AgentRequest, text: str) -> list[dict[str, Any]]:
        """The messages that answer a policy turn: tool results, the user's reply, or none."""
        from rlkit.tools import parse_tool_calls

        calls, errors = parse_tool_calls(text) if self.toolbox else ([], [])
        if calls or errors:
            answers = [f"error: {e}" for e in errors]
            row.tool_calls += len(calls) + len(errors)
            row.tool_errors += len(errors)
            for result in await asyncio.gather(*(self._call_tool(c) for c in calls)):
                answers.append(result.text)
                row.tool_errors += result.status == "error"
                row.tool_timeouts += result.status == "timeout"
                row.tool_latency_s += result.latency_s
            return [{"role": "tool", "content": a} for a in answers]
        if self.interaction is None:
            return []
        reply = await asyncio.get_running_loop().run_in_executor(
            self.workers,
            lambda: self.interaction.reply(
                list(row.conversation),
                ground_truth=request.ground_truth,
                data_source=request.data_source,
                extra_info=request.extra_info,
            ),
        )
        if reply.score is not None:
            row.score_last_token(float(reply.score))
        if reply.message is None:
            return []
        row.user_turns += 1
        return [{"role": "user", "content": reply.message}]

    async def _call_tool(self, call: Any) -> Any:
        from rlkit.tools import run_tool_calls

        c = self.config
        return (
            await asyncio.get_running_loop().run_in_executor(
                self.workers,
                lambda: run_tool_calls(
                    [call],
                    tools=self.toolbox,
                    timeout_s=c.tool_timeout_s,
                    max_output_chars=c.max_tool_output_chars,
                ),
            )
        )[0]


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
        "user_turns/mean": sum(s.get("user_turns", 0.0) for s in stats) / len(stats),
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
