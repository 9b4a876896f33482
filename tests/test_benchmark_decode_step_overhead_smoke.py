"""The decode-step overhead benchmark runs end to end on a tiny model (no timing assertions)."""

from __future__ import annotations

import pytest
import torch

from tests.benchmark_scripts import load_benchmark

TINY = ["--hidden-size", "64", "--layers", "2", "--max-new-tokens", "3", "--rounds", "1"]


def _rows(out: str) -> dict[str, list[str]]:
    cells = [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in out.splitlines()
        if line.startswith("| ") and not line.startswith("| decode step")
    ]
    return {row[0]: row[1:] for row in cells}


@pytest.mark.parametrize("precision", ["no", "bf16"])
@pytest.mark.parametrize("prompt_tokens", ["5", "40"])  # 40: each group's prompt read once
def test_the_direct_step_gives_the_models_log_probs_bitwise(capsys, precision, prompt_tokens):
    if precision == "bf16" and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        pytest.skip("oneDNN has no bf16 kernels on this CPU")
    benchmark = load_benchmark("decode_step_overhead.py")
    argv = [*TINY, "--mixed-precision", precision, "--prompt-tokens", prompt_tokens]
    assert benchmark.main(argv) == 0
    rows = _rows(capsys.readouterr().out)
    assert list(rows) == ["model", "direct"]
    assert rows["model"][1:] == ["1.000", "reference"]
    assert rows["direct"][2] == "bitwise the same"
    assert float(rows["direct"][0]) > 0 and float(rows["direct"][1]) > 0


def test_the_benchmark_restores_the_decode_loops_own_step():
    benchmark = load_benchmark("decode_step_overhead.py")
    own = benchmark.kv_decode._Stepper.decode
    assert benchmark.main(TINY) == 0
    assert benchmark.kv_decode._Stepper.decode is own


def test_a_direct_step_with_other_arithmetic_fails_the_run(capsys, monkeypatch):
    benchmark = load_benchmark("decode_step_overhead.py")
    exact = benchmark.direct_step

    def off_by_a_little(model):
        step = exact(model)
        return lambda *args: step(*args) * (1 + 1e-3)  # a temperature of 1/1.001

    monkeypatch.setattr(benchmark, "direct_step", off_by_a_little)
    assert benchmark.main(TINY) == 1
    assert _rows(capsys.readouterr().out)["direct"][2] == "DIFFER"
