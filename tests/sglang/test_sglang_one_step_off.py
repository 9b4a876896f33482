"""``TrainerConfig.rollout_mode = "one_step_off"`` on a real SGLang server: each batch is
generated while the previous one trains, one weight version behind, and a run resumed
from a checkpoint taken with a batch in flight trains the same prompts as the run that
went on."""

from __future__ import annotations

import math

import pytest
import torch

from rlkit.registry import ROLLOUT_ENGINES
from rlkit.trainer.trainer import RLTrainer
from tests.benchmark_scripts import load_benchmark
from tests.experiment_factory import small_experiment
from tests.sglang.conftest import CPU_SERVER, require_sglang

pytestmark = [pytest.mark.sglang, pytest.mark.slow]


def module_server(model_dir, tmp_path_factory, name: str):
    """A CPU SGLang server serving ``model_dir`` for the module's runs (they attach to it
    by URL); yields its URL."""
    require_sglang()
    from rlkit.rollout import sglang  # noqa: F401  (registers "sglang")

    engine = ROLLOUT_ENGINES.get("sglang")(
        model_path=str(model_dir),
        seed=0,
        num_servers=1,
        log_dir=str(tmp_path_factory.mktemp(name)),
        **CPU_SERVER,
    )
    try:
        yield engine.sync_endpoints[0].url
    finally:
        engine.close()


@pytest.fixture(scope="module")
def server_url(demo_model_dir, tmp_path_factory):
    """The demo model's server."""
    yield from module_server(demo_model_dir, tmp_path_factory, "one_step_off_server")


def one_step_off_run(
    model_dir,
    out_dir,
    url,
    *,
    algorithm=None,
    engine_options=None,
    rollout=None,
    optim=None,
    **trainer,
):
    """A trainer attached to the server at ``url`` (or starting its own with
    ``engine_options``), and the prompts of each step's update as it trains."""
    trainer = {"rollout_mode": "one_step_off", **trainer}
    engine_options = engine_options or {"num_servers": 0, "urls": [url], "device": "cpu"}
    cfg = small_experiment(
        model_dir,
        out_dir,
        # Rewards that vary within a group (response lengths), so every update moves the
        # weights; scored in a worker process, as one_step_off requires.
        data={
            "reward": "length_penalty",
            "reward_options": {"max_response_length": 6},
            "reward_workers": 1,
        },
        rollout={
            "engine": "sglang",
            "engine_options": engine_options,
            **(rollout or {}),
        },
        # One optimizer step per step (one mini-batch of the 4 groups): a batch one step
        # behind is one weight version behind. The rollout correction makes the trainer
        # recompute the old log-probs and weight each token by pi_old / pi_rollout.
        algorithm={"use_kl_loss": False, "rollout_is_level": "token", **(algorithm or {})},
        optim={"lr": 1e-3, "ppo_mini_batch_size": 4, "micro_batch_size": 8, **(optim or {})},
        trainer={"save_at_end": False, **trainer},
    )
    trainer_ = RLTrainer(cfg)
    trainer_.setup()
    # The module's runs share the server: give it this run's starting weights (a run
    # syncs them itself only on resume, trusting a server it attaches to otherwise).
    trainer_.rollout.sync_weights()
    trained: list[set[tuple[int, ...]]] = []  # the prompts of each step's update
    actor = trainer_.roles["actor"]
    update = actor.update

    def recording_update(batch):
        trained.append(prompts_of(batch))
        return update(batch)

    actor.update = recording_update
    return trainer_, trained


def train(trainer) -> list[dict[str, float]]:
    try:
        return trainer.train()
    finally:
        trainer.cleanup()  # stops the run's engine client; the module's server stays up


def prompts_of(batch) -> set[tuple[int, ...]]:
    """The distinct prompts (token ids, left padding removed) of a batch."""
    ids = batch.input_ids[:, : batch.prompt_width]
    return {tuple(row[-int(n) :].tolist()) for row, n in zip(ids, batch.prompt_lengths)}


