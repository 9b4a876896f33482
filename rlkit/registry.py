"""Name -> function registries: the only way the trainer reaches RL math.

Every concept (advantage estimators, policy losses, KL penalties, loss
aggregations, rewards, rollout engines, ...) has one :class:`Registry`
instance below. A component registers itself with a decorator::

    from rlkit.registry import ESTIMATORS

    @ESTIMATORS.register("my_estimator", paper="arXiv:2402.03300")
    def my_estimator(token_level_rewards, response_mask, **kw): ...

and is found by name with ``ESTIMATORS.get("my_estimator")``.

"Bring your own": ``get("my_pkg.my_module:my_fn")`` imports the dotted path, and
``get("path/to/my_file.py:my_fn")`` imports the file (relative to the working
directory, ``~`` expanded), so a researcher's function in a file of their own is
usable from a gin config without editing rlkit or ``PYTHONPATH``. A file is imported
once, as the module :func:`file_module_name` names (``sys.modules`` holds it), and
that name imports the same file in any process that imports this module, so its
functions pickle (worker processes, ``functools.partial``) like any module's.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.abc
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


class UnknownNameError(KeyError):
    """Raised for a name that no registry entry (nor alias) answers to."""

    def __str__(self) -> str:  # KeyError would quote the whole message.
        return str(self.args[0]) if self.args else ""


class RegistrationError(ValueError):
    """Raised when a name is already taken by a different function."""


@dataclass(frozen=True)
class Entry(Generic[F]):
    """One registered function with its metadata."""

    name: str
    fn: F
    aliases: tuple[str, ...] = ()
    paper: str | None = None
    summary: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def _first_doc_line(fn: Callable[..., Any]) -> str:
    doc = inspect.getdoc(fn) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def _same_function(a: Callable[..., Any], b: Callable[..., Any]) -> bool:
    # A reloaded module yields a new function object for the same definition.
    if a is b:
        return True
    key = lambda f: (getattr(f, "__module__", None), getattr(f, "__qualname__", None))  # noqa: E731
    return key(a) == key(b) and key(a) != (None, None)


class Registry(Generic[F]):
    """A named collection of functions of one kind.

    Args:
        kind: human-readable kind, used in error messages ("advantage estimator").
        home: module imported on first lookup so that the built-in entries are
            registered (e.g. ``"estimators"``); ``None`` for none.
    """

    def __init__(self, kind: str, *, home: str | None = None) -> None:
        self.kind = kind
        self.home = home
        self._entries: dict[str, Entry[F]] = {}
        self._aliases: dict[str, str] = {}
        self._home_loaded = home is None

    # -- registration -----------------------------------------------------
    def register(
        self,
        name: str,
        *,
        aliases: Iterable[str] = (),
        paper: str | None = None,
        summary: str | None = None,
        **extra: Any,
    ) -> Callable[[F], F]:
        """Decorator registering ``fn`` under ``name`` (and ``aliases``).

        Raises:
            RegistrationError: the name or an alias is taken by another function.
        """

        def decorator(fn: F) -> F:
            self.add(name, fn, aliases=aliases, paper=paper, summary=summary, **extra)
            return fn

        return decorator

    def add(
        self,
        name: str,
        fn: F,
        *,
        aliases: Iterable[str] = (),
        paper: str | None = None,
        summary: str | None = None,
        **extra: Any,
    ) -> None:
        """Register ``fn`` without a decorator (see :meth:`register`)."""
        if not callable(fn):
            raise TypeError(f"cannot register {fn!r} as {self.kind} {name!r}: not callable")
        aliases = tuple(aliases)
        for key in (name, *aliases):
            owner = self._lookup_exact(key)
            if owner is not None and not _same_function(owner.fn, fn):
                raise RegistrationError(
                    f"{self.kind} name {key!r} is already registered to "
                    f"{owner.fn.__module__}.{owner.fn.__qualname__}; choose another name "
                    f"or unregister the existing one first"
                )
        entry = Entry(name, fn, aliases, paper, summary or _first_doc_line(fn), dict(extra))
        self._entries[name] = entry
        for alias in aliases:
            self._aliases[alias] = name

    def unregister(self, name: str) -> None:
        """Remove ``name`` and its aliases (used by tests and notebooks)."""
        entry = self._entries.pop(self._canonical(name))
        for alias in entry.aliases:
            self._aliases.pop(alias, None)

    # -- lookup -----------------------------------------------------------
    def get(self, name: str) -> F:
        """Return the function registered as ``name`` or an alias of it.

        ``"package.module:function"`` imports and returns that function instead, and
        ``"path/to/file.py:function"`` (a name with a ``/`` or a ``.py`` before the
        colon) imports that file and returns the function.

        Raises:
            UnknownNameError: no such name; the message lists the known names
                and the nearest match. For a path: the module or file cannot be
                imported (the file does not exist, or raised while importing), has
                no such attribute, or the attribute is not callable.
        """
        return self.entry(name).fn

    def entry(self, name: str) -> Entry[F]:
        """Like :meth:`get` but returns the whole :class:`Entry`."""
        if not isinstance(name, str):
            raise TypeError(f"{self.kind} name must be a string, got {type(name).__name__}")
        if ":" in name:
            return self._import_path(name)
        self._load_home()
        found = self._lookup_exact(name)
        if found is None and is_file_path(name):
            raise UnknownNameError(
                f"bad {self.kind} path {name!r}: name the function in the file, "
                f"as 'path/to/file.py:function'"
            )
        if found is None:
            raise UnknownNameError(self._unknown_message(name))
        return found

    def entry_for(self, fn: Callable[..., Any]) -> Entry[F] | None:
        """The entry ``fn`` is registered under (same function or same module and
        qualified name, as for a reloaded module), or None if it is not registered."""
        self._load_home()
        return self._registered(fn)

    def names(self) -> list[str]:
        """Sorted canonical names (aliases excluded)."""
        self._load_home()
        return sorted(self._entries)

    def describe(self) -> list[Entry[F]]:
        """All entries, sorted by name."""
        self._load_home()
        return [self._entries[n] for n in sorted(self._entries)]

    def __contains__(self, name: object) -> bool:
        self._load_home()
        return isinstance(name, str) and self._lookup_exact(name) is not None

    def __len__(self) -> int:
        self._load_home()
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {len(self._entries)} entries)"

    # -- internals --------------------------------------------------------
    def _canonical(self, name: str) -> str:
        return self._aliases.get(name, name)

    def _lookup_exact(self, name: str) -> Entry[F] | None:
        return self._entries.get(self._canonical(name))

    def _registered(self, fn: Callable[..., Any]) -> Entry[F] | None:
        entries = self._entries.values()
        same = next((e for e in entries if e.fn is fn), None)
        return same or next((e for e in entries if _same_function(e.fn, fn)), None)

    def _load_home(self) -> None:
        if not self._home_loaded:
            self._home_loaded = True  # set first: the import registers into us
            try:
                importlib.import_module(self.home)  # type: ignore[arg-type]
            except BaseException:
                # An interrupted import (an error, a time limit) must not leave the
                # registry empty for the rest of the process: the next lookup retries.
                self._home_loaded = False
                raise

    def _unknown_message(self, name: str) -> str:
        known = sorted([*self._entries, *self._aliases])
        near = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
        hint = f" Did you mean {near[0]!r}?" if near else ""
        return (
            f"unknown {self.kind} {name!r}.{hint} Known: {', '.join(known) or '(none)'}. "
            f"Register your own with @register(...) or pass 'package.module:function' or "
            f"'path/to/file.py:function'."
        )

    def _import_path(self, path: str) -> Entry[F]:
        if is_file_path(path.rpartition(":")[0]):
            return self._entry_of(path, self._import_file(path))
        module_name, _, attr = path.partition(":")
        if not module_name or not attr:
            raise UnknownNameError(
                f"bad {self.kind} path {path!r}: expected 'package.module:function'"
            )
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise UnknownNameError(
                f"cannot import module {module_name!r} for {self.kind} {path!r}: {exc}. "
                f"Is it on PYTHONPATH?"
            ) from exc
        obj: Any = module
        for part in attr.split("."):
            if not hasattr(obj, part):
                raise UnknownNameError(
                    f"module {module_name!r} has no attribute {attr!r} ({path!r})"
                )
            obj = getattr(obj, part)
        if not callable(obj):
            raise UnknownNameError(f"{path!r} is not callable, so it cannot be a {self.kind}")
        return self._entry_of(path, obj)

    def _import_file(self, path: str) -> Any:
        """The callable ``path`` (``"file.py:attr"``) names, with one clear error per failure."""
        file_part, _, attr = path.rpartition(":")
        if not attr:
            raise UnknownNameError(
                f"bad {self.kind} path {path!r}: expected 'path/to/file.py:function'"
            )
        file = resolve_file(file_part)
        if not os.path.isfile(file):
            where = (
                ""
                if os.path.isabs(os.path.expanduser(file_part))
                else (f"; relative paths are read from the working directory {os.getcwd()}")
            )
            raise UnknownNameError(f"{self.kind} file {file} does not exist (from {path!r}{where})")
        try:
            module = importlib.import_module(file_module_name(file))
        except Exception as exc:  # the file's own code failed: say which file and how
            raise UnknownNameError(
                f"importing {self.kind} file {file} (from {path!r}) raised "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        obj: Any = module
        for part in attr.split("."):
            if not hasattr(obj, part):
                defined = public_callables(module)
                near = difflib.get_close_matches(attr, defined, n=1, cutoff=0.5)
                hint = f" Did you mean {near[0]!r}?" if near else ""
                raise UnknownNameError(
                    f"{self.kind} file {file} has no attribute {attr!r} (from {path!r}).{hint} "
                    f"Public callables defined there: {', '.join(defined) or '(none)'}"
                )
            obj = getattr(obj, part)
        if not callable(obj):
            raise UnknownNameError(
                f"{attr!r} in {self.kind} file {file} is not callable (type "
                f"{type(obj).__name__}), so it cannot be a {self.kind} (from {path!r})"
            )
        return obj

    def _entry_of(self, path: str, obj: Any) -> Entry[F]:
        # A function its module registered keeps what it declared there (needs, inputs),
        # under the name it was asked for.
        registered = self._registered(obj)
        if registered is not None:
            return Entry(path, obj, (), registered.paper, registered.summary, registered.extra)
        return Entry(path, obj, (), None, _first_doc_line(obj))


# -- functions in files of their own ----------------------------------------------
_FILE_MODULE_PREFIX = "_rlkit_file_"


def is_file_path(text: str) -> bool:
    """Whether ``text`` (a name, or the part of one before its last ``:``) is a file path:
    it contains a ``/`` or ends in ``.py``. ``pkg.module`` never does."""
    return "/" in text or text.endswith(".py")


def resolve_file(path: str) -> str:
    """``path`` as an absolute path: ``~`` expanded, relative to the working directory."""
    return os.path.abspath(os.path.expanduser(path))


def file_module_name(file: str) -> str:
    """The module name a file is imported under: one per absolute path, and reversible.

    Letters and digits stay; every other byte of the UTF-8 path becomes ``_`` and two
    hex digits (``/srv/my_r.py`` -> ``_rlkit_file__2fsrv_2fmy_5fr_2epy``), so the
    same file is always the same module, and the name alone says which file to import
    (see :class:`_FileModuleFinder`): a pickled function of the file loads in a fresh
    process too.
    """
    encoded = "".join(
        chr(b) if chr(b).isascii() and chr(b).isalnum() else f"_{b:02x}"
        for b in resolve_file(file).encode()
    )
    return _FILE_MODULE_PREFIX + encoded


def _file_of_module(name: str) -> str | None:
    """The file :func:`file_module_name` encoded in ``name``, or None for another name."""
    if not name.startswith(_FILE_MODULE_PREFIX):
        return None
    text, out, i = name[len(_FILE_MODULE_PREFIX) :], bytearray(), 0
    try:
        while i < len(text):
            if text[i] == "_":
                out.append(int(text[i + 1 : i + 3], 16))
                i += 3
            else:
                out.append(ord(text[i]))
                i += 1
        return out.decode()
    except (ValueError, UnicodeDecodeError):
        return None


def public_callables(module: Any) -> list[str]:
    """Sorted names of the callables ``module`` defines (not imports) without a leading ``_``."""
    return sorted(
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and callable(value)
        and getattr(value, "__module__", None) == module.__name__
    )


class _FileModuleFinder(importlib.abc.MetaPathFinder):
    """Imports the modules named by :func:`file_module_name` from their files."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        file = _file_of_module(fullname)
        if file is None or not os.path.isfile(file):
            return None
        return importlib.util.spec_from_file_location(fullname, file)


