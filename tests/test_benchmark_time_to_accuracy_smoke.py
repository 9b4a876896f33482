"""The time-to-accuracy benchmark (rlkit vs TRL) at its tiniest size, and its arithmetic
(no timing assertions). TRL is imported without a skip: CI installs it."""

from __future__ import annotations

import trl  # noqa: F401  (fails loudly when the bench extra is not installed)

from tests.benchmark_scripts import load_benchmark


def test_time_to_a_threshold_is_the_first_evaluation_at_or_above_it():
    benchmark = load_benchmark("time_to_accuracy.py")
    # (step, training seconds, accuracy)
    a = [(0, 0.0, 0.40), (10, 5.0, 0.62), (20, 9.0, 0.71)]
    b = [(0, 0.0, 0.40), (10, 6.0, 0.58), (20, 11.0, 0.69)]
    assert benchmark.time_to(a, 0.6) == 5.0 and benchmark.time_to(a, 0.7) == 9.0
    assert benchmark.time_to(b, 0.7) is None
    # 60%: seconds 5.0 and 11.0, median 8.0, both reached; 70%: one of two, no median
    assert benchmark.median_time([a, b], 0.6) == (8.0, 2)
    assert benchmark.median_time([a, b], 0.7) == (None, 1)


def test_the_clock_leaves_evaluations_out(monkeypatch):
    benchmark = load_benchmark("time_to_accuracy.py")
    now = iter([100.0, 103.0, 107.0])  # start; step 1 ends at +3 s; its evaluation takes 4 s
    monkeypatch.setattr(benchmark.time, "perf_counter", lambda: next(now))
    curve = benchmark.Curve(lambda model: 0.5, every=1)
    curve.begin(None)
    curve.after_step(1, None)
    assert curve.points == [(0, 0.0, 0.5), (1, 3.0, 0.5)]
    assert curve.evaluating == 4.0


def test_both_frameworks_train_and_are_evaluated_from_the_same_start(demo_model_dir, capsys):
    benchmark = load_benchmark("time_to_accuracy.py")
    argv = ["--model", str(demo_model_dir), "--seeds", "0", "--steps", "2", "--eval-every", "1"]
    argv += ["--prompts-per-step", "2", "--group-size", "2", "--micro-batch-size", "4"]
    argv += ["--eval-prompts", "4", "--eval-samples", "2", "--threads", "1"]
    assert benchmark.main(argv) == 0
    out = capsys.readouterr().out
    traces = {
        line.split(" seed ")[0]: line.split(": ", 1)[1]
        for line in out.splitlines()
        if " seed 0: 0:" in line
    }
    assert set(traces) == {"rlkit", "trl"}
    # Step 0 is the same weights and the same evaluation draws in both: the same accuracy.
    assert traces["rlkit"].split(",")[0].split("@")[0] == traces["trl"].split(",")[0].split("@")[0]
    assert all(len(t.split(", ")) == 3 for t in traces.values())  # steps 0, 1 and 2
    assert "TRL time / rlkit time" in out
