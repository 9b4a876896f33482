"""A checkpoint write that fails on one process fails on every process, with the same
full-disk message, and leaves the previous checkpoint the latest: no process hangs in a
collective the failed one never reaches (checkpoint_failure_checks.py runs the saves)."""

from __future__ import annotations

import errno
import json
import subprocess
from pathlib import Path

import pytest

from rlkit.models.tiny import build_tiny_qwen2, train_byte_tokenizer
from tests.distributed.launch import accelerate_launch, launch_env

pytestmark = pytest.mark.distributed

SCRIPT = Path(__file__).with_name("checkpoint_failure_checks.py")
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    root = tmp_path_factory.mktemp("ckpt_failures")
    model = build_tiny_qwen2(root / "model", train_byte_tokenizer())
    out = root / "run"
    out.mkdir()
    command = [*accelerate_launch(2), str(SCRIPT), "--model", str(model), "--out", str(out)]
    # A hang guard: a process left waiting in a collective would never exit.
    proc = subprocess.run(
        command, cwd=REPO, env=launch_env(), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return [json.loads((out / f"result_rank{r}.json").read_text()) for r in (0, 1)] + [out]


@pytest.mark.parametrize("step", ["step_2", "step_3"], ids=["rank1_rng_file", "rank0_state"])
def test_a_full_disk_on_one_process_fails_the_save_on_every_process(ranks, step):
    for result in ranks[:2]:
        failed = result[step]
        assert failed["errno"] == errno.ENOSPC
        assert "no space left on device while writing checkpoint" in failed["message"]
        assert failed["latest"] == "global_step_1"


def test_the_run_directory_keeps_only_complete_checkpoints_and_saves_again(ranks):
    out = ranks[2] / "checkpoints"
    for result in ranks[:2]:
        assert result["step_1"]["saved"] == "global_step_1"
        assert result["step_4"] == {"saved": "global_step_4", "latest": "global_step_4"}
    names = sorted(p.name for p in out.iterdir())
    assert names == ["global_step_1", "global_step_4", "latest"]  # no partial .tmp-*


def test_the_manifest_covers_every_process_s_files_and_catches_a_changed_one(ranks):
    from rlkit.trainer.checkpoint import MANIFEST, CheckpointError, verify_checkpoint

    ckpt = ranks[2] / "checkpoints" / "global_step_4"
    listed = set(json.loads((ckpt / MANIFEST).read_text())["files"])
    on_disk = {p.relative_to(ckpt).as_posix() for p in ckpt.rglob("*") if p.is_file()}
    assert listed == on_disk - {MANIFEST}
    assert {"rng_rank0.pt", "rng_rank1.pt"} <= listed
    assert len([name for name in listed if name.endswith(".distcp")]) == 2  # one per rank
    verify_checkpoint(ckpt)
    shard = ckpt / sorted(name for name in listed if name.endswith(".distcp"))[1]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF  # bit rot (the last test of this module: nothing reads it after)
    shard.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=f"{shard.name} changed"):
        verify_checkpoint(ckpt)