if not any(type(f).__name__ == _FileModuleFinder.__name__ for f in sys.meta_path):
    sys.meta_path.append(_FileModuleFinder())


# The registries of rlkit. ``home`` is the module holding the built-ins.
ESTIMATORS: Registry[Callable[..., Any]] = Registry("advantage estimator", home="estimators")
POLICY_LOSSES: Registry[Callable[..., Any]] = Registry("policy loss", home="algorithms.losses")
KL_PENALTIES: Registry[Callable[..., Any]] = Registry("KL penalty", home="algorithms.kl")
AGGREGATIONS: Registry[Callable[..., Any]] = Registry(
    "loss aggregation", home="algorithms.aggregation"
)
VALUE_LOSSES: Registry[Callable[..., Any]] = Registry("value loss", home="algorithms.value_loss")
ROLLOUT_CORRECTIONS: Registry[Callable[..., Any]] = Registry(
    "rollout correction", home="algorithms.rollout_correction"
)
REWARDS: Registry[Callable[..., Any]] = Registry("reward function", home="rewards")
ROLLOUT_ENGINES: Registry[Callable[..., Any]] = Registry("rollout engine", home="rlkit.rollout")
AGENT_LOOPS: Registry[Callable[..., Any]] = Registry("agent loop", home="rlkit.rollout.agent_loop")
TOOLS: Registry[Callable[..., Any]] = Registry("tool", home="rlkit.tools")
INTERACTIONS: Registry[Callable[..., Any]] = Registry("interaction", home="rlkit.interactions")
#: The models of a training step (actor, reference, critic, reward model, PRIME's implicit
#: PRM, a user's own): classes built with a ``rlkit.trainer.roles.RoleContext``.
ROLES: Registry[Callable[..., Any]] = Registry("trainer role", home="rlkit.trainer.roles")
#: Metric sinks (console, jsonl, tensorboard, wandb, mlflow, swanlab): factories called
#: with a ``rlkit.logging.LoggerContext``; each registration's ``fix=`` is the advice shown
#: when it fails to start.
LOGGERS: Registry[Callable[..., Any]] = Registry("logger", home="rlkit.logging")

#: Registries shown by ``rlkit list``, keyed by the CLI's group name.
LISTED: dict[str, Registry[Any]] = {
    "estimators": ESTIMATORS,
    "losses": POLICY_LOSSES,
    "kl": KL_PENALTIES,
    "aggregations": AGGREGATIONS,
    "value_losses": VALUE_LOSSES,
    "rollout_corrections": ROLLOUT_CORRECTIONS,
    "rewards": REWARDS,
    "rollout_engines": ROLLOUT_ENGINES,
    "agent_loops": AGENT_LOOPS,
    "tools": TOOLS,
    "interactions": INTERACTIONS,
    "roles": ROLES,
}
