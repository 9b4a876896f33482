"""What a user can get wrong in a run, its data and its directory: each mistake is one
message and exit status 2 from ``rlkit train`` (no traceback), found before the model loads
where it can be, and nothing the run wrote is lost."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlkit.train import main as rlkit_train
from tests.gin_files import arithmetic_gin

ONE_STEP = {
    "TrainerConfig.total_steps": 1,
    "TrainerConfig.val_before_train": False,
    "OptimConfig.ppo_mini_batch_size": 4,
    "OptimConfig.micro_batch_size": 4,
    "DataConfig.max_prompt_length": 64,
}


def _train(capfd, tmp_path: Path, model: str, out: Path, bindings: dict) -> tuple[int, str]:
    """``rlkit train FILE.gin`` on the tiny task; its exit status and stderr."""
    gin_file = tmp_path / "experiment.gin"
    gin_file.write_text(arithmetic_gin(model, out, ONE_STEP | bindings))
    capfd.readouterr()
    status = rlkit_train([str(gin_file)])
    return status, capfd.readouterr().err


def _one_message(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.startswith("rlkit train:")]
    assert "Traceback" not in err and len(lines) == 1, err
    return lines[0]


def test_a_prompt_longer_than_the_limit_is_one_message(capfd, tmp_path, tiny_model_dir):
    status, err = _train(
        capfd, tmp_path, tiny_model_dir, tmp_path / "run", {"DataConfig.max_prompt_length": 2}
    )
    assert status == 2
    assert "DataConfig.max_prompt_length=2" in _one_message(err)


def test_filter_dropping_every_prompt_is_one_message(capfd, tmp_path, tiny_model_dir):
    bindings = {"DataConfig.max_prompt_length": 2, "DataConfig.truncation": "filter"}
    status, err = _train(capfd, tmp_path, tiny_model_dir, tmp_path / "run", bindings)
    assert status == 2
    assert "truncation='filter' dropped them" in _one_message(err)


def test_an_output_dir_that_cannot_be_written_stops_before_the_model_loads(
    capfd, tmp_path, tiny_model_dir
):
    blocker = tmp_path / "a_file"
    blocker.write_text("")  # a directory cannot be made inside a file, even by root
    status, err = _train(capfd, tmp_path, tiny_model_dir, blocker / "run", {})
    assert status == 2
    assert "is not writable" in _one_message(err)


def test_a_second_run_on_a_locked_directory_names_the_holder(capfd, tmp_path, tiny_model_dir):
    out = tmp_path / "run"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from pathlib import Path\n"
            "from rlkit.trainer.run_dir import lock_run_dir\n"
            f"lock_run_dir(Path({str(out)!r}))\n"
            "print('locked', flush=True)\n"
            "time.sleep(120)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        status, err = _train(capfd, tmp_path, tiny_model_dir, out, {})
        assert status == 2
        assert f"in use by another rlkit run (pid {holder.pid})" in _one_message(err)
    finally:
        holder.kill()  # a crashed holder: the kernel drops its lock
        holder.wait()
    status, err = _train(capfd, tmp_path, tiny_model_dir, out, {})
    assert status == 0, err


def test_on_error_skip_trains_on_the_good_rows(capfd, tmp_path, tiny_model_dir):
    data = tmp_path / "train.jsonl"
    good = [f'{{"question": "{a}+{a}=", "answer": "{2 * a}"}}' for a in range(4)]
    data.write_text("\n".join([good[0], '{"question": "no answer"}', "not json", *good[1:]]))
    bindings = {
        "DataConfig.dataset_fn": None,
        "DataConfig.train_files": str(data),
        "DataConfig.use_chat_template": False,
        "DataConfig.on_error": "skip",
    }
    status, err = _train(capfd, tmp_path, tiny_model_dir, tmp_path / "run", bindings)
    assert status == 0, err
    assert (tmp_path / "run" / "checkpoints" / "global_step_1").is_dir()


@pytest.mark.parametrize("score", ["1e308", "float('inf')", "float('-inf')"])
def test_a_reward_out_of_range_is_a_reward_error(capfd, tmp_path, tiny_model_dir, score):
    reward = tmp_path / "huge.py"
    reward.write_text(f"def huge(response, ground_truth, **fields):\n    return {score}\n")
    bindings = {"DataConfig.reward": f"{reward}:huge"}
    status, err = _train(capfd, tmp_path, tiny_model_dir, tmp_path / "run", bindings)
    assert status == 2
    message = _one_message(err)
    assert "reward calls failed" in message and "out-of-range score" in message


def test_a_prompt_message_role_the_template_drops_names_the_row(tiny_model_dir):
    from transformers import AutoTokenizer

    from rlkit.data.prompt_dataset import PromptDataError
    from rlkit.tasks.tool_arithmetic import TOOL_CHAT_TEMPLATE
    from rlkit.trainer.prompts import tokenize_prompts

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.chat_template = TOOL_CHAT_TEMPLATE
    row = {"id": "w1", "ground_truth": "1", "data_source": "t"}
    rows = [
        row | {"prompt": [{"role": "user", "content": "2*3?"}]},
        row | {"id": "w2", "prompt": [{"role": "wizard", "content": "cast a spell"}]},
    ]
    with pytest.raises(PromptDataError, match=r"train prompt 1 \(id 'w2'\).*role 'wizard'"):
        tokenize_prompts(
            rows,
            tokenizer,
            max_prompt_length=64,
            truncation="error",
            use_chat_template=True,
            name="train",
        )


def test_the_lock_file_names_this_process_and_is_released(tmp_path):
    from rlkit.trainer.run_dir import LOCK_FILE, lock_run_dir

    lock = lock_run_dir(tmp_path)
    assert (tmp_path / LOCK_FILE).read_text().strip() == str(os.getpid())
    lock.release()
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            f"from rlkit.trainer.run_dir import lock_run_dir; lock_run_dir({str(tmp_path)!r})",
        ],
        capture_output=True,
        text=True,
    )
    assert probe.returncode == 0, probe.stderr


def test_a_verl_row_without_a_ground_truth_names_the_field(tmp_path):
    from rlkit.data import load_prompt_dataset

    path = tmp_path / "train.jsonl"
    row = {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": "1+1?"}],
        "reward_model": {"style": "rule", "ground_truth": None},
    }
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(Exception, match=r"reward_model.ground_truth is missing or None"):
        load_prompt_dataset(str(path), split="train")


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ("import os\nos._exit(0)\n", 0),
        ("import os\nos._exit(3)\n", 3),
        ("raise SystemExit(0)\n", 0),
    ],
)
def test_a_reward_module_that_exits_when_imported_is_named(
    capfd, tmp_path, tiny_model_dir, body, status
):
    reward = tmp_path / "exiting_reward.py"
    reward.write_text(body + "\ndef score(response, ground_truth, **extra):\n    return 1.0\n")
    code, err = _train(
        capfd, tmp_path, tiny_model_dir, tmp_path / "run", {"DataConfig.reward": f"{reward}:score"}
    )
    assert code == 2
    line = _one_message(err)
    assert "DataConfig.reward" in line and f"ended the process (exit status {status})" in line
    assert not (tmp_path / "run").exists()  # stopped before anything was written


def _train_with_reward_code(tmp_path, tiny_model_dir, code: str) -> tuple[int, list[str], str]:
    """``python -m rlkit.train`` (its own process: a crash must not end the test runner)
    with ``score`` defined by ``code`` scored in the trainer's process; the exit status,
    the ``rlkit train:`` lines of stderr, and stderr."""
    reward = tmp_path / "hostile_reward.py"
    reward.write_text(code)
    gin_file = tmp_path / "experiment.gin"
    bindings = ONE_STEP | {"DataConfig.reward": f"{reward}:score", "DataConfig.reward_workers": 0}
    gin_file.write_text(arithmetic_gin(tiny_model_dir, tmp_path / "run", bindings))
    done = subprocess.run(
        [sys.executable, "-m", "rlkit.train", str(gin_file)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("rlkit train:")]
    return done.returncode, lines, done.stderr


@pytest.mark.parametrize(
    ("call", "shown"),
    [
        ("os._exit(0)", "os._exit(0)"),  # exit status 0: a sweep would count it a success
        ("sys.exit(3)", "sys.exit(3)"),  # SystemExit is no Exception: it escaped the guard
    ],
)
def test_a_reward_that_exits_when_called_in_process_is_named(tmp_path, tiny_model_dir, call, shown):
    code = f"import os, sys\n\ndef score(response, ground_truth, **extra):\n    {call}\n"
    status, lines, err = _train_with_reward_code(tmp_path, tiny_model_dir, code)
    assert status == 2, err[-2000:]
    assert "Traceback" not in err and len(lines) == 1, err[-2000:]
    assert f"the reward called {shown}" in lines[0] and "hostile_reward.py:score" in lines[0]
    assert "on row 0 (prompt '" in lines[0]  # the row, by its prompt's id


def test_a_reward_that_segfaults_in_process_is_named_with_the_row(tmp_path, tiny_model_dir):
    code = (
        "import ctypes\n\ndef score(response, ground_truth, **extra):\n"
        "    ctypes.string_at(0)  # reads address 0: SIGSEGV inside C\n"
    )
    status, lines, err = _train_with_reward_code(tmp_path, tiny_model_dir, code)
    assert status == 2 and len(lines) == 1, err[-2000:]
    assert "died from SIGSEGV inside the reward" in lines[0]
    assert "hostile_reward.py:score" in lines[0] and "while it scored row 0" in lines[0]
    assert "DataConfig.reward_workers = 1" in lines[0]


def test_killing_the_command_leaves_no_trainer_behind(tmp_path, tiny_model_dir):
    import psutil

    gin_file = tmp_path / "experiment.gin"
    bindings = ONE_STEP | {"TrainerConfig.total_steps": 500, "TrainerConfig.save_freq": 0}
    gin_file.write_text(arithmetic_gin(tiny_model_dir, tmp_path / "run", bindings))
    run = subprocess.Popen(
        [sys.executable, "-m", "rlkit.train", str(gin_file)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while not psutil.Process(run.pid).children() and time.monotonic() < deadline:
        time.sleep(0.1)
    (trainer,) = psutil.Process(run.pid).children()  # the supervised trainer
    run.send_signal(signal.SIGKILL)
    run.wait(timeout=30)
    trainer.wait(timeout=30)  # the parent-death signal took it too
    assert not trainer.is_running()


def test_sigterm_says_where_the_run_stopped(tmp_path, tiny_model_dir):
    gin_file = tmp_path / "experiment.gin"
    bindings = ONE_STEP | {"TrainerConfig.total_steps": 500, "TrainerConfig.save_freq": 0}
    gin_file.write_text(arithmetic_gin(tiny_model_dir, tmp_path / "run", bindings))
    run = subprocess.Popen(
        [sys.executable, "-m", "rlkit.train", str(gin_file)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    metrics = tmp_path / "run" / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while not (metrics.exists() and metrics.stat().st_size) and time.monotonic() < deadline:
        assert run.poll() is None, run.stderr.read()[-2000:]
        time.sleep(0.5)
    run.send_signal(signal.SIGTERM)
    _, err = run.communicate(timeout=120)
    assert run.returncode == -signal.SIGTERM  # it still dies of the signal: 143 in a shell
    assert "rlkit train: terminated (SIGTERM) at step" in err
    assert "no checkpoint in" in err  # and says what a new run of the command would do


def test_an_ignored_ctrl_c_during_a_checkpoint_write_announces_nothing(capsys):
    from rlkit.trainer.checkpoint import _interrupt_after_write

    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as under `nohup` or `&`
    try:
        with _interrupt_after_write("global_step_1"):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.1)
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)
    assert "stopping after checkpoint" not in capsys.readouterr().err


def test_a_full_disk_during_a_checkpoint_is_one_message_and_leaves_no_partial_one(
    tmp_path, tiny_model_dir
):
    # A real full disk: a 2 MiB tmpfs, mounted in a mount namespace of its own (gone when
    # the command ends). One checkpoint of the tiny model (1.4 MiB) fits, the second not.
    disk = tmp_path / "disk"
    disk.mkdir()
    bindings = ONE_STEP | {"TrainerConfig.save_freq": 1, "TrainerConfig.total_steps": 2}
    gin_file = tmp_path / "experiment.gin"
    gin_file.write_text(arithmetic_gin(tiny_model_dir, disk / "run", bindings))
    script = (
        f"mount -t tmpfs -o size=2m tmpfs {disk} && "
        f"{sys.executable} -m rlkit.train {gin_file}; echo status=$?; "
        f"ls -a {disk}/run/checkpoints"
    )
    done = subprocess.run(
        ["unshare", "--mount", "sh", "-c", script], capture_output=True, text=True, timeout=600
    )
    assert "status=2" in done.stdout, done.stderr[-3000:]
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("rlkit train:")]
    assert "Traceback" not in done.stderr and len(lines) == 1, done.stderr[-3000:]
    assert "no space left on device while writing checkpoint global_step_2" in lines[0]
    assert "global_step_1 is still the latest" in lines[0]
    listed = done.stdout.split()
    assert "global_step_1" in listed and ".tmp-global_step_2" not in listed  # removed
