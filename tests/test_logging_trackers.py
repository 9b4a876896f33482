"""Experiment trackers (wandb, MLflow, SwanLab) record what ``metrics.jsonl`` records.

One short training run logs to every tracker whose package is installed, each in its
offline mode (no network): wandb with ``WANDB_MODE=offline``, MLflow in a file store
in the run folder, SwanLab with ``SWANLAB_MODE=offline``. Each tracker's own files are
then read back and compared, step by step and metric by metric, with ``metrics.jsonl``.
"""

from __future__ import annotations

import importlib.util
import math
import struct
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

from rlkit.logging import LoggerContext, LoggerStartWarning, MetricsLogger, read_metrics
from tests.experiment_factory import small_experiment

TRACKERS = {"wandb": "wandb", "mlflow": "mlflow", "swanlab": "swanlab"}  # logger -> module
INSTALLED = [name for name, module in TRACKERS.items() if importlib.util.find_spec(module)]
USER_SINK = "tests.test_logging_trackers:RecordingSink"

pytestmark = pytest.mark.slow


class RecordingSink:
    """A logger of one's own, named by ``pkg.module:factory``: keeps what it is given."""

    runs: list[RecordingSink] = []

    def __init__(self, ctx: LoggerContext) -> None:
        self.ctx, self.records, self.closed = ctx, [], False
        RecordingSink.runs.append(self)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.records.append({"step": step, **metrics})

    def close(self) -> None:
        self.closed = True


def expected(records: list[dict[str, Any]]) -> dict[tuple[int, str], float]:
    """(step, metric) -> value of every finite number in ``metrics.jsonl``."""
    return {
        (r["step"], k): v
        for r in records
        for k, v in r.items()
        if k != "step" and isinstance(v, int | float) and math.isfinite(v)
    }


def train(out: Path, model_dir: str, loggers: tuple[str, ...]) -> Path:
    from rlkit.trainer.trainer import RLTrainer

    cfg = small_experiment(
        model_dir,
        out,
        trainer={
            "save_at_end": False,
            "loggers": loggers,
            "project_name": "rlkit-tests",
            "experiment_name": "tiny",
        },
    )
    cfg.validate()
    RLTrainer(cfg).run()
    return out


@pytest.fixture(scope="module")
def tracked_run(demo_model_dir, tmp_path_factory) -> Path:
    """A 2-step run logged to jsonl, tensorboard, every installed tracker and a user sink."""
    patch = pytest.MonkeyPatch()
    patch.setenv("WANDB_MODE", "offline")
    patch.setenv("WANDB_SILENT", "true")
    patch.setenv("SWANLAB_MODE", "offline")
    patch.delenv("MLFLOW_TRACKING_URI", raising=False)
    RecordingSink.runs.clear()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", LoggerStartWarning)  # every tracker must start
            out = tmp_path_factory.mktemp("tracked") / "run"
            train(out, demo_model_dir, ("jsonl", "tensorboard", *INSTALLED, USER_SINK))
    finally:
        patch.undo()
    return out


def leveldb_records(path: Path) -> list[bytes]:
    """The records of a LevelDB-style log (wandb's ``.wandb``, SwanLab's ``.swanlab``):
    a 7-byte file header, then 32 KiB blocks of records, each with a 7-byte header
    (checksum, length, type: 1 full, 2 first, 3 middle, 4 last part)."""
    data, pos, out, part = path.read_bytes(), 7, [], b""
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # too little room for a header: zero padding
            pos += 32768 - pos % 32768
            continue
        length, kind = struct.unpack("<HB", data[pos + 4 : pos + 7])
        payload, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 1:
            out.append(payload)
        elif kind == 2:
            part = payload
        elif kind == 3:
            part += payload
        elif kind == 4:
            out.append(part + payload)
    return out


