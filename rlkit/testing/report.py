"""The result of a property battery: one row per property, with the shrunk counterexample."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass(frozen=True)
class PropertyResult:
    """One property of the battery.

    Attributes:
        property: its name (see ``rlkit.testing.ESTIMATOR_PROPERTIES`` / ``LOSS_PROPERTIES``).
        passed: no counterexample was found.
        counterexample: for a failure, the shrunk inputs (as Python literals) and
            what went wrong; None when it passed.
        description: what the property asserts.
        examples: how many inputs were tried (1 for the static checks).

    Unpacks as ``(property, passed, counterexample)``.
    """

    property: str
    passed: bool
    counterexample: str | None = None
    description: str = ""
    examples: int = 0

    def __iter__(self) -> Iterator[object]:
        return iter((self.property, self.passed, self.counterexample))


@dataclass
class Report:
    """All properties checked on one function.

    Attributes:
        target: what was checked (the name, path or function's qualified name).
        kind: ``"estimator"`` or ``"loss"``.
        results: one :class:`PropertyResult` per property checked, in battery order.
        exempt: properties not checked because the function declares it lacks them.
        seconds: wall-clock time of the battery.

    Iterating gives ``(property, passed, counterexample)`` triples.
    """

    target: str
    kind: str
    results: list[PropertyResult] = field(default_factory=list)
    exempt: tuple[str, ...] = ()
    seconds: float = 0.0

    def __iter__(self) -> Iterator[PropertyResult]:
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)

    def __getitem__(self, name: str) -> PropertyResult:
        for result in self.results:
            if result.property == name:
                return result
        raise KeyError(f"{name!r} was not checked; checked: {[r.property for r in self.results]}")

    @property
    def ok(self) -> bool:
        """Every checked property passed."""
        return all(r.passed for r in self.results)

    @property
    def failed(self) -> list[str]:
        """Names of the properties that failed, in battery order."""
        return [r.property for r in self.results if not r.passed]

    @property
    def passed(self) -> list[str]:
        """Names of the properties that passed, in battery order."""
        return [r.property for r in self.results if r.passed]

    def table(self, *, counterexamples: bool = True) -> str:
        """A plain-text table: property, result; each failure followed by its counterexample."""
        width = max([len("property"), *(len(r.property) for r in self.results)], default=8)
        lines = [f"{'property':<{width}}  result", "-" * (width + 8)]
        for r in self.results:
            lines.append(f"{r.property:<{width}}  {'passed' if r.passed else 'FAILED'}")
            if not r.passed and counterexamples and r.counterexample:
                lines += ["    " + line for line in r.counterexample.splitlines()]
        for name in self.exempt:
            lines.append(f"{name:<{width}}  exempt")
        lines.append(
            f"{len(self.passed)} passed, {len(self.failed)} failed, {len(self.exempt)} exempt"
            f" ({self.seconds:.1f} s)"
        )
        return "\n".join(lines)

    def __str__(self) -> str:
        return f"{self.kind} {self.target}\n{self.table()}"

    def assert_ok(self) -> None:
        """Raise AssertionError with the table (and counterexamples) unless every property passed."""
        if not self.ok:
            raise AssertionError(
                f"{self.kind} {self.target} fails {', '.join(self.failed)}:\n{self.table()}"
            )
