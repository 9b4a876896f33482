"""benchmarks/profile_step.py profiles a warm rlkit step at its tiniest size (no timing
assertions): every phase's operators are charged to it and sorted into categories."""

from __future__ import annotations

from tests.benchmark_scripts import load_benchmark, tiniest_workload_argv


def test_the_profile_table_charges_each_phases_operators_to_categories(tmp_path, capsys):
    benchmark = load_benchmark("profile_step.py")
    argv = ["--warm-steps", "1", "--profiled-steps", "1"] + tiniest_workload_argv(tmp_path)
    assert benchmark.main(argv) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("| phase |"))
    cells = [c.strip() for c in header.strip("|").split("|")]
    assert cells[4:11] == list(benchmark.CATEGORIES)
    rows = {
        line.split("|")[1].strip(): [c.strip() for c in line.strip("|").split("|")]
        for line in out.splitlines()
        if line.startswith("| ") and "---" not in line and not line.startswith("| phase")
    }
    for phase in ("gen", "update_actor"):
        shares = [int(c.split("(")[1].rstrip("%)")) for c in rows[phase][4:11]]
        # Every microsecond of the phase is in exactly one category (rounding aside).
        assert 95 <= sum(shares) <= 105, (phase, shares)
        assert shares[0] > 0  # the model's products are matmuls
    assert "top operators in update_actor" in out


def test_matmul_flops_read_from_the_recorded_shapes():
    benchmark = load_benchmark("profile_step.py")
    # mm (3 x 4) @ (4 x 5): 2 x 3 x 4 x 5 = 120; addmm's bias first; bmm 2 x (3 x 4 @ 4 x 5).
    assert benchmark.matmul_flops("aten::mm", [[3, 4], [4, 5]]) == 120
    assert benchmark.matmul_flops("aten::addmm", [[5], [3, 4], [4, 5], [], []]) == 120
    assert benchmark.matmul_flops("aten::bmm", [[2, 3, 4], [2, 4, 5]]) == 240
    # A packed linear layer: (2 x 3 rows, 4 in) times (5 out, 4 in): 2 * 6 * 4 * 5.
    packed = [[2, 3, 4], [5, 4], [], [], [], []]
    assert benchmark.matmul_flops("mkldnn::_linear_pointwise", packed) == 240
    assert benchmark.matmul_flops("aten::mm", []) == 0
