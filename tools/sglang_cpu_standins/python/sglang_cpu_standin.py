"""Machinery of the import-only stand-ins for ``sgl_kernel`` and ``torchvision``.

TEST/CI TOOLING, NOT A LIBRARY. SGLang imports ``sgl_kernel`` (CUDA-only, no CPU
wheel on PyPI) and ``torchvision`` (PyPI's build does not import beside the CPU
torch) at module level, but its CPU path on a machine without SGLang's AMX kernels
calls nothing from them. A stand-in package answers every import with placeholder
objects, so SGLang starts; any *call* of a placeholder prints a marker line to
stderr (the server log) and raises, so a future SGLang that starts calling one
fails loudly instead of computing something else.

rlkit puts this folder on the ``PYTHONPATH`` of a CPU SGLang server subprocess
only, and only when the real package is not importable; it never enters the
trainer's process or ``site-packages``. See ``tools/sglang_cpu_standins/README.md``.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

#: Printed to stderr whenever a placeholder is called; tests grep server logs for it.
CALL_MARKER = "SGLANG-CPU-STANDIN-CALLED"


class StandinCalledError(RuntimeError):
    """A stand-in placeholder was called: the real package is needed for this path."""


class Placeholder:
    """Any attribute of a stand-in module: attribute access nests, calling raises."""

    def __init__(self, qualname: str) -> None:
        self._qualname = qualname

    def __getattr__(self, name: str) -> Placeholder:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)  # keep pickle, copy, inspect, typing honest
        return Placeholder(f"{self._qualname}.{name}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        message = (
            f"{CALL_MARKER}: {self._qualname} was called, but it is an import-only stand-in "
            f"(tools/sglang_cpu_standins). This SGLang code path needs the real package: "
            f"install it, or use a configuration that does not reach this call."
        )
        print(message, file=sys.stderr, flush=True)
        raise StandinCalledError(message)

    def __repr__(self) -> str:
        return f"<import-only stand-in {self._qualname}>"

    # Used as a type in annotations or isinstance checks: never matches.
    def __instancecheck__(self, obj: Any) -> bool:
        return False

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        return (object,)  # ``class X(placeholder)`` gives a plain class


class StandinModule(types.ModuleType):
    """A module whose missing attributes are :class:`Placeholder` objects."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return Placeholder(f"{self.__name__}.{name}")


class _SubmoduleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Creates ``root.any.sub.module`` on import as a :class:`StandinModule`."""

    def __init__(self, root: str) -> None:
        self.root = root

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if not fullname.startswith(self.root + "."):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = StandinModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def install(package: types.ModuleType, version: str) -> None:
    """Turn ``package`` (the stand-in's ``__init__`` module) into a stand-in root."""
    package.__class__ = StandinModule
    package.__version__ = version
    package.__sglang_cpu_standin__ = True
    sys.meta_path.append(_SubmoduleFinder(package.__name__))
