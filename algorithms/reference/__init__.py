"""Loop references of rlkit's loss math, for tests and benchmarks.

Each module follows the written formula (verl 0.9 semantics unless the rlkit
docstring states a difference) one row and one token at a time, with 0-dim tensor
arithmetic so that autograd gives reference gradients too. Obviously correct and
slow: tiny inputs only. Nothing in rlkit's training path imports them.

* ``aggregation_loops``: the loss aggregation modes and the masked mean;
* ``policy_loss_loops``: every registered policy loss;
* ``value_loss_loops``, ``kl_loops``, ``entropy_loops``, ``rollout_correction_loops``:
  PPO's value loss, the KL penalties, the entropy of a softmax, rollout IS weights;
* ``policy_loss_inputs``: random policy-loss inputs (ragged masks, empty rows).

These are references of the *formulas*, not rlkit's plain math: the plain math of a
loss is the vectorised torch in its own module (``algorithms.set_math("plain")``).
PRIME's references are in ``estimators.reference.prime_loops``.
"""
