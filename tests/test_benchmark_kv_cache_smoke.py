"""The KV-cache benchmark runs end to end on a tiny decoder (no timing assertions)."""

from __future__ import annotations

from rlkit.rollout.embedded.kv_cache import in_place_cache
from tests.benchmark_scripts import load_benchmark


def test_benchmark_prints_a_row_per_shape_with_the_same_samples_from_both_caches(capsys):
    sizes = ["--hidden-size", "16", "--layers", "2", "--prompts", "2", "--n", "3"]
    benchmark = load_benchmark("kv_cache.py")
    assert benchmark.main([*sizes, "--shapes", "5x6,9x4", "--pairs", "2"]) == 0
    rows = [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("| ") and not line.startswith("| prompt")
    ]
    assert [row[0] for row in rows] == ["5 + 6", "9 + 4"]
    for row in rows:
        assert len(row[3].split(" / ")) == 2  # one ratio per pair
        assert row[-1] == "yes"  # bitwise the same tokens and log-probs
    # The baseline swap is undone: the decode loop builds the in-place cache again.
    assert benchmark.kv_decode.in_place_cache is in_place_cache
