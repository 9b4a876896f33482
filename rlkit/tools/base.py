"""A tool: a Python function the policy calls by name, described by a JSON schema.

The schema is derived from the function itself, as Hugging Face's
``transformers.utils.get_json_schema`` does (same output, less its ``"return"`` entry,
which chat templates ignore): the name, the docstring's text before its first
section as the description, one property per parameter typed from its annotation
and described by the docstring's ``Args:`` section (Google style), and the
parameters without a default as ``required``::

    {"type": "function",
     "function": {"name": "calculator",
                  "description": "Evaluate an arithmetic expression.",
                  "parameters": {"type": "object",
                                 "properties": {"expression": {"type": "string",
                                                               "description": "..."}},
                                 "required": ["expression"]}}}

Annotations: ``str`` (string), ``int`` (integer), ``float`` (number), ``bool``
(boolean), ``list[...]`` (array with items), ``tuple[...]``, ``dict[str, ...]``
(object), ``Literal[...]`` (enum), ``X | None`` / ``Optional[X]`` (``"nullable":
true``), unions (a type list or ``anyOf``) and ``Any`` (no constraint). A
description ending in ``(choices: ["a", "b"])`` becomes an ``enum``, as in
transformers.

One parameter is never shown to the model: a keyword-only ``timeout_s``. The runner
fills it with the call's time limit, so that a tool doing its work in a process of its
own (the ``python`` tool) can stop that work itself and report a timeout.
"""

from __future__ import annotations

import copy
import functools
import inspect
import json
import math
import re
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from rlkit.registry import TOOLS

#: The keyword-only parameter the runner sets to the call's time limit (hidden from the schema).
TIMEOUT_PARAMETER = "timeout_s"

#: Tool names accepted (the OpenAI function-calling rule: letters, digits, ``_``, ``-``).
_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

ToolSpec = Union[str, Callable[..., Any], "Tool"]


class ToolError(Exception):
    """Raised by a tool for a call that failed; ``str(exc)`` is the text the policy sees.

    The runner reports the call with status ``"error"`` and this exact text, so a tool
    phrases it for the model (the built-ins start theirs with ``"Error: "``).
    """


class ToolTimeout(ToolError):
    """Raised by a tool that stopped its own work at its time limit (status ``"timeout"``)."""


class ToolSchemaError(TypeError):
    """A function cannot be described as a tool (no docstring, an undocumented,
    unannotated or unsupported parameter, a bad name)."""


class ToolArgumentError(ValueError):
    """The arguments of a call do not match the tool's schema."""


