"""Which implementation of the policy-loss math runs: the plain one or a fused one.

Every policy loss has a **plain** implementation: a few lines of torch in the loss's
own module that read like the paper's equations, whose gradient is autograd's, and
that a debugger steps through line by line (``vanilla_terms`` in
``algorithms/losses/vanilla.py`` is PPO's clip). Where ``benchmarks/losses.py``
showed a fused implementation to be meaningfully faster (at least 1.2x at 64 x
1,024 and 512 x 4,096 tokens), it is kept beside the plain one with the same
signature, in ``algorithms/losses/fused.py``, and runs by default; the losses with
one are listed in :data:`FUSED_PATHS`. Every other loss always runs its plain math.

Select the plain math for the whole process, or for a block::

    algorithms.set_math("plain")
    with algorithms.plain_math():
        loss, metrics = algorithms.get_loss("vanilla")(old, new, advantages, mask)

The choice is read on every call of a loss, so it also reaches a trainer that has
already looked its loss up in the registry. It is process-wide state (not per
thread). ``estimators`` has the same switch for the advantage estimators.
"""

from __future__ import annotations

from rlkit.math_switch import MATH_MODES, MathSwitch

#: Registered policy losses that have a fused path beside their plain math.
FUSED_PATHS = ("clip_cov", "geo_mean", "gspo", "vanilla")

_SWITCH = MathSwitch("policy loss")
set_math = _SWITCH.set
get_math = _SWITCH.get
use_math = _SWITCH.use
plain_math = _SWITCH.plain
choose = _SWITCH.choose

__all__ = ["FUSED_PATHS", "MATH_MODES", "choose", "get_math", "plain_math", "set_math", "use_math"]
