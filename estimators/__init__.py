"""Advantage estimators: (token rewards, mask, ...) -> (advantages, returns), found by name.

Every estimator has one signature::

    fn(token_level_rewards, response_mask, *, index=None, values=None,
       reward_baselines=None, gamma=1.0, lam=1.0, norm_by_std=True,
       epsilon=1e-6, **options) -> (advantages, returns)

* ``token_level_rewards`` (B, T) float; ``response_mask`` (B, T) bool or 0/1;
  ``values`` (B, T) critic values; ``index`` (B,) group ids (a 1-D tensor, a
  numpy array or any sequence of hashable ids such as uid strings);
  ``reward_baselines`` (B,).
* An argument the estimator does not use is accepted and ignored; a required
  one that is missing raises ValueError naming it.
* ``**options`` carries estimator-specific options (``gae``: ``whiten``;
  ``gpg``: ``f_norm``). A key the estimator does not understand raises
  TypeError naming it, so a typo in a gin config (or a verl spelling such as
  ``norm_adv_by_std_in_grpo``) fails instead of being silently ignored.
* Outputs are (B, T), in the rewards' dtype, exactly 0 on mask-0 tokens (verl
  leaves values there). Outcome estimators return the same tensor twice.
  Everything runs under ``torch.no_grad``.

Degenerate inputs, one behaviour for all estimators, never NaN/inf:

* empty responses (fully masked rows) get 0 and are left out of group
  statistics and of whitening statistics, so appending fully masked rows or
  columns changes nothing on real tokens;
* a group with one (non-empty) response gets advantage 0: there is no baseline
  to compare against (verl keeps a raw or rescaled score there; see each
  estimator);
* a group whose scores are all equal gets 0 from std-normalised estimators;
* whitening over fewer than two valid tokens only centres (one token: 0);
* B = 0 gives empty outputs.

On non-degenerate inputs (all groups of size >= 2, no empty rows, rewards zero
on mask-0 tokens) the names shared with verl 0.9 give verl's numbers;
``estimators/reference/estimator_loops.py`` holds loop references of verl's
formulas (verl's quirks included) and the tests compare against them.

Plain or fused math. The estimators that sum discounted rewards over time
(``gae``, ``reinforce_plus_plus``, ``remax``) have a plain implementation, the
textbook ``for t in reversed(range(T))`` loop (``gae_advantages`` in
``estimators/gae.py``, ``discounted_returns`` in ``estimators/discounted_returns.py``),
and beside it a fused one with the same signature and numbers (a chunked-matmul
scan, many times faster) that runs by default. ``estimators.set_math("plain")``
selects the loops for the rest of the process, ``with estimators.plain_math():``
for a block (``estimators.math_mode``); ``get_math()`` says which is selected.
The other estimators are vectorised torch without a loop over time and have one
implementation. ``algorithms`` has the same switch for the policy losses.

Use ``estimators.get(name)``, ``names()`` and ``describe()`` (the registry
``rlkit.registry.ESTIMATORS``); register your own with
``@ESTIMATORS.register("name", paper="arXiv:...")`` in a module of your own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# Importing the modules registers the built-in estimators.
from estimators import (  # noqa: F401
    gae,
    gpg,
    grpo,
    grpo_batch_std,
    grpo_passk,
    opo,
    prime,
    reinforce_plus_plus,
    reinforce_plus_plus_baseline,
    remax,
    rloo,
)
from estimators.math_mode import get_math, plain_math, set_math
from rlkit.registry import ESTIMATORS, Entry

__all__ = ["describe", "get", "get_math", "names", "plain_math", "set_math"]


def get(name: str) -> Callable[..., Any]:
    """The estimator registered as ``name`` (or alias, or "package.module:function").

    Raises:
        rlkit.registry.UnknownNameError: no such estimator (lists the known ones).
    """
    return ESTIMATORS.get(name)


def names() -> list[str]:
    """Sorted canonical names of the registered estimators (aliases excluded)."""
    return ESTIMATORS.names()


def describe() -> list[Entry[Callable[..., Any]]]:
    """Registry entries (name, aliases, paper, summary) of all estimators, sorted by name."""
    return ESTIMATORS.describe()
