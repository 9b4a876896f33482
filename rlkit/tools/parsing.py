"""Tool calls in model text: the Qwen / Hermes ``<tool_call>`` format.

A message calls tools with one block per call, anywhere in its text::

    Let me compute that.
    <tool_call>
    {"name": "calculator", "arguments": {"expression": "123 * 456"}}
    </tool_call>

:func:`parse_tool_calls` returns the well-formed calls and one error string per
malformed block; it never raises, so model output of any shape is safe to feed it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"


@dataclass(frozen=True)
class ToolCall:
    """One call: the tool's name and its arguments (a JSON object)."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)

    def to_text(self) -> str:
        """The call in the Hermes format, as a Qwen chat template renders it."""
        body = json.dumps({"name": self.name, "arguments": self.arguments}, ensure_ascii=False)
        return f"{TOOL_CALL_OPEN}\n{body}\n{TOOL_CALL_CLOSE}"

    def to_message_entry(self) -> dict[str, Any]:
        """An entry of an assistant message's ``tool_calls`` for ``apply_chat_template``."""
        return {"type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def _json_kind(value: Any) -> str:
    return {
        str: "a string",
        list: "an array",
        bool: "a boolean",
        int: "a number",
        float: "a number",
        type(None): "null",
    }.get(type(value), type(value).__name__)


def _short_reason(exc: Exception, limit: int = 120) -> str:
    """The first ``limit`` characters of an exception's message, on one line."""
    reason = " ".join(str(exc).split()) or type(exc).__name__
    return reason if len(reason) <= limit else reason[: limit - 3] + "..."


def _parse_block(body: str, number: int) -> tuple[ToolCall | None, str | None]:
    where = f"tool call {number}"
    try:
        # strict=False: raw newlines and tabs inside strings (code arguments) are accepted.
        obj = json.loads(body, strict=False)
    except json.JSONDecodeError as exc:
        return None, f"{where}: malformed JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
    except RecursionError:
        return None, f"{where}: malformed JSON (nested too deeply)"
    except ValueError as exc:  # e.g. an integer past sys.get_int_max_str_digits()
        return None, f"{where}: unreadable JSON ({_short_reason(exc)})"
    if not isinstance(obj, Mapping):
        return (
            None,
            f'{where}: expected a JSON object {{"name": ..., "arguments": {{...}}}}, got {_json_kind(obj)}',
        )
    name = obj.get("name")
    if name is None:
        return None, f'{where}: missing "name"'
    if not isinstance(name, str) or not name.strip():
        return None, f'{where}: "name" must be a non-empty string, got {_json_kind(name)}'
    arguments = obj.get("arguments", {})
    if not isinstance(arguments, Mapping):
        hint = " (an object, not a JSON-encoded string)" if isinstance(arguments, str) else ""
        return (
            None,
            f'{where}: "arguments" must be a JSON object{hint}, got {_json_kind(arguments)}',
        )
    return ToolCall(name.strip(), dict(arguments)), None


def parse_tool_calls(
    text: str, *, allow_unclosed: bool = False
) -> tuple[list[ToolCall], list[str]]:
    """Find the ``<tool_call>{...}</tool_call>`` blocks of a model message.

    Each block holds a JSON object with a string ``"name"`` and an object
    ``"arguments"`` (absent means ``{}``; other keys are ignored).

    Args:
        text: the decoded model message (special tokens included or not).
        allow_unclosed: also accept a last ``<tool_call>`` without its closing tag
            (for generation that stopped *at* ``</tool_call>`` and dropped it). By
            default such a block is an error.

    Returns:
        ``(calls, errors)``: the well-formed calls in order, and one message per
        malformed block (``"tool call 2: malformed JSON (...)"``, numbered in the
        order of the blocks), never an exception.
    """
    calls: list[ToolCall] = []
    errors: list[str] = []
    if not isinstance(text, str):
        return calls, [f"expected the message text as a string, got {type(text).__name__}"]
    pos, number = 0, 0
    while (start := text.find(TOOL_CALL_OPEN, pos)) != -1:
        number += 1
        body_start = start + len(TOOL_CALL_OPEN)
        end = text.find(TOOL_CALL_CLOSE, body_start)
        reopened = text.find(TOOL_CALL_OPEN, body_start)
        if reopened != -1 and (end == -1 or reopened < end):  # a block left open, then another
            errors.append(f"tool call {number}: {TOOL_CALL_OPEN} without {TOOL_CALL_CLOSE}")
            pos = reopened
            continue
        if end == -1:
            if not allow_unclosed:
                errors.append(f"tool call {number}: {TOOL_CALL_OPEN} without {TOOL_CALL_CLOSE}")
                break
            body, pos = text[body_start:], len(text)
        else:
            body, pos = text[body_start:end], end + len(TOOL_CALL_CLOSE)
        call, error = _parse_block(body.strip(), number)
        if call is not None:
            calls.append(call)
        else:
            errors.append(error)  # type: ignore[arg-type]
    return calls, errors
