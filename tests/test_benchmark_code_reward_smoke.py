"""The code-reward throughput benchmark runs end to end on a few solutions (no timing)."""

from __future__ import annotations

import sys

import pytest

from tests.benchmark_scripts import load_benchmark

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the sandbox reads /proc and uses rlimits"
)


def test_benchmark_prints_a_row_per_worker_count_and_the_mix(capsys):
    benchmark = load_benchmark("code_reward_throughput.py")
    argv = ["--solutions", "8", "--rounds", "1", "--case-timeout-s", "0.5"]
    assert benchmark.main(argv) == 0
    out = capsys.readouterr().out
    table = [line for line in out.splitlines() if line.startswith("| ")]
    assert table[0].startswith("| workers |") and "solutions/s" in table[0]
    rows = [row.split("|") for row in table[1:3]]
    assert [row[1].strip() for row in rows] == ["1", "2"]
    assert float(rows[0][-2]) == 1.0 and float(rows[1][-2]) > 0
    mix = {row.split("|")[1].strip(): row for row in table[4:]}
    # Eight solutions: four correct, two wrong, one slow, one that raises.
    assert mix["correct"].split("|")[2:4] == [" 4 ", " 1.00 "]
    assert "timeout 1" in mix["slow"] and "runtime_error 4" in mix["error"]
    assert "scores identical across worker counts: yes" in out
