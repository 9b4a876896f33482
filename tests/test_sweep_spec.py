"""Sweep specs: grid expansion, seeds, run names, gin literals, bad specs; tables, seed
aggregates and paired differences from metrics files."""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

import pytest

from rlkit.sweep.aggregate import aggregate_points, compare_points
from rlkit.sweep.driver import dry_run, plan, thread_share
from rlkit.sweep.report import paired_table, points_table
from rlkit.sweep.results import collect_rows, markdown_table, run_metrics
from rlkit.sweep.runner import RunRecord, execute, previous_record, train_command
from rlkit.sweep.spec import (
    PRESETS_DIR,
    RunSpec,
    SweepError,
    SweepSpec,
    expand_grid,
    gin_literal,
    parse_sweep_file,
)

ROOT = Path(__file__).resolve().parents[1]
DEMO = str(ROOT / "experiments" / "demo.gin")


def test_grid_is_the_cartesian_product_in_written_order():
    spec = SweepSpec(
        base_configs=[DEMO],
        grid={"preset": ["grpo", "rloo"], "TrainerConfig.seed": [0, 1, 2]},
        bindings=["TrainerConfig.total_steps = 3"],
    )
    runs = expand_grid(spec)
    # 2 presets x 3 seeds = 6 runs, the last axis varying fastest.
    assert [r.name for r in runs] == [
        "grpo_seed=0", "grpo_seed=1", "grpo_seed=2", "rloo_seed=0", "rloo_seed=1", "rloo_seed=2",
    ]  # fmt: skip
    assert runs[4].configs == (DEMO, str(PRESETS_DIR / "rloo.gin"))
    assert runs[4].bindings == ("TrainerConfig.total_steps = 3", "TrainerConfig.seed = 1")
    assert runs[4].axes == {"preset": "rloo", "TrainerConfig.seed": "1"}


def test_single_value_axes_stay_out_of_run_names():
    spec = SweepSpec(
        base_configs=[DEMO],
        grid={"AlgorithmConfig.adv_estimator": ["grpo", "rloo"], "TrainerConfig.seed": [7]},
    )
    runs = expand_grid(spec)
    assert [r.name for r in runs] == ["adv_estimator=grpo", "adv_estimator=rloo"]
    assert runs[1].bindings == ('AlgorithmConfig.adv_estimator = "rloo"', "TrainerConfig.seed = 7")


def test_train_args_put_the_output_dir_last(tmp_path):
    run = RunSpec("a", ("x.gin",), ("A.b = 1",), {})
    assert run.train_args(tmp_path / "a") == [
        "x.gin", "--gin_param", "A.b = 1",
        "--gin_param", f'TrainerConfig.output_dir = "{tmp_path / "a"}"',
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("grpo", '"grpo"'),
        ('say "hi"', '"say \\"hi\\""'),
        (1e-6, "1e-06"),
        (True, "True"),
        (None, "None"),
        ([1, "a"], '[1, "a"]'),
        ({"method": "flexible"}, '{"method": "flexible"}'),
        ("@arithmetic_dataset", "@arithmetic_dataset"),
    ],
)
def test_gin_literals(value, text):
    assert gin_literal(value) == text


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (SweepSpec(grid={"preset": ["grpo"]}), "base_configs is empty"),
        (SweepSpec(base_configs=[DEMO], grid={"seed": [0]}), "neither 'preset'"),
        (SweepSpec(base_configs=[DEMO], grid={"preset": []}), "non-empty list"),
        (SweepSpec(base_configs=[DEMO], grid={"preset": ["grpoo"]}), "unknown algorithm preset"),
        (SweepSpec(base_configs=["nope/missing.gin"]), "not found"),
        (
            SweepSpec(base_configs=[DEMO], grid={"A.x": ["a b", "a/b"]}),
            "both make run name",
        ),
    ],
)
def test_bad_specs_raise_naming_the_problem(spec, message):
    with pytest.raises(SweepError, match=message):
        expand_grid(spec)


