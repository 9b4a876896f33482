"""rlkit.testing: every registered estimator and loss passes the battery; planted bugs do not.

The kit's own contract: each built-in passes every property it is not exempt
from (and every optional one it declares); a copy of each built-in with a
planted bug (mask ignored, a std division without epsilon, one group for the
whole batch, the mini-batch normalisers dropped, a gradient leaking into
padding) fails the property that bug breaks; failures come with a shrunk,
reproducible counterexample; ``rlkit check`` reports them with the right exit
status.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlkit.registry import ESTIMATORS, POLICY_LOSSES
from rlkit.testing import (
    ESTIMATOR_PROPERTIES,
    LOSS_PROPERTIES,
    PropertyResult,
    Report,
    check_estimator,
    check_loss,
    declared_inputs,
)
from rlkit.testing import strategies as S

ROOT = Path(__file__).resolve().parents[1]
ESTIMATOR_NAMES = ESTIMATORS.names()
LOSS_NAMES = POLICY_LOSSES.names()
#: Planted-bug sweeps only need pass / fail: fewer inputs, no shrinking.
QUICK = {"max_examples": 20, "shrink": False}


# -- the built-ins pass ---------------------------------------------------------------
@pytest.mark.parametrize("name", ESTIMATOR_NAMES)
def test_every_registered_estimator_passes_its_battery(name):
    report = check_estimator(name)
    report.assert_ok()
    extra = ESTIMATORS.entry(name).extra
    checked = {r.property for r in report}
    assert set(extra.get("properties", ())) <= checked  # the declared ones ran
    assert set(report.exempt) == set(extra.get("properties_exempt", ()))


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_every_registered_loss_passes_its_battery(name):
    report = check_loss(name)
    report.assert_ok()
    extra = POLICY_LOSSES.entry(name).extra
    assert set(extra.get("properties", ())) <= {r.property for r in report}
    assert set(report.exempt) == set(extra.get("properties_exempt", ()))


def test_the_documented_exemptions_and_declarations_of_the_built_ins():
    exempt = {n: ESTIMATORS.entry(n).extra.get("properties_exempt", ()) for n in ESTIMATOR_NAMES}
    no_groups = ("singleton_group_zero", "equal_scores_zero")
    assert {n for n, e in exempt.items() if e} == {
        "gae", "reinforce_plus_plus", "remax", "reinforce_plus_plus_baseline", "prime"
    }  # fmt: skip
    assert all(set(e) == set(no_groups) for e in exempt.values() if e)
    declared = lambda n: set(ESTIMATORS.entry(n).extra.get("properties", ()))  # noqa: E731
    assert {"group_zero_sum", "reward_scale_invariant"} <= declared("grpo")
    assert "group_zero_sum" in declared("rloo") and "group_token_zero_sum" in declared("opo")
    for name in ("kl_cov", "clip_cov"):
        assert "microbatch_invariance" in POLICY_LOSSES.entry(name).extra["properties_exempt"]
        assert "microbatch_invariance" in (POLICY_LOSSES.get(name).__doc__ or "")
    on_policy = {
        n for n in LOSS_NAMES
        if "reduces_to_vanilla_at_ratio_one" in POLICY_LOSSES.entry(n).extra.get("properties", ())
    }  # fmt: skip
    assert on_policy == set(LOSS_NAMES) - {"clip_cov"}


# -- planted bugs are caught ----------------------------------------------------------
def _estimator_declarations(name: str) -> dict:
    extra = ESTIMATORS.entry(name).extra
    return {
        "properties": extra.get("properties", ()),
        "exempt": extra.get("properties_exempt", ()),
        "needs_values": bool(extra.get("needs_values")),
        "needs_reward_baselines": bool(extra.get("needs_reward_baselines")),
        "inputs": tuple(extra.get("inputs", ())),
    }


def _loss_declarations(name: str) -> dict:
    extra = POLICY_LOSSES.entry(name).extra
    return {"properties": extra.get("properties", ()), "exempt": extra.get("properties_exempt", ())}


def mask_ignored(fn):
    def estimator(token_level_rewards, response_mask, **kw):
        return fn(token_level_rewards, torch.ones_like(response_mask), **kw)

    return estimator


def std_without_epsilon(fn):
    """The estimator's advantages divided by their group's std, with no epsilon."""

    def estimator(token_level_rewards, response_mask, *, index=None, **kw):
        advantages, returns = fn(token_level_rewards, response_mask, index=index, **kw)
        ids = torch.unique(torch.as_tensor(index), return_inverse=True)[1]
        valid = response_mask.bool()
        rows = (advantages * valid).sum(-1) / valid.sum(-1).clamp(min=1)
        zeros = rows.new_zeros(int(ids.max()) + 1 if ids.numel() else 0)
        size = zeros.index_add(0, ids, torch.ones_like(rows))
        mean = zeros.index_add(0, ids, rows) / size
        std = (zeros.index_add(0, ids, (rows - mean[ids]) ** 2) / (size - 1)).sqrt()
        return advantages / std[ids][:, None], returns

    return estimator


def one_group_for_the_batch(fn):
    """The group statistics taken over the whole batch (every row in group 0)."""

    def estimator(token_level_rewards, response_mask, *, index=None, **kw):
        whole = torch.zeros(token_level_rewards.shape[0], dtype=torch.long)
        return fn(token_level_rewards, response_mask, index=whole, **kw)

    return estimator


@pytest.mark.parametrize("name", ESTIMATOR_NAMES)
def test_an_estimator_that_ignores_the_mask_is_caught(name):
    report = check_estimator(
        mask_ignored(ESTIMATORS.get(name)),
        only=("zero_at_masked_tokens", "masked_inputs_ignored"),
        **_estimator_declarations(name),
        **QUICK,
    )
    assert report.failed == ["zero_at_masked_tokens", "masked_inputs_ignored"]


@pytest.mark.parametrize("name", ESTIMATOR_NAMES)
def test_an_estimator_divided_by_a_std_without_epsilon_is_caught(name):
    report = check_estimator(
        std_without_epsilon(ESTIMATORS.get(name)),
        only=("finite",),
        **_estimator_declarations(name),
        **QUICK,
    )
    assert report.failed == ["finite"]
    assert "= nan" in report["finite"].counterexample or "inf" in report["finite"].counterexample


GROUPED = [n for n in ESTIMATOR_NAMES if n not in ("gae", "reinforce_plus_plus", "remax")]


@pytest.mark.parametrize("name", GROUPED)
def test_an_estimator_whose_group_mean_is_the_batch_mean_is_caught(name):
    group_properties = (
        "singleton_group_zero",
        "equal_scores_zero",
        "group_zero_sum",
        "group_token_zero_sum",
        "group_shift_invariant",
        "group_local",
    )
    report = check_estimator(
        one_group_for_the_batch(ESTIMATORS.get(name)),
        only=group_properties,
        **_estimator_declarations(name),
        **QUICK,
    )
    assert report.results and report.failed, report.table()


def normalisers_dropped(fn):
    """The micro-batch's own counts instead of the mini-batch's normalisers."""

    def loss(old_log_prob, log_prob, advantages, response_mask, **kw):
        for key in ("num_tokens", "num_seqs", "norm_length"):
            kw.pop(key, None)
        return fn(old_log_prob, log_prob, advantages, response_mask, **kw)

    return loss


def loss_mask_ignored(fn):
    def loss(old_log_prob, log_prob, advantages, response_mask, **kw):
        return fn(old_log_prob, log_prob, advantages, torch.ones_like(response_mask), **kw)

    return loss


def gradient_into_padding(fn):
    def loss(old_log_prob, log_prob, advantages, response_mask, **kw):
        value, metrics = fn(old_log_prob, log_prob, advantages, response_mask, **kw)
        padding = torch.where(response_mask.bool(), 0.0, log_prob.clamp(min=-1.0))
        return value + 1e-3 * padding.sum(), metrics

    return loss


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_a_loss_that_drops_the_mini_batch_normalisers_is_caught(name):
    report = check_loss(
        normalisers_dropped(POLICY_LOSSES.get(name)),
        only=("aggregation_semantics", "microbatch_invariance"),
        **_loss_declarations(name),
        **QUICK,
    )
    assert "aggregation_semantics" in report.failed
    exempt = "microbatch_invariance" in _loss_declarations(name)["exempt"]
    assert exempt or "microbatch_invariance" in report.failed


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_a_loss_that_ignores_the_mask_is_caught(name):
    report = check_loss(
        loss_mask_ignored(POLICY_LOSSES.get(name)),
        only=("zero_grad_at_masked_tokens", "masked_inputs_ignored"),
        **_loss_declarations(name),
        **QUICK,
    )
    # Only the value is a sure sign: where the drawn advantages at padding are 0 (often),
    # a loss that ignores the mask still has no gradient there (gpg's −A·log π never does),
    # so whether zero_grad_at_masked_tokens also fails depends on the draws.
    assert "masked_inputs_ignored" in report.failed


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_a_loss_with_a_gradient_at_padding_is_caught(name):
    report = check_loss(
        gradient_into_padding(POLICY_LOSSES.get(name)),
        only=("zero_grad_at_masked_tokens",),
        **_loss_declarations(name),
        **QUICK,
    )
    assert report.failed == ["zero_grad_at_masked_tokens"]


# -- a hand-written flawed estimator, whole battery, shrunk counterexamples -------------
def grpo_no_eps(
    token_level_rewards,
    response_mask,
    *,
    index=None,
    values=None,
    reward_baselines=None,
    gamma=1.0,
    lam=1.0,
    norm_by_std=True,
    epsilon=1e-6,
    **options,
):
    """GRPO with the std division unguarded: (s - mean) / std."""
    if options:
        raise TypeError(sorted(options))
    mask = response_mask.to(token_level_rewards.dtype)
    scores = (token_level_rewards * mask).sum(-1)
    valid = (mask.sum(-1) > 0).to(scores.dtype)
    ids = torch.unique(torch.as_tensor(index), return_inverse=True)[1]
    zeros = scores.new_zeros(int(ids.max()) + 1 if ids.numel() else 0)
    size = zeros.index_add(0, ids, valid).clamp(min=1)
    mean = zeros.index_add(0, ids, scores * valid) / size
    centred = (scores - mean[ids]) * valid
    std = (zeros.index_add(0, ids, centred**2) / (size - 1)).sqrt()
    advantages = (centred / std[ids])[:, None] * mask
    return advantages, advantages


def test_a_flawed_grpo_fails_the_degenerate_properties_with_small_counterexamples():
    report = check_estimator(grpo_no_eps, properties=("group_zero_sum",))
    assert {"finite", "singleton_group_zero", "equal_scores_zero"} <= set(report.failed)
    assert "row_permutation_equivariance" in report.passed
    singleton = report["singleton_group_zero"].counterexample
    assert "alone in its group" in singleton and "nan" in singleton
    # Shrunk: the equal-scores counterexample is one group of two one-token responses.
    assert "response_mask = [[1], [1]]" in report["equal_scores_zero"].counterexample
    # The same run finds the same counterexamples (derandomised, fixed seed).
    again = check_estimator(
        grpo_no_eps, properties=("group_zero_sum",), only=("equal_scores_zero",)
    )
    assert again["equal_scores_zero"].counterexample == report["equal_scores_zero"].counterexample


# -- the report and the declarations ----------------------------------------------------
def test_the_report_lists_property_passed_counterexample_triples():
    report = check_estimator(grpo_no_eps, only=("signature", "equal_scores_zero"))
    assert isinstance(report, Report) and not report.ok
    triples = [tuple(r) for r in report]
    assert [t[:2] for t in triples] == [("signature", True), ("equal_scores_zero", False)]
    assert triples[0][2] is None and "->" in triples[1][2]
    assert all(isinstance(r, PropertyResult) and r.description for r in report)
    table = report.table()
    assert "equal_scores_zero" in table and "FAILED" in table and "1 passed, 1 failed" in table
    with pytest.raises(AssertionError, match="equal_scores_zero"):
        report.assert_ok()


def test_exemptions_and_declarations_select_the_properties():
    report = check_estimator("grpo", exempt=("finite",), properties=(), only=None, max_examples=5)
    assert "finite" not in {r.property for r in report} and report.exempt == ("finite",)
    plain = check_estimator(grpo_no_eps, only=("signature",))
    assert "group_zero_sum" not in {r.property for r in plain}
    with pytest.raises(ValueError, match="unknown estimator property"):
        check_estimator("grpo", properties=("group_sum_zero",))
    with pytest.raises(ValueError, match="checked for every estimator"):
        check_estimator("grpo", properties=("finite",))
    with pytest.raises(ValueError, match="unknown policy loss property"):
        check_loss("vanilla", exempt=("micro_batch_invariance",))


def test_a_registered_function_passed_as_a_callable_keeps_its_registration():
    # gae needs critic values and is exempt from the group properties.
    report = check_estimator(ESTIMATORS.get("gae"), only=("finite", "singleton_group_zero"))
    assert report.ok and report.exempt == ("singleton_group_zero",)


def test_a_missing_shared_keyword_fails_the_signature_property():
    def narrow(token_level_rewards, response_mask, index):
        return token_level_rewards, token_level_rewards

    report = check_estimator(narrow, only=("signature",))
    assert report.failed == ["signature"]
    assert "values" in report["signature"].counterexample


# -- declared extra inputs ---------------------------------------------------------------
def scaled_by_extra(
    token_level_rewards,
    response_mask,
    *,
    index=None,
    values=None,
    reward_baselines=None,
    gamma=1.0,
    lam=1.0,
    norm_by_std=True,
    epsilon=1e-6,
    token_bonus=None,
    **options,
):
    """Rewards plus a declared (B, T) input, summed over the row's valid tokens, per token."""
    if options:
        raise TypeError(sorted(options))
    if token_bonus is None:
        raise ValueError("needs token_bonus")
    mask = response_mask.to(token_level_rewards.dtype)
    total = ((token_level_rewards + token_bonus) * mask).sum(-1, keepdim=True) * mask
    return total, total


