"""rlkit.tools: schemas, parsing, execution, the calculator and BM25 search (docs/tools.md).

The python sandbox has its own file, tests/test_tools_sandbox.py.
"""

from __future__ import annotations

import json
import re
import threading
import time
from typing import Literal

import pytest

from rlkit.registry import LISTED, TOOLS
from rlkit.tools import (
    Passage,
    SearchIndex,
    Tool,
    Toolbox,
    ToolCall,
    ToolError,
    ToolSchemaError,
    ToolTimeout,
    calculator,
    make_search_tool,
    parse_tool_calls,
    run_tool_calls,
    schemas,
    tool_metrics,
    tool_schema,
)
from rlkit.tools.arithmetic import evaluate


# -- functions to describe -----------------------------------------------------------
def get_weather(city: str, unit: Literal["celsius", "fahrenheit"] = "celsius") -> str:
    """Get the current weather in a city.

    Args:
        city: The city's name, e.g. "Paris".
        unit: The temperature unit.

    Returns:
        A sentence about the weather.
    """
    return f"sunny in {city}, 21 degrees {unit}"


def add(a: int, b: float) -> float:
    """Add two numbers.

    Args:
        a: The first number.
        b: The second number, which may have a fractional part and whose
            description runs on over two lines.
    """
    return a + b


def many_types(
    names: list[str],
    flag: bool,
    limit: int | None = None,
    weights: list[float] | None = None,
    mode: str = "fast",
) -> str:
    """Exercise every supported annotation.

    Args:
        names: Names to look at.
        flag: A switch.
        limit: At most this many, or null for no limit.
        weights: One weight per name.
        mode: How to run (choices: ["fast", "slow"])
    """
    return ""


def test_schema_of_a_small_function_is_the_hand_written_one():
    assert tool_schema(get_weather) == {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": 'The city\'s name, e.g. "Paris".'},
                    "unit": {
                        "type": "string",
                        "enum": ["celsius", "fahrenheit"],
                        "description": "The temperature unit.",
                    },
                },
                "required": ["city"],
            },
        },
    }


def test_schema_types_optional_lists_and_choices():
    props = tool_schema(many_types)["function"]["parameters"]["properties"]
    assert props["names"] == {
        "type": "array",
        "items": {"type": "string"},
        "description": "Names to look at.",
    }
    assert props["flag"]["type"] == "boolean"
    assert props["limit"] == {
        "type": "integer",
        "nullable": True,
        "description": "At most this many, or null for no limit.",
    }
    assert props["weights"]["items"] == {"type": "number"}
    assert props["mode"] == {
        "type": "string",
        "enum": ["fast", "slow"],
        "description": "How to run",
    }
    assert tool_schema(many_types)["function"]["parameters"]["required"] == ["names", "flag"]


@pytest.mark.parametrize("fn", [get_weather, add, many_types, calculator])
def test_schema_matches_transformers_get_json_schema(fn):
    chat_template_utils = pytest.importorskip("transformers.utils.chat_template_utils")
    expected = chat_template_utils.get_json_schema(fn)
    expected["function"].pop("return", None)  # chat templates ignore it; rlkit leaves it out
    assert tool_schema(fn) == expected


def test_schemas_render_in_a_chat_template():
    from transformers.utils.chat_template_utils import render_jinja_template

    template = "{% for t in tools %}{{ t.function.name }}:{{ t | tojson }}\n{% endfor %}"
    rendered, _ = render_jinja_template(
        conversations=[[{"role": "user", "content": "hi"}]],
        tools=schemas(["calculator", "search"]),
        chat_template=template,
    )
    assert rendered[0].startswith("calculator:")
    assert '"name": "search"' in rendered[0]


def test_hidden_timeout_parameter_and_bad_functions():
    def sleeper(seconds: float, *, timeout_s: float | None = None) -> str:
        """Sleep.

        Args:
            seconds: How long.
        """
        return ""

    tool = Tool.from_function(sleeper)
    assert tool.takes_timeout
    assert list(tool.parameters["properties"]) == ["seconds"]

    def undocumented(x: int) -> str:
        """No Args section."""

    def unannotated(x) -> str:
        """Doc.

        Args:
            x: A thing.
        """

    def varargs(*xs: int) -> str:
        """Doc.

        Args:
            xs: Things.
        """

    for bad in (undocumented, unannotated, varargs, lambda x: x):
        with pytest.raises(ToolSchemaError):
            Tool.from_function(bad)


