"""verl 0.9.1's reward functions, loaded as a test oracle without running ``verl/__init__``.

Importing ``verl.utils.reward_score`` the usual way runs ``verl/__init__.py``, which needs
ray, tensordict and the rest of verl's runtime. The reward rules need none of it: this
module executes the installed package's files under a private package name
(``_verl_oracle``), with stand-ins for the two parents whose ``__init__`` would pull in
the runtime, and gives back ``default_compute_score`` and the rule modules.

verl is a test-only dependency (``scripts/setup.sh`` installs ``verl==0.9.1`` without its
dependencies); when it is missing, :func:`load` fails with a message saying so.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
import types
from collections.abc import Iterator
from functools import cache
from pathlib import Path

VERSION = "0.9.1"
PACKAGE = "_verl_oracle"
#: The absolute ``verl.*`` imports the reward modules make at import time.
_ABSOLUTE = ("verl.utils.py_functional", "verl.utils.import_utils")


class OracleUnavailableError(RuntimeError):
    """verl is not installed in the test environment."""


def _verl_dir() -> Path:
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise OracleUnavailableError(
            f"verl {VERSION} (the reward oracle of these tests) is not installed; run "
            f"`bash scripts/setup.sh` (it installs verl=={VERSION} --no-deps into .venv)"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def _package(name: str, path: Path) -> types.ModuleType:
    """An empty package ``name`` whose submodules are the files under ``path``."""
    module = types.ModuleType(name)
    module.__path__ = [str(path)]
    module.__package__ = name
    sys.modules[name] = module
    return module


def _metric_stub() -> types.ModuleType:
    # py_functional imports verl.utils.metric (torch) only for a type it never needs here.
    stub = types.ModuleType(f"{PACKAGE}.utils.metric")
    stub.Metric = object
    return stub


@contextlib.contextmanager
def _verl_names_pointing_at_the_oracle() -> Iterator[None]:
    """``verl``, ``verl.utils`` and the modules in :data:`_ABSOLUTE` resolve to the
    oracle's copies while its modules execute; the previous entries are put back."""
    aliases = {"verl": PACKAGE, "verl.utils": f"{PACKAGE}.utils", "verl.utils.metric": None}
    aliases.update({name: name.replace("verl", PACKAGE, 1) for name in _ABSOLUTE})
    saved = {name: sys.modules.get(name) for name in aliases}
    try:
        sys.modules["verl"] = sys.modules[PACKAGE]
        sys.modules["verl.utils"] = sys.modules[f"{PACKAGE}.utils"]
        sys.modules["verl.utils.metric"] = sys.modules[f"{PACKAGE}.utils.metric"]
        for name in _ABSOLUTE:
            sys.modules[name] = importlib.import_module(aliases[name])
        yield
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


@cache
def load() -> types.SimpleNamespace:
    """verl's ``default_compute_score`` and its rule modules.

    Returns:
        A namespace with ``default_compute_score`` and the modules ``gsm8k``,
        ``math_reward``, ``math_dapo``, ``prime_math`` and ``geo3k``.

    Raises:
        OracleUnavailableError: verl is not installed (or not version 0.9.1).
    """
    root = _verl_dir()
    from importlib.metadata import version

    if version("verl") != VERSION:
        raise OracleUnavailableError(
            f"the tests compare with verl {VERSION}, found verl {version('verl')}; "
            f"run `bash scripts/setup.sh`"
        )
    _package(PACKAGE, root)
    _package(f"{PACKAGE}.utils", root / "utils")
    sys.modules[f"{PACKAGE}.utils.metric"] = _metric_stub()
    with _verl_names_pointing_at_the_oracle():
        score = importlib.import_module(f"{PACKAGE}.utils.reward_score")
        modules = {
            name: importlib.import_module(f"{PACKAGE}.utils.reward_score.{name}")
            for name in ("gsm8k", "math_reward", "math_dapo", "prime_math", "geo3k")
        }
    return types.SimpleNamespace(default_compute_score=score.default_compute_score, **modules)
