"""Multi-turn contexts against the chat template: the tokens the trainer trains on, compared
with the model's own template rendering the same conversation.

A multi-turn trajectory is built by appending: the policy's sampled ids, then the ids of
the inserted messages (tool results, user replies) with the template's separators. If
the separators are wrong, e.g. a template that drops the newline after each end-of-turn
token, every turn boundary carries a context the model never sees at inference, where the
chat template renders the whole conversation at once. The trainer then trains, and the
engine samples, on that off-distribution context; no log-prob gap shows it, because
both sides see the same wrong tokens.

:func:`compare_rendering` re-renders a trajectory's conversation with a reference
tokenizer (the model directory's own chat template) and reports, per turn boundary, the
first token where the two differ.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlkit.rollout.trajectory import Trajectory


@dataclass
class TurnDifference:
    """The first difference near one turn boundary of one trajectory.

    Attributes:
        row: the trajectory's index in the diagnosed batch.
        turn: the boundary's number: 1 is the end of the prompt, 2 the end of the
            policy's first turn, and so on (each start of a run of sampled or of
            inserted tokens).
        position: index in the trained sequence (prompt and response) of the first
            differing token.
        trained: the trained tokens from there (up to 8), decoded.
        rendered: the reference rendering's tokens from there (up to 8), decoded.
        kind: ``"template"`` (in the prompt or in inserted tokens: the rendering of the
            conversation differs) or ``"retokenized"`` (inside the policy's own sampled
            tokens, which are kept as sampled: decoding and re-encoding them is not
            bijective, e.g. a byte sequence that is not valid UTF-8).
    """

    row: int
    turn: int
    position: int
    trained: str
    rendered: str
    kind: str = "template"


def boundaries(trajectory: Trajectory) -> list[int]:
    """Positions (in prompt + response) where a run of sampled or inserted tokens starts:
    the end of the prompt first."""
    start = len(trajectory.prompt_ids)
    out = [start]
    for i in range(1, len(trajectory.loss_mask)):
        if trajectory.loss_mask[i] != trajectory.loss_mask[i - 1]:
            out.append(start + i)
    return out


def rendered_ids(
    tokenizer: Any, conversation: Sequence[Mapping[str, Any]], tools: Any = None
) -> list[int]:
    """The whole conversation as the reference template renders it, as token ids."""
    text = tokenizer.apply_chat_template(
        [dict(m) for m in conversation], tools=tools, tokenize=False
    )
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def compare_rendering(
    row: int, trajectory: Trajectory, reference: Any, tools: Any = None
) -> list[TurnDifference]:
    """The first difference per turn boundary between ``trajectory``'s trained tokens and
    ``reference`` rendering its conversation; empty when they agree (up to the trained
    length: the rendering goes on past a response cut by the token budget).

    A difference is assigned to the last boundary at or before it. One inside a policy
    turn (not at its first token) is of kind ``"retokenized"``: the template is not at
    fault there.
    """
    if not trajectory.conversation:
        return []
    trained = list(trajectory.prompt_ids) + list(trajectory.response_ids)
    reference_ids = rendered_ids(reference, trajectory.conversation, tools)
    starts = boundaries(trajectory)
    found: dict[int, TurnDifference] = {}
    matcher = difflib.SequenceMatcher(a=trained, b=reference_ids, autojunk=False)
    for tag, i1, _, j1, _ in matcher.get_opcodes():
        if tag == "equal" or i1 >= len(trained):
            continue
        if tag == "insert" and i1 == len(trained):
            continue  # the rendering goes on past the trained tokens
        turn = sum(1 for s in starts if s <= i1) or 1
        offset = i1 - len(trajectory.prompt_ids)
        sampled = offset > 0 and trajectory.loss_mask[offset] and i1 not in starts
        if turn not in found:
            found[turn] = TurnDifference(
                row,
                turn,
                i1,
                reference.decode(trained[i1 : i1 + 8]),
                reference.decode(reference_ids[j1 : j1 + 8]),
                "retokenized" if sampled else "template",
            )
    return [found[t] for t in sorted(found)]