def assert_same(got: dict[tuple[int, str], float], run: Path) -> None:
    want = expected(read_metrics(run / "metrics.jsonl"))
    assert {s for s, _ in want} == {0, 1, 2}  # validation at 0, training steps 1 and 2
    assert set(got) == set(want)
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-6, abs=1e-9), key


def test_wandb_offline_run_holds_the_metrics_of_metrics_jsonl(tracked_run):
    pytest.importorskip("wandb", reason="wandb is not installed: pip install 'rlkit[wandb]'")
    import json

    from wandb.proto import wandb_internal_pb2

    (file,) = (tracked_run / "wandb").glob("offline-run-*/run-*.wandb")
    got: dict[tuple[int, str], float] = {}
    config = {}
    for data in leveldb_records(file):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        kind = record.WhichOneof("record_type")
        if kind == "history":
            row = {
                i.key or "/".join(i.nested_key): json.loads(i.value_json)
                for i in record.history.item
            }
            step = row.pop("_step")
            got.update({(step, k): v for k, v in row.items() if not k.startswith("_")})
        elif kind == "run":
            assert record.run.project == "rlkit-tests"
            assert record.run.display_name == "tiny"
            config = {i.key: json.loads(i.value_json) for i in record.run.config.update}
    assert_same(got, tracked_run)
    assert config["trainer.total_steps"] == 2 and config["trainer.loggers"][-1] == USER_SINK


def test_mlflow_file_store_holds_the_metrics_of_metrics_jsonl(tracked_run):
    pytest.importorskip("mlflow", reason="mlflow is not installed: pip install 'rlkit[mlflow]'")
    from mlflow.tracking import MlflowClient

    from rlkit.logging import mlflow_key

    client = MlflowClient(tracking_uri=(tracked_run / "mlruns").resolve().as_uri())
    experiment = client.get_experiment_by_name("rlkit-tests")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "tiny" and run.info.status == "FINISHED"
    assert run.data.params["trainer.total_steps"] == "2"
    keys = {k for _, k in expected(read_metrics(tracked_run / "metrics.jsonl"))}
    got = {
        (m.step, key): m.value
        for key in keys
        for m in client.get_metric_history(run.info.run_id, mlflow_key(key))
    }
    assert set(run.data.metrics) == {mlflow_key(k) for k in keys}  # no other metric
    assert_same(got, tracked_run)


def test_swanlab_offline_run_holds_the_metrics_of_metrics_jsonl(tracked_run):
    pytest.importorskip(
        "swanlab",
        reason="swanlab is not installed (it needs protobuf<7): pip install 'rlkit[swanlab]'",
    )
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record

    (file,) = (tracked_run / "swanlog").glob("run-*/run-*.swanlab")
    got: dict[tuple[int, str], float] = {}
    for data in leveldb_records(file):
        record = Record()
        record.ParseFromString(data)
        if record.HasField("start"):
            assert (record.start.project, record.start.name) == ("rlkit-tests", "tiny")
        # Keys under __swanlab__ are SwanLab's own system metrics (CPU, memory).
        if record.HasField("scalar") and not record.scalar.key.startswith("__swanlab__"):
            got[(record.scalar.step, record.scalar.key)] = record.scalar.value.number
    assert_same(got, tracked_run)


def test_a_logger_named_by_module_path_gets_every_record(tracked_run):
    (sink,) = RecordingSink.runs
    assert sink.closed and sink.ctx.project_name == "rlkit-tests"
    assert sink.ctx.config["trainer.loggers"][-1] == USER_SINK
    got = expected(sink.records)
    assert_same(got, tracked_run)
    assert (tracked_run / "tensorboard").is_dir()


