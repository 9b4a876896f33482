"""The split of the cores between the trainer and the servers it starts on the same CPU
(``RolloutConfig.server_cores``): which runs get one, how it is shared out, how a started
server takes its cores, and the settings refused."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlkit.rollout.servers import cpu_split
from rlkit.rollout.servers.process import _EXEC_WITH_PDEATHSIG
from rlkit.rollout.servers.run import ServerRun
from rlkit.trainer.config import ExperimentConfig
from tests.experiment_factory import small_experiment

TWO = frozenset({0, 1})


def test_auto_splits_two_cores_one_each_when_rollouts_overlap_training():
    split, how = cpu_split.plan(
        "auto", rollout_mode="one_step_off", servers_on_cpu=True, available=TWO
    )
    # The servers take the upper half (rounded up: 1 of 2), the trainer the rest.
    assert (split.server_cpus, split.trainer_cpus, split.server_threads) == ((1,), (0,), 1)
    assert "one_step_off" in how
    assert split.server_env() == {
        cpu_split.SERVER_CPUS_ENV: "1",
        cpu_split.FRONTEND_CPUS_ENV: "0",  # where the server's front-end moves
        "OMP_NUM_THREADS": "1",
    }


def test_auto_splits_eight_cores_in_halves_and_two_servers_share_theirs():
    split, _ = cpu_split.plan(
        "auto", rollout_mode="async", servers_on_cpu=True, available=range(8), num_servers=2
    )
    assert split.server_cpus == (4, 5, 6, 7) and split.trainer_cpus == (0, 1, 2, 3)
    assert split.server_threads == 2  # 4 cores / 2 servers
    assert split.server_env()[cpu_split.SERVER_CPUS_ENV] == "4,5,6,7"
    assert "cores 4-7" in split.describe() and "cores 0-3" in split.describe()


@pytest.mark.parametrize(
    ("setting", "mode", "on_cpu", "cores", "reason"),
    [
        ("auto", "sync", True, TWO, "take turns"),  # each side waits while the other runs
        ("auto", "one_step_off", False, TWO, "starts no server"),
        ("auto", "one_step_off", True, {3}, "one core"),
        ("off", "one_step_off", True, TWO, "'off'"),
    ],
)
def test_no_split_where_there_is_nothing_to_split_or_it_is_turned_off(
    setting, mode, on_cpu, cores, reason
):
    split, why = cpu_split.plan(setting, rollout_mode=mode, servers_on_cpu=on_cpu, available=cores)
    assert split is None and reason in why


def test_a_count_gives_the_servers_that_many_cores_in_any_mode():
    split, how = cpu_split.plan(1, rollout_mode="sync", servers_on_cpu=True, available=range(4))
    assert split.server_cpus == (3,) and split.trainer_cpus == (0, 1, 2)
    assert how == "RolloutConfig.server_cores = 1"


def test_trainer_processes_on_one_machine_share_out_the_trainer_cores():
    split = cpu_split.CpuSplit((4, 5), (0, 1, 2, 3), 2, "test")
    assert split.trainer_cores(0, 2) == (0, 2) and split.trainer_cores(1, 2) == (1, 3)
    assert split.trainer_cores(0, 8) == (0, 1, 2, 3)  # fewer cores than processes: all


@pytest.mark.parametrize(
    ("options", "takes_run", "on_cpu", "expected"),
    [
        ({}, True, True, True),  # one server by default, on the CPU platform's CPU
        ({"device": "cpu"}, True, False, True),
        ({"num_servers": 0, "urls": ["http://h:1"]}, True, True, False),  # attached only
        ({"device": "cuda"}, True, True, False),
        ({}, False, True, False),  # the embedded engine starts no server
    ],
)
def test_servers_on_cpu_reads_the_engine_options(options, takes_run, on_cpu, expected):
    assert cpu_split.servers_on_cpu(options, takes_run, on_cpu) is expected


def test_a_started_server_runs_on_the_cores_named_in_its_environment():
    # The same wrapper a ManagedServer execs in front of the server command.
    last = max(os.sched_getaffinity(0))
    command = "import os; print(sorted(os.sched_getaffinity(0)))"
    out = subprocess.run(
        [sys.executable, "-c", _EXEC_WITH_PDEATHSIG, sys.executable, "-c", command],
        env={**os.environ, cpu_split.SERVER_CPUS_ENV: str(last)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.strip() == f"[{last}]"


def test_the_users_server_env_wins_over_the_split():
    split = cpu_split.CpuSplit((1,), (0,), 1, "test")
    run = ServerRun(cpu_split=split)
    env = run.server_env({"OMP_NUM_THREADS": "4"})
    assert env == {
        cpu_split.SERVER_CPUS_ENV: "1",
        cpu_split.FRONTEND_CPUS_ENV: "0",
        "OMP_NUM_THREADS": "4",
    }
    assert ServerRun().server_env(None) == {}


def test_placing_the_trainer_pins_every_thread_and_restoring_gives_them_back():
    before_cores, before_threads = os.sched_getaffinity(0), torch.get_num_threads()
    first = min(before_cores)
    split = cpu_split.CpuSplit((max(before_cores),), (first,), 1, "test")
    placement = cpu_split.place_trainer(split, threads=None)
    try:
        assert placement.cores == (first,) and placement.threads == 1
        assert torch.get_num_threads() == 1
        for task in os.listdir("/proc/self/task"):  # the threads started before too
            assert os.sched_getaffinity(int(task)) == {first}
    finally:
        cpu_split.restore(placement)
    assert os.sched_getaffinity(0) == before_cores
    assert torch.get_num_threads() == before_threads


def config_with(tmp_path, tiny_model_dir, **rollout) -> ExperimentConfig:
    cfg = small_experiment(tiny_model_dir, tmp_path / "run")
    cfg.rollout = dataclasses.replace(cfg.rollout, **rollout)
    return cfg


@pytest.mark.parametrize(
    ("rollout", "message"),
    [
        ({"server_cores": "fast"}, "server_cores must be 'auto', 'off' or a number of cores"),
        ({"server_cores": 0}, "server_cores must be 'auto', 'off' or a number of cores"),
        ({"server_cores": 1}, "engine 'hf' with these engine_options starts none"),
    ],
)
def test_server_cores_that_cannot_work_are_one_message(tmp_path, tiny_model_dir, rollout, message):
    with pytest.raises(ValueError, match=message):
        config_with(tmp_path, tiny_model_dir, **rollout).validate()


def test_server_cores_leaving_the_trainer_no_core_is_refused(tmp_path, tiny_model_dir):
    from rlkit.rollout import sglang  # noqa: F401  (registers "sglang")

    every = len(cpu_split.available_cores())
    cfg = config_with(
        tmp_path,
        tiny_model_dir,
        engine="sglang",
        engine_options={"device": "cpu"},
        server_cores=every,
    )
    with pytest.raises(ValueError, match=f"server_cores = {every} leaves the trainer no core"):
        cfg.validate()


def test_a_healthy_server_keeps_its_model_process_on_its_cores_and_moves_the_rest(tmp_path):
    # The stand-in server tree (an HTTP parent, a child standing for SGLang's scheduler)
    # started as every ManagedServer is, with a split's variables in its environment.
    import psutil

    from rlkit.rollout.servers.process import ManagedServer
    from rlkit.rollout.sglang.server import ServerConfig
    from tests.sglang.fake_server_tree import CHILD

    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.fail("this test needs 2 cores (the suite's machines have them)")
    split = cpu_split.CpuSplit((cores[-1],), tuple(cores[:-1]), 1, "test")
    config = dataclasses.replace(
        ServerConfig(model_path="unused", device="cpu", startup_timeout_s=60),
        env=split.server_env(),
    )
    config = FrontEndNamed(config, (f"{sys.executable} -c {CHILD[:20]}",))
    fake = Path(__file__).with_name("sglang") / "fake_server_tree.py"
    server = ManagedServer(config, tmp_path / "log", command=[sys.executable, str(fake), "{port}"])
    server.start()
    try:
        root = psutil.Process(server.process.pid)
        (child,) = root.children()
        assert child.cpu_affinity() == [cores[-1]]  # the model's process: the servers' core
        assert root.cpu_affinity() == cores[:-1]  # the front-end: the trainer's cores
        assert all(os.sched_getaffinity(t.id) == set(cores[:-1]) for t in root.threads())
    finally:
        server.close()


class FrontEndNamed:
    """A server configuration whose compute processes are the ones named."""

    def __init__(self, config, compute_processes):
        self._config, self.compute_processes = config, compute_processes

    def __getattr__(self, name):
        return getattr(self._config, name)
