"""Code rewards: a Python solution run against unit tests in a separate, limited process.

``code_unit_tests`` extracts the code from the response (the last fenced ``python``
block; else the last untagged fenced block; else, when the response has no fence at
all, the whole response) and runs it once per test case in
:class:`rlkit.tools.PythonSandbox`: a fresh interpreter with CPU-time, wall-time,
memory and process limits, no inherited environment, a throwaway working directory,
and its process group killed at the limit. Two styles of case:

* **stdin/stdout**: the case's input is the program's stdin; its stdout, normalised
  (``compare``), must equal the expected output, and it must exit with code 0.
* **assert**: the case's test code (``assert f(2) == 4``, or a whole ``def check(f):
  ...`` block and its call) runs after the solution; it passes when nothing raises.

The test cases are ``extra_info["test_cases"]`` when the row has it, else the ground
truth; either is a JSON string (or, in ``extra_info``, a dict)::

    {"inputs": ["1 2\\n", "5 7\\n"], "outputs": ["3\\n", "12\\n"]}   # verl/PRIME, APPS
    {"asserts": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"]}

Both keys may appear in one object (stdin cases run first); other keys are ignored,
except ``fn_name`` (APPS' call-based cases), which is refused rather than misread.

The result holds ``score`` (the fraction of cases passed, or 1/0 with
``all_or_nothing``), ``acc`` (1.0 when every case passed), ``tests_passed``,
``tests_total``, and for every kind of failure ``code/<kind>``: how many cases ended
that way (0 when none, so that the logged mean is over every response). The counts and
``tests_passed`` add up to ``tests_total``. ``failure`` (a string, not logged) says how
the first failing case failed.

What contains the code depends on the sandbox's isolation mode (see
:mod:`rlkit.tools.isolation` and docs/tools.md): under bubblewrap it has no network, a
read-only file system but for its scratch directory, its own PID namespace and no view
of secrets; without bubblewrap, as root it runs as ``nobody`` and Unix permissions are
the boundary, and as another user it can read and write whatever that user may and
signal the caller's processes.
"""

from __future__ import annotations

import dataclasses
import json
import numbers
import os
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from rlkit.registry import REWARDS
from rlkit.tools.python_sandbox import PythonSandbox, SandboxResult

PREFIX = "code"
"""Failure counts are reported as ``"code/<kind>"``."""

KINDS = (
    "no_code",
    "syntax_error",
    "runtime_error",
    "wrong_answer",
    "timeout",
    "memory",
    "processes",
    "not_run",
)
"""How a case can fail: no code in the response, the code does not parse, an uncaught
exception or non-zero exit (or a kill by a signal), a wrong output or failed assert, the
wall-clock or CPU limit, the memory limit, the process limit, or not run at all (the
``total_timeout_s`` budget ran out, or ``all_or_nothing`` stopped at a failure)."""

COMPARE_MODES = ("lines", "tokens", "exact")
PYTHON_FENCES = ("python", "py", "python3", "py3")
# A case is not started with less time than this left of the budget.
_MIN_CASE_S = 0.05
_DETAIL_CHARS = 160