# -- docstrings ---------------------------------------------------------------
_SECTION_RE = re.compile(
    r"^(Args|Arguments|Parameters|Params|Keyword Args|Keyword Arguments|Returns?|Yields?|"
    r"Raises|Examples?|Notes?|Attributes|See Also|Warnings?|Todo|References?):\s*$"
)
_ARG_RE = re.compile(r"^(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_CHOICES_RE = re.compile(r"\(choices:\s*(.*?)\)\s*$", flags=re.IGNORECASE)


def parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into (description, {argument: description}).

    The description is the text before the first section header (``Args:``,
    ``Returns:``, ``Raises:``, ...), stripped. In ``Args:`` an entry is
    ``name: text`` or ``name (type): text``; indented continuation lines join it,
    separated by single spaces.
    """
    lines = inspect.cleandoc(doc).splitlines()
    description: list[str] = []
    args: dict[str, str] = {}
    section: str | None = None
    entry_indent: int | None = None
    current: str | None = None
    for line in lines:
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        header = _SECTION_RE.match(stripped)
        if header and (section is None or indent == 0):
            section = header.group(1)
            entry_indent, current = None, None
            continue
        if section is None:
            description.append(line)
            continue
        if section not in ("Args", "Arguments", "Parameters", "Params") or not stripped:
            continue
        if entry_indent is None:
            entry_indent = indent
        match = _ARG_RE.match(stripped)
        if indent <= entry_indent and match:
            current = match.group(1)
            args[current] = match.group(2).strip()
        elif current is not None:
            args[current] = f"{args[current]} {stripped}".strip()
    return "\n".join(description).strip(), args


# -- annotations -> JSON schema -------------------------------------------------
_BASIC: dict[Any, dict[str, Any]] = {
    str: {"type": "string"},
    int: {"type": "integer"},
    float: {"type": "number"},
    bool: {"type": "boolean"},
    type(None): {"type": "null"},
    list: {"type": "array"},
    tuple: {"type": "array"},
    dict: {"type": "object"},
}


def json_type(hint: Any) -> dict[str, Any]:
    """The JSON schema of one annotation (see the module docstring for what is supported).

    Raises:
        ToolSchemaError: an annotation with no JSON counterpart (a class, a callable, ...).
    """
    if hint is Any:
        return {}
    if hint in _BASIC:
        return dict(_BASIC[hint])
    origin, args = get_origin(hint), get_args(hint)
    if origin is Union or origin is types.UnionType:
        subtypes = [json_type(t) for t in args if t is not type(None)]
        if len(subtypes) == 1:
            out = subtypes[0]
        elif all(s.keys() == {"type"} and isinstance(s["type"], str) for s in subtypes):
            names = sorted({s["type"] for s in subtypes})
            out = {"type": names[0] if len(names) == 1 else names}
        else:
            out = {"anyOf": subtypes}
        if type(None) in args:
            out["nullable"] = True
        return out
    if origin is Literal and args:
        kinds: list[str] = []
        for value in args:
            if type(value) not in (int, float, str, bool, type(None)):
                raise ToolSchemaError(
                    f"Literal values must be str, int, float, bool or None: {hint}"
                )
            kind = _BASIC[type(value)]["type"]
            if kind not in kinds:
                kinds.append(kind)
        return {"type": kinds[0] if len(kinds) == 1 else kinds, "enum": list(args)}
    if origin is list:
        return {"type": "array", "items": json_type(args[0])} if args else {"type": "array"}
    if origin is tuple:
        if not args:
            return {"type": "array"}
        if len(args) == 1 or ... in args:
            raise ToolSchemaError(f"use list[...] for a variable-length sequence, not {hint}")
        return {"type": "array", "prefixItems": [json_type(t) for t in args]}
    if origin is dict:
        out = {"type": "object"}
        if len(args) == 2:
            out["additionalProperties"] = json_type(args[1])
        return out
    raise ToolSchemaError(f"cannot describe the annotation {hint!r} in JSON schema")


def _target(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The function whose docstring and annotations describe ``fn`` (unwraps a partial)."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return fn


# -- the Tool ----------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Tool:
    """A function callable by the policy, with its schema.

    Build one with :meth:`from_function` (or :func:`as_tool`); calling it calls
    ``fn`` with keyword arguments.

    Attributes:
        name: the name the model calls it by (``schema["function"]["name"]``).
        fn: the function, called as ``fn(**arguments)``.
        schema: the OpenAI / Hermes function schema (see the module docstring).
        takes_timeout: ``fn`` has a keyword-only ``timeout_s`` the runner sets.
    """

    name: str
    fn: Callable[..., Any]
    schema: dict[str, Any]
    takes_timeout: bool = False

    @classmethod
    def from_function(
        cls, fn: Callable[..., Any], *, name: str | None = None, description: str | None = None
    ) -> Tool:
        """Derive a tool from ``fn``'s signature, annotations and Google-style docstring.

        Args:
            fn: a function (or a ``functools.partial`` of one) taking JSON-typed arguments.
            name: the tool's name; default ``fn.__name__``.
            description: replaces the docstring's description.

        Raises:
            ToolSchemaError: ``fn`` has no docstring, a parameter without an annotation
                or an ``Args:`` entry, ``*args`` / ``**kwargs`` or a positional-only
                parameter, an unsupported annotation, or the name is not
                ``[A-Za-z0-9_-]{1,64}``.
        """
        target = _target(fn)
        name = name or getattr(target, "__name__", "")
        if not _NAME_RE.match(name):
            raise ToolSchemaError(f"tool name {name!r} must match [A-Za-z0-9_-]{{1,64}}")
        doc = inspect.getdoc(target)
        if not doc:
            raise ToolSchemaError(f"tool {name!r} needs a docstring: it is the model's description")
        main_doc, arg_docs = parse_docstring(doc)
        try:
            hints = get_type_hints(target)
        except Exception as exc:  # a forward reference that does not resolve
            raise ToolSchemaError(f"cannot read the annotations of tool {name!r}: {exc}") from exc
        properties: dict[str, Any] = {}
        required: list[str] = []
        takes_timeout = False
        for param in inspect.signature(fn).parameters.values():
            if param.name == TIMEOUT_PARAMETER and param.kind is param.KEYWORD_ONLY:
                takes_timeout = True
                continue
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
                raise ToolSchemaError(
                    f"tool {name!r}: parameter {param.name!r} must be passable by keyword "
                    f"(no *args, **kwargs or positional-only parameters)"
                )
            if param.name not in hints:
                raise ToolSchemaError(f"tool {name!r}: parameter {param.name!r} has no annotation")
            if param.name not in arg_docs:
                raise ToolSchemaError(
                    f"tool {name!r}: parameter {param.name!r} is not described in the "
                    f"docstring's Args: section"
                )
            prop = json_type(hints[param.name])
            text = arg_docs[param.name]
            choices = _CHOICES_RE.search(text)
            if choices:
                try:
                    prop["enum"] = json.loads(choices.group(1))
                    text = text[: choices.start()].strip()
                except json.JSONDecodeError:
                    pass
            prop["description"] = text
            properties[param.name] = prop
            if param.default is param.empty:
                required.append(param.name)
        parameters: dict[str, Any] = {"type": "object", "properties": properties}
        if required:
            parameters["required"] = required
        function = {
            "name": name,
            "description": main_doc if description is None else description,
            "parameters": parameters,
        }
        return cls(name, fn, {"type": "function", "function": function}, takes_timeout)

    @property
    def description(self) -> str:
        return self.schema["function"]["description"]

    @property
    def parameters(self) -> dict[str, Any]:
        return self.schema["function"]["parameters"]

    def renamed(self, name: str) -> Tool:
        """The same tool under another name."""
        if not _NAME_RE.match(name):
            raise ToolSchemaError(f"tool name {name!r} must match [A-Za-z0-9_-]{{1,64}}")
        schema = copy.deepcopy(self.schema)
        schema["function"]["name"] = name
        return Tool(name, self.fn, schema, self.takes_timeout)

    def validate(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """Check ``arguments`` against the schema; return them (integral floats made ints).

        Raises:
            ToolArgumentError: not an object, a missing required or unknown argument,
                or a value of the wrong type or outside its enum.
        """
        return validate_arguments(self.parameters, arguments)

    def __call__(self, **arguments: Any) -> Any:
        return self.fn(**arguments)

    def __repr__(self) -> str:
        return f"Tool({self.name!r})"


# -- validation ---------------------------------------------------------------
def _json_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "array"
    if isinstance(value, Mapping):
        return "object"
    return type(value).__name__


def _as_kind(value: Any, kind: str, schema: Mapping[str, Any], where: str) -> tuple[bool, Any]:
    """(matches, coerced value) of ``value`` as JSON type ``kind``."""
    if kind == "string":
        return isinstance(value, str), value
    if kind == "boolean":
        return isinstance(value, bool), value
    if kind == "null":
        return value is None, value
    if kind == "integer":
        if isinstance(value, int) and not isinstance(value, bool):
            return True, value
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            return True, int(value)
        return False, value
    if kind == "number":
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        return ok and math.isfinite(value), value
    if kind == "array":
        if not isinstance(value, list | tuple):
            return False, value
        if "prefixItems" in schema:
            items = schema["prefixItems"]
            if len(value) != len(items):
                raise ToolArgumentError(f"{where} must have {len(items)} items, got {len(value)}")
            return True, [
                _check(v, s, f"{where}[{i}]") for i, (v, s) in enumerate(zip(value, items))
            ]
        item = schema.get("items", {})
        return True, [_check(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if kind == "object":
        if not isinstance(value, Mapping):
            return False, value
        extra = schema.get("additionalProperties")
        if isinstance(extra, Mapping):
            return True, {k: _check(v, extra, f"{where}[{k!r}]") for k, v in value.items()}
        return True, dict(value)
    return True, value  # a type this validator does not know: accept


def _check(value: Any, schema: Mapping[str, Any], where: str) -> Any:
    if value is None and schema.get("nullable"):
        return None
    if "anyOf" in schema:
        for option in schema["anyOf"]:
            try:
                return _check(value, option, where)
            except ToolArgumentError:
                continue
        raise ToolArgumentError(
            f"{where} does not match any allowed type (got {_json_name(value)})"
        )
    kinds = schema.get("type")
    if kinds is not None:
        kinds = [kinds] if isinstance(kinds, str) else list(kinds)
        for kind in kinds:
            ok, coerced = _as_kind(value, kind, schema, where)
            if ok:
                value = coerced
                break
        else:
            raise ToolArgumentError(
                f"{where} must be {' or '.join(kinds)}, got {_json_name(value)}"
            )
    if "enum" in schema:
        allowed = schema["enum"]
        # 1 == True in Python; in JSON a boolean is not a number.
        if not any(a == value and isinstance(a, bool) == isinstance(value, bool) for a in allowed):
            raise ToolArgumentError(f"{where} must be one of {json.dumps(allowed)}, got {value!r}")
    return value


def validate_arguments(parameters: Mapping[str, Any], arguments: Any) -> dict[str, Any]:
    """Check a call's ``arguments`` against a ``parameters`` object schema.

    Returns:
        The arguments, with integral floats (``3.0``) turned into ints where the
        schema asks for an integer.

    Raises:
        ToolArgumentError: with a message short enough to show the model.
    """
    if not isinstance(arguments, Mapping):
        raise ToolArgumentError(f"arguments must be an object, got {_json_name(arguments)}")
    properties: Mapping[str, Any] = parameters.get("properties", {})
    unknown = [k for k in arguments if k not in properties]
    if unknown:
        expected = ", ".join(properties) or "none"
        raise ToolArgumentError(
            f"unexpected argument {unknown[0]!r} (expected: {expected})"
            if len(unknown) == 1
            else f"unexpected arguments {', '.join(map(repr, unknown))} (expected: {expected})"
        )
    missing = [k for k in parameters.get("required", []) if k not in arguments]
    if missing:
        raise ToolArgumentError(
            f"missing required argument{'s' if len(missing) > 1 else ''} "
            f"{', '.join(map(repr, missing))}"
        )
    return {k: _check(v, properties[k], f"argument {k!r}") for k, v in arguments.items()}


# -- resolving names ------------------------------------------------------------
@functools.lru_cache(maxsize=512)
def _derived(fn: Callable[..., Any], name: str) -> Tool:
    return Tool.from_function(fn, name=name)


def _from_callable(fn: Callable[..., Any], name: str) -> Tool:
    if isinstance(fn, Tool):
        return fn if fn.name == name else fn.renamed(name)
    try:
        return _derived(fn, name)
    except TypeError as exc:  # unhashable callable: derive without the cache
        if isinstance(exc, ToolSchemaError):
            raise
        return Tool.from_function(fn, name=name)


def as_tool(spec: ToolSpec) -> Tool:
    """A :class:`Tool` from a registered name, a ``"pkg.module:fn"`` path, a function or a Tool.

    A registered tool is named by its registry name; a dotted path or a bare function
    by the function's ``__name__`` (a :class:`Tool` keeps its own name).

    Raises:
        UnknownNameError: no tool is registered under the name (the message lists them).
        ToolSchemaError: the function cannot be described (see :meth:`Tool.from_function`).
    """
    if isinstance(spec, Tool):
        return spec
    if isinstance(spec, str):
        entry = TOOLS.entry(spec)
        if ":" in spec:
            name = entry.fn.name if isinstance(entry.fn, Tool) else _target(entry.fn).__name__
        else:
            name = entry.name
        return _from_callable(entry.fn, name)
    if callable(spec):
        return _from_callable(spec, spec.name if isinstance(spec, Tool) else _target(spec).__name__)
    raise TypeError(f"a tool is a registered name, a 'pkg.module:fn' path or a function: {spec!r}")


def tool_schema(fn_or_name: ToolSpec) -> dict[str, Any]:
    """The function-calling schema of one tool (a fresh copy, safe to modify)."""
    return copy.deepcopy(as_tool(fn_or_name).schema)


def schemas(names: Iterable[ToolSpec] | ToolSpec) -> list[dict[str, Any]]:
    """The schemas of several tools, ready for ``tokenizer.apply_chat_template(..., tools=...)``."""
    if isinstance(names, str) or callable(names):
        names = [names]
    return [tool_schema(n) for n in names]
