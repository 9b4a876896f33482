"""Roles declared by the algorithm: which a run builds, the order of their hooks, and a
user's own roles, loss and estimator reading new tensors by name without an rlkit edit."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlkit.registry import ROLES, UnknownNameError
from rlkit.trainer.algorithm import Algorithm
from rlkit.trainer.data_contract import DataContractError, input_problems
from rlkit.trainer.roles import Role
from tests.experiment_factory import run_one_step, small_experiment
from tests.gin_files import arithmetic_gin

REPO = Path(__file__).resolve().parents[1]
DOC = (REPO / "docs" / "extending.md").read_text()
TEACHER = "distill.py:TeacherRole"
DIFFICULTY = "difficulty.py:DifficultyRole"


def _doc_block(lang: str, first_line: str) -> str:
    blocks = re.findall(rf"```{lang}\n(.*?)```", DOC, flags=re.S)
    return next(b for b in blocks if b.startswith(first_line))


@pytest.fixture
def user_files(tmp_path, monkeypatch):
    """docs/extending.md's ``distill.py`` and ``difficulty.py``, in the working folder."""
    (tmp_path / "distill.py").write_text(_doc_block("python", '"""On-policy distillation'))
    (tmp_path / "difficulty.py").write_text(_doc_block("python", '"""A per-response weight'))
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    # The files register their functions by name: free the names for the next copy.
    from rlkit.registry import ESTIMATORS, POLICY_LOSSES

    for registry, name in ((POLICY_LOSSES, "ppo_distill"), (ESTIMATORS, "difficulty_grpo")):
        if name in registry:
            registry.unregister(name)


@pytest.mark.parametrize(
    ("sections", "roles"),
    [
        ({}, ("actor",)),
        ({"algorithm": {"use_kl_loss": True}}, ("actor", "reference")),
        ({"algorithm": {"adv_estimator": "gae"}}, ("actor", "critic")),
        (
            {"algorithm": {"adv_estimator": "prime"}},
            ("actor", "reference", "implicit_prm"),
        ),
        ({"algorithm": {"roles": (TEACHER,)}}, ("actor", TEACHER)),
        # rlkit's roles first, then the user's in the order named ...
        (
            {"algorithm": {"adv_estimator": "gae", "roles": (DIFFICULTY, TEACHER)}},
            ("actor", "critic", DIFFICULTY, TEACHER),
        ),
        # ... unless one reads what another provides: the provider runs first.
        (
            {"algorithm": {"roles": ("reader.py:Reader", DIFFICULTY)}},
            ("actor", DIFFICULTY, "reader.py:Reader"),
        ),
    ],
)
def test_the_roles_follow_from_what_the_run_reads(tmp_path, user_files, sections, roles):
    (user_files / "reader.py").write_text(
        "from rlkit.trainer.roles import Role\n\n\n"
        "class Reader(Role):\n    inputs = ('difficulty_weight',)\n"
    )
    assert Algorithm(small_experiment("unused", tmp_path, **sections)).roles == roles


def test_providers_that_read_each_other_are_a_cycle_named_as_such(tmp_path, user_files):
    (user_files / "loop.py").write_text(
        "from rlkit.trainer.roles import Role\n\n\n"
        "class A(Role):\n    provides = ('a',)\n    inputs = ('b',)\n\n\n"
        "class B(Role):\n    provides = ('b',)\n    inputs = ('a',)\n"
    )
    cfg = small_experiment("unused", tmp_path, algorithm={"roles": ("loop.py:A", "loop.py:B")})
    (problem,) = input_problems(cfg)
    assert problem.startswith("roles ['loop.py:A', 'loop.py:B'] read each other's inputs")


def test_an_input_nobody_provides_is_one_configuration_problem_naming_what_is_available(
    tmp_path, user_files
):
    cfg = small_experiment("unused", tmp_path, algorithm={"policy_loss": "distill.py:ppo_distill"})
    (problem,) = input_problems(cfg)
    assert problem.startswith(
        "policy loss 'distill.py:ppo_distill' reads the input 'teacher_log_prob', which "
        "nothing in this run provides; available: ["
    )
    assert "'ref_log_prob'" in problem and "'rollout_log_prob'" in problem
    assert "provides = ('teacher_log_prob',)" in problem
    with pytest.raises(DataContractError, match="teacher_log_prob"):
        Algorithm(cfg)


