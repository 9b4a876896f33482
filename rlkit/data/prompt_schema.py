"""rlkit's prompt schema: the columns every prompt dataset has after loading.

==============  ==========================================================
column          meaning
==============  ==========================================================
``id``          stable string id of the problem
``prompt``      chat messages ``[{"role": ..., "content": ...}, ...]``
``ground_truth`` the reference answer, a string the reward compares against
``data_source`` which dataset the row came from (``gsm8k``, ``math500``, ...)
``extra_info``  optional: the row's free-form fields for rewards, a JSON object
                stored as a string (Arrow needs one type per column); read it
                with :func:`decode_extra_info`
``images``      optional: the images of a vision-language prompt, each
                ``{"bytes": ..., "path": ...}``, one ``<image>`` in the
                messages per image (:mod:`rlkit.data.images`)
==============  ==========================================================
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import datasets

COLUMNS = ("id", "prompt", "ground_truth", "data_source")

FEATURES = datasets.Features(
    {
        "id": datasets.Value("string"),
        # The list-of-dicts literal is the features spelling every datasets version reads.
        "prompt": [{"role": datasets.Value("string"), "content": datasets.Value("string")}],
        "ground_truth": datasets.Value("string"),
        "data_source": datasets.Value("string"),
        "extra_info": datasets.Value("string"),
    }
)

IMAGE_FEATURES = datasets.Features(
    {
        **FEATURES,
        "images": [{"bytes": datasets.Value("binary"), "path": datasets.Value("string")}],
    }
)
"""The schema of a dataset with image prompts (rows without images hold ``[]``)."""


def encode_extra_info(value: Mapping[str, Any] | None) -> str:
    """A row's ``extra_info`` as the JSON text the ``extra_info`` column stores."""
    return json.dumps(dict(value or {}), sort_keys=True, default=str)


def decode_extra_info(value: Any) -> dict[str, Any]:
    """A row's ``extra_info`` as a dict, from the stored JSON text, a mapping or ``None``.

    Raises:
        ValueError: the value is neither (e.g. a list, or text that is not a JSON object).
    """
    if value is None or value == "":
        return {}
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, str):
        decoded = json.loads(value)
        if isinstance(decoded, dict):
            return decoded
    raise ValueError(f"extra_info must be a JSON object or a mapping, got {value!r:.60}")


def build_messages(
    question: str, *, instruction: str | None = None, system_prompt: str | None = None
) -> list[dict[str, str]]:
    """Chat messages for one question.

    Args:
        question: the problem text.
        instruction: appended to the question after a space (verl's GSM8K style),
            or, if it contains ``{question}``, a template the question is put into.
        system_prompt: an optional system message placed first.

    Returns:
        ``[{"role": "system", ...}?, {"role": "user", "content": ...}]``.
    """
    if instruction is None:
        content = question
    elif "{question}" in instruction:
        content = instruction.replace("{question}", question)
    else:
        content = f"{question} {instruction}"
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return [*messages, {"role": "user", "content": content}]


def message_problem(messages: Any) -> str | None:
    """What is wrong with ``messages`` as a chat prompt, or ``None`` if nothing.

    Returns:
        A short description of the first problem found (for error messages).
    """
    if isinstance(messages, str) or not isinstance(messages, Sequence):
        return f"prompt must be a list of chat messages, got {type(messages).__name__}"
    if not messages:
        return "prompt has no messages"
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            return f"prompt message {i} must be a dict with a string 'role', got {m!r:.80}"
        if not isinstance(m.get("content"), str):
            return f"prompt message {i} has no string 'content'"
    return None