def test_registry_and_dotted_path():
    assert {"calculator", "python", "search"} <= set(TOOLS.names())
    assert LISTED["tools"] is TOOLS
    by_path = tool_schema("tests.test_tools:get_weather")
    assert by_path["function"]["name"] == "get_weather"

    @TOOLS.register("weather_for_test")
    def weather(city: str) -> str:
        """Weather.

        Args:
            city: Where.
        """
        return f"rain in {city}"

    try:
        assert tool_schema("weather_for_test")["function"]["name"] == "weather_for_test"
        (result,) = run_tool_calls([ToolCall("weather_for_test", {"city": "Oslo"})])
        assert (result.status, result.text) == ("ok", "rain in Oslo")
    finally:
        TOOLS.unregister("weather_for_test")


def test_a_broken_registered_tool_is_an_error_not_an_exception():
    def broken(x):  # no docstring, no annotation: no schema
        return x

    TOOLS.add("broken_for_test", broken)
    try:
        (result,) = run_tool_calls([ToolCall("broken_for_test", {"x": 1})])
        assert result.status == "error" and "cannot be used" in result.text
    finally:
        TOOLS.unregister("broken_for_test")


# -- parsing ---------------------------------------------------------------------
def test_parse_one_call():
    text = (
        "I will compute it.\n<tool_call>\n"
        '{"name": "calculator", "arguments": {"expression": "2 + 2"}}\n</tool_call>'
    )
    calls, errors = parse_tool_calls(text)
    assert calls == [ToolCall("calculator", {"expression": "2 + 2"})]
    assert errors == []


def test_parse_several_calls_and_round_trip():
    first = ToolCall("search", {"query": "capital of France", "top_k": 2})
    second = ToolCall("python", {"code": "print('a')\nprint('b')"})
    text = f"{first.to_text()}\nand\n{second.to_text()}"
    assert parse_tool_calls(text) == ([first, second], [])
    assert first.to_message_entry() == {
        "type": "function",
        "function": {"name": "search", "arguments": {"query": "capital of France", "top_k": 2}},
    }


def test_parse_accepts_raw_newlines_in_strings_and_missing_arguments():
    text = '<tool_call>{"name": "python", "arguments": {"code": "x = 1\nprint(x)"}}</tool_call>'
    calls, errors = parse_tool_calls(text)
    assert calls[0].arguments["code"] == "x = 1\nprint(x)" and not errors
    assert parse_tool_calls('<tool_call>{"name": "now"}</tool_call>') == ([ToolCall("now")], [])


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ('{"name": "calculator", "arguments": {"expression": "1"}', "malformed JSON"),
        ("not json at all", "malformed JSON"),
        ('{"arguments": {"expression": "1"}}', 'missing "name"'),
        ('{"name": 3, "arguments": {}}', '"name" must be a non-empty string'),
        (
            '{"name": "calculator", "arguments": "{\\"expression\\": \\"1\\"}"}',
            '"arguments" must be a JSON object',
        ),
        ('{"name": "calculator", "arguments": [1, 2]}', '"arguments" must be a JSON object'),
        ('["calculator"]', "expected a JSON object"),
        ('{"name": "calculator", "arguments": {"n": ' + "9" * 5000 + "}}", "unreadable JSON"),
    ],
)
def test_parse_errors_never_raise(body, fragment):
    good = '<tool_call>{"name": "calculator", "arguments": {"expression": "3"}}</tool_call>'
    calls, errors = parse_tool_calls(f"<tool_call>\n{body}\n</tool_call> then {good}")
    assert calls == [ToolCall("calculator", {"expression": "3"})]
    assert len(errors) == 1 and errors[0].startswith("tool call 1: ") and fragment in errors[0]


def test_parse_unclosed_blocks():
    body = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "3"}}\n'
    calls, errors = parse_tool_calls(body)
    assert calls == [] and "without </tool_call>" in errors[0]
    calls, errors = parse_tool_calls(body, allow_unclosed=True)
    assert calls == [ToolCall("calculator", {"expression": "3"})] and errors == []
    # An unclosed block followed by a good one: the good one still counts.
    calls, errors = parse_tool_calls("<tool_call>{oops " + body + "</tool_call>")
    assert len(calls) == 1 and len(errors) == 1
    assert parse_tool_calls("no calls here") == ([], [])
    assert parse_tool_calls(None)[1]  # not even a string: an error, not an exception


# -- execution ---------------------------------------------------------------------
def echo(text: str, times: int = 1) -> str:
    """Repeat a text.

    Args:
        text: What to repeat.
        times: How often.
    """
    return text * times