def test_role_options_are_checked_against_the_roles_options_type(tmp_path, user_files):
    cfg = small_experiment(
        "unused",
        tmp_path,
        algorithm={
            "roles": (TEACHER, DIFFICULTY),
            "role_options": {
                TEACHER: {"path": "x", "temperature": 2.0},
                DIFFICULTY: {"floor": 0.2},
                "ghost.py:Role": {},
            },
        },
    )
    problems = input_problems(cfg)
    assert problems == [
        "AlgorithmConfig.role_options for TeacherRole: unknown option(s) ['temperature']; "
        "TeacherOptions has ['path']",
        "AlgorithmConfig.role_options names 'ghost.py:Role', which is not in "
        f"AlgorithmConfig.roles {[TEACHER, DIFFICULTY]}: add it there, or remove its options",
    ]
    cfg.algorithm = dataclasses.replace(cfg.algorithm, role_options={TEACHER: {}})
    assert "missing 1 required positional argument: 'path'" in input_problems(cfg)[0]
    cfg.algorithm = dataclasses.replace(cfg.algorithm, role_options={TEACHER: "path=x"})
    assert input_problems(cfg) == [
        f"AlgorithmConfig.role_options[{TEACHER!r}] must be a dict of the role's options, "
        "got str 'path=x'"
    ]


def test_two_roles_providing_one_name_or_a_batch_field_are_refused(tmp_path, user_files):
    (user_files / "clash.py").write_text(
        "from rlkit.trainer.roles import Role\n\n\n"
        "class Again(Role):\n    provides = ('teacher_log_prob',)\n\n\n"
        "class Scores(Role):\n    provides = ('scores',)\n"
    )
    cfg = small_experiment(
        "unused",
        tmp_path,
        algorithm={"roles": (TEACHER, "clash.py:Again", "clash.py:Scores")},
    )
    problems = input_problems(cfg)
    assert problems[0].startswith(
        "'teacher_log_prob' is provided by both role 'distill.py:TeacherRole' and role "
        "'clash.py:Again'"
    )
    assert problems[1].startswith("role 'clash.py:Scores' provides 'scores', the name of a")


def test_every_built_in_role_is_registered_and_a_role():
    for name in ("actor", "reference", "critic", "reward_model", "implicit_prm"):
        assert issubclass(ROLES.get(name), Role)
    with pytest.raises(UnknownNameError, match="teachr"):
        ROLES.get("teachr")
    # The built-in roles provide what the batch no longer keeps fields for.
    assert ROLES.get("reference").provides == ("ref_log_prob",)
    assert ROLES.get("critic").provides == ("values",)
    assert "process_rewards" in ROLES.get("implicit_prm").provides


def test_critic_updates_before_the_actor():
    assert ROLES.get("critic").update_order < ROLES.get("actor").update_order


def test_the_difficulty_role_weights_grpo_per_response_by_hand(tmp_path, user_files):
    from rlkit.trainer.roles.role import RoleContext
    from tests.test_trainer_algorithm import _tool_batch

    cfg = small_experiment(
        "unused",
        tmp_path,
        algorithm={
            "adv_estimator": "difficulty.py:difficulty_grpo",
            "roles": (DIFFICULTY,),
            "role_options": {DIFFICULTY: {"floor": 0.25}},
        },
    )
    algo = Algorithm(cfg)
    ctx = RoleContext(cfg, None, algo, None, None, print, lambda: 0, name=DIFFICULTY)
    role = ROLES.get(DIFFICULTY)(ctx)
    batch = _tool_batch()  # one group of two responses, acc (1, 0), scores (1, 0)
    metrics = role.forward(batch)
    # Group accuracy 0.5: w = 0.25 + 0.75 * (1 - 0.5) = 0.625 for both responses.
    assert batch.extras["difficulty_weight"].tolist() == [0.625, 0.625]
    assert metrics == {"difficulty/weight_mean": 0.625}
    algo.compute_advantages(batch)
    # GRPO alone: ±0.5 / std(1, 0) = ±0.7071 on the sampled tokens t = 0, 3; times 0.625.
    a = 0.625 * 0.5 / math.sqrt(0.5)
    expected = torch.tensor([[a, 0, 0, a], [-a, 0, 0, -a]])
    torch.testing.assert_close(batch.advantages, expected, rtol=1e-5, atol=1e-6)


def _distill_run(model: str, teacher: str, out: Path, **more) -> dict:
    algorithm = {
        "adv_estimator": "difficulty.py:difficulty_grpo",
        "policy_loss": "distill.py:ppo_distill",
        "loss_options": {"distill_coef": 0.1},
        "roles": (TEACHER, DIFFICULTY),
        "role_options": {TEACHER: {"path": teacher}, DIFFICULTY: {"floor": 0.25}},
    }
    return small_experiment(model, out, algorithm=algorithm, trainer={"total_steps": 1}, **more)


def test_a_users_teacher_loss_and_difficulty_estimator_train_without_an_rlkit_edit(
    tiny_model_dir, demo_model_dir, tmp_path, user_files
):
    run = run_one_step(_distill_run(demo_model_dir, tiny_model_dir, tmp_path / "run"))
    kl = run.metrics["actor/reverse_kl"]  # the loss's own metric, logged
    # A warmed-up policy against a random teacher (same byte vocabulary): the teacher
    # gives the sampled tokens far less probability, a clearly positive gap per token.
    assert math.isfinite(kl) and kl > 0.1
    assert run.metrics["timing_s/teacher"] > 0
    assert 0.25 <= run.metrics["difficulty/weight_mean"] <= 1.0
    assert run.metrics["actor/pg_clipfrac"] >= 0  # vanilla's metrics come along
    moved = any(not torch.equal(run.initial[n], p) for n, p in run.params.items())
    assert moved


