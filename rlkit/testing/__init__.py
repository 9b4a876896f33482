"""A property-test kit for advantage estimators and policy losses (yours or rlkit's).

Run the contract battery that rlkit's own registered functions pass on a
function of your own::

    from rlkit.testing import check_estimator, check_loss

    report = check_estimator("my_pkg.my_module:my_estimator")
    print(report.table())          # property, passed / FAILED, shrunk counterexample
    report.assert_ok()             # in a pytest test

or from the shell: ``rlkit check my_pkg.my_module:my_estimator``.

* :func:`check_estimator` / :func:`check_loss` take a function, a registered
  name or ``"package.module:function"``, and return a :class:`Report`: one
  :class:`PropertyResult` ``(property, passed, counterexample)`` per property.
* Generic properties (``ESTIMATOR_PROPERTIES`` / ``LOSS_PROPERTIES`` entries
  not marked optional) are checked on every function unless it declares it
  lacks them: ``@ESTIMATORS.register("name", properties_exempt=("...",))`` or
  ``check_estimator(fn, exempt=("...",))``. Say why in the docstring.
* Optional properties (e.g. ``group_zero_sum``) are checked when declared:
  ``@ESTIMATORS.register("name", properties=("group_zero_sum",))`` or
  ``check_estimator(fn, properties=("group_zero_sum",))``.
* Each property is a :func:`hypothesis.find` search over
  :mod:`rlkit.testing.strategies` with a fixed seed and ``derandomize=True``
  (reproducible), ``max_examples`` inputs (default 30), shrinking a failure
  to a small counterexample.
* Registration flags are honoured: ``needs_values`` estimators get critic
  values drawn, ``needs_reward_baselines`` ones greedy baselines, and every
  extra input an estimator declares (``inputs=("process_rewards",)``) a (B, T)
  tensor passed by keyword (:func:`declared_inputs` lists them).

The strategies are public, to write properties of your own
(``from rlkit.testing import strategies``). See docs/testing.md.

Needs ``hypothesis`` (``pip install 'rlkit[testing]'``).
"""

from __future__ import annotations

try:
    import hypothesis  # noqa: F401
except ImportError as exc:  # pragma: no cover - hypothesis is a declared dependency
    raise ImportError(
        "rlkit.testing needs the hypothesis package: pip install 'rlkit[testing]' "
        "(or pip install hypothesis)"
    ) from exc

from rlkit.testing import strategies
from rlkit.testing.estimator_checks import ESTIMATOR_PROPERTIES, check_estimator, declared_inputs
from rlkit.testing.loss_checks import LOSS_PROPERTIES, check_loss
from rlkit.testing.report import PropertyResult, Report
from rlkit.testing.runner import DEFAULT_MAX_EXAMPLES, DEFAULT_SEED, Property

__all__ = [
    "DEFAULT_MAX_EXAMPLES",
    "DEFAULT_SEED",
    "ESTIMATOR_PROPERTIES",
    "LOSS_PROPERTIES",
    "Property",
    "PropertyResult",
    "Report",
    "check_estimator",
    "check_loss",
    "declared_inputs",
    "strategies",
]