def explode(reason: str) -> str:
    """Always fails.

    Args:
        reason: Why.
    """
    raise RuntimeError(reason)


def refuse(reason: str) -> str:
    """Fails with a message for the model.

    Args:
        reason: Why.
    """
    raise ToolError(f"Error: refused because {reason}")


def test_execution_statuses_and_counting():
    box = Toolbox([echo, explode, refuse, "calculator"])
    calls = [
        ToolCall("echo", {"text": "ab", "times": 3}),
        ToolCall("echo", {"text": "ab", "times": 2.0}),  # an integral float is an integer
        ToolCall("nope", {}),
        ToolCall("echo", {}),
        ToolCall("echo", {"text": "a", "extra": 1}),
        ToolCall("echo", {"text": 5}),
        ToolCall("echo", {"text": "a", "times": True}),
        ToolCall("explode", {"reason": "boom"}),
        ToolCall("refuse", {"reason": "no"}),
        {"name": "calculator", "arguments": {"expression": "1/0"}},
    ]
    results = box.run(calls, timeout_s=5)
    assert [r.status for r in results] == ["ok", "ok"] + ["error"] * 8
    assert results[0].text == "ababab" and results[1].text == "abab"
    assert "unknown tool 'nope'" in results[2].text and "echo" in results[2].text
    assert "missing required argument 'text'" in results[3].text
    assert "unexpected argument 'extra'" in results[4].text
    assert "'text' must be string, got integer" in results[5].text
    assert "'times' must be integer, got boolean" in results[6].text
    assert "RuntimeError: boom" in results[7].text
    assert results[8].text == "Error: refused because no"
    assert results[9].text == "Error: division by zero"
    assert all(r.text.startswith("Error") for r in results[2:])
    metrics = tool_metrics(results, num_parse_errors=2)
    assert metrics["tool/num_calls"] == 10
    assert metrics["tool/num_ok"] == 2 and metrics["tool/num_errors"] == 8
    assert metrics["tool/num_timeouts"] == 0 and metrics["tool/num_parse_errors"] == 2
    assert results[0].to_message() == {"role": "tool", "name": "echo", "content": "ababab"}


def test_model_cannot_call_dotted_paths_or_unoffered_tools():
    results = run_tool_calls(
        [ToolCall("os:system", {"command": "true"}), ToolCall("python", {"code": "1"})],
        tools=["calculator"],
    )
    assert [r.status for r in results] == ["error", "error"]
    (result,) = run_tool_calls([ToolCall("os:getcwd", {})])  # tools=None: registered names only
    assert result.status == "error" and "unknown tool" in result.text


def test_output_is_truncated_with_a_marker():
    (result,) = run_tool_calls(
        [ToolCall("echo", {"text": "x", "times": 50})], tools=[echo], max_output_chars=10
    )
    assert result.truncated
    assert result.text == "x" * 10 + "\n...[truncated 40 characters]"
    assert tool_metrics([result])["tool/num_truncated"] == 1


def test_calls_run_concurrently_up_to_max_concurrency():
    barrier = threading.Barrier(4, timeout=10)
    lock = threading.Lock()
    state = {"now": 0, "peak": 0}

    def meet(label: str) -> str:
        """Wait for the others.

        Args:
            label: A label.
        """
        with lock:
            state["now"] += 1
            state["peak"] = max(state["peak"], state["now"])
        try:
            barrier.wait()  # passes only if 4 calls run at the same time
        finally:
            with lock:
                state["now"] -= 1
        return label

    calls = [ToolCall("meet", {"label": str(i)}) for i in range(4)]
    results = run_tool_calls(calls, tools=[meet], max_concurrency=4, timeout_s=20)
    assert [r.text for r in results] == ["0", "1", "2", "3"]
    assert all(r.status == "ok" for r in results) and state["peak"] == 4

    state["peak"] = 0

    def count(label: str) -> str:
        """Count simultaneous calls.

        Args:
            label: A label.
        """
        with lock:
            state["now"] += 1
            state["peak"] = max(state["peak"], state["now"])
        time.sleep(0.05)
        with lock:
            state["now"] -= 1
        return label

    calls = [ToolCall("count", {"label": str(i)}) for i in range(6)]
    results = run_tool_calls(calls, tools=[count], max_concurrency=2)
    assert [r.text for r in results] == [str(i) for i in range(6)]
    assert state["peak"] <= 2


