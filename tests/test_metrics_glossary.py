"""Every metric a training step logs is in docs/metrics.md (the glossary is checked
against real runs, so a new metric cannot land undocumented)."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

import pytest

from rlkit.trainer.trainer import RLTrainer
from tests.experiment_factory import small_experiment

GLOSSARY = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"


def documented_names() -> set[str]:
    """Backticked names, with ``<placeholder>`` turned into a ``*`` wildcard."""
    out = set()
    for raw in re.findall(r"`([^`\s]+)`", GLOSSARY.read_text()):
        if re.fullmatch(r"[a-z_]+/\*", raw):
            continue  # a section's whole family (`actor/*`, a heading) documents no member
        name = re.sub(r"<[^>]+>", "*", raw)
        if "*" in name and not re.match(r"[a-z_]+/", name):
            continue  # a wildcard keeps a family in front (not a path like `<output_dir>/x`)
        out.add(name)
    return out


def is_documented(key: str, names: set[str]) -> bool:
    if key in names or any("*" in n and fnmatch.fnmatchcase(key, n) for n in names):
        return True
    # A row such as "`global_seqlen/min`, `max`": a bare name after a family's full one.
    family, _, last = key.rpartition("/")
    return last in names and any(n.startswith(family + "/") for n in names)


@pytest.fixture(scope="module")
def logged_keys(demo_model_dir, tmp_path_factory) -> set[str]:
    root = tmp_path_factory.mktemp("glossary")
    runs = {
        # Critic, KL in the reward, a checkpoint, validation.
        "ppo": {"algorithm": {"adv_estimator": "gae", "use_kl_in_reward": True}},
        # A KL loss against the reference, DAPO's overlong shaping.
        "grpo": {"algorithm": {"use_kl_loss": True, "overlong_buffer_len": 2}},
    }
    keys: set[str] = set()
    for name, sections in runs.items():
        cfg = small_experiment(demo_model_dir, root / name, trainer={"total_steps": 1}, **sections)
        keys |= set(RLTrainer(cfg).run()[-1])
    return keys


def test_every_logged_metric_is_in_the_glossary(logged_keys):
    names = documented_names()
    missing = sorted(k for k in logged_keys if not is_documented(k, names))
    assert not missing, f"metrics logged but not in docs/metrics.md: {missing}"


def test_the_check_itself_tells_documented_from_undocumented_names():
    names = documented_names()
    assert is_documented("global_seqlen/balanced_max", names)
    assert is_documented("val/gsm8k/pass@4", names)
    assert is_documented("timing_s/generate_sequences", names)
    assert not is_documented("actor/made_up_metric", names)


def test_lengths_of_right_and_wrong_responses_are_logged_apart():
    import torch

    from rlkit.trainer.metrics import lengths_by_correctness

    lengths = torch.tensor([4, 10, 6, 20])
    acc = torch.tensor([1.0, 0.0, 1.0, 0.0])
    # right: (4 + 6) / 2 = 5; wrong: (10 + 20) / 2 = 15
    assert lengths_by_correctness(lengths, acc) == {
        "response_length/correct/mean": 5.0,
        "response_length/incorrect/mean": 15.0,
    }
    # every answer wrong: no "correct" key rather than a 0 that reads as a length
    assert lengths_by_correctness(lengths[1::2], acc[1::2]) == {
        "response_length/incorrect/mean": 15.0
    }
