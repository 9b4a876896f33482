"""Which implementation of the estimators' scans runs: the plain loop or the fused scan.

Discounted sums over time (GAE, the discounted returns of REINFORCE++ and ReMax) have
a **plain** implementation: the textbook ``for t in reversed(range(T))`` loop, in
the estimator's own module (``gae_advantages`` in ``estimators/gae.py``,
``discounted_returns`` in ``estimators/discounted_returns.py``), which a debugger
steps through token by token. Beside each sits a fused one with the same signature
(valid tokens packed to the front of each row, then a chunked-matmul scan:
``estimators/discounted_scan.py``, ``estimators/valid_token_compaction.py``), which
``benchmarks/estimators.py`` showed to be much faster and which runs by default.
The estimators with such a pair are listed in :data:`FUSED_PATHS`; the others are
vectorised torch with no loop over time and have only one implementation.

Select the plain math for the whole process, or for a block::

    estimators.set_math("plain")
    with estimators.plain_math():
        advantages, returns = estimators.get("gae")(rewards, mask, values=values)

The choice is read on every call, so it also reaches a trainer that has already
looked its estimator up in the registry. It is process-wide state (not per thread).
``algorithms`` has the same switch for the policy losses.
"""

from __future__ import annotations

from rlkit.math_switch import MATH_MODES, MathSwitch

#: Registered estimators that have a fused scan beside their plain loop.
FUSED_PATHS = ("gae", "reinforce_plus_plus", "remax")

_SWITCH = MathSwitch("estimator")
set_math = _SWITCH.set
get_math = _SWITCH.get
use_math = _SWITCH.use
plain_math = _SWITCH.plain
choose = _SWITCH.choose

__all__ = ["FUSED_PATHS", "MATH_MODES", "choose", "get_math", "plain_math", "set_math", "use_math"]