def test_a_hanging_in_process_tool_times_out_and_the_others_finish():
    release = threading.Event()

    def hang(label: str) -> str:
        """Hang until released.

        Args:
            label: A label.
        """
        release.wait(30)
        return label

    def stop_myself(label: str, *, timeout_s: float | None = None) -> str:
        """Reports its own timeout.

        Args:
            label: A label.
        """
        raise ToolTimeout(f"stopped after {timeout_s} s")

    try:
        results = run_tool_calls(
            [
                ToolCall("hang", {"label": "a"}),
                ToolCall("echo", {"text": "b"}),
                ToolCall("stop_myself", {"label": "c"}),
            ],
            tools=[hang, echo, stop_myself],
            timeout_s=0.3,
        )
    finally:
        release.set()
    assert [r.status for r in results] == ["timeout", "ok", "timeout"]
    assert "timed out after 0.3 s" in results[0].text
    assert results[2].text == "stopped after 0.3 s"
    assert tool_metrics(results)["tool/num_timeouts"] == 2


def test_invalid_runner_options_raise():
    for options in ({"timeout_s": 0}, {"max_concurrency": 0}, {"max_output_chars": 0}):
        with pytest.raises(ValueError):
            run_tool_calls([], **options)
    with pytest.raises(ValueError, match="two tools"):
        Toolbox([echo, echo])


# -- calculator --------------------------------------------------------------------
@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("123456789*987654321", "121932631112635269"),
        ("2**100", str(2**100)),
        ("(3 + 4) * 2 ** 10", "7168"),
        ("-7 // 2", "-4"),
        ("-7 % 3", "2"),
        ("10 / 4", "2.5"),
        ("6 / 3", "2"),
        ("1/3 + 1/6", "0.5"),
        ("(10**30 + 1) - 10**30", "1"),
        ("0.1 + 0.2", "0.30000000000000004"),
        ("sqrt(144)", "12"),
        ("sqrt(2)", "1.4142135623730951"),
        ("2 ** -2", "0.25"),
        ("4 ** 0.5", "2.0"),
        ("abs(-5) + round(2.6) + min(3, 1, 2) + max(1, 9)", "18"),
        ("round(3.14159, 2)", "3.14"),
        ("factorial(20)", "2432902008176640000"),
        ("floor(-2.5) + ceil(2.1)", "0"),
        ("gcd(12, 18)", "6"),
        ("+-+3", "-3"),
        ("2 * pi", repr(2 * 3.141592653589793)),
        ("(1/3) ** 1000", "0.0"),  # too many exact digits: a float, which underflows
    ],
)
def test_calculator_values(expression, expected):
    assert calculator(expression) == expected