def test_one_step_off_trains_each_batch_one_version_behind_and_resumes_the_batch_in_flight(
    demo_model_dir, server_url, tmp_path
):
    trainer, trained = one_step_off_run(
        demo_model_dir, tmp_path / "a", server_url, total_steps=4, save_freq=2
    )
    history = train(trainer)
    assert len(history) == len(trained) == 4
    # The first batch is generated before any update; every later one while the previous
    # step trained, from the weights before that update: one version behind.
    assert history[0]["async/staleness/max"] == 0.0
    for metrics in history[1:]:
        assert metrics["async/staleness/mean"] == metrics["async/staleness/max"] == 1.0
        assert metrics["timing_s/wait_for_rollout"] >= 0.0
        assert math.isfinite(metrics["actor/pg_loss"])
    # Same weights at step 1: server and trainer agree (float32); later the lag shows.
    assert history[0]["rollout/logprob_abs_diff_mean"] < 1e-3
    assert all(m["rollout/logprob_abs_diff_mean"] > 1e-5 for m in history[1:])
    # Each sync reached the server and was verified against the trainer's weights.
    assert history[-1]["weight_sync/logprob_max_abs_diff"] < 1e-3
    # 4 distinct prompts per step, none trained twice in the epoch (32 prompts).
    assert all(len(p) == 4 for p in trained)
    assert len(set().union(*trained)) == 16

    # Resume from the checkpoint of step 2, saved while batch 3 was being generated: the
    # resumed run generates batch 3 again, from the same prompts, then goes on as run a did.
    checkpoint = tmp_path / "a" / "checkpoints" / "global_step_2"
    resumed, trained_after = one_step_off_run(
        demo_model_dir, tmp_path / "b", server_url, total_steps=4, resume_mode=str(checkpoint)
    )
    after = train(resumed)
    assert resumed.step_count == 4 and len(after) == 2
    assert trained_after == trained[2:]
    assert after[0]["async/staleness/max"] == 0.0  # generated from the checkpoint's weights
    assert after[1]["async/staleness/max"] == 1.0
    assert torch.isfinite(torch.tensor([m["actor/pg_loss"] for m in after])).all()


def test_one_step_off_runs_dapo_group_filtering_in_the_rollout_thread(
    demo_model_dir, server_url, tmp_path
):
    # DAPO's dynamic sampling draws and scores rounds until enough groups vary: in
    # one_step_off those rounds run in the rollout thread, during the previous update.
    dapo = {"filter_groups": True, "filter_metric": "score", "max_num_gen_batches": 3}
    trainer, trained = one_step_off_run(
        demo_model_dir, tmp_path / "dapo", server_url, algorithm=dapo, total_steps=3
    )
    history = train(trainer)
    assert len(history) == 3
    for metrics in history:
        assert 1 <= metrics["train/num_gen_batches"] <= 3
        assert 1 <= metrics["train/num_kept_groups"] <= 4  # varied groups only
    assert [m["async/staleness/max"] for m in history] == [0.0, 1.0, 1.0]
    # Every round drew fresh prompts: no prompt was trained twice.
    assert sum(len(p) for p in trained) == len(set().union(*trained)) >= 3


def test_async_keeps_every_token_within_max_staleness_and_resumes_both_batches_in_flight(
    demo_model_dir, server_url, tmp_path
):
    # One optimizer step per step (u = 1) and max_staleness = 2: two steps generated ahead,
    # each prompt its own call; a sync waits for the calls running, new calls wait for it.
    run = {"rollout_mode": "async", "max_staleness": 2, "total_steps": 5}
    trainer, trained = one_step_off_run(
        demo_model_dir, tmp_path / "a", server_url, save_freq=2, **run
    )
    assert trainer.rollout.depth == 2
    history = train(trainer)
    assert len(history) == len(trained) == 5
    assert history[0]["async/staleness/max"] == 0.0  # generated in place, before any update
    # Batch 2 was drawn at step 1 with weights 0 or 1 (its calls may wait for the sync of
    # weights 1): 1 or 2 versions behind the weights 2 that train on it; never more.
    staleness = [m["async/staleness/max"] for m in history]
    assert all(s <= 2 for s in staleness) and max(staleness[1:]) >= 1
    for metrics in history[1:]:
        assert metrics["async/queue_size"] >= 0 and metrics["async/partial_rollouts"] >= 0
        assert math.isfinite(metrics["actor/pg_loss"])
    synced = [
        m["weight_sync/logprob_max_abs_diff"]
        for m in history
        if "weight_sync/logprob_max_abs_diff" in m
    ]
    assert synced and max(synced) < 1e-3  # each background sync reached the server
    # 4 distinct prompts per step, none trained twice (32 prompts in the epoch).
    assert all(len(p) == 4 for p in trained) and len(set().union(*trained)) == 20

    # The checkpoint of step 2 was saved with batches 3 and 4 in flight: the resumed run
    # regenerates both from the same prompts, then goes on as run a did.
    checkpoint = tmp_path / "a" / "checkpoints" / "global_step_2"
    resumed, trained_after = one_step_off_run(
        demo_model_dir, tmp_path / "b", server_url, resume_mode=str(checkpoint), **run
    )
    after = train(resumed)
    assert resumed.step_count == 5 and len(after) == 3
    assert trained_after == trained[2:]
    assert after[0]["async/staleness/max"] == 0.0
    assert all(m["async/staleness/max"] <= 2 for m in after)