def test_the_distillation_term_adds_the_sampled_reverse_kl_with_its_score_gradient(
    user_files,
):
    import algorithms
    from rlkit.registry import POLICY_LOSSES

    POLICY_LOSSES.entry("distill.py:ppo_distill")  # imports the file, which registers it
    log_prob = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    teacher = torch.tensor([[-1.5, -1.0, -9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    zero = torch.zeros(1, 3)
    loss, metrics = algorithms.get_loss("ppo_distill")(
        log_prob.detach(), log_prob, zero, mask, teacher_log_prob=teacher, distill_coef=0.5
    )
    loss.backward()
    # Advantages 0: the clip term is 0. gap = log pi - log pi_teacher = (0.5, -1.0) on the
    # two sampled tokens; token-mean: 0.5 * (0.5 - 1.0) / 2 = -0.125.
    assert loss.item() == pytest.approx(-0.125)
    assert metrics["reverse_kl"].item() == pytest.approx(-0.25)
    # Gradient 0.5 * gap / 2 per sampled token, 0 on the unsampled one.
    assert log_prob.grad.tolist() == [[0.125, -0.25, 0.0]]


@pytest.mark.parametrize(
    "settings",
    [
        {"optim": {"micro_batch_size": 3}},
        {
            "optim": {"use_dynamic_bsz": True, "max_token_len_per_micro_batch": 40},
            "model": {"use_remove_padding": True},
        },
        {"model": {"share_prompt_prefix": True}, "optim": {"micro_batch_size": 5}},
    ],
    ids=["rows", "token_budget_packed", "shared_prompts"],
)
def test_each_micro_batch_receives_its_own_rows_of_every_extra(
    demo_model_dir, tmp_path, extras_checks, settings
):
    model = settings.pop("model", {})
    cfg = small_experiment(
        demo_model_dir,
        tmp_path / "run",
        algorithm={
            "adv_estimator": "checked_grpo",
            "policy_loss": "checked_vanilla",
            "roles": ("tests.extras_checks:StampRole",),
        },
        trainer={"total_steps": 1},
        model={"path": str(demo_model_dir), **model},
        **settings,
    )
    run = run_one_step(cfg)
    assert run.metrics["actor/stamps_ok"] == 1.0


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize(
    "split",
    [{}, {"ModelConfig.ulysses_sequence_parallel_size": 2}],
    ids=["data_parallel", "ulysses"],
)
def test_extras_follow_the_rows_over_two_fsdp_processes(demo_model_dir, tmp_path, split):
    # Two data-parallel shares, or one Ulysses group whose two processes split every
    # packed sequence: either way each loss call gets its micro-batch's rows of the extras.
    from tests.distributed.test_trainer_two_processes import train_two_processes

    out = tmp_path / "run"
    bindings = split | {
        "AlgorithmConfig.adv_estimator": "tests.extras_checks:checked_grpo",
        "AlgorithmConfig.policy_loss": "tests.extras_checks:checked_vanilla",
        "AlgorithmConfig.roles": ["tests.extras_checks:StampRole"],
        "OptimConfig.ppo_mini_batch_size": 2,
        "OptimConfig.use_dynamic_bsz": True,
        "OptimConfig.max_token_len_per_micro_batch": 40,
        "ModelConfig.use_remove_padding": True,
        "TrainerConfig.total_steps": 1,
        "TrainerConfig.save_at_end": False,
    }
    train_two_processes(arithmetic_gin(demo_model_dir, out, bindings), tmp_path)
    last = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["actor/stamps_ok"] == 1.0


def test_a_loss_reading_a_missing_input_stops_rlkit_train_with_one_line_and_exit_2(
    tiny_model_dir, tmp_path, user_files
):
    cfg = tmp_path / "experiment.gin"
    bindings = {
        "AlgorithmConfig.policy_loss": "distill.py:ppo_distill",
        "OptimConfig.ppo_mini_batch_size": 4,
    }
    cfg.write_text(arithmetic_gin(tiny_model_dir, tmp_path / "run", bindings))
    proc = subprocess.run(
        [sys.executable, "-m", "rlkit.train", str(cfg)],
        cwd=user_files,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    # One message: the configuration's header and its one problem.
    header, problem = [line for line in proc.stderr.splitlines() if line.strip()]
    assert header == "rlkit train: invalid experiment configuration:"
    assert problem.startswith("  - policy loss 'distill.py:ppo_distill' reads the input ")
    # Stopped at the configuration: no model was loaded, no run directory written.
    assert not (tmp_path / "run").exists()
