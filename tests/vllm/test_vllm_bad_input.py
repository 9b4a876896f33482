"""`rlkit train` with the vLLM engine and something wrong with vLLM: one message naming the
fix and exit status 2, before any training step, never a traceback."""

from __future__ import annotations

import json
import shutil
import socket
import sys

import gin
import pytest

from rlkit.train import main as train_main
from tests.gin_files import arithmetic_gin
from tests.test_one_line_errors import RUN
from tests.vllm.conftest import CPU_SERVER, require_vllm

pytestmark = pytest.mark.vllm


@pytest.fixture(autouse=True)
def _no_gin_left_behind():
    """`rlkit train` runs in this process: its gin bindings must not reach later tests."""
    yield
    gin.clear_config()


def train_on_vllm(tmp_path, model, capfd, **options) -> str:
    """Run `rlkit train` on ``model`` with the vLLM engine; its stderr, after asserting it
    stopped with a user error before writing any step."""
    bindings = RUN | {
        "RolloutConfig.engine": "vllm",
        "RolloutConfig.engine_options": {"device": "cpu", **options},
    }
    config = tmp_path / "run.gin"
    config.write_text(arithmetic_gin(model, tmp_path / "out", bindings))
    capfd.readouterr()
    assert train_main([str(config)]) == 2
    err = capfd.readouterr().err
    assert "Traceback" not in err
    assert not list((tmp_path / "out").glob("checkpoints/step_*")), "no step may have run"
    return err


def test_vllm_not_installed_names_the_install_script(tmp_path, tiny_model_dir, capfd):
    # The trainer's own interpreter: its environment has no vLLM.
    err = train_on_vllm(tmp_path, tiny_model_dir, capfd, python=sys.executable)
    assert f"vLLM is not installed for {sys.executable}" in err
    assert "scripts/install_vllm.sh" in err


def test_a_missing_vllm_interpreter_is_named(tmp_path, tiny_model_dir, capfd, monkeypatch):
    monkeypatch.setenv("RLKIT_VLLM_PYTHON", str(tmp_path / "no_env" / "bin" / "python"))
    err = train_on_vllm(tmp_path, tiny_model_dir, capfd)
    assert "no_env/bin/python' does not exist" in err and "RLKIT_VLLM_PYTHON" in err


def test_an_unsupported_vllm_version_is_refused(tmp_path, tiny_model_dir, capfd, monkeypatch):
    require_vllm()
    # The installed vLLM (0.32) becomes "unsupported" when the engine speaks only 0.99.
    monkeypatch.setattr("rlkit.rollout.vllm.server.SUPPORTED_VERSIONS", ("0.99.",))
    err = train_on_vllm(tmp_path, tiny_model_dir, capfd)
    assert "vLLM 0.32.0" in err and "is not supported" in err and "0.99.x" in err


def test_an_attached_url_that_does_not_answer(tmp_path, tiny_model_dir, capfd):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    err = train_on_vllm(
        tmp_path, tiny_model_dir, capfd, num_servers=0, urls=[f"http://127.0.0.1:{port}"]
    )
    assert f"http://127.0.0.1:{port} does not answer GET /health" in err
    assert "fix the address in urls" in err


def test_a_head_size_vllm_cannot_run_on_cpu_is_refused_before_a_server_starts(
    tmp_path, tiny_model_dir, capfd
):
    require_vllm()
    # The suite's usual tiny model: 4 heads of 16; vLLM's CPU attention starts at 32.
    err = train_on_vllm(tmp_path, tiny_model_dir, capfd)
    assert "its attention head size is 16" in err and "engine='sglang'" in err
    assert not list((tmp_path / "out").rglob("vllm_server_*.log")), "no server was started"


def test_a_model_the_server_cannot_load_reports_its_log_and_command(tmp_path, model_dirs, capfd):
    require_vllm()
    model = tmp_path / "unknown_architecture"
    shutil.copytree(model_dirs["a"], model)
    config = json.loads((model / "config.json").read_text())
    config["architectures"] = ["NoSuchModelForCausalLM"]
    (model / "config.json").write_text(json.dumps(config))
    err = train_on_vllm(tmp_path, model, capfd, **CPU_SERVER)
    assert "exited with code" in err and "during startup" in err
    # The server's own reason, the one line of its log that says it, and where the log
    # is: in the run's directory.
    assert "Model architectures ['NoSuchModelForCausalLM'] are not supported" in err
    log = tmp_path / "out" / "servers" / "vllm_server_0.log"
    assert f"log: {log}" in err and log.is_file()
    assert "command: " in err and "vllm.entrypoints.openai.api_server --model" in err


def test_a_kv_cache_larger_than_the_machine_stops_with_the_cause_from_the_log(
    tmp_path, model_dirs, capfd
):
    require_vllm()
    err = train_on_vllm(
        tmp_path, model_dirs["a"], capfd, **(CPU_SERVER | {"kv_cache_gib": 100_000})
    )
    log = tmp_path / "out" / "servers" / "vllm_server_0.log"
    (cause,) = [line for line in err.splitlines() if "exited with code" in line]
    assert "during startup: ValueError: Available memory on node" in cause
    assert "is less than requested memory for kv (100000.0 GiB)" in cause
    assert "engine option kv_cache_gib" in cause  # which option sizes it
    assert f"log: {log}" in err and log.is_file()
    # One message: not the log's tracebacks, nor vLLM's "see root cause above" wrappers.
    assert "Engine core initialization failed" not in err and 'File "' not in err