def bonus_unmasked(token_level_rewards, response_mask, *, token_bonus=None, **kw):
    """The same, reading the declared input at mask-0 tokens too."""
    adv, _ = scaled_by_extra(token_level_rewards, response_mask, token_bonus=token_bonus, **kw)
    leaked = adv + token_bonus.sum(-1, keepdim=True) * response_mask.to(adv.dtype)
    return leaked, leaked


def test_declared_inputs_are_read_from_the_registration():
    assert declared_inputs("prime") == ("process_rewards",)
    assert declared_inputs("grpo") == ()
    assert declared_inputs(scaled_by_extra) == ()  # not registered


def test_a_declared_input_is_drawn_and_passed_by_keyword():
    no_groups = ("singleton_group_zero", "equal_scores_zero")
    report = check_estimator(scaled_by_extra, inputs=("token_bonus",), exempt=no_groups)
    report.assert_ok()
    # Without the declaration the input is never passed: every drawn call raises.
    missing = check_estimator(scaled_by_extra, only=("finite",), **QUICK)
    assert missing.failed == ["finite"] and "needs token_bonus" in missing["finite"].counterexample


def test_an_estimator_that_reads_a_declared_input_at_padding_is_caught():
    report = check_estimator(
        bonus_unmasked,
        inputs=("token_bonus",),
        only=("masked_inputs_ignored", "empty_rows_ignored"),
        **QUICK,
    )
    assert report.failed == ["masked_inputs_ignored", "empty_rows_ignored"]