@dataclass(frozen=True)
class CodeTestOptions:
    """Options of ``code_unit_tests`` (``DataConfig.reward_options``).

    Attributes:
        case_timeout_s: wall-clock limit of one case in seconds (its CPU limit is the
            ceiling). Not ``timeout_s``: ``score_batch`` passes options next to its own
            ``timeout_s`` argument.
        total_timeout_s: budget for all the cases of one response; cases that would
            start after it are not run (``code/not_run``) and a running one is cut to
            what is left. Keep it below ``DataConfig.reward_timeout_s``, the limit the
            trainer puts on the whole reward call. ``None``: no budget.
        memory_mb: address-space limit of the process (``RLIMIT_AS``); ``None``: none.
        max_processes: processes and threads the code may start; ``None``: no limit.
        all_or_nothing: score 1 only when every case passes, else 0; cases after the
            first failure are not run.
        compare: stdout vs expected output: ``"lines"`` (both stripped, trailing
            spaces of each line dropped), ``"tokens"`` (whitespace-separated tokens
            equal) or ``"exact"``.
        max_cases: run only the first ``max_cases`` cases; ``None``: all.
        parallel_cases: cases of one response run at the same time (threads, one
            process each). Keep 1 when ``DataConfig.reward_workers`` already uses the
            cores: responses are then scored in parallel instead.
        python: the interpreter that runs the code; ``None``: this process's. As root
            without bubblewrap, one that other users can run (``/usr/bin/python3``) lets
            the code run as ``nobody``.
        site_packages: let the code import this interpreter's installed packages
            (numpy, ...); by default only the standard library imports.
    """

    case_timeout_s: float = 3.0
    total_timeout_s: float | None = 8.0
    memory_mb: float | None = 1024
    max_processes: int | None = 8
    all_or_nothing: bool = False
    compare: str = "lines"
    max_cases: int | None = None
    parallel_cases: int = 1
    python: str | None = None
    site_packages: bool = False

    def __post_init__(self) -> None:
        _check_number("case_timeout_s", self.case_timeout_s, minimum=0.0)
        _check_number("total_timeout_s", self.total_timeout_s, minimum=0.0, optional=True)
        _check_number("memory_mb", self.memory_mb, minimum=64.0, optional=True, strict=False)
        _check_int("max_processes", self.max_processes, minimum=0, optional=True)
        _check_int("max_cases", self.max_cases, minimum=1, optional=True)
        _check_int("parallel_cases", self.parallel_cases, minimum=1)
        for name in ("all_or_nothing", "site_packages"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(
                    f"code_unit_tests: {name} must be true or false, got {getattr(self, name)!r}"
                )
        if self.compare not in COMPARE_MODES:
            raise ValueError(
                f"code_unit_tests: compare must be one of {COMPARE_MODES}, got {self.compare!r}"
            )
        if self.python is not None and not _is_executable(self.python):
            raise ValueError(f"code_unit_tests: python={self.python!r} is not an executable file")

    def sandbox(self) -> PythonSandbox:
        """The sandbox the cases run in (stderr apart, run as a script)."""
        memory = None if self.memory_mb is None else int(self.memory_mb * (1 << 20))
        return PythonSandbox(
            timeout_s=self.case_timeout_s,
            memory_bytes=memory,
            max_processes=self.max_processes,
            executable=self.python,
            site_packages=self.site_packages,
            separate_stderr=True,
            echo_last_expression=False,
        )


OPTION_NAMES = tuple(f.name for f in dataclasses.fields(CodeTestOptions))


def _check_number(
    name: str,
    value: Any,
    *,
    minimum: float,
    optional: bool = False,
    strict: bool = True,
) -> None:
    if value is None and optional:
        return
    bad_type = isinstance(value, bool) or not isinstance(value, numbers.Real)
    too_small = not bad_type and (value <= minimum if strict else value < minimum)
    if bad_type or too_small or value != value or value == float("inf"):
        bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
        none = " or None" if optional else ""
        raise ValueError(
            f"code_unit_tests: {name} must be a finite number {bound}{none}, got {value!r}"
        )


def _check_int(name: str, value: Any, *, minimum: int, optional: bool = False) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        none = " or None" if optional else ""
        raise ValueError(
            f"code_unit_tests: {name} must be an int >= {minimum}{none}, got {value!r}"
        )


def _is_executable(path: Any) -> bool:
    return isinstance(path, str) and os.path.isfile(path) and os.access(path, os.X_OK)


def check_options(options: Mapping[str, Any]) -> None:
    """Check ``DataConfig.reward_options`` of ``code_unit_tests`` before any work.

    Raises:
        ValueError: an unknown option (a typo would otherwise be ignored), or a bad value.
    """
    unknown = sorted(set(options) - set(OPTION_NAMES))
    if unknown:
        raise ValueError(
            f"code_unit_tests: unknown options {unknown}; it takes {', '.join(OPTION_NAMES)}"
        )
    CodeTestOptions(**options)


# -- test cases ---------------------------------------------------------------------
@dataclass(frozen=True)
class TestCase:
    """One case: ``stdin`` and ``expected`` stdout, or ``test`` code run after the solution."""

    stdin: str = ""
    expected: str = ""
    test: str | None = None

    __test__ = False  # not a pytest class, whatever imports it


def load_test_cases(
    ground_truth: Any, extra_info: Mapping[str, Any] | None = None
) -> list[TestCase]:
    """The cases of a row: ``extra_info["test_cases"]`` if present, else the ground truth.

    Raises:
        ValueError: the cases are not in the documented format (a data bug, not the
            model's: ``score_batch`` counts it as an error).
    """
    spec, source = ground_truth, "the ground truth"
    if extra_info and extra_info.get("test_cases") is not None:
        spec, source = extra_info["test_cases"], "extra_info['test_cases']"
    if isinstance(spec, str | bytes):
        try:
            spec = json.loads(spec)
        except ValueError as exc:
            raise ValueError(f"code_unit_tests: {source} is not JSON ({exc})") from exc
    if not isinstance(spec, Mapping):
        raise ValueError(
            f"code_unit_tests: {source} must be an object like "
            f'{{"inputs": [...], "outputs": [...]}} or {{"asserts": [...]}}, got {spec!r:.80}'
        )
    if spec.get("fn_name"):
        raise ValueError(
            f"code_unit_tests: {source} has call-based cases (fn_name); convert them to "
            f"asserts, e.g. 'assert {spec['fn_name']}(1, 2) == 3'"
        )
    cases = _stdio_cases(spec, source) + _assert_cases(spec, source)
    if not cases:
        raise ValueError(f"code_unit_tests: {source} holds no test cases")
    return cases


def _text(value: Any, what: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "\n".join(value)  # some datasets keep a case as a list of lines
    raise ValueError(f"code_unit_tests: {what} must be a string, got {value!r:.80}")


def _stdio_cases(spec: Mapping[str, Any], source: str) -> list[TestCase]:
    inputs, outputs = spec.get("inputs"), spec.get("outputs")
    if inputs is None and outputs is None:
        return []
    if not isinstance(inputs, list) or not isinstance(outputs, list):
        raise ValueError(f"code_unit_tests: {source} needs both 'inputs' and 'outputs' as lists")
    if len(inputs) != len(outputs):
        raise ValueError(
            f"code_unit_tests: {source} has {len(inputs)} inputs but {len(outputs)} outputs"
        )
    return [
        TestCase(stdin=_text(i, f"{source} inputs[{n}]"), expected=_text(o, f"outputs[{n}]"))
        for n, (i, o) in enumerate(zip(inputs, outputs))
    ]


def _assert_cases(spec: Mapping[str, Any], source: str) -> list[TestCase]:
    asserts = spec.get("asserts")
    if asserts is None:
        return []
    if isinstance(asserts, str):
        asserts = [asserts]
    if not isinstance(asserts, list):
        raise ValueError(f"code_unit_tests: {source} 'asserts' must be a list of strings")
    return [TestCase(test=_text(a, f"{source} asserts[{n}]")) for n, a in enumerate(asserts)]


# -- the code -----------------------------------------------------------------------
def _fenced_blocks(text: str) -> tuple[list[tuple[str, str]], bool]:
    """(language, body) of each fenced block, and whether the text has any fence.

    An unclosed last block (a response cut at the length limit) counts as a block.
    """
    blocks: list[tuple[str, str]] = []
    language: str | None = None
    body: list[str] = []
    seen = False
    for line in text.splitlines():
        stripped = line.strip()
        if language is None and stripped.startswith("```"):
            words = stripped[3:].split()
            language, body, seen = (words[0].lower() if words else ""), [], True
        elif language is not None and stripped.strip("`") == "" and len(stripped) >= 3:
            blocks.append((language, "\n".join(body)))
            language = None
        elif language is not None:
            body.append(line)
    if language is not None:
        blocks.append((language, "\n".join(body)))
    return blocks, seen


def extract_code(response: str) -> str:
    """The code of a response: its last ``python`` block, else its last untagged block,
    else (no fence at all) the whole response; ``""`` when it has only other languages."""
    blocks, fenced = _fenced_blocks(response)
    if not fenced:
        return response.strip()
    for wanted in (PYTHON_FENCES, ("",)):
        chosen = [body for language, body in blocks if language in wanted]
        if chosen:
            return chosen[-1].strip()
    return ""


# -- running the cases ----------------------------------------------------------------
@dataclass(frozen=True)
class CaseOutcome:
    """How one case ended: ``kind`` is ``""`` when it passed, else one of :data:`KINDS`."""

    kind: str
    detail: str = ""


def _short(text: str, limit: int = _DETAIL_CHARS) -> str:
    text = text if len(text) <= limit else text[: limit - 3] + "..."
    return repr(text)


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


_PROCESS_LIMIT_ERRORS = ("BlockingIOError: [Errno 11]", "can't start new thread")


def _error_kind(result: SandboxResult, is_assert: bool) -> str:
    """The kind of a run that did not exit cleanly: the sandbox's reason, else stderr's."""
    if result.reason in ("timeout", "cpu"):
        return "timeout"
    if result.reason in ("memory", "processes"):
        return result.reason
    last = _last_line(result.stderr)
    if last.startswith(("SyntaxError", "IndentationError", "TabError")):
        return "syntax_error"
    if last.startswith("MemoryError"):
        return "memory"
    if is_assert and last.startswith("AssertionError"):
        return "wrong_answer"
    # RLIMIT_NPROC refuses a fork with EAGAIN and a thread with "can't start new
    # thread"; forked processes interleave their tracebacks, so look at every line.
    if any(error in result.stderr for error in _PROCESS_LIMIT_ERRORS):
        return "processes"
    return "runtime_error"


def _error_detail(result: SandboxResult) -> str:
    if result.reason in ("timeout", "cpu"):
        return f"stopped after {result.duration_s:.2f} s ({result.reason})"
    if result.reason == "processes":
        return "killed: it started more processes than max_processes"
    last = _last_line(result.stderr)
    if last:
        return last[:_DETAIL_CHARS]
    return f"exit code {result.exit_code}" + (f" ({result.reason})" if result.reason else "")


def _normalised(text: str, compare: str) -> Any:
    if compare == "tokens":
        return text.split()
    if compare == "lines":
        return [line.rstrip() for line in text.strip().splitlines()]
    return text


def _run_case(
    box: PythonSandbox, code: str, case: TestCase, timeout_s: float, compare: str
) -> CaseOutcome:
    """Run one case; never raises for anything the code does."""
    if case.test is not None:
        result = box.run(f"{code}\n\n{case.test}\n", timeout_s=timeout_s)
    else:
        # Room to read back an expected output larger than the default.
        room = 2 * len(case.expected.encode("utf-8", "replace")) + 4096
        if room > box.max_output_bytes:
            file_limit = None if box.max_file_bytes is None else max(box.max_file_bytes, room)
            box = dataclasses.replace(box, max_output_bytes=room, max_file_bytes=file_limit)
        result = box.run(code, timeout_s=timeout_s, stdin=case.stdin)
    if result.status != "ok":
        return CaseOutcome(_error_kind(result, case.test is not None), _error_detail(result))
    if case.test is not None:
        return CaseOutcome("")
    if _normalised(result.output, compare) == _normalised(case.expected, compare):
        return CaseOutcome("")
    detail = f"expected {_short(case.expected)}, got {_short(result.output)}"
    return CaseOutcome("wrong_answer", detail)


def run_cases(code: str, cases: Sequence[TestCase], options: CodeTestOptions) -> list[CaseOutcome]:
    """Run every case (``parallel_cases`` at a time) within the ``total_timeout_s`` budget."""
    box = options.sandbox()
    budget = options.total_timeout_s
    deadline = time.monotonic() + (float("inf") if budget is None else budget)
    stop = threading.Event()
    unparsable: list[CaseOutcome] = []  # the code alone does not parse: no stdin case can run

    def one(case: TestCase) -> CaseOutcome:
        if stop.is_set():
            return CaseOutcome("not_run", "all_or_nothing: an earlier case failed")
        if unparsable and case.test is None:
            return unparsable[0]
        left = deadline - time.monotonic()
        if left < _MIN_CASE_S:
            return CaseOutcome("not_run", "total_timeout_s ran out")
        outcome = _run_case(box, code, case, min(options.case_timeout_s, left), options.compare)
        if outcome.kind == "syntax_error" and case.test is None:
            unparsable.append(outcome)
        if outcome.kind and options.all_or_nothing:
            stop.set()
        return outcome

    if options.parallel_cases == 1:
        # In this thread: a time limit that interrupts the reward (SIGALRM) interrupts
        # the case, whose sandbox still cleans up.
        return [one(case) for case in cases]
    with ThreadPoolExecutor(options.parallel_cases, thread_name_prefix="code-case") as pool:
        try:
            return list(pool.map(one, cases))
        except BaseException:
            stop.set()  # the queued cases return at once; the running ones end at their limit
            raise


def _result(outcomes: Sequence[CaseOutcome], all_or_nothing: bool) -> dict[str, Any]:
    total = len(outcomes)
    passed = sum(1 for o in outcomes if not o.kind)
    counts = {f"{PREFIX}/{kind}": 0.0 for kind in KINDS}
    for outcome in outcomes:
        if outcome.kind:
            counts[f"{PREFIX}/{outcome.kind}"] += 1.0
    acc = 1.0 if passed == total else 0.0
    first = next(((i, o) for i, o in enumerate(outcomes) if o.kind), None)
    failure = "" if first is None else f"case {first[0] + 1}: {first[1].kind}: {first[1].detail}"
    return {
        "score": acc if all_or_nothing else passed / total,
        "acc": acc,
        "tests_passed": passed,
        "tests_total": total,
        **counts,
        "failure": failure,
    }


@REWARDS.register(
    "code_unit_tests",
    summary="Python solution vs stdin/stdout or assert tests, sandboxed",
    check_options=check_options,
)
def code_unit_tests(
    response: str,
    ground_truth: str,
    *,
    extra_info: Mapping[str, Any] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """Score the response's Python code by the fraction of test cases it passes.

    Args:
        response: the model's response; the code is :func:`extract_code`'s.
        ground_truth: the test cases as JSON (see the module docstring), unless
            ``extra_info["test_cases"]`` holds them.
        extra_info: the dataset row's ``extra_info`` (reward context).
        **extra: the options of :class:`CodeTestOptions`; other per-row fields
            (``data_source``, ``response_length``) are ignored.

    Returns:
        ``{"score", "acc", "tests_passed", "tests_total", "code/<kind>" for every kind
        in KINDS, "failure"}``.

    Raises:
        ValueError: bad test cases (a data bug) or bad options.
    """
    options = CodeTestOptions(**{k: v for k, v in extra.items() if k in OPTION_NAMES})
    cases = load_test_cases(ground_truth, extra_info)
    if options.max_cases is not None:
        cases = cases[: options.max_cases]
    code = extract_code(response)
    if not code:
        return _result([CaseOutcome("no_code", "no code in the response")] * len(cases), False)
    return _result(run_cases(code, cases, options), options.all_or_nothing)
