"""The shared-prefix attention benchmark runs end to end at small sizes (no timing
assertions)."""

from __future__ import annotations

from tests.benchmark_scripts import load_benchmark


def test_benchmark_prints_both_layouts_batches_and_the_same_results(capsys):
    benchmark = load_benchmark("segmented_attention.py")
    args = ["--shapes", "4x60x3,5x3x3", "--heads", "2", "--kv-heads", "1", "--head-dim", "8"]
    assert benchmark.main([*args, "--repeats", "2"]) == 0
    rows = [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("| ") and not line.startswith("| prompt")
    ]
    assert [row[0] for row in rows] == ["4x60x3", "5x3x3"]
    # 4 + 3 x 60 = 184 tokens per segment, 2 segments: one row each over 184 x 184, or
    # per response a run of 64 queries over 64 keys (the prompt with the first response,
    # then 60 response queries over 4 + 60 keys). 5 + 3 x 3 = 14 tokens: gathering the
    # prompt's keys per response costs more than it saves, so both layouts are the same.
    assert [row[1] for row in rows] == ["2x184x184", "2x14x14"]
    assert [row[3] for row in rows] == ["6x64x64", "2x14x14"]
    for row in rows:
        assert row[5].endswith("x")
        assert float(row[6]) < 1e-4  # the same outputs and gradients