def test_a_declared_input_the_signature_cannot_take_fails_the_signature_property():
    def narrow(
        token_level_rewards,
        response_mask,
        *,
        index=None,
        values=None,
        reward_baselines=None,
        gamma=1.0,
        lam=1.0,
        norm_by_std=True,
        epsilon=1e-6,
    ):
        return token_level_rewards, token_level_rewards  # fmt: skip

    report = check_estimator(narrow, inputs=("token_bonus",), only=("signature",))
    assert report.failed == ["signature"]
    assert "token_bonus" in report["signature"].counterexample


@settings(max_examples=30, deadline=None, derandomize=True, database=None)
@given(S.estimator_inputs(extra_inputs=("process_rewards", "other")))
def test_declared_token_inputs_are_zero_at_mask_zero_tokens(case):
    mask = case["response_mask"]
    for name in ("process_rewards", "other"):
        assert case[name].shape == mask.shape and bool((case[name][~mask] == 0).all())


def test_the_catalogues_describe_every_property():
    for catalogue in (ESTIMATOR_PROPERTIES, LOSS_PROPERTIES):
        assert all(p.description and p.name == name for name, p in catalogue.items())
    assert ESTIMATOR_PROPERTIES["group_zero_sum"].optional
    assert not LOSS_PROPERTIES["microbatch_invariance"].optional