def test_sweep_files_parse_into_a_spec(tmp_path):
    path = tmp_path / "s.gin"
    path.write_text(
        'Sweep.name = "t"\nSweep.base_configs = ["experiments/demo.gin"]\n'
        'Sweep.grid = {"preset": ["grpo", "dapo"]}\n'
    )
    spec = parse_sweep_file(path, ['Sweep.launcher = "accelerate launch --num_processes 2"'])
    assert spec.name == "t" and dict(spec.grid) == {"preset": ["grpo", "dapo"]}
    commands = dry_run(spec)
    assert commands[1].startswith("accelerate launch --num_processes 2 -m rlkit.train ")
    assert "dapo.gin" in commands[1]
    with pytest.raises(SweepError, match="bad sweep file"):
        parse_sweep_file(path, ["Sweep.no_such_field = 1"])


def test_the_ready_sweeps_expand_to_the_five_algorithms():
    # demo_algorithms_seeds includes demo_algorithms.gin and adds 3 seeds: 5 x 3 runs.
    for name, count in (("demo_algorithms", 5), ("gsm8k_gpu", 10), ("demo_algorithms_seeds", 15)):
        spec = parse_sweep_file(ROOT / "experiments" / "sweeps" / f"{name}.gin")
        runs = plan(spec)
        assert len(runs) == count
        assert {r.axes["preset"] for r in runs} == {
            "grpo", "dr_grpo", "dapo", "rloo", "reinforce_plus_plus",
        }  # fmt: skip