def test_extras_reach_the_loss_of_batches_generated_ahead(
    demo_model_dir, server_url, tmp_path, extras_checks
):
    # Batches generated in the rollout threads get their extras at their own step's
    # forward passes; every estimator and loss call checks it received its rows of them.
    algorithm = {
        "adv_estimator": "checked_grpo",
        "policy_loss": "checked_vanilla",
        "roles": ("tests.extras_checks:StampRole",),
    }
    run = {"rollout_mode": "async", "max_staleness": 2, "total_steps": 3}
    trainer, _ = one_step_off_run(
        demo_model_dir, tmp_path / "a", server_url, algorithm=algorithm, **run
    )
    history = train(trainer)
    assert len(history) == 3
    assert all(m["actor/stamps_ok"] == 1.0 for m in history)
    assert max(m["async/staleness/max"] for m in history) >= 1  # trained behind the rollout


@pytest.fixture(scope="module")
def tool_server_url(tool_model_dir, tmp_path_factory):
    """A second server, serving the model warmed up to call the calculator."""
    yield from module_server(tool_model_dir, tmp_path_factory, "one_step_off_tool_server")


def test_one_step_off_runs_the_multi_turn_tool_loop_in_the_rollout_thread(
    tool_model_dir, tool_server_url, tmp_path
):
    import functools

    from rlkit.tasks.tool_arithmetic import tool_arithmetic_dataset

    cfg = small_experiment(
        tool_model_dir,
        tmp_path / "tools",
        data={
            "dataset_fn": functools.partial(tool_arithmetic_dataset, limit=16),
            "max_prompt_length": 48,
            "reward_workers": 1,
        },
        rollout={
            "engine": "sglang",
            "engine_options": {"num_servers": 0, "urls": [tool_server_url], "device": "cpu"},
            "agent_loop": "tool_agent",
            "agent": {"tools": ["calculator"], "max_turns": 3},
            "max_response_length": 160,
        },
        algorithm={"use_kl_loss": False, "rollout_is_level": "token"},
        optim={"lr": 1e-4, "ppo_mini_batch_size": 4, "micro_batch_size": 8},
        trainer={"rollout_mode": "one_step_off", "total_steps": 3, "save_at_end": False},
    )
    trainer = RLTrainer(cfg)
    trainer.setup()
    trainer.rollout.sync_weights()
    history = train(trainer)
    assert [m["async/staleness/max"] for m in history] == [0.0, 1.0, 1.0]
    # The warmed-up policy calls the calculator in the thread's rollouts: one request per
    # turn, the tool's output spliced between turns.
    assert all(m["tool_calls/mean"] > 0 and m["num_turns/max"] >= 2 for m in history)
    assert all(math.isfinite(m["actor/pg_loss"]) for m in history)  # (sampled calls may err)
    assert history[-1]["weight_sync/logprob_max_abs_diff"] < 1e-3


def test_async_continues_running_generations_under_new_weights_and_tags_each_token(
    demo_model_dir, server_url, tmp_path
):
    # partial_rollout = "continue": a sync pauses the requests running (their KV cache is
    # freed), loads the weights and continues them, recomputing their context under the new
    # weights; the server reports which version sampled each token.
    run = {"rollout_mode": "async", "max_staleness": 2, "partial_rollout": "continue"}
    mixed: list[set[int]] = []
    # Whether a sync lands while a response is being generated is a matter of timing; on a
    # busy machine a run's syncs may all fall between generations. Up to three runs.
    for attempt in range(3):
        versions = _async_continue_run(
            demo_model_dir, tmp_path / f"continue{attempt}", server_url, run
        )
        mixed = [v for step in versions for v in step if len(v) > 1]
        if mixed:
            break
    # Some response was sampled by two weight versions: begun before a sync, continued
    # after it, each token tagged with its own.
    assert mixed, f"no response spans a sync in three runs: {versions}"
    assert all(max(v) - min(v) >= 1 for v in mixed)


