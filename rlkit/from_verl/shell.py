"""A launch script read as bash reads it, for the part of bash that verl recipes use.

Understood: comments; line continuations; ``;``, ``&&``, ``||``, ``|`` and ``&`` between
commands; single quotes, double quotes and backslash escapes; ``NAME=value`` and
``export NAME=value`` assignments (in order, each seeing the ones before it);
``$NAME``, ``${NAME}``, ``${NAME:-word}`` / ``${NAME-word}`` (``word`` itself expanded, so
defaults nest), ``${NAME:=word}``, ``${NAME:+word}``, ``${#NAME}``; ``$((...))`` integer
arithmetic with bash's truncating division; ``~`` at the start of a word; ``$@`` and
``$1``... (a script run without arguments: empty); an unquoted ``$EXTRA`` alone in a word
is split into words.

Not run: ``$(...)`` and backquoted commands (``now=$(date +%s)``). A word that needs one,
or a variable neither the script nor the environment sets, records what it lacked in
:attr:`Word.missing` (bash would put the command's output there, or nothing).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

_NAME = re.compile(r"[A-Za-z_]\w*")
_ASSIGNMENT = re.compile(r"[A-Za-z_]\w*=")
_DECLARE = ("export", "declare", "local", "readonly", "typeset")
#: ``${NAME<op>word}`` operators, longest first.
_OPERATORS = (":-", ":=", ":+", ":?", "-", "=", "+", "?")


@dataclass
class Word:
    """One word of a command after expansion and quote removal."""

    text: str
    missing: list[str] = field(default_factory=list)


@dataclass
class Command:
    """One simple command: its words, and the variables it was expanded with."""

    words: list[Word]


class ScriptReader:
    """Reads a script's commands with bash's expansions (module docstring).

    Args:
        environ: the environment the script starts with (bash: the caller's).
    """

    def __init__(self, environ: Mapping[str, str]):
        self.variables: dict[str, str] = dict(environ)
        #: variables whose value lacked something (a command's output, an unset name)
        self.incomplete: dict[str, list[str]] = {}
        self.branches: list[_Branch] = []  # the if / loop blocks the reader is inside

    @property
    def active(self) -> bool:
        """Whether the commands being read run (every enclosing branch taken)."""
        return all(b.active for b in self.branches)

    def commands(self, text: str) -> list[Command]:
        """The script's commands other than assignments, in order; assignments update
        :attr:`variables` as they are met."""
        found = []
        for raw_words in split_commands(text):
            rest = self._control(raw_words)
            words = self._run(rest) if rest and self.active else []
            if words:
                found.append(Command(words))
        return found

    def _control(self, raw_words: list[str]) -> list[str]:
        """Follow ``if`` / ``elif`` / ``else`` / ``fi`` (and loops, read once) at the start
        of a command; the words left to run."""
        while raw_words:
            head, rest = raw_words[0], raw_words[1:]
            if head in ("then", "do"):
                raw_words = rest
            elif head == "else":
                if self.branches:
                    self.branches[-1].otherwise()
                raw_words = rest
            elif head in ("fi", "done", "esac"):
                if self.branches:
                    self.branches.pop()
                raw_words = rest
            elif head in ("if", "elif"):
                taken = self._test(rest) if self.active or head == "elif" else False
                if head == "if":
                    self.branches.append(_Branch(taken, rest))
                elif self.branches:
                    self.branches[-1].alternative(taken, rest)
                return []
            elif head in ("while", "until", "for", "case", "select"):
                self.branches.append(_Branch(None, raw_words))  # the body is read once
                return []
            else:
                return raw_words
        return []

    def _test(self, raw_words: list[str]) -> bool | None:
        """The value of a ``[ ... ]`` / ``[[ ... ]]`` / ``test`` condition, or None when
        it is not one this reader evaluates."""
        words = [self.expand(raw) for raw in raw_words]
        if any(w.missing for w in words):
            return None
        texts = [w.text for w in words]
        if texts[:1] == ["test"]:
            texts = texts[1:]
        elif texts[:1] in (["["], ["[["]) and texts[-1:] in (["]"], ["]]"]):
            texts = texts[1:-1]
        else:
            return None
        negate = texts[:1] == ["!"]
        value = _condition(texts[1:] if negate else texts)
        return None if value is None else value != negate

    def _run(self, raw_words: list[str]) -> list[Word]:
        if raw_words and raw_words[0] in _DECLARE:
            for raw in raw_words[1:]:
                if _ASSIGNMENT.match(raw):
                    self._assign(raw)
            return []
        prefix = 0
        while prefix < len(raw_words) and _ASSIGNMENT.match(raw_words[prefix]):
            prefix += 1
        if prefix == len(raw_words):  # only assignments: they set the script's variables
            for raw in raw_words:
                self._assign(raw)
            return []
        words: list[Word] = []
        for raw in raw_words[prefix:]:
            words += self._expand_command_word(raw)
        return words

    def _assign(self, raw: str) -> None:
        name, _, value = raw.partition("=")
        word = self.expand(value)
        self.variables[name] = word.text
        unread = [f"the test {b.test}" for b in self.branches if b.taken is None]
        if word.missing or unread:
            self.incomplete[name] = word.missing + unread
        else:
            self.incomplete.pop(name, None)

    def _expand_command_word(self, raw: str) -> list[Word]:
        # An unquoted expansion alone in a word is split on blanks (EXTRA="a=1 b=2").
        word = self.expand(raw)
        if re.fullmatch(r"\$(\w+|\{[^}]*\}|@|\*)", raw):
            return [Word(part, word.missing) for part in word.text.split()]
        if not word.text and not any(q in raw for q in "'\""):
            return []  # an unquoted expansion to nothing is no word at all
        return [word]

    def expand(self, raw: str) -> Word:
        """``raw`` (one word as written) with its expansions done and its quotes removed."""
        missing: list[str] = []
        text = _Expansion(self, missing).word(raw)
        return Word(text, missing)

    def lookup(self, name: str, missing: list[str]) -> str:
        """The value of ``$name``; records it in ``missing`` when nothing sets it."""
        if name.isdigit() or name in ("@", "*"):
            return ""  # the script's arguments: it is read as run without any
        if name == "#":
            return "0"
        if name in self.variables:
            missing += self.incomplete.get(name, [])
            return self.variables[name]
        missing.append(f"${name}")
        return ""


class _Branch:
    """One ``if`` (or loop) block: whether its current branch runs."""

    def __init__(self, taken: bool | None, test_words: list[str]):
        self.taken = taken  # None: a test this reader does not evaluate (read as taken)
        self.test = " ".join(test_words)
        self.done = bool(taken)  # an earlier branch of this if ran

    @property
    def active(self) -> bool:
        return self.taken is not False

    def alternative(self, taken: bool | None, test_words: list[str]) -> None:
        """``elif``: runs when no earlier branch did and its own test holds."""
        self.taken = False if self.done else taken
        self.test = " ".join(test_words)
        self.done = self.done or bool(taken)

    def otherwise(self) -> None:
        """``else``: runs when no earlier branch did."""
        self.taken = None if self.taken is None else not self.done
        self.done = True


def _condition(texts: list[str]) -> bool | None:
    """``a = b``, ``a == b``, ``a != b``, ``-n a``, ``-z a`` or ``a``; else None."""
    if len(texts) == 3 and texts[1] in ("=", "=="):
        return texts[0] == texts[2]
    if len(texts) == 3 and texts[1] == "!=":
        return texts[0] != texts[2]
    if len(texts) == 2 and texts[0] in ("-n", "-z"):
        return bool(texts[1]) == (texts[0] == "-n")
    if len(texts) == 1:
        return bool(texts[0])
    return None


class _Expansion:
    """The expansions of one word (a helper of :class:`ScriptReader`)."""

    def __init__(self, reader: ScriptReader, missing: list[str]):
        self.reader = reader
        self.missing = missing

    def word(self, raw: str) -> str:
        out: list[str] = []
        i = 0
        if raw.startswith("~") and (len(raw) == 1 or raw[1] == "/"):
            out.append(self.reader.lookup("HOME", self.missing))
            i = 1
        while i < len(raw):
            c = raw[i]
            if c == "'":
                end = _closing(raw, i, "'")
                out.append(raw[i + 1 : end])
                i = end + 1
            elif c == '"':
                end = _closing(raw, i, '"')
                out.append(self.double_quoted(raw[i + 1 : end]))
                i = end + 1
            elif c == "\\":
                out.append(raw[i + 1 : i + 2])
                i += 2
            elif c in "$`":
                value, i = self.dollar(raw, i)
                out.append(value)
            else:
                out.append(c)
                i += 1
        return "".join(out)

    def double_quoted(self, body: str) -> str:
        out: list[str] = []
        i = 0
        while i < len(body):
            c = body[i]
            if c == "\\" and body[i + 1 : i + 2] in ('"', "\\", "$", "`"):
                out.append(body[i + 1])
                i += 2
            elif c in "$`":
                value, i = self.dollar(body, i)
                out.append(value)
            else:
                out.append(c)
                i += 1
        return "".join(out)

    def dollar(self, text: str, i: int) -> tuple[str, int]:
        """The value of the expansion starting at ``text[i]`` and the index after it."""
        if text[i] == "`":
            end = _closing(text, i, "`")
            self.missing.append(f"`{text[i + 1 : end]}`")
            return "", end + 1
        rest = text[i + 1 :]
        if rest.startswith("(("):
            end = _group_end(text, i + 1)
            return self.arithmetic(text[i + 3 : end - 1]), end + 1
        if rest.startswith("("):
            end = _group_end(text, i + 1)
            self.missing.append(f"$({text[i + 2 : end]})")
            return "", end + 1
        if rest.startswith("{"):
            end = _group_end(text, i + 1)
            return self.braced(text[i + 2 : end]), end + 1
        name = _NAME.match(rest)
        if name:
            return self.reader.lookup(name.group(), self.missing), i + 1 + name.end()
        if rest[:1] and rest[0] in "@*#0123456789":
            return self.reader.lookup(rest[0], self.missing), i + 2
        return "$", i + 1

    def braced(self, body: str) -> str:
        """``${body}``: a name, or a name with one of bash's default/alternative forms."""
        if body.startswith("#") and _NAME.fullmatch(body[1:]):
            return str(len(self.reader.lookup(body[1:], self.missing)))
        name = _NAME.match(body) or re.match(r"[@*#\d]", body)
        if name is None:
            self.missing.append(f"${{{body}}}")
            return ""
        key, rest = name.group(), body[name.end() :]
        if not rest:
            return self.reader.lookup(key, self.missing)
        operator = next((op for op in _OPERATORS if rest.startswith(op)), None)
        if operator is None:  # ${X/a/b}, ${X%.*} ...: not read
            self.missing.append(f"${{{body}}}")
            return ""
        return self.with_operator(key, operator, rest[len(operator) :])

    def with_operator(self, name: str, operator: str, word: str) -> str:
        value = self.reader.variables.get(name)
        unset = value is None or (operator.startswith(":") and value == "")
        if operator in (":-", "-"):
            return self.word(word) if unset else str(value)
        if operator in (":=", "="):
            if unset:
                self.reader.variables[name] = self.word(word)
            return self.reader.variables[name]
        if operator in (":+", "+"):
            return "" if unset else self.word(word)
        # ${X:?message}: bash would stop the script when X is unset.
        if unset:
            self.missing.append(f"${name}")
        return value or ""

    def arithmetic(self, expression: str) -> str:
        """``$((expression))`` as bash computes it (integers; ``/`` truncates toward 0)."""
        text = self.double_quoted(expression)
        try:
            return str(_Arithmetic(self.reader.variables).value(text))
        except (ValueError, SyntaxError, ZeroDivisionError, RecursionError):
            self.missing.append(f"$(({expression}))")
            return ""


class _Arithmetic:
    """bash's integer arithmetic over + - * / % ** and parentheses; a bare name is the
    variable's value, itself read as an expression."""

    def __init__(self, variables: Mapping[str, str], depth: int = 0):
        if depth > 20:
            raise RecursionError("variables refer to each other in a loop")
        self.variables = variables
        self.depth = depth

    def value(self, text: str) -> int:
        if not text.strip():
            return 0
        return self._node(ast.parse(text.strip(), mode="eval").body)

    def _node(self, node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in self.variables:
                raise ValueError(f"${node.id} is not set")
            return _Arithmetic(self.variables, self.depth + 1).value(self.variables[node.id])
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            operand = self._node(node.operand)
            return -operand if isinstance(node.op, ast.USub) else operand
        if isinstance(node, ast.BinOp):
            return _binary(node.op, self._node(node.left), self._node(node.right))
        raise ValueError(f"not integer arithmetic: {ast.dump(node)}")


def _binary(op: ast.operator, left: int, right: int) -> int:
    if isinstance(op, ast.Add):
        return left + right
    if isinstance(op, ast.Sub):
        return left - right
    if isinstance(op, ast.Mult):
        return left * right
    if isinstance(op, ast.Div | ast.Mod):
        if right == 0:
            raise ZeroDivisionError("division by 0")
        quotient = abs(left) // abs(right) * (1 if (left >= 0) == (right >= 0) else -1)
        return quotient if isinstance(op, ast.Div) else left - right * quotient
    if isinstance(op, ast.Pow) and right >= 0:
        return left**right
    raise ValueError(f"operator {type(op).__name__} is not read")


def _closing(text: str, start: int, quote: str) -> int:
    """Index of the quote that closes the one at ``text[start]`` (the end if none)."""
    i = start + 1
    while i < len(text):
        if text[i] == "\\" and quote != "'":
            i += 2
            continue
        if text[i] == quote:
            return i
        i += 1
    return len(text)


def _group_end(text: str, start: int) -> int:
    """Index of the bracket closing the ``(`` or ``{`` at ``text[start]`` (nesting and
    quotes inside respected); for ``((`` the index of the second ``)``."""
    opener = text[start]
    closer = ")" if opener == "(" else "}"
    depth, i = 0, start
    while i < len(text):
        c = text[i]
        if c in "'\"":
            i = _closing(text, i, c) + 1
            continue
        if c == "\\":
            i += 2
            continue
        if c == opener:
            depth += 1
        elif c == closer:
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return len(text) - 1


def split_commands(text: str) -> list[list[str]]:
    """The script as simple commands, each a list of words as written (quotes and
    expansions kept), comments and line continuations removed."""
    commands: list[list[str]] = []
    words: list[str] = []
    word: list[str] = []

    def end_word() -> None:
        if word:
            words.append("".join(word))
            word.clear()

    def end_command() -> None:
        end_word()
        if words:
            commands.append(list(words))
            words.clear()

    i = 0
    while i < len(text):
        c = text[i]
        if c == "\\" and text[i + 1 : i + 2] == "\n":
            i += 2
        elif c in " \t\r":
            end_word()
            i += 1
        elif c in "\n;" or (c in "&|" and not (word and word[-1] in "<>")):
            end_command()
            i += 1
        elif c == "#" and not word:
            newline = text.find("\n", i)
            i = len(text) if newline < 0 else newline
        elif c in "'\"`":
            end = _closing(text, i, c)
            word.append(text[i : end + 1])
            i = end + 1
        elif c == "$" and text[i + 1 : i + 2] in ("(", "{"):
            end = _group_end(text, i + 1)
            word.append(text[i : end + 1])
            i = end + 1
        elif c == "\\":
            word.append(text[i : i + 2])
            i += 2
        else:
            word.append(c)
            i += 1
    end_command()
    return commands
