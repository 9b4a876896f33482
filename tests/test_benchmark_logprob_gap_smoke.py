"""benchmarks/logprob_gap.py runs at its tiniest size: a gap per precision, attention path
and step, each within the bound the trainer's guard uses (no timing)."""

from __future__ import annotations

from tests.benchmark_scripts import load_benchmark, tiniest_workload_argv


def test_each_precision_and_attention_path_reports_a_gap_within_the_guards_bound(tmp_path, capsys):
    benchmark = load_benchmark("logprob_gap.py")
    assert benchmark.main(["--gap-steps", "1"] + tiniest_workload_argv(tmp_path)) == 0
    rows = [
        [c.strip() for c in line.strip("|").split("|")]
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("| float32") or line.startswith("| bfloat16")
    ]
    assert [(r[0], r[1]) for r in rows] == [
        ("float32", "cpu_attention"),
        ("float32", "plain sdpa"),
        ("bfloat16", "cpu_attention"),
        ("bfloat16", "plain sdpa"),
    ]
    for precision, _, gap, bound in rows:
        assert 0 <= float(gap) <= float(bound), (precision, gap, bound)