def _async_continue_run(model_dir, out_dir, server_url, run) -> list[list[set[int]]]:
    """Six async steps with ``partial_rollout = "continue"``; per step, per row, the
    weight versions of its sampled tokens."""
    trainer, trained = one_step_off_run(
        model_dir,
        out_dir,
        server_url,
        rollout={"max_response_length": 48},  # long enough for syncs to meet requests
        # A small step: at 1e-3 the length reward taught short answers within a few steps,
        # after which every response could finish between two syncs.
        optim={"lr": 1e-5},
        total_steps=6,
        **run,
    )
    versions: list[list[set[int]]] = []
    update = trainer.roles["actor"].update

    def recording_update(batch):
        rows = []
        for row, mask in zip(batch.policy_version, batch.loss_mask.bool()):
            rows.append(set(row[mask].tolist()))
        versions.append(rows)
        return update(batch)

    trainer.roles["actor"].update = recording_update
    history = train(trainer)
    assert len(history) == 6 and all(len(p) == 4 for p in trained)
    assert all(m["async/staleness/max"] <= 2 for m in history)
    return versions


def test_ctrl_c_stops_an_async_run_and_its_resume_draws_each_prompt_once(
    demo_model_dir, server_url, tmp_path
):
    """A literal SIGINT to `rlkit train` while batches are generated ahead: exit 130 with
    the one-line resume hint; every checkpoint's sampler stands at 4 prompts per step
    trained (the batches in flight are regenerated on resume), and the resumed run ends
    there too."""
    import os
    import subprocess
    import sys
    import time
    from pathlib import Path

    from tests.gin_files import arithmetic_gin
    from tests.interrupts import ctrl_c, start_run

    out = tmp_path / "run"
    cfg = tmp_path / "async.gin"
    bindings = {
        "RolloutConfig.engine": "sglang",
        "RolloutConfig.engine_options": {"num_servers": 0, "urls": [server_url], "device": "cpu"},
        "DataConfig.reward_workers": 1,
        "OptimConfig.ppo_mini_batch_size": 4,
        "TrainerConfig.rollout_mode": "async",
        "TrainerConfig.total_steps": 1000,
        "TrainerConfig.save_freq": 2,
        "TrainerConfig.val_before_train": False,
        "TrainerConfig.tensorboard": False,
    }
    cfg.write_text(arithmetic_gin(demo_model_dir, out, bindings))
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    stderr_path = tmp_path / "stderr.txt"
    proc = start_run(
        ["-m", "rlkit.train", str(cfg)], stderr_path, cwd=root, env=env, stdout=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 240
        while not (out / "checkpoints" / "global_step_4").exists():
            assert proc.poll() is None, stderr_path.read_text()[-3000:]
            assert time.monotonic() < deadline, (
                f"no checkpoint of step 4 in 240 s:\n{stderr_path.read_text()[-3000:]}"
            )
            time.sleep(0.05)
        time.sleep(0.3)  # into step 5 or 6: batches in flight
        stderr = ctrl_c(proc, stderr_path, timeout_s=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1].startswith("rlkit train: interrupted at step ")

    def drawn(step_dir: Path) -> int:
        sampler = torch.load(step_dir / "trainer_state.pt", weights_only=False)["sampler"]
        return sampler["epoch"] * sampler["num_prompts"] + sampler["position"]

    saved = sorted(out.glob("checkpoints/global_step_*"), key=lambda p: int(p.name.split("_")[-1]))
    last = int(saved[-1].name.split("_")[-1])
    assert all(drawn(d) == 4 * int(d.name.split("_")[-1]) for d in saved)
    resumed = subprocess.run(
        [sys.executable, "-m", "rlkit.train", str(cfg)]
        + ["--gin_param", f"TrainerConfig.total_steps = {last + 2}"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert drawn(out / "checkpoints" / f"global_step_{last + 2}") == 4 * (last + 2)


def test_async_loses_no_prompt_when_its_server_is_killed_mid_rollout(demo_model_dir, tmp_path):
    """The run starts its own server (an attached one cannot be restarted); it is killed
    with requests in flight. The engine restarts it from the newest weight snapshot and
    re-sends those requests: every step trains its 4 prompts, none twice. Generating
    ahead on this CPU, the server's model process and the trainer run on cores of their
    own (``RolloutConfig.server_cores = "auto"``; the server's front-end moves to the
    trainer's), the restarted server too."""
    import os
    import signal
    import threading
    import time

    import psutil

    cores_before = os.sched_getaffinity(0)

    options = {"num_servers": 1, "log_dir": str(tmp_path / "server"), **CPU_SERVER}
    trainer, trained = one_step_off_run(
        demo_model_dir,
        tmp_path / "kill",
        None,
        engine_options=options,
        rollout_mode="async",
        total_steps=5,
    )
    endpoint = trainer.engine.pool.endpoints[0]
    killed: list[int] = []
    split = trainer.cpu_split
    assert split is not None and split.server_cpus == (max(cores_before),)
    assert set(trainer.placement.cores) == cores_before - {max(cores_before)}
    assert os.sched_getaffinity(0) == set(trainer.placement.cores)

    def server_cores() -> set[tuple[bool, tuple[int, ...]]]:
        """(is the model's process, its cores) over the server's process tree."""
        tree = psutil.Process(endpoint.server.process.pid)
        return {
            (" ".join(p.cmdline()).startswith("sglang::scheduler"), tuple(p.cpu_affinity()))
            for p in [tree, *tree.children(recursive=True)]
        }

    # The scheduler (the model) on the servers' core, the front-end with the trainer.
    placed = {(True, split.server_cpus), (False, split.trainer_cpus)}
    assert server_cores() == placed
    restarted_cores: list[set[tuple[bool, tuple[int, ...]]]] = []

    def kill_with_requests_in_flight() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and trainer.step_count < 2:
            time.sleep(0.005)  # the kill goes to a step generated ahead
        while time.monotonic() < deadline and endpoint.inflight == 0:
            time.sleep(0.001)
        if endpoint.inflight:
            killed.append(endpoint.server.process.pid)
            os.killpg(killed[0], signal.SIGKILL)
        restarted = lambda: endpoint.restarts >= 1 and endpoint.usable  # noqa: E731
        while time.monotonic() < deadline and not restarted():
            time.sleep(0.01)
        if endpoint.server.alive:
            restarted_cores.append(server_cores())

    killer = threading.Thread(target=kill_with_requests_in_flight, daemon=True)
    killer.start()
    history = train(trainer)
    killer.join(5)
    assert killed, "no request was in flight to kill"
    assert len(history) == len(trained) == 5
    assert history[-1]["rollout/server_restarts"] == 1.0
    assert sum(m["rollout/num_retries"] for m in history) >= 1  # in-flight requests re-sent
    assert all(len(p) == 4 for p in trained) and len(set().union(*trained)) == 20
    assert all(m["async/staleness/max"] <= 2 for m in history)
    assert restarted_cores == [placed]
    assert os.sched_getaffinity(0) == cores_before  # given back when the run ended
    assert restarted_cores == [placed]
    assert os.sched_getaffinity(0) == cores_before  # given back when the run ended


def test_the_overlap_benchmark_prints_every_mode_and_its_ratio_to_sync(
    demo_model_dir, server_url, capsys
):
    benchmark = load_benchmark("async_overlap.py")
    argv = ["--model", str(demo_model_dir), "--url", server_url, "--prompts", "4"]
    argv += ["--new-tokens", "6", "--steps", "2", "--warmup", "1", "--rounds", "1"]
    argv += ["--modes", "sync,one_step_off,async", "--stop-ids", "2"]
    argv += ["--partial-rollout", "continue"]
    assert benchmark.main(argv) == 0
    out = capsys.readouterr().out
    rows = {line.split("|")[1].strip(): line for line in out.splitlines() if line.startswith("| ")}
    assert {"sync", "one_step_off", "async"} <= set(rows)
    for mode in ("sync", "one_step_off", "async"):
        step_s, tokens_per_s = (float(c.replace(",", "")) for c in rows[mode].split("|")[2:4])
        assert step_s > 0 and tokens_per_s > 0
    for mode in ("one_step_off", "async"):
        (ratio,) = out.rsplit(f"{mode} / sync tokens/s per round: ", 1)[1].split()[:1]
        assert float(ratio) > 0
