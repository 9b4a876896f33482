"""Loop references of verl 0.9's advantage estimators, for tests and benchmarks.

``estimator_loops``: every registered estimator written step by step from verl's
``core_algos.py`` (verl's quirks kept), with ``call(name, inputs)`` and the random
inputs on which they give verl's numbers; ``prime_loops``: PRIME's advantage and
implicit-PRM math from verl's ``recipe/prime``. Obviously correct and slow: tiny
inputs only. Nothing in rlkit's training path imports them.
"""