def test_a_tracker_that_cannot_start_is_named_and_the_run_keeps_its_logs(
    demo_model_dir, tmp_path, monkeypatch
):
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed: import fails
    with pytest.warns(LoggerStartWarning) as caught:
        out = train(tmp_path / "run", demo_model_dir, ("jsonl", "tensorboard", "wandb"))
    (message,) = [str(w.message) for w in caught if issubclass(w.category, LoggerStartWarning)]
    assert "logger 'wandb' did not start (ModuleNotFoundError" in message
    assert "pip install 'rlkit[wandb]'" in message and "WANDB_MODE=offline" in message
    assert "goes on with jsonl, tensorboard" in message
    assert {r["step"] for r in read_metrics(out / "metrics.jsonl")} == {0, 1, 2}
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))


def test_bad_tracker_settings_are_named_and_metrics_jsonl_is_still_written(tmp_path, monkeypatch):
    pytest.importorskip("mlflow", reason="mlflow is not installed: pip install 'rlkit[mlflow]'")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "nosuchscheme://tracker")
    with pytest.warns(
        LoggerStartWarning, match=r"logger 'mlflow' did not start .*MLFLOW_TRACKING_URI"
    ):
        logger = MetricsLogger(tmp_path, total_steps=1, loggers=("mlflow",), progress_bar=False)
    assert logger.loggers == ["jsonl"]  # tensorboard was not asked for, jsonl always is
    logger.log({"a": 1.0}, step=1)
    logger.close()
    assert read_metrics(tmp_path / "metrics.jsonl") == [{"step": 1, "a": 1.0}]


def test_a_tracker_failing_mid_run_is_dropped_with_a_warning(tmp_path):
    logger = MetricsLogger(
        tmp_path, total_steps=2, loggers=(USER_SINK,), tensorboard=False, progress_bar=False
    )
    RecordingSink.runs[-1].log = lambda metrics, step: 1 / 0  # type: ignore[method-assign]
    with pytest.warns(LoggerStartWarning, match=r"failed at step 1 \(ZeroDivisionError"):
        logger.log({"a": 1.0}, step=1)
    logger.log({"a": 2.0}, step=2)  # no second warning: the sink is gone
    logger.close()
    assert logger.loggers == ["jsonl"]
    assert [r["a"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1.0, 2.0]


def test_the_default_loggers_follow_the_two_flags(tmp_path):
    from rlkit.logging import default_loggers
    from rlkit.trainer.config import TrainerConfig

    assert TrainerConfig().loggers == default_loggers() == ("console", "jsonl", "tensorboard")
    assert default_loggers(tensorboard=False, progress_bar=False) == ("jsonl",)
    logger = MetricsLogger(
        tmp_path, total_steps=1, loggers=("console", "tensorboard"), tensorboard=False
    )
    assert logger.loggers == ["jsonl", "console"]  # the flag switches tensorboard off
    logger.close()


@pytest.mark.parametrize(
    ("field", "value"),
    [("loggers", "wandb"), ("loggers", ("wandb", "nosuch")), ("project_name", "a/b")],
)
def test_logger_fields_are_validated(field, value):
    from rlkit.trainer.config import DataConfig, ExperimentConfig, ModelConfig, TrainerConfig

    cfg = ExperimentConfig(
        model=ModelConfig(path="some/model"),
        data=DataConfig(train_files="train.jsonl"),
        trainer=TrainerConfig(**{field: value}),
    )
    with pytest.raises(ValueError, match=f"TrainerConfig.{field} must be "):
        cfg.validate()


def test_a_full_disk_while_logging_says_so_and_names_the_file(tmp_path):
    # /dev/full is a real device whose every write fails with ENOSPC.
    import errno
    import os

    from rlkit.logging.trackers import JsonlSink, LoggerContext

    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full (Linux)")
    (tmp_path / "metrics.jsonl").symlink_to("/dev/full")
    sink = JsonlSink(LoggerContext(output_dir=tmp_path, total_steps=1))
    with pytest.raises(OSError, match="no space left on device while logging step 3 to") as info:
        sink.log({"actor/pg_loss": 0.5}, 3)
    assert info.value.errno == errno.ENOSPC and "metrics.jsonl" in str(info.value)
    sink.close()
