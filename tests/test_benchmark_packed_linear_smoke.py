"""The packed-linear benchmark runs end to end on tiny models (no timing assertions)."""

from __future__ import annotations

import torch

from tests.benchmark_scripts import load_benchmark


def test_benchmark_prints_a_row_per_model_and_dtype_with_bf16_bitwise_equal(capsys):
    benchmark = load_benchmark("packed_linear.py")
    # 256 x 1024 MLP weights are packed in both dtypes; 128 x 512 in bf16 only.
    argv = ["--models", "256x1,128x1", "--rows", "4", "--rounds", "2", "--seconds", "0.02"]
    assert benchmark.main(argv) == 0
    rows = [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("| ") and not line.startswith("| model")
    ]
    bf16 = torch.ops.mkldnn._is_mkldnn_bf16_supported()
    dtypes = ["float32", "bf16"] if bf16 else ["float32"]
    models = ("256x1", "128x1")
    assert [(row[0], row[1]) for row in rows] == [(m, d) for m in models for d in dtypes]
    for row in rows:
        assert all(float(cell) > 0 for cell in row[2:5])  # plain, packed, their ratio
    differences = {(row[0], row[1]): float(row[5]) for row in rows}
    assert 0 < differences["256x1", "float32"] <= 1e-5  # packed: another kernel's rounding
    assert differences["128x1", "float32"] == 0  # too small to pack: F.linear both ways
    if bf16:
        assert differences["256x1", "bf16"] == differences["128x1", "bf16"] == 0
