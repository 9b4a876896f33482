"""Run parsed tool calls: one :class:`ToolResult` per call, in order, whatever happens.

Every call is resolved against the tools on offer, its arguments are checked against
the tool's schema, and the tool runs in a thread of its own (at most
``max_concurrency`` at once) under a time limit. An unknown tool, bad arguments, a
tool that raises, or one that overruns gives a result with status ``"error"`` or
``"timeout"`` and a short message for the policy; nothing propagates to the caller.

A thread cannot be stopped from outside: an in-process tool that overruns is
reported as a timeout and abandoned (a daemon thread, it does not keep the process
alive). Tools whose work may hang run it in a process of their own and take the
limit as their keyword-only ``timeout_s`` (the ``python`` tool does; see
:mod:`rlkit.tools.base`).
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlkit.registry import TOOLS, UnknownNameError
from rlkit.tools.base import (
    TIMEOUT_PARAMETER,
    Tool,
    ToolArgumentError,
    ToolError,
    ToolSchemaError,
    ToolSpec,
    ToolTimeout,
    as_tool,
)
from rlkit.tools.parsing import ToolCall

#: Default limit of one call, in seconds.
DEFAULT_TIMEOUT_S = 30.0
#: Default number of calls running at once.
DEFAULT_MAX_CONCURRENCY = 4
#: Default length of a result's text, in characters, before the truncation marker.
DEFAULT_MAX_OUTPUT_CHARS = 4000
#: A tool that enforces its own limit (takes ``timeout_s``) gets this much longer
#: before the runner gives up on it, so that it can report its own timeout.
SELF_LIMIT_GRACE_S = 2.0
_MAX_MESSAGE_CHARS = 300

STATUSES = ("ok", "error", "timeout")


@dataclass(frozen=True)
class ToolResult:
    """The outcome of one tool call.

    Attributes:
        name: the tool called (as the model wrote it).
        text: what goes back to the policy as the tool message's content.
        status: ``"ok"``, ``"error"`` (unknown tool, bad arguments, the tool failed)
            or ``"timeout"``.
        latency_s: seconds the call ran (0 for calls refused before running).
        truncated: ``text`` was cut to the runner's ``max_output_chars``.
    """

    name: str
    text: str
    status: str
    latency_s: float = 0.0
    truncated: bool = False

    def to_message(self) -> dict[str, Any]:
        """The tool message for the conversation (``apply_chat_template`` format)."""
        return {"role": "tool", "name": self.name, "content": self.text}


def truncate(text: str, max_chars: int | None) -> tuple[str, bool]:
    """``text`` cut to ``max_chars`` characters plus a marker saying how much was cut."""
    if max_chars is None or len(text) <= max_chars:
        return text, False
    return f"{text[:max_chars]}\n...[truncated {len(text) - max_chars} characters]", True


def _short(message: str) -> str:
    message = " ".join(message.split())
    return (
        message if len(message) <= _MAX_MESSAGE_CHARS else message[: _MAX_MESSAGE_CHARS - 3] + "..."
    )


def _to_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    if isinstance(value, Mapping | list | tuple | bool | int | float):
        try:
            return json.dumps(value, ensure_ascii=False, default=str)
        except (TypeError, ValueError):
            pass
    return str(value)


class Toolbox:
    """The tools offered to the policy in an episode, by the name the model uses.

    Args:
        tools: registered names (``"calculator"``), ``"pkg.module:fn"`` paths,
            functions, or :class:`Tool` objects (e.g. from ``make_search_tool``).

    Raises:
        ValueError: two tools share a name.
        UnknownNameError, ToolSchemaError: a tool cannot be found or described.
    """

    def __init__(self, tools: Iterable[ToolSpec]) -> None:
        if isinstance(tools, str | Tool) or callable(tools):
            tools = [tools]
        self._tools: dict[str, Tool] = {}
        for spec in tools:
            tool = as_tool(spec)
            if tool.name in self._tools:
                raise ValueError(f"two tools are named {tool.name!r}; rename one (Tool.renamed)")
            self._tools[tool.name] = tool

    @property
    def names(self) -> list[str]:
        return list(self._tools)

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)

    def __repr__(self) -> str:
        return f"Toolbox({self.names})"

    def schemas(self) -> list[dict[str, Any]]:
        """The schemas to pass as ``tools=`` to ``apply_chat_template``."""
        return [json.loads(json.dumps(t.schema)) for t in self._tools.values()]

    def run(
        self, calls: Sequence[ToolCall | Mapping[str, Any]], **options: Any
    ) -> list[ToolResult]:
        """:func:`run_tool_calls` with these tools."""
        return run_tool_calls(calls, tools=self, **options)


def _registered(name: str) -> Tool | None:
    # Only names registered in TOOLS: a "pkg.module:fn" written by the model is never imported.
    if not name or ":" in name or name not in TOOLS:
        return None
    return as_tool(name)


@dataclass
class _Running:
    index: int
    tool: Tool
    started: float
    deadline: float
    outcome: tuple[str, str, float] | None = None


def _call(tool: Tool, arguments: dict[str, Any], timeout_s: float | None) -> tuple[str, str]:
    kwargs = dict(arguments)
    if tool.takes_timeout and timeout_s is not None:
        kwargs[TIMEOUT_PARAMETER] = timeout_s
    try:
        return "ok", _to_text(tool.fn(**kwargs))
    except ToolTimeout as exc:
        return "timeout", str(exc) or f"Error: tool {tool.name!r} ran out of time"
    except ToolError as exc:
        return "error", str(exc) or f"Error: tool {tool.name!r} failed"
    except (Exception, SystemExit) as exc:
        return "error", _short(f"Error: tool {tool.name!r} failed: {type(exc).__name__}: {exc}")


def _check_options(timeout_s: Any, max_concurrency: Any, max_output_chars: Any) -> None:
    if timeout_s is not None and not (isinstance(timeout_s, int | float) and timeout_s > 0):
        raise ValueError(f"timeout_s must be > 0 seconds or None (no limit), got {timeout_s!r}")
    if not isinstance(max_concurrency, int) or max_concurrency < 1:
        raise ValueError(f"max_concurrency must be an int >= 1, got {max_concurrency!r}")
    if max_output_chars is not None and (
        not isinstance(max_output_chars, int) or max_output_chars < 1
    ):
        raise ValueError(f"max_output_chars must be an int >= 1 or None, got {max_output_chars!r}")


def run_tool_calls(
    calls: Sequence[ToolCall | Mapping[str, Any]],
    *,
    tools: Toolbox | Iterable[ToolSpec] | None = None,
    timeout_s: float | None = DEFAULT_TIMEOUT_S,
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
    max_output_chars: int | None = DEFAULT_MAX_OUTPUT_CHARS,
) -> list[ToolResult]:
    """Run tool calls concurrently; return one :class:`ToolResult` per call, in order.

    Args:
        calls: :class:`ToolCall` objects (from :func:`parse_tool_calls`) or
            ``{"name": ..., "arguments": {...}}`` dicts.
        tools: the tools on offer (a :class:`Toolbox` or what one is built from);
            ``None`` for every tool registered in ``TOOLS``, by its registered name.
            A name the model writes is only ever looked up here, never imported.
        timeout_s: limit of each call in seconds, counted from its start; ``None``
            for none. Tools that take ``timeout_s`` receive it (and
            :data:`SELF_LIMIT_GRACE_S` more before the runner gives up on them).
        max_concurrency: calls running at the same time.
        max_output_chars: a result's text longer than this is cut and marked
            ``...[truncated N characters]``; ``None`` for no limit.

    Returns:
        ``len(calls)`` results in the order of ``calls``. Status ``"error"``: the
        tool is unknown, the arguments are missing, extra or of the wrong type (checked
        against the schema before calling), or the tool raised; ``"timeout"``: it ran
        past ``timeout_s``. The text of a failure is a short message for the policy.

    Raises:
        ValueError: invalid ``timeout_s``, ``max_concurrency`` or ``max_output_chars``.
    """
    _check_options(timeout_s, max_concurrency, max_output_chars)
    box = tools if isinstance(tools, Toolbox) else None if tools is None else Toolbox(tools)
    results: list[ToolResult | None] = [None] * len(calls)
    queue: deque[tuple[int, Tool, dict[str, Any]]] = deque()

    for index, call in enumerate(calls):
        if isinstance(call, ToolCall):
            name, arguments = call.name, call.arguments
        elif isinstance(call, Mapping):
            name, arguments = call.get("name"), call.get("arguments", {})
        else:
            results[index] = ToolResult(
                "", f"Error: not a tool call: {type(call).__name__}", "error"
            )
            continue
        name = name if isinstance(name, str) else ""
        try:
            tool = box.get(name) if box is not None else _registered(name)
        except (ToolSchemaError, UnknownNameError) as exc:  # a registered tool that is broken
            results[index] = ToolResult(
                name, _short(f"Error: tool {name!r} cannot be used: {exc}"), "error"
            )
            continue
        if tool is None:
            offered = box.names if box is not None else TOOLS.names()
            results[index] = ToolResult(
                name,
                _short(f"Error: unknown tool {name!r}. Available tools: {', '.join(offered)}"),
                "error",
            )
            continue
        try:
            arguments = tool.validate(arguments)
        except ToolArgumentError as exc:
            results[index] = ToolResult(
                name, _short(f"Error: invalid arguments for tool {name!r}: {exc}"), "error"
            )
            continue
        queue.append((index, tool, arguments))

    done = threading.Condition()
    finished: list[_Running] = []
    running: dict[int, _Running] = {}

    def work(job: _Running, arguments: dict[str, Any]) -> None:
        status, text = _call(job.tool, arguments, timeout_s)
        with done:
            job.outcome = (status, text, time.monotonic() - job.started)
            finished.append(job)
            done.notify()

    while queue or running:
        while queue and len(running) < max_concurrency:
            index, tool, arguments = queue.popleft()
            now = time.monotonic()
            limit = math.inf if timeout_s is None else timeout_s
            if tool.takes_timeout:
                limit += SELF_LIMIT_GRACE_S
            job = _Running(index, tool, now, now + limit)
            running[index] = job
            threading.Thread(
                target=work, args=(job, arguments), name=f"tool-{tool.name}", daemon=True
            ).start()
        with done:
            if not finished:
                wait = min(j.deadline for j in running.values()) - time.monotonic()
                done.wait(timeout=None if math.isinf(wait) else max(wait, 0.0))
            ready, finished[:] = list(finished), []
        for job in ready:
            if running.pop(job.index, None) is None:
                continue  # reported as a timeout already; a late answer is dropped
            status, text, latency = job.outcome  # type: ignore[misc]
            text, cut = truncate(text, max_output_chars)
            results[job.index] = ToolResult(job.tool.name, text, status, latency, cut)
        now = time.monotonic()
        for job in [j for j in running.values() if now >= j.deadline]:
            del running[job.index]
            results[job.index] = ToolResult(
                job.tool.name,
                f"Error: tool {job.tool.name!r} timed out after {timeout_s:g} s",
                "timeout",
                now - job.started,
            )
    return [r if r is not None else ToolResult("", "Error: lost", "error") for r in results]


def tool_metrics(results: Sequence[ToolResult], *, num_parse_errors: int = 0) -> dict[str, float]:
    """Numbers to log for a batch of tool results.

    Returns:
        ``tool/num_calls``, ``tool/num_ok``, ``tool/num_errors``, ``tool/num_timeouts``,
        ``tool/num_truncated``, ``tool/num_parse_errors`` and, for a non-empty batch,
        ``tool/latency_s/mean`` and ``tool/latency_s/max``.
    """
    out = {
        "tool/num_calls": float(len(results)),
        "tool/num_ok": float(sum(r.status == "ok" for r in results)),
        "tool/num_errors": float(sum(r.status == "error" for r in results)),
        "tool/num_timeouts": float(sum(r.status == "timeout" for r in results)),
        "tool/num_truncated": float(sum(r.truncated for r in results)),
        "tool/num_parse_errors": float(num_parse_errors),
    }
    if results:
        latencies = [r.latency_s for r in results]
        out["tool/latency_s/mean"] = sum(latencies) / len(latencies)
        out["tool/latency_s/max"] = max(latencies)
    return out
