"""Chat templates that replace a tokenizer's own (``ModelConfig.chat_template``).

Some instruct models ship a chat template that ignores ``tools=``: SmolLM2-Instruct's
renders the messages only, so a policy trained with tools would never be told they
exist. :data:`CHAT_TEMPLATES` holds drop-in replacements by name:

``smollm2_tools``
    SmolLM2-Instruct's own ChatML template, unchanged when there are no tools (the
    same default system message), plus the Qwen2.5 / Hermes function-calling
    convention when there are: the tools' JSON schemas inside ``<tools></tools>`` in
    the system turn with the instruction to answer calls as ``<tool_call>{"name": ...,
    "arguments": {...}}</tool_call>`` (what :func:`rlkit.tools.parse_tool_calls` reads),
    an assistant message's ``tool_calls`` written as such blocks, and ``tool`` messages
    as ``<tool_response>`` blocks of one ``user`` turn (SmolLM2 knows no ``tool`` role).
"""

from __future__ import annotations

SMOLLM2_TOOLS_TEMPLATE = r"""
{%- set default_system = 'You are a helpful AI assistant named SmolLM, trained by Hugging Face' %}
{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content }}
    {%- else %}
        {{- default_system }}
    {%- endif %}
    {{- '\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n' }}
    {{- 'You are provided with function signatures within <tools></tools> XML tags:\n<tools>' }}
    {%- for tool in tools %}
        {{- '\n' + (tool | tojson) }}
    {%- endfor %}
    {{- '\n</tools>\n\nFor each function call, return a json object with function name and ' }}
    {{- 'arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n' }}
    {{- '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' }}
{%- elif messages[0].role != 'system' %}
    {{- '<|im_start|>system\n' + default_system + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'system' and loop.first and tools %}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' + message.content + '\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- elif message.role == 'assistant' and message.tool_calls %}
        {{- '<|im_start|>assistant' }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for call in message.tool_calls %}
            {%- if call.function is defined %}
                {%- set call = call.function %}
            {%- endif %}
            {%- set arguments = call.arguments if call.arguments is string else call.arguments | tojson %}
            {{- '\n<tool_call>\n{"name": "' + call.name + '", "arguments": ' + arguments + '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
""".strip()

CHAT_TEMPLATES: dict[str, str] = {"smollm2_tools": SMOLLM2_TOOLS_TEMPLATE}
"""Built-in chat templates by name (see the module docstring)."""


def resolve_chat_template(value: str) -> str:
    """The Jinja text of ``ModelConfig.chat_template``: a name of :data:`CHAT_TEMPLATES`,
    or the template itself (any text holding ``{{`` or ``{%``).

    Raises:
        ValueError: ``value`` is neither a known name nor a Jinja template.
    """
    if value in CHAT_TEMPLATES:
        return CHAT_TEMPLATES[value]
    if "{{" in value or "{%" in value:
        return value
    raise ValueError(
        f"ModelConfig.chat_template {value!r} is not a built-in template "
        f"({', '.join(sorted(CHAT_TEMPLATES))}) nor a Jinja template"
    )