# -- the strategies draw what they document ------------------------------------------------
@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(S.response_masks(max_rows=5, max_len=7), S.response_masks(interior_masks=False))
def test_masks_are_left_aligned_runs_with_interior_spans_only(mask, plain):
    for row in mask:
        valid = row.nonzero().flatten()
        if valid.numel():
            assert valid[0] == 0  # left-aligned
            last = int(valid[-1])
            assert bool(row[last]) and bool(row[0])  # spans never touch the ends
    # Without interior spans every row is one run from position 0.
    lengths = plain.sum(-1, keepdim=True)
    assert torch.equal(plain, torch.arange(plain.shape[1]) < lengths)


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(st.data())
def test_group_layouts_and_inputs_have_the_documented_shapes(data):
    layout = data.draw(st.sampled_from(S.LAYOUTS))
    index = data.draw(S.group_indices(6, layouts=(layout,)))
    assert index.shape == (6,) and index.dtype == torch.long
    if layout == "singletons":
        assert index.unique().numel() == 6
    if layout == "dense":
        assert torch.equal(index, index.sort().values) and int(index.max()) < index.unique().numel()
    case = data.draw(S.estimator_inputs(reward_kind="outcome", values=False))
    mask = case["response_mask"]
    b, t = case["token_level_rewards"].shape
    assert mask.shape == (b, t) and case["index"].shape == (b,) and case["values"] is None
    assert bool((case["token_level_rewards"][~mask] == 0).all())
    assert bool(((case["token_level_rewards"] != 0).sum(-1) <= 1).all())  # one outcome reward


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(S.loss_inputs(max_log_ratio=0.0, per_sequence_advantages=True, padding=("-inf",)))
def test_on_policy_loss_inputs_have_ratio_one_and_per_sequence_advantages(case):
    mask = case["response_mask"]
    assert torch.equal(case["log_prob"][mask], case["old_log_prob"][mask])
    assert bool((case["log_prob"][~mask] == -torch.inf).all())
    adv = case["advantages"]
    assert bool((adv[~mask] == 0).all())
    for row, valid in zip(adv, mask):
        assert row[valid].unique().numel() <= 1


