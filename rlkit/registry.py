"""Name -> function registries: the only way the trainer reaches RL math.

Every concept (advantage estimators, policy losses, KL penalties, loss
aggregations, rewards, rollout engines, ...) has one :class:`Registry`
instance below. A component registers itself with a decorator::

    from rlkit.registry import ESTIMATORS

    @ESTIMATORS.register("my_estimator", paper="arXiv:2402.03300")
    def my_estimator(token_level_rewards, response_mask, **kw): ...

and is found by name with ``ESTIMATORS.get("my_estimator")``.

"Bring your own": ``get("my_pkg.my_module:my_fn")`` imports the dotted path,
so a researcher's function in a file of their own is usable from a gin config
without editing rlkit.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
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

        ``"package.module:function"`` imports and returns that function instead.

        Raises:
            UnknownNameError: no such name; the message lists the known names
                and the nearest match.
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
            importlib.import_module(self.home)  # type: ignore[arg-type]

    def _unknown_message(self, name: str) -> str:
        known = sorted([*self._entries, *self._aliases])
        near = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
        hint = f" Did you mean {near[0]!r}?" if near else ""
        return (
            f"unknown {self.kind} {name!r}.{hint} Known: {', '.join(known) or '(none)'}. "
            f"Register your own with @register(...) or pass 'package.module:function'."
        )

    def _import_path(self, path: str) -> Entry[F]:
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
        # A function its module registered keeps what it declared there (needs, inputs),
        # under the name it was asked for.
        registered = self._registered(obj)
        if registered is not None:
            return Entry(path, obj, (), registered.paper, registered.summary, registered.extra)
        return Entry(path, obj, (), None, _first_doc_line(obj))


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
}
