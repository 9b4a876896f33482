"""Token ids of the messages inserted between the policy's turns (tool results, user replies).

A multi-turn trajectory keeps the policy's sampled ids as they are (decoding and
re-encoding them is not bijective) and appends the inserted messages rendered
to ids once. Two template facts make the naive "render the message alone" wrong:

* the policy stops at its end-of-turn token (``<|im_end|>`` for Qwen) and never
  samples what the template writes after it (Qwen: a newline), so that
  separator must be part of the inserted ids, or each turn boundary loses a
  token relative to the template's own rendering of the whole conversation;
* a message's rendering depends on its role header and on the generation prompt
  that follows it (``<|im_start|>assistant\\n``), which belong to the inserted ids too.

:class:`ObservationRenderer` derives both from the tokenizer's chat template by
rendering a fixed short conversation with and without the inserted messages and
taking the difference, so no token id is hard-coded. Templates that rewrite
earlier turns (e.g. drop past reasoning) are not append-only; the rendering here
is still exact for the tokens appended, because earlier tokens are never re-rendered.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

_BASE = [{"role": "user", "content": "?"}]
_PLACEHOLDER = "\u2400"  # a character no template rewrites


class ObservationRenderer:
    """Renders inserted messages to the ids that follow a policy turn.

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template.
        tools: tool schemas passed to the template (some templates render them
            into the system turn; they never change what follows an assistant turn,
            but the same ``tools=`` keeps the rendering identical to the prompt's).

    Raises:
        ValueError: the tokenizer has no chat template, or rendering an assistant
            turn does not end with a prefix of what the template writes after it.
    """

    def __init__(self, tokenizer: Any, tools: Sequence[Mapping[str, Any]] | None = None) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                "a multi-turn agent loop needs a tokenizer with a chat template "
                "(set ModelConfig.tokenizer_path to one that has it)"
            )
        self.tokenizer = tokenizer
        self.tools = list(tools) if tools else None
        assistant = {"role": "assistant", "content": _PLACEHOLDER}
        closed = self._render([*_BASE, assistant])
        self._closed = closed
        # What the template writes after the assistant's content: e.g. "<|im_end|>\n".
        self.turn_suffix = closed[closed.rindex(_PLACEHOLDER) + len(_PLACEHOLDER) :]

    def _render(self, messages: list[Mapping[str, Any]], generation_prompt: bool = False) -> str:
        return self.tokenizer.apply_chat_template(
            [dict(m) for m in messages],
            tools=self.tools,
            tokenize=False,
            add_generation_prompt=generation_prompt,
        )

    def observation_ids(
        self, messages: Sequence[Mapping[str, Any]], *, policy_text_tail: str = ""
    ) -> list[int]:
        """Ids to append after a policy turn: the rest of the turn's closing text, the
        inserted ``messages`` (e.g. ``{"role": "tool", "content": ...}``) and the next
        assistant header.

        Args:
            messages: the inserted messages, in order.
            policy_text_tail: the end of the policy turn's decoded text *with* special
                tokens (e.g. ``"...<|im_end|>"``); the part of :attr:`turn_suffix` it
                already produced is not repeated. Empty when the turn ended without
                a stop token (then the whole suffix is inserted).
        """
        assistant = {"role": "assistant", "content": _PLACEHOLDER}
        full = self._render([*_BASE, assistant, *messages], generation_prompt=True)
        if not full.startswith(self._closed):
            raise ValueError(
                "the chat template is not append-only after an assistant turn: rendering "
                "a tool or user message changed the text before it"
            )
        inserted = full[len(self._closed) :]
        missing = self.turn_suffix
        for cut in range(len(missing), -1, -1):  # longest suffix end the policy already wrote
            if policy_text_tail.endswith(missing[:cut]):
                missing = missing[cut:]
                break
        return self.tokenizer(missing + inserted, add_special_tokens=False)["input_ids"]