@settings(max_examples=30, deadline=None, derandomize=True, database=None)
@given(st.integers(0, 9).flatmap(lambda b: st.tuples(st.just(b), S.micro_batch_splits(b))))
def test_micro_batch_splits_cover_every_row_once(case):
    rows, slices = case
    covered = [r for s in slices for r in range(rows)[s]]
    assert covered == list(range(rows))


# -- rlkit check ---------------------------------------------------------------------
FLAWED = textwrap.dedent(
    '''
    import torch


    def ignores_the_mask(token_level_rewards, response_mask, **kw):
        """Outcome score broadcast to every token, padding included."""
        scores = token_level_rewards.sum(-1, keepdim=True)
        return scores.expand_as(token_level_rewards).clone(), scores.expand_as(token_level_rewards).clone()


    def helper(x):
        return x
    '''
)


def _rlkit(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rlkit.cli", "check", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_rlkit_check_passes_a_built_in_with_exit_status_0():
    proc = _rlkit("grpo", "--max-examples", "5", "--only", "finite", "--only", "group_zero_sum")
    assert proc.returncode == 0, proc.stderr
    assert "finite" in proc.stdout and "group_zero_sum" in proc.stdout
    assert "2 passed, 0 failed" in proc.stdout


def test_rlkit_check_prints_failures_with_counterexamples_and_exit_status_1(tmp_path):
    (tmp_path / "flawed.py").write_text(FLAWED)
    proc = _rlkit("flawed:ignores_the_mask", "--max-examples", "10", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "advantage estimator flawed:ignores_the_mask" in proc.stdout
    for line in proc.stdout.splitlines():
        if line.startswith("zero_at_masked_tokens"):
            assert line.split()[-1] == "FAILED"
    assert "response_mask = " in proc.stdout and "at a mask-0 token" in proc.stdout
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("no_such_module:fn", "cannot import module 'no_such_module'"),
        ("gpg", "names both an advantage estimator and a policy loss"),
    ],
)
def test_rlkit_check_bad_targets_give_one_message_and_exit_status_2(target, message):
    proc = _rlkit(target)
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("kit_flawed:no_such_function", "has no attribute 'no_such_function'"),
        ("kit_flawed:helper", "cannot tell whether 'kit_flawed:helper' is an estimator or a loss"),
        (
            "kit_broken:fn",
            "importing module 'kit_broken' ('kit_broken:fn') raised ZeroDivisionError",
        ),
        ("grop", "Did you mean 'grpo'?"),
        (":fn", "bad target"),
        ("vanilla --property no_such_property", "unknown policy loss property"),
    ],
)
def test_more_bad_targets_and_arguments_exit_with_status_2(
    tmp_path, monkeypatch, capsys, target, message
):
    from rlkit.check import main

    (tmp_path / "kit_flawed.py").write_text(FLAWED)
    (tmp_path / "kit_broken.py").write_text("1 / 0\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    for module in ("kit_flawed", "kit_broken"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    assert main(target.split()) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_rlkit_check_kind_flag_picks_the_registry():
    proc = _rlkit("gpg", "--kind", "loss", "--max-examples", "5", "--only", "finite")
    assert proc.returncode == 0, proc.stderr
    assert "policy loss gpg" in proc.stdout


HOSTILE = textwrap.dedent(
    """
    import ctypes
    import pathlib
    import time


    def segfaults(token_level_rewards, response_mask, **kw):
        if token_level_rewards.numel() > 0:
            ctypes.string_at(0)
        return token_level_rewards, token_level_rewards


    def never_returns(token_level_rewards, response_mask, **kw):
        pathlib.Path("started").touch()
        while True:
            time.sleep(0.01)
    """
)


def test_rlkit_check_names_the_signal_property_and_input_of_a_crash(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "hostile.py").write_text(HOSTILE)
    proc = _rlkit(
        "sub/hostile.py:segfaults", "--max-examples", "3", "--only", "finite", cwd=tmp_path
    )
    assert proc.returncode == 1
    assert "crashed (SIGSEGV) in property 'finite' on input 1:" in proc.stderr
    assert "token_level_rewards = " in proc.stderr and "Traceback" not in proc.stderr


def test_rlkit_check_stops_an_input_past_its_time_limit(tmp_path):
    (tmp_path / "hostile.py").write_text(HOSTILE)
    target = f"{tmp_path / 'hostile.py'}:never_returns"  # an absolute file path
    proc = _rlkit(target, "--only", "finite", "--timeout-s", "1", cwd=tmp_path)
    assert proc.returncode == 1
    assert "timed out after 1 s in property 'finite' on input 1:" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_rlkit_check_interrupted_says_so_in_one_line(tmp_path):
    (tmp_path / "hostile.py").write_text(HOSTILE)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rlkit.cli",
            "check",
            "hostile.py:never_returns",
            "--only",
            "finite",
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not (tmp_path / "started").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert err.strip() == "rlkit check: interrupted"