@pytest.mark.parametrize(
    ("expression", "fragment"),
    [
        ("1/0", "division by zero"),
        ("5 // 0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("0 ** -1", "division by zero"),
        ("9 ** 9 ** 9", "too large"),
        ("10 ** 101", "too large"),
        ("2 ** 10 ** 18", "too large"),
        ("10**60 * 10**60", "too large"),
        ("1e300 * 10", "too large"),
        ("factorial(1000)", "too large"),
        ("exp(1000)", "too large"),
        ("(-8) ** (1/3)", "not a real number"),
        ("sqrt(-1)", "domain"),
        ("__import__('os')", "cannot call '__import__'"),
        ("__import__('os').system('true')", "attribute access"),
        ("(1).__class__", "attribute access"),
        ("math.sqrt(4)", "attribute access"),
        ("x + 1", "unknown name 'x'"),
        ("open", "unknown name 'open'"),
        ("[1, 2][0]", "subscripts"),
        ("'a' * 3", "only numbers"),
        ("True + 1", "only numbers"),
        ("1 < 2", "comparisons"),
        ("lambda: 1", "unsupported syntax: Lambda"),
        ("2 ^ 3", "use '**'"),
        ("1 +", "invalid expression"),
        ("", "empty expression"),
        ("1 + " * 400 + "1", "longer than"),
        ("round(2.5, ndigits=1)", "positional"),
        ("sqrt(1, 2)", "takes 1 argument"),
        ("sqrt", "is a function"),
    ],
)
def test_calculator_refusals(expression, fragment):
    with pytest.raises(ToolError) as info:
        calculator(expression)
    assert str(info.value).startswith("Error: ") and fragment in str(info.value)


def test_calculator_never_evaluates_python(monkeypatch):
    import builtins

    def forbidden(*args, **kwargs):
        raise AssertionError("eval/exec must not be used")

    monkeypatch.setattr(builtins, "eval", forbidden)
    monkeypatch.setattr(builtins, "exec", forbidden)
    assert evaluate("2 ** 64 - 1") == 2**64 - 1
    (result,) = run_tool_calls([ToolCall("calculator", {"expression": "6 * 7"})])
    assert (result.status, result.text) == ("ok", "42")


# -- search ----------------------------------------------------------------------
CORPUS = [
    {"id": "d1", "title": "Paris", "text": "Paris is the capital and largest city of France."},
    {"id": "d2", "title": "Berlin", "text": "Berlin is the capital of Germany."},
    {"id": "d3", "title": "Bananas", "text": "A banana is an elongated, edible fruit."},
    {"id": "d4", "contents": "Mount Everest is Earth's highest mountain above sea level."},
    {"id": "d5", "title": "Rome", "text": "Rome is the capital city of Italy."},
]


@pytest.fixture
def corpus_path(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text("\n".join(json.dumps(row) for row in CORPUS) + "\n\n", encoding="utf-8")
    return path


def test_bm25_ranks_the_document_with_the_query_terms_first(corpus_path):
    index = SearchIndex.from_jsonl(corpus_path)
    assert len(index) == 5
    hits = index.search("largest city in France", top_k=3)
    assert hits[0][0].id == "d1"
    assert [s for _, s in hits] == sorted((s for _, s in hits), reverse=True)
    assert index.search("highest mountain")[0][0] == Passage(
        "d4", "", "Mount Everest is Earth's highest mountain above sea level."
    )
    assert index.search("zebra quantum") == []


def test_search_tool_formats_numbered_passages(corpus_path):
    tool = make_search_tool(corpus_path)
    assert tool.name == "search"
    text = tool(query="capital of Germany", top_k=2)
    assert text.startswith("[1] Berlin\nBerlin is the capital of Germany.\n\n[2] ")
    assert text.count("\n\n") == 1
    assert tool(query="zebra") == "No results for: zebra"
    results = run_tool_calls(
        [ToolCall("search", {"query": "banana fruit"}), ToolCall("search", {"query": "?!"})],
        tools=[tool],
    )
    assert results[0].status == "ok" and results[0].text.startswith("[1] Bananas")
    assert results[1].status == "error" and "no words" in results[1].text


def test_registered_search_reads_the_corpus_from_the_environment(corpus_path, monkeypatch):
    monkeypatch.delenv("RLKIT_SEARCH_CORPUS", raising=False)
    (result,) = run_tool_calls([ToolCall("search", {"query": "Paris"})])
    assert result.status == "error" and "RLKIT_SEARCH_CORPUS" in result.text
    monkeypatch.setenv("RLKIT_SEARCH_CORPUS", str(corpus_path))
    (result,) = run_tool_calls([ToolCall("search", {"query": "Italy capital", "top_k": 1})])
    assert result.status == "ok" and result.text == "[1] Rome\nRome is the capital city of Italy."


def test_bad_corpus_lines_name_the_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": 1, "text": "ok"}\n{"id": 2}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad.jsonl:2"):
        SearchIndex.from_jsonl(path)


def test_the_python_examples_of_docs_tools_md_run():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "tools.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) == 3
    try:
        for block in blocks:
            exec(compile(block, "docs/tools.md", "exec"), {"__name__": "docs_tools_md"})
        (result,) = run_tool_calls([ToolCall("unit_convert", {"value": 2, "unit": "foot"})])
        assert (result.status, result.text) == ("ok", "0.6096 m")
    finally:
        if "unit_convert" in TOOLS:
            TOOLS.unregister("unit_convert")


def test_a_search_tool_without_a_readable_corpus_is_refused_at_configuration(
    corpus_path, monkeypatch, tmp_path
):
    from rlkit.rollout.agent_loop import agent_config

    agent = agent_config({"tools": ["search"]})
    monkeypatch.setenv("RLKIT_SEARCH_CORPUS", str(tmp_path / "nowhere.jsonl"))
    (problem,) = agent.problems()
    assert "RLKIT_SEARCH_CORPUS" in problem and "nowhere.jsonl" in problem
    monkeypatch.delenv("RLKIT_SEARCH_CORPUS")
    assert "set RLKIT_SEARCH_CORPUS" in agent.problems()[0]
    monkeypatch.setenv("RLKIT_SEARCH_CORPUS", str(corpus_path))
    assert agent.problems() == []
