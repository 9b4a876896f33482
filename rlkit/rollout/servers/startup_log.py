"""The one line of a server's log that says why it did not start.

A server that dies while starting leaves hundreds of lines: banners, warnings, the
tracebacks of every process it had forked, and a last exception that only says "see
root cause above" (vLLM's ``Engine core initialization failed``, SGLang's ``scheduler
is dead``). :func:`root_cause` picks the line a user needs, in this order:

1. a line that names a shortage of memory (``less than desired``, ``out of memory``,
   ``Cannot allocate memory`` ...);
2. the first exception line (``ValueError: ...``, ``pydantic_core...ValidationError``
   with the validation message under it) or command-line ``error:`` that is not one of
   the wrappers that point elsewhere;
3. the last ``ERROR`` line that is not such a wrapper.

Only the part of the log after the last :data:`START_MARKER` is read (a restarted
server appends to its log), log prefixes such as ``(EngineCore pid=7) ERROR 12-06
06:08:01 [core.py:1510]`` are removed, and ``WARNING`` / ``INFO`` / ``DEBUG`` lines never
count (a warning that merely mentions an error is not one).
"""

from __future__ import annotations

import re

#: Written to a server's log before each start; the cause is looked for after the last one.
START_MARKER = "=== rlkit: starting "
#: The longest cause reported (some messages list every supported architecture).
MAX_LENGTH = 600

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# "(APIServer pid=1) ERROR 12-06 06:08:01 [file.py:12] " / "[2025-01-01 10:00:00 TP0] " /
# "ERROR 12-06 ..." / "[2025-...] ERROR ..." in any combination, at the start of a line.
_PROCESS = re.compile(r"^\([\w\-. ]+ pid=\d+\)\s*")
_LEVEL = re.compile(r"^(DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)\b[^\]]*?\[[^\]]*\]\s?")
_BRACKET = re.compile(r"^\[\d{4}-\d\d-\d\d[^\]]*\]\s*")
_QUIET = ("DEBUG", "INFO", "WARNING", "WARN")

_MEMORY = re.compile(
    r"less than desired|less than requested memory|out of memory|outofmemory|"
    r"cannot allocate memory|not enough memory|insufficient memory|"
    r"no available memory for the cache blocks|larger than the available kv cache",
    re.IGNORECASE,
)
_EXCEPTION = re.compile(
    r"^(?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt)\b.*?:\s*\S"
)
_ARGPARSE = re.compile(r"^\S+: error: \S")
_WRAPPERS = re.compile(
    r"see root cause above|see stack trace|root cause|engine core initialization failed|"
    r"enginedeaderror|workerproc failed to start|workerproc hit an exception|"
    r"initialization failed due to an exception in a background process|"
    r"scheduler is dead|please check if there are relevant logs|"
    r"^traceback \(most recent call last\)",
    re.IGNORECASE,
)


def _clean(line: str) -> tuple[str, str | None]:
    """``line`` without colours and log prefixes, and its log level (``None``: none)."""
    text = _ANSI.sub("", line).rstrip()
    level = None
    for _ in range(3):  # prefixes come in either order
        before = text
        text = _PROCESS.sub("", text)
        text = _BRACKET.sub("", text)
        match = _LEVEL.match(text)
        if match:
            level = match.group(1)
            text = text[match.end() :]
        if text == before:
            break
    return text, level


def this_start(log_text: str) -> str:
    """The part of ``log_text`` after the last :data:`START_MARKER` line (all of it if
    there is none)."""
    at = log_text.rfind(START_MARKER)
    if at < 0:
        return log_text
    newline = log_text.find("\n", at)
    return "" if newline < 0 else log_text[newline + 1 :]


def root_cause(log_text: str) -> str | None:
    """The line of a server log that says why the server did not start (see the module
    docstring), without its log prefix and at most :data:`MAX_LENGTH` characters;
    ``None`` when no line does."""
    lines = [_clean(raw) for raw in this_start(log_text).splitlines()]
    candidates = [
        (i, text)
        for i, (text, level) in enumerate(lines)
        if text.strip() and level not in _QUIET and not text.startswith((" ", "\t"))
    ]
    exceptions = [
        (i, t)
        for i, t in candidates
        if (_EXCEPTION.match(t) or _ARGPARSE.match(t)) and not _WRAPPERS.search(t)
    ]
    memory = [(i, t) for i, t in candidates if _MEMORY.search(t) and not _WRAPPERS.search(t)]
    errors = [
        (i, t)
        for i, t in candidates
        if lines[i][1] in ("ERROR", "CRITICAL", "FATAL") and not _WRAPPERS.search(t)
    ]
    for found in (memory, exceptions, errors[-1:]):
        if found:
            index, text = found[0]
            return _shorten(_with_detail(text, lines, index))
    return None


def _with_detail(text: str, lines: list[tuple[str, str | None]], index: int) -> str:
    """A pydantic ``ValidationError`` names its field count on the exception line and
    the reason under it: join the first non-empty line that follows."""
    if "validation error" not in text:
        return text
    for following, _ in lines[index + 1 : index + 4]:
        if following.strip():
            return f"{text}: {following.strip()}"
    return text


def _shorten(text: str) -> str:
    text = text.strip()
    return text if len(text) <= MAX_LENGTH else text[: MAX_LENGTH - 3] + "..."
