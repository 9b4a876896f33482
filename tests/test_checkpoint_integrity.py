"""A checkpoint whose bytes changed on disk never resumes silently, and a run directory
with a damaged ``metrics.jsonl`` still resumes, losing nothing: ``rlkit train`` and
``rlkit export`` as a user runs them, on a real two-checkpoint run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rlkit import export
from rlkit.train import main as rlkit_train
from rlkit.trainer.checkpoint import MANIFEST
from tests.gin_files import arithmetic_gin

BINDINGS = {
    "TrainerConfig.total_steps": 2,
    "TrainerConfig.save_freq": 1,
    "TrainerConfig.val_before_train": False,
    "OptimConfig.ppo_mini_batch_size": 4,
    "OptimConfig.micro_batch_size": 4,
    "DataConfig.max_prompt_length": 64,
}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, tiny_model_dir) -> Path:
    """A run of 2 steps with checkpoints global_step_1 and global_step_2."""
    out = tmp_path_factory.mktemp("integrity") / "run"
    gin_file = out.parent / "experiment.gin"
    gin_file.write_text(arithmetic_gin(tiny_model_dir, out, BINDINGS))
    assert rlkit_train([str(gin_file)]) == 0
    return out


def _copy(run: Path, tmp_path: Path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(run, out)
    return out


def _train(capfd, out: Path, *bindings: str) -> tuple[int, str, str]:
    """Resume ``out`` to step 3 with ``bindings``; exit status, stdout, stderr."""
    model = json.loads((out / "resolved_config.json").read_text())["model"]["path"]
    gin_file = out.parent / "experiment.gin"
    gin_file.write_text(arithmetic_gin(model, out, BINDINGS | {"TrainerConfig.total_steps": 3}))
    args = [str(gin_file)]
    for binding in bindings:
        args += ["--gin_param", binding]
    capfd.readouterr()
    status = rlkit_train(args)
    captured = capfd.readouterr()
    return status, captured.out, captured.err


def _flip_a_byte(directory: Path) -> Path:
    """Bit rot: one byte of the largest shard changed, the file's size kept."""
    shard = max((p for p in directory.rglob("*.distcp")), key=lambda p: p.stat().st_size)
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    return shard


def test_every_checkpoint_has_a_manifest_of_every_file(finished_run):
    ckpt = finished_run / "checkpoints" / "global_step_2"
    listed = set(json.loads((ckpt / MANIFEST).read_text())["files"])
    on_disk = {p.relative_to(ckpt).as_posix() for p in ckpt.rglob("*") if p.is_file()}
    assert listed == on_disk - {MANIFEST}
    assert {"trainer_state.pt", "rng_rank0.pt", "COMPLETE"} <= listed


def test_a_corrupted_latest_checkpoint_falls_back_to_an_intact_one(capfd, finished_run, tmp_path):
    out = _copy(finished_run, tmp_path)
    shard = _flip_a_byte(out / "checkpoints" / "global_step_2")
    with pytest.warns(UserWarning, match=f"global_step_2 is corrupted: .*{shard.name}"):
        status, stdout, stderr = _train(capfd, out)
    assert status == 0, stderr
    assert "resumed_from=" in stdout and "global_step_1" in stdout
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps[-2:] == [2, 3]


def test_stop_on_a_corrupted_checkpoint_writes_nothing(capfd, finished_run, tmp_path):
    out = _copy(finished_run, tmp_path)
    _flip_a_byte(out / "checkpoints" / "global_step_2")
    metrics = (out / "metrics.jsonl").read_bytes()
    status, _, stderr = _train(capfd, out, "TrainerConfig.on_corrupt_checkpoint = 'stop'")
    assert status == 2 and "Traceback" not in stderr
    assert "global_step_2 is corrupted" in stderr.strip().splitlines()[-1]
    assert not list(out.glob("config.resume_step_*"))
    assert (out / "metrics.jsonl").read_bytes() == metrics


def test_a_truncated_checkpoint_without_a_manifest_is_one_message(capfd, finished_run, tmp_path):
    out = _copy(finished_run, tmp_path)
    ckpt = out / "checkpoints" / "global_step_2"
    (ckpt / MANIFEST).unlink()  # as saved by an older rlkit
    state = ckpt / "trainer_state.pt"
    state.write_bytes(state.read_bytes()[:100])
    status, _, stderr = _train(capfd, out)
    assert status == 2 and "Traceback" not in stderr
    assert "global_step_2 cannot be read" in stderr.strip().splitlines()[-1]


