"""`rlkit train` on the vLLM engine with no engine options, on this CPU machine with memory
in use: the server gets the CPU and a KV cache sized for the run (vLLM's own default
reserves 92% of the machine's memory and dies when more than 8% is in use), and its log
lands in the run's directory. One real server, started by the run."""

from __future__ import annotations

import json

import gin
import psutil
import pytest

from rlkit.rollout.servers.startup_log import START_MARKER
from rlkit.train import main as train_main
from tests.gin_files import arithmetic_gin
from tests.test_one_line_errors import RUN
from tests.vllm.conftest import require_vllm

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

GIB = 1 << 30


@pytest.fixture(autouse=True)
def _no_gin_left_behind():
    yield
    gin.clear_config()


def hold_memory() -> bytearray:
    """Memory written (so resident) until the returned object is dropped: enough that
    more than 8% of this machine's memory is in use, the most vLLM's default allows."""
    vm = psutil.virtual_memory()
    size = max(GIB, int(0.08 * vm.total) + GIB - (vm.total - vm.available))
    assert size < vm.available - 6 * GIB, "this test needs the held memory and 6 GiB more"
    held = bytearray(b"\x01") * size
    assert psutil.virtual_memory().available < 0.92 * vm.total  # the old default would fail
    return held


def test_rlkit_train_on_vllm_with_no_engine_options_runs_3_steps_beside_memory_in_use(
    tmp_path, model_dirs, capfd, caplog
):
    require_vllm()
    out = tmp_path / "out"
    bindings = {k: v for k, v in RUN.items() if k != "TrainerConfig.save_freq"} | {
        "TrainerConfig.total_steps": 3,
        "TrainerConfig.save_at_end": False,
        "RolloutConfig.engine": "vllm",  # and no RolloutConfig.engine_options
    }
    config = tmp_path / "run.gin"
    config.write_text(arithmetic_gin(model_dirs["a"], out, bindings))
    held = hold_memory()
    capfd.readouterr()
    try:
        assert train_main([str(config)]) == 0
    finally:
        del held
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in steps if "actor/pg_loss" in m] == [1, 2, 3]
    # The defaults chosen, in one line: sized from the run (4 prompts x 4 samples x
    # (64 + 6) tokens is below the floor), not from the machine's memory.
    chosen = [r.getMessage() for r in caplog.records if "vLLM on CPU: KV cache" in r.getMessage()]
    assert len(chosen) == 1 and "\n" not in chosen[0]
    assert "16384 tokens: 16 sequences x 70 tokens = 1120, floor 16384" in chosen[0]
    # The server's log (and the weight snapshots) are in the run's directory.
    log = (out / "servers" / "vllm_server_0.log").read_text()
    (started,) = [line for line in log.splitlines() if line.startswith(START_MARKER)]
    assert (
        "--kv-cache-memory-bytes 67108864" in started and "--gpu-memory-utilization" not in started
    )
    assert (out / "servers" / "weights").is_dir()
