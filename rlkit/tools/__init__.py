"""Tools for multi-turn agentic RL: schemas, parsing of tool calls, sandboxed execution.

The agent loop uses four calls (docs/tools.md)::

    from rlkit.tools import Toolbox, parse_tool_calls, tool_metrics

    box = Toolbox(["calculator", "python", make_search_tool("wiki.jsonl")])
    prompt = tokenizer.apply_chat_template(messages, tools=box.schemas(), ...)
    calls, errors = parse_tool_calls(model_text)
    results = box.run(calls, timeout_s=30, max_concurrency=4)
    messages += [r.to_message() for r in results]

Built-ins registered in ``rlkit.registry.TOOLS``: ``calculator`` (exact arithmetic
on a parsed expression), ``python`` (code in a separate, resource-limited process) and
``search`` (BM25 over a JSON Lines corpus). A tool of your own is a documented,
annotated function: ``@TOOLS.register("name")`` or ``"pkg.module:fn"``.
"""

from rlkit.tools.arithmetic import calculator
from rlkit.tools.base import (
    TIMEOUT_PARAMETER,
    Tool,
    ToolArgumentError,
    ToolError,
    ToolSchemaError,
    ToolTimeout,
    as_tool,
    parse_docstring,
    schemas,
    tool_schema,
    validate_arguments,
)
from rlkit.tools.execution import (
    DEFAULT_MAX_CONCURRENCY,
    DEFAULT_MAX_OUTPUT_CHARS,
    DEFAULT_TIMEOUT_S,
    Toolbox,
    ToolResult,
    run_tool_calls,
    tool_metrics,
    truncate,
)
from rlkit.tools.parsing import ToolCall, parse_tool_calls
from rlkit.tools.python_sandbox import PythonSandbox, SandboxResult, make_python_tool, python
from rlkit.tools.retrieval import (
    CORPUS_ENV,
    Passage,
    SearchIndex,
    load_corpus,
    make_search_tool,
    search,
)

__all__ = [
    "CORPUS_ENV",
    "DEFAULT_MAX_CONCURRENCY",
    "DEFAULT_MAX_OUTPUT_CHARS",
    "DEFAULT_TIMEOUT_S",
    "TIMEOUT_PARAMETER",
    "Passage",
    "PythonSandbox",
    "SandboxResult",
    "SearchIndex",
    "Tool",
    "ToolArgumentError",
    "ToolCall",
    "ToolError",
    "ToolResult",
    "ToolSchemaError",
    "ToolTimeout",
    "Toolbox",
    "as_tool",
    "calculator",
    "load_corpus",
    "make_python_tool",
    "make_search_tool",
    "parse_docstring",
    "parse_tool_calls",
    "python",
    "run_tool_calls",
    "schemas",
    "search",
    "tool_metrics",
    "tool_schema",
    "truncate",
    "validate_arguments",
]
