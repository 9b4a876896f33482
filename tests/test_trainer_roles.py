"""Roles declared by the algorithm: which a run builds, the order of their hooks, and a
user's own role (a distillation teacher) added without touching the trainer."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from rlkit.registry import ROLES, UnknownNameError
from rlkit.trainer.algorithm import Algorithm
from rlkit.trainer.roles import Role
from tests.experiment_factory import run_one_step, small_experiment

DOC = (Path(__file__).resolve().parents[1] / "docs" / "extending.md").read_text()
TEACHER = "teacher.py:TeacherRole"


@pytest.fixture
def teacher_file(tmp_path, monkeypatch):
    """docs/extending.md's teacher role, written to ``teacher.py`` in the working folder."""
    blocks = re.findall(r"```python\n(.*?)```", DOC, flags=re.S)
    (tmp_path / "teacher.py").write_text(next(b for b in blocks if "class TeacherRole" in b))
    monkeypatch.chdir(tmp_path)
    return TEACHER


@pytest.mark.parametrize(
    ("preset", "sections", "roles"),
    [
        ("grpo", {}, ("actor",)),
        ("grpo", {"algorithm": {"use_kl_loss": True}}, ("actor", "reference")),
        ("gae", {"algorithm": {"adv_estimator": "gae"}}, ("actor", "critic")),
        (
            "prime",
            {"algorithm": {"adv_estimator": "prime"}},
            ("actor", "reference", "implicit_prm"),
        ),
        ("extra", {"algorithm": {"roles": (TEACHER,)}}, ("actor", TEACHER)),
    ],
)
def test_the_algorithm_declares_the_roles_a_run_needs(tmp_path, preset, sections, roles):
    cfg = small_experiment("unused", tmp_path, **sections)
    assert Algorithm(cfg).roles == roles


def test_every_built_in_role_is_registered_and_a_role():
    for name in ("actor", "reference", "critic", "reward_model", "implicit_prm"):
        assert issubclass(ROLES.get(name), Role)
    with pytest.raises(UnknownNameError, match="teachr"):
        ROLES.get("teachr")


def test_critic_updates_before_the_actor():
    assert ROLES.get("critic").update_order < ROLES.get("actor").update_order


def test_a_users_teacher_role_shapes_the_rewards_without_a_trainer_change(
    tiny_model_dir, demo_model_dir, tmp_path, teacher_file
):
    cfg = small_experiment(
        demo_model_dir,
        tmp_path / "run",
        algorithm={"roles": (TEACHER,), "role_options": {TEACHER: {"path": tiny_model_dir}}},
        trainer={"total_steps": 1},
    )
    run = run_one_step(cfg)
    kl = run.metrics["teacher/reverse_kl"]
    # A warmed-up policy against a random teacher (same byte vocabulary): the teacher
    # gives its sampled tokens far less probability, a clearly positive gap per token.
    assert math.isfinite(kl) and kl > 0.1
    assert run.metrics["timing_s/teacher"] > 0
    # The rewards the advantages saw include the teacher's negative term: their mean is
    # below the mean outcome score (exact_match: 0 or 1 per response).
    assert run.metrics["critic/rewards/mean"] < run.metrics["critic/score/mean"]
