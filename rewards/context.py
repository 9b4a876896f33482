"""What a reward may know about the response it scores, and how it says what it reads.

Every reward is called as ``fn(response, ground_truth, **extra)``, where ``extra``
always holds ``data_source``, ``response_length`` and the configured
``reward_options``. A reward that needs more names it as a parameter:

* ``prompt`` (the rendered prompt text), ``messages`` (the prompt's chat
  messages), ``conversation`` (the whole chat when there were several turns,
  else ``None``) or ``extra_info`` (the dataset row's ``extra_info`` dict) —
  each passed when the function's signature names it;
* ``context``: the whole :class:`RewardContext`.

A function with verl's signature ``(data_source, solution_str, ground_truth,
extra_info)`` is called by keyword instead (:mod:`rewards.verl_signature`).

So existing rewards keep working unchanged, and a reward declares what it reads
by its own signature, whether it is registered or named by ``pkg.module:function``::

    def my_reward(response, ground_truth, *, extra_info, **_):
        return float(response.strip() == extra_info["expected"])
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

READABLE = ("prompt", "messages", "conversation", "extra_info", "images")
"""Context fields a reward receives when its signature names them."""


@dataclass(frozen=True)
class RewardContext:
    """Everything known about one response when it is scored.

    Attributes:
        response: the decoded response: every token after the prompt (for several turns,
            tool and user turns included, as the model read them).
        ground_truth: the dataset row's reference answer.
        prompt: the prompt as the model saw it (chat template applied), decoded.
        messages: the prompt's chat messages (``[{"role", "content"}, ...]``).
        conversation: the whole conversation (prompt, policy turns, tool and user
            turns) when there were several turns; ``None`` for a single response.
        data_source: the row's data source (e.g. ``"gsm8k"``).
        extra_info: the dataset row's ``extra_info`` (verl's column), ``{}`` if none.
        response_length: response tokens (EOS included; every token after the prompt).
        reward_model_score: the trainer's reward model's score of this response
            (``RewardModelConfig.path``), ``None`` when no reward model is configured;
            the ``reward_model`` reward returns it.
        images: the prompt's images (PIL, RGB) for a vision-language prompt, in the order
            of its ``<image>`` placeholders; ``()`` for a text prompt.
    """

    response: str
    ground_truth: str
    prompt: str = ""
    messages: tuple[Mapping[str, Any], ...] = ()
    conversation: tuple[Mapping[str, Any], ...] | None = None
    data_source: str = ""
    extra_info: Mapping[str, Any] = field(default_factory=dict)
    response_length: int = 0
    reward_model_score: float | None = None
    images: tuple[Any, ...] = ()


def fields_read(fn: Callable[..., Any]) -> tuple[str, ...]:
    """The context fields ``fn`` names as parameters (``context`` for the whole object).

    A ``**kwargs`` catch-all does not count: only a named parameter declares a read,
    so a reward that forwards its keywords (``combined``) receives what it did before.
    """
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # builtins and some C callables have no signature
        return ()
    named = {
        name for name, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    }
    return tuple(name for name in (*READABLE, "context") if name in named)


def context_kwargs(reads: tuple[str, ...], context: RewardContext) -> dict[str, Any]:
    """The keyword arguments for the fields ``reads`` (:func:`fields_read` of a reward)."""
    out: dict[str, Any] = {}
    for name in reads:
        if name == "context":
            out[name] = context
        elif name in ("messages", "conversation"):
            value = getattr(context, name)
            out[name] = None if value is None else [dict(m) for m in value]
        elif name == "extra_info":
            out[name] = dict(context.extra_info)
        elif name == "images":
            out[name] = list(context.images)
        else:
            out[name] = getattr(context, name)
    return out
