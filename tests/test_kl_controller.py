"""Fixed and adaptive KL coefficient controllers."""

import math

import pytest

import algorithms


def test_fixed_controller_never_changes():
    ctrl = algorithms.FixedKLController(0.05)
    ctrl.update(current_kl=10.0, n_steps=1000)
    assert ctrl.value == 0.05


def test_adaptive_controller_by_hand():
    # β = 0.1, target 0.1, horizon 100, n = 10:
    # KL 0.11: error = 0.11/0.1 − 1 = 0.1 -> β·(1 + 0.1·10/100) = 0.1·1.01 = 0.101
    ctrl = algorithms.AdaptiveKLController(init_kl_coef=0.1, target_kl=0.1, horizon=100)
    ctrl.update(0.11, 10)
    assert ctrl.value == pytest.approx(0.101, rel=1e-12)
    # KL 1.0: error 9 is clipped to 0.2 -> 0.101·(1 + 0.2·0.1) = 0.10302
    ctrl.update(1.0, 10)
    assert ctrl.value == pytest.approx(0.10302, rel=1e-12)
    # KL 0: error −1 clipped to −0.2 -> 0.10302·(1 − 0.02) = 0.1009596
    ctrl.update(0.0, 10)
    assert ctrl.value == pytest.approx(0.1009596, rel=1e-12)


def test_state_dict_round_trip_resumes_the_same_coefficient():
    ctrl = algorithms.make_kl_controller("adaptive", kl_coef=0.2, target_kl=0.05, horizon=500)
    ctrl.update(0.5, 64)
    fresh = algorithms.make_kl_controller("adaptive")
    fresh.load_state_dict(ctrl.state_dict())
    assert fresh.state_dict() == ctrl.state_dict()
    fresh.update(0.01, 64)
    ctrl.update(0.01, 64)
    assert fresh.value == ctrl.value


def test_factory_defaults_are_verls():
    fixed = algorithms.make_kl_controller()
    assert isinstance(fixed, algorithms.FixedKLController) and fixed.value == 0.001
    adaptive = algorithms.make_kl_controller("adaptive")
    assert (adaptive.value, adaptive.target, adaptive.horizon) == (0.001, 0.1, 10000)


def test_loading_another_kinds_state_raises():
    fixed = algorithms.FixedKLController(0.1)
    with pytest.raises(ValueError, match="'adaptive'"):
        fixed.load_state_dict(algorithms.make_kl_controller("adaptive").state_dict())


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"kind": "pid"}, "unknown KL controller kind"),
        ({"kind": "adaptive", "horizon": 0}, "horizon"),
        ({"kind": "adaptive", "target_kl": -1.0}, "target_kl"),
        ({"kind": "fixed", "kl_coef": math.nan}, "kl_coef"),
    ],
)
def test_bad_settings_raise(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        algorithms.make_kl_controller(**kwargs)


def test_a_nan_kl_measurement_is_rejected_instead_of_poisoning_beta():
    ctrl = algorithms.make_kl_controller("adaptive")
    with pytest.raises(ValueError, match="finite"):
        ctrl.update(math.nan, 1)
    assert ctrl.value == 0.001
