"""The line of a server log that says why it did not start (no server: logs of real failed
starts, kept in ``startup_logs/``, and a server stand-in that dies).

The logs are vLLM 0.32 (CPU build) and SGLang 0.5.23 servers that exited while starting:
a bad flag value, a KV cache larger than the machine, vLLM's default CPU memory
utilization (92%) with memory in use, an architecture neither knows.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from rlkit.rollout.servers.errors import ServerStartError
from rlkit.rollout.servers.process import ManagedServer
from rlkit.rollout.servers.startup_log import MAX_LENGTH, START_MARKER, root_cause

LOGS = Path(__file__).parent / "startup_logs"


@pytest.mark.parametrize(
    "log, cause",
    [
        (
            "vllm_bad_flag_value.log",
            "api_server.py: error: argument --max-model-len: invalid "
            "human_readable_int_or_auto value: 'abc'",
        ),
        (
            "vllm_kv_cache_too_large.log",
            "ValueError: Available memory on node 0 (17.88/23.54 GiB) on kv cache allocation "
            "is less than requested memory for kv (93132.26 GiB).",
        ),
        (
            "vllm_cpu_memory_utilization.log",
            "ValueError: Available memory on node 0 (17.84/23.54 GiB) on startup is less "
            "than desired CPU memory utilization (0.92, 21.66 GiB).",
        ),
        (
            "vllm_unknown_architecture.log",
            "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig: "
            "Value error, Model architectures ['NoSuchModelForCausalLM'] are not supported",
        ),
        (
            "sglang_unknown_architecture.log",
            "ValueError: Cannot find model module. 'NoSuchModelForCausalLM' is not a "
            "registered model",
        ),
    ],
)
def test_the_cause_of_a_real_failed_start_is_found(log, cause):
    found = root_cause((LOGS / log).read_text())
    assert found is not None and found.startswith(cause), found
    # Log prefixes are gone; wrappers ("see root cause above") and warnings that mention
    # an error (vLLM's ulimit warning names OSError) are never picked.
    assert "pid=" not in found and "root cause" not in found and "ulimit" not in found
    assert len(found) <= MAX_LENGTH


def test_memory_lines_win_over_an_earlier_exception():
    log = (
        "(APIServer pid=1) INFO 12-06 06:00:00 [api.py:1] starting\n"
        "KeyError: 'rope_scaling'\n"
        "(EngineCore pid=2) ERROR 12-06 06:00:01 [core.py:9] RuntimeError: CPU out of memory "
        "allocating 9.00 GiB\n"
    )
    assert root_cause(log) == "RuntimeError: CPU out of memory allocating 9.00 GiB"


def test_warnings_and_info_lines_never_count():
    log = (
        "(APIServer pid=1) WARNING 12-06 06:00:00 [x.py:1] failed with error: "
        "OSError: [Errno 24] Too many open files\n"
        "(APIServer pid=1) INFO 12-06 06:00:00 [x.py:2] RuntimeError: nothing is wrong\n"
    )
    assert root_cause(log) is None


def test_only_the_last_start_of_a_restarted_server_is_read():
    log = (
        f"{START_MARKER}vLLM server on port 1 at 2026-01-01 00:00:00: python -m x\n"
        "ValueError: the first start's reason\n"
        f"{START_MARKER}vLLM server on port 1 at 2026-01-01 00:01:00: python -m x\n"
        "[2026-01-01 00:01:02] Scheduler hit an exception: Traceback (most recent call last):\n"
        '  File "x.py", line 3, in <module>\n'
        "torch.OutOfMemoryError: the second start's reason\n"
        "[2026-01-01 00:01:03] Received sigquit from a child process. It usually means the "
        "child failed.\n"
    )
    assert root_cause(log) == "torch.OutOfMemoryError: the second start's reason"


def test_an_error_line_is_the_last_resort_and_long_causes_are_cut():
    log = "(APIServer pid=1) ERROR 12-06 06:00:00 [x.py:1] the port is taken " + "x" * 2000
    found = root_cause(log)
    assert found.startswith("the port is taken") and found.endswith("...")
    assert len(found) == MAX_LENGTH


@dataclass(frozen=True)
class DyingServer:
    """A stand-in launch whose process prints a vLLM-like failure and exits."""

    script: str
    server_name: str = "vLLM"
    host: str = "127.0.0.1"
    startup_timeout_s: float = 30.0
    env: dict[str, str] = field(default_factory=dict)

    def command(self, port: int) -> list[str]:
        return [sys.executable, "-c", self.script]

    def environment(self, base):
        return dict(base)

    def with_weights(self, model_path, weight_version):
        return self


def test_a_server_that_dies_while_starting_raises_its_cause_and_log_path(tmp_path):
    script = (
        "import sys\n"
        "print('(APIServer pid=5) INFO 12-06 06:00:00 [a.py:1] starting')\n"
        "print('(Worker pid=6) ERROR 12-06 06:00:01 [w.py:2] ValueError: Available memory on "
        "node 0 (1.00/23.54 GiB) on startup is less than desired CPU memory utilization')\n"
        "print('RuntimeError: Engine core initialization failed. See root cause above.')\n"
        "sys.exit(1)\n"
    )
    server = ManagedServer(DyingServer(script), tmp_path / "servers" / "vllm_server_0.log")
    with pytest.raises(ServerStartError) as caught:
        server.start()
    message = str(caught.value)
    first, *rest = message.splitlines()
    assert (
        first.startswith("vLLM server on port ") and "exited with code 1 during startup: " in first
    )
    assert first.endswith("less than desired CPU memory utilization")
    assert f"log: {tmp_path / 'servers' / 'vllm_server_0.log'}" in rest
    assert any(line.startswith("command: ") for line in rest)
    reported = message.split("\ncommand: ")[0]  # the command holds the stand-in's script
    assert "Engine core initialization failed" not in reported and "INFO" not in reported
