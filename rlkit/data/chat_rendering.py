"""Turn a prompt's chat messages into the text a model is given."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rlkit.data.prompt_schema import message_problem

KNOWN_ROLES = frozenset({"system", "user", "assistant", "tool"})
"""Roles every chat template in use renders; a message with another role is checked to
have reached the prompt."""


def render_prompt(
    messages: Sequence[Mapping[str, str]],
    tokenizer: Any,
    *,
    use_chat_template: bool = True,
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> str:
    """The text of a prompt, ready to tokenise and continue.

    Args:
        messages: chat messages ``[{"role": ..., "content": ...}, ...]``.
        tokenizer: a Hugging Face tokenizer (may be ``None`` when
            ``use_chat_template`` is ``False``).
        use_chat_template: apply the tokenizer's chat template (with the
            generation prompt) when it has one.
        tools: function-calling schemas the template renders into the prompt
            (``apply_chat_template(tools=...)``); they need a chat template.

    Returns:
        The chat template's output; without a template, the messages as
        ``"role: content"`` lines followed by ``"assistant:"`` for the model to continue.

    Raises:
        ValueError: ``messages`` is not a non-empty list of role/content dicts, or the
            chat template dropped a message of a role it does not know.
    """
    problem = message_problem(messages)
    if problem is not None:
        raise ValueError(f"cannot render prompt: {problem}")
    has_template = use_chat_template and getattr(tokenizer, "chat_template", None)
    if tools and not has_template:
        raise ValueError(
            "tools need the tokenizer's chat template to be rendered into the prompt; "
            "set DataConfig.use_chat_template = True and use a tokenizer that has one"
        )
    if has_template:
        # tools= only when there are some: a tokenizer whose template takes none may not
        # accept the keyword.
        extra = {"tools": list(tools)} if tools else {}
        text = tokenizer.apply_chat_template(
            [dict(m) for m in messages], tokenize=False, add_generation_prompt=True, **extra
        )
        _check_unknown_roles_rendered(messages, text)
        return text
    lines = [f"{m['role']}: {m['content']}" for m in messages]
    return "\n".join([*lines, "assistant:"])


def _check_unknown_roles_rendered(messages: Sequence[Mapping[str, str]], text: str) -> None:
    # Templates render each role they know by name and skip the rest without a word: a
    # message of another role would silently vanish from the prompt.
    for i, m in enumerate(messages):
        content = m.get("content")
        if m["role"] in KNOWN_ROLES or not isinstance(content, str) or not content.strip():
            continue
        if content.strip() not in text:
            raise ValueError(
                f"message {i} has role {m['role']!r}, which the chat template does not "
                f"render (its content would be lost); use one of {', '.join(sorted(KNOWN_ROLES))}"
            )