def _write_metrics(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_final_and_best_come_from_the_logged_steps(tmp_path):
    path = _write_metrics(
        tmp_path / "metrics.jsonl",
        [
            {"step": 0, "val/toy/mean@2": 0.25},
            {"step": 1, "critic/score/mean": 0.3},
            {"step": 2, "val/toy/mean@2": 0.75, "critic/score/mean": 0.5},
            {"step": 4, "val/toy/mean@2": 0.5, "val/toy/pass@2": "nan"},
        ],
    )
    last, values = run_metrics(path, ["val/*"])
    # final = value at step 4 (0.5); best = max(0.25, 0.75, 0.5) = 0.75, first reached at step 2.
    assert last == 4
    assert values == {
        "final val/toy/mean@2": 0.5, "best val/toy/mean@2": 0.75, "best_step val/toy/mean@2": 2.0,
    }  # fmt: skip
    assert run_metrics(tmp_path / "missing.jsonl", ["val/*"]) == (None, {})


def test_failed_runs_stay_in_the_table_with_their_log(tmp_path):
    _write_metrics(tmp_path / "ok" / "metrics.jsonl", [{"step": 3, "val/toy/mean@1": 0.5}])
    records = [
        RunRecord("ok", "completed", str(tmp_path / "ok"), "ok/train.log", 0, 12.0),
        RunRecord("bad", "failed", str(tmp_path / "bad"), "bad/train.log", 1, 2.0, error="x"),
    ]
    rows = collect_rows(records, {"ok": {"preset": "grpo"}, "bad": {"preset": "rloo"}}, ["val/*"])
    assert [r["status"] for r in rows] == ["completed", "failed"]
    table = markdown_table(rows, ["preset"], base_dir=None)
    lines = table.splitlines()
    assert lines[0] == "| run | status | preset | final mean@1 | best mean@1 | steps | wall (s) |"
    assert lines[2] == "| ok | completed | grpo | 0.5000 | 0.5000 | 3 | 12 |"
    assert lines[3] == "| bad | failed (bad/train.log) | rloo | - | - | - | 2 |"


def test_a_run_over_its_time_limit_is_stopped_and_recorded_failed(tmp_path):
    # The launcher here is a Python that notes its pid and sleeps: a real process to stop.
    pid_file = tmp_path / "pid"
    code = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    run = RunSpec("slow", (DEMO,), (), {})
    record = execute(run, tmp_path / "slow", launcher=shlex.join([sys.executable, "-c", code]),
                     timeout_s=3.0)  # fmt: skip
    assert record.status == "failed" and record.returncode is None
    assert "time limit of 3 s" in record.error
    saved = json.loads((tmp_path / "slow" / "sweep_run.json").read_text())
    assert saved["status"] == "failed"
    with pytest.raises(ProcessLookupError):  # stopped and reaped, not left running
        os.kill(int(pid_file.read_text()), 0)


def test_a_run_directory_with_other_bindings_is_refused(tmp_path):
    run = RunSpec("a", (DEMO,), ("TrainerConfig.seed = 0",), {})
    record = execute(run, tmp_path / "a", launcher=f"{sys.executable} -c 'pass'")
    assert record.status == "completed"
    assert previous_record(run, tmp_path / "a").status == "completed"
    changed = RunSpec("a", (DEMO,), ("TrainerConfig.seed = 1",), {})
    with pytest.raises(SweepError, match="different bindings"):
        previous_record(changed, tmp_path / "a")


def test_an_edited_config_file_is_noticed_on_resume(tmp_path):
    config = tmp_path / "exp.gin"
    config.write_text("TrainerConfig.total_steps = 2\n")
    run = RunSpec("a", (str(config),), (), {})
    execute(run, tmp_path / "a", launcher=f"{sys.executable} -c 'pass'")
    assert previous_record(run, tmp_path / "a").status == "completed"
    config.write_text("TrainerConfig.total_steps = 3\n")
    with pytest.raises(SweepError, match="config file contents"):
        previous_record(run, tmp_path / "a")


def test_seeds_run_every_point_once_per_seed_bound_last():
    spec = SweepSpec(
        base_configs=[DEMO],
        grid={"preset": ["grpo", "rloo"]},
        seeds=[0, 7],
        bindings=["TrainerConfig.total_steps = 3"],
    )
    runs = expand_grid(spec)
    assert [r.name for r in runs] == ["grpo_seed=0", "grpo_seed=7", "rloo_seed=0", "rloo_seed=7"]
    assert [(r.point, r.seed) for r in runs] == [("grpo", 0), ("grpo", 7), ("rloo", 0), ("rloo", 7)]
    assert runs[3].bindings == ("TrainerConfig.total_steps = 3", "TrainerConfig.seed = 7")
    assert runs[3].axes == {"preset": "rloo"}
    # One grid point: the runs are named after the sweep.
    single = expand_grid(SweepSpec(name="one", base_configs=[DEMO], seeds=[3]))
    assert [(r.name, r.point) for r in single] == [("one_seed=3", "one")]


def test_a_parallel_run_gets_its_thread_share_outside_the_recorded_arguments(tmp_path):
    run = RunSpec("a", (DEMO,), ("TrainerConfig.num_threads = 4",), {})
    command = train_command(run, tmp_path / "a", threads=2)
    # The share comes before the run's own bindings, so a binding of the sweep wins.
    assert command.index("TrainerConfig.num_threads = 2") < command.index(
        "TrainerConfig.num_threads = 4"
    )
    record = execute(run, tmp_path / "a", launcher=f"{sys.executable} -c 'pass'", threads=2)
    assert "TrainerConfig.num_threads = 2" not in record.args
    assert previous_record(run, tmp_path / "a").status == "completed"  # resumable at any share
    assert thread_share(1) is None and thread_share(10_000) == 1


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"seeds": [0, 0]}, "lists a seed twice"),
        ({"seeds": [0, "1"]}, "list of integers"),
        ({"seeds": 3}, "list of integers"),
        ({"seeds": [0], "grid": {"TrainerConfig.seed": [0, 1]}}, "both set the seed"),
        ({"max_parallel": 0}, "max_parallel must be >= 1"),
        (
            {"grid": {"preset": ["grpo", "rloo"]}, "compare": "dapo"},
            "Sweep.compare = 'dapo' is not a grid point; the points are: grpo, rloo",
        ),
    ],
)
def test_bad_seed_compare_and_parallel_settings(fields, message):
    with pytest.raises(SweepError, match=message):
        expand_grid(SweepSpec(base_configs=[DEMO], **fields))