def test_export_refuses_a_corrupted_checkpoint(capfd, finished_run, tmp_path):
    out = _copy(finished_run, tmp_path)
    _flip_a_byte(out / "checkpoints" / "global_step_2")
    capfd.readouterr()
    status = export.main([str(out), str(tmp_path / "hf")])
    stderr = capfd.readouterr().err
    assert status == 2 and "Traceback" not in stderr
    assert "global_step_2 is corrupted" in stderr
    assert not (tmp_path / "hf").exists()


def test_unparsable_metrics_lines_are_quarantined_on_resume(capfd, finished_run, tmp_path):
    out = _copy(finished_run, tmp_path)
    lines = (out / "metrics.jsonl").read_bytes().splitlines(keepends=True)
    garbage, not_utf8 = b"}{ not json\n", b"\xff\xfe\x00 latin garbage\n"
    (out / "metrics.jsonl").write_bytes(lines[0] + garbage + b"".join(lines[1:]) + not_utf8)
    with pytest.warns(UserWarning, match="moved 2 line"):
        status, _, stderr = _train(capfd, out)
    assert status == 0, stderr
    assert (out / "metrics.quarantined.jsonl").read_bytes() == garbage + not_utf8
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]


def test_every_checkpoint_damaged_stops_instead_of_starting_over(capfd, finished_run, tmp_path):
    out = _copy(finished_run, tmp_path)
    for step in (1, 2):
        _flip_a_byte(out / "checkpoints" / f"global_step_{step}")
    before = (out / "metrics.jsonl").read_text()
    status, _, err = _train(capfd, out)  # on_corrupt_checkpoint = "fallback" (the default)
    assert status == 2
    assert "every checkpoint in" in err and "global_step_2, global_step_1" in err
    assert "start over from step 0" in err and "Traceback" not in err
    assert (out / "metrics.jsonl").read_text() == before  # the old metrics are kept


def test_a_truncated_shard_without_a_manifest_is_one_message(capfd, finished_run, tmp_path):
    out = _copy(finished_run, tmp_path)
    ckpt = out / "checkpoints" / "global_step_2"
    (ckpt / MANIFEST).unlink()  # as saved by an older rlkit: nothing checks the bytes first
    shard = max((p for p in ckpt.rglob("*.distcp")), key=lambda p: p.stat().st_size)
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 3])
    status, _, stderr = _train(capfd, out)
    assert status == 2 and "Traceback" not in stderr, stderr[-3000:]
    assert "global_step_2 cannot be read" in stderr.strip().splitlines()[-1]


def test_a_checkpoint_of_another_model_is_one_message(capfd, finished_run, tmp_path):
    from rlkit.models.tiny import build_tiny_qwen2, train_byte_tokenizer

    out = _copy(finished_run, tmp_path)
    other = build_tiny_qwen2(tmp_path / "other", train_byte_tokenizer(), hidden_size=32, seed=1)
    checkpoint = out / "checkpoints" / "global_step_2"
    gin_file = tmp_path / "other.gin"
    gin_file.write_text(
        arithmetic_gin(
            other,
            tmp_path / "other_run",
            BINDINGS
            | {"TrainerConfig.total_steps": 3, "TrainerConfig.resume_mode": str(checkpoint)},
        )
    )
    capfd.readouterr()
    status = rlkit_train([str(gin_file)])
    stderr = capfd.readouterr().err
    assert status == 2 and "Traceback" not in stderr, stderr[-3000:]
    assert "global_step_2 cannot be read" in stderr.strip().splitlines()[-1]


def test_export_of_a_truncated_shard_without_a_manifest_is_one_message(
    capfd, finished_run, tmp_path
):
    out = _copy(finished_run, tmp_path)
    ckpt = out / "checkpoints" / "global_step_2"
    (ckpt / MANIFEST).unlink()
    for shard in ckpt.rglob("*.distcp"):
        shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 3])
    capfd.readouterr()
    status = export.main([str(out), str(tmp_path / "hf")])
    stderr = capfd.readouterr().err
    assert status == 2 and "Traceback" not in stderr, stderr[-3000:]
    assert "global_step_2 cannot be read" in stderr
    assert not (tmp_path / "hf").exists()
