"""docs/testing.md's flawed examples fail as the page shows; its tables match the kit."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from rlkit.registry import ESTIMATORS, POLICY_LOSSES
from rlkit.testing import ESTIMATOR_PROPERTIES, LOSS_PROPERTIES

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "testing.md").read_text()
TIMING = re.compile(r" \(\d+\.\d s\)$")


def _block(lang: str, starts_with: str) -> str:
    for block in re.findall(rf"```{lang}\n(.*?)```", DOC, flags=re.S):
        if block.startswith(starts_with):
            return block
    raise AssertionError(f"no ```{lang} block starting with {starts_with!r} in docs/testing.md")


def _failed(output: str) -> list[str]:
    return [line.split()[0] for line in output.splitlines() if line.endswith(" FAILED")]


def _without_timing(output: str) -> list[str]:
    return [TIMING.sub("", line) for line in output.strip().splitlines()]


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("project")
    (path / "my_flawed.py").write_text(_block("python", '"""Two deliberately flawed functions'))
    return path


@pytest.mark.parametrize(
    ("target", "expected_failures"),
    [
        (
            "my_flawed:grpo_no_eps",
            {"finite", "zero_at_masked_tokens", "empty_rows_ignored", "singleton_group_zero",
             "equal_scores_zero"},
        ),
        ("my_flawed:ppo_masked_mean", {"aggregation_semantics", "microbatch_invariance"}),
    ],
)  # fmt: skip
def test_rlkit_check_on_the_flawed_examples_prints_what_the_page_shows(
    project, target, expected_failures
):
    shown = _block("text", f"$ rlkit check {target}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "rlkit.cli", "check", target],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stderr
    assert set(_failed(proc.stdout)) == expected_failures
    assert _failed(shown.split("\n", 1)[1]) == _failed(proc.stdout)
    # The whole table, counterexamples included (the searches are derandomised).
    assert _without_timing(proc.stdout) == _without_timing(shown.split("\n", 1)[1])


def test_the_python_example_prints_what_the_page_shows(project):
    (project / "api_demo.py").write_text(
        _block("python", "from rlkit.testing import check_estimator\n\nreport")
    )
    proc = subprocess.run(
        [sys.executable, "api_demo.py"], cwd=project, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    shown = _block("text", "$ python api_demo.py\n").split("\n", 1)[1]
    assert proc.stdout.strip().splitlines() == shown.strip().splitlines()


def test_the_property_tables_list_every_property_of_the_kit():
    rows = dict(re.findall(r"^\| `(\w+)`(?: \(optional\))? \| (.+) \|$", DOC, flags=re.M))
    for catalogue in (ESTIMATOR_PROPERTIES, LOSS_PROPERTIES):
        for name, prop in catalogue.items():
            assert name in rows, name
            marked = f"| `{name}` (optional) |" in DOC
            assert marked == prop.optional, name


def test_the_built_ins_table_matches_the_registrations():
    section = DOC.split("| built-in | declares | exempt from (why) |", 1)[1].split("\n\n", 1)[0]
    rows = re.findall(r"^\| (.+?) \| (.+?) \| (.+?) \|$", section, flags=re.M)
    seen = set()
    for names, declares, exempt in rows:
        for name in re.findall(r"`(\w+)`", names):
            kind = "loss" if name in POLICY_LOSSES and "(estimator)" not in names else "estimator"
            registry = POLICY_LOSSES if kind == "loss" else ESTIMATORS
            extra = registry.entry(name).extra
            assert set(re.findall(r"`(\w+)`", declares)) == set(extra.get("properties", ())), name
            listed = set(re.findall(r"`(\w+)`", exempt))
            assert listed == set(extra.get("properties_exempt", ())), name
            seen.add((kind, name))
    expected = {("estimator", n) for n in ESTIMATORS.names()}
    expected |= {("loss", n) for n in POLICY_LOSSES.names()}
    assert seen == expected