def _seed_runs(tmp_path: Path, finals: dict[str, list[float]]) -> tuple[list, list]:
    """Runs of points x seeds whose metrics.jsonl log `val/t/acc` at steps 0 and 5 (`final`)."""
    runs, records = [], []
    for point, values in finals.items():
        for seed, value in enumerate(values):
            name = f"{point}_seed={seed}"
            _write_metrics(
                tmp_path / name / "metrics.jsonl",
                [{"step": 0, "val/t/acc": 0.1 * seed}, {"step": 5, "val/t/acc": value}],
            )
            runs.append(RunSpec(name, (DEMO,), (), {"preset": point}, point, seed))
            records.append(RunRecord(name, "completed", str(tmp_path / name), "", 0, 1.0))
    return runs, records


def test_seeds_aggregate_into_mean_std_and_t_interval(tmp_path):
    runs, records = _seed_runs(tmp_path, {"a": [0.5, 0.6, 0.7], "b": [0.4]})
    columns = {r.name: {"point": r.point, "seed": str(r.seed)} for r in runs}
    rows = collect_rows(records, columns, ["val/*"])
    a, b = aggregate_points(runs, rows)
    # a: mean 0.6, std 0.1, half width t(0.975, 2) * 0.1 / sqrt 3 = 4.302653 * 0.057735 = 0.248414.
    est = a.estimates["final val/t/acc"]
    assert (est.mean, est.std, est.n) == (pytest.approx(0.6), pytest.approx(0.1), 3)
    assert (est.low, est.high) == pytest.approx((0.6 - 0.248414, 0.6 + 0.248414), abs=1e-6)
    assert a.csv_row()["ci95_low final val/t/acc"] == pytest.approx(0.351586, abs=1e-6)
    assert b.estimates["final val/t/acc"].n == 1  # one seed: a mean, no interval
    table = points_table([a, b], ["preset"]).splitlines()
    assert table[2].startswith("| a | a | 3 | 0.6000 ± 0.1000 [0.3516, 0.8484] |")
    assert table[3].startswith("| b | b | 1 | 0.4000 (n=1: no interval) |")


def test_paired_differences_to_the_baseline_at_the_same_step(tmp_path):
    runs, records = _seed_runs(tmp_path, {"base": [0.5, 0.6, 0.7], "new": [0.6, 0.8, 0.8]})
    records[4].status = "failed"  # new seed 1 failed: only seeds 0 and 2 pair up
    (diff,) = compare_points(runs, records, "base", ["val/*"])
    # Seeds 0 and 2 at step 5: differences 0.6 - 0.5 = 0.1 and 0.8 - 0.7 = 0.1, no spread.
    assert (diff.point, diff.metric, diff.step, diff.seeds) == ("new", "val/t/acc", 5, [0, 2])
    assert diff.test.difference.mean == pytest.approx(0.1)
    records[0].status = "failed"  # and base seed 0: seed 2 alone, no interval
    (diff,) = compare_points(runs, records, "base", ["val/*"])
    assert diff.seeds == [2] and diff.test.verdict == "n=1: no interval"
    records[0].status = records[4].status = "completed"
    (diff,) = compare_points(runs, records, "base", ["val/*"])
    # Differences 0.1, 0.2, 0.1: mean 0.133333, std 0.057735, t = 0.133333 / 0.033333 = 4;
    # df 2: p = 1 - 4 / sqrt(18) = 0.057191; half width 4.302653 * 0.033333 = 0.143422.
    assert diff.test.p_value == pytest.approx(0.057191, abs=1e-6)
    assert diff.test.difference.low == pytest.approx(0.133333 - 0.143422, abs=1e-6)
    assert diff.test.verdict == "not distinguishable (interval includes 0)"
    assert "| new | acc | 5 | 3 | 0.7333 | 0.6000 | +0.1333 | [-0.0101, 0.2768] | 0.057 |" in (
        paired_table([diff])
    )
