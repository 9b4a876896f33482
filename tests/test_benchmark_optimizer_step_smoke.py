"""The optimizer-step benchmark runs end to end on a tiny decoder (no timing assertions)."""

from __future__ import annotations

import argparse
import math

from rlkit.trainer.config import OPTIMIZER_IMPLEMENTATIONS
from tests.benchmark_scripts import load_benchmark


def test_benchmark_prints_every_implementation_with_the_same_update(capsys):
    sizes = ["--hidden-size", "8", "--layers", "2", "--intermediate-size", "16"]
    assert (
        load_benchmark("optimizer_step.py").main(
            [*sizes, "--kv-size", "4", "--vocab", "11", "--repeats", "2"]
        )
        == 0
    )
    rows = [
        line.split("|") for line in capsys.readouterr().out.splitlines() if line.startswith("| ")
    ]
    assert [row[1].strip() for row in rows[1:]] == list(OPTIMIZER_IMPLEMENTATIONS)
    for row in rows[1:]:
        assert float(row[-2]) < 1e-6, row  # the same AdamW update to float rounding


def test_benchmark_parameters_are_a_qwen2_decoder_with_an_untied_head():
    benchmark = load_benchmark("optimizer_step.py")
    args = argparse.Namespace(hidden_size=8, layers=2, intermediate_size=16, kv_size=4, vocab=11)
    count = sum(math.prod(shape) for shape in benchmark.decoder_shapes(args))
    # Per layer: q 8x8 + 8, k and v 4x8 + 4 each, o 8x8, gate and up 16x8, down 8x16, two
    # norms of 8: 72 + 72 + 64 + 384 + 16 = 608. Embedding and head 11x8 = 88 each, the
    # final norm 8: 2 * 608 + 88 + 88 + 8 = 1,400.
    assert count == 1400
