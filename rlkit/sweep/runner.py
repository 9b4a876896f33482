"""Run one sweep point as a ``rlkit train`` subprocess, and remember how it ended.

Each run is a separate process, so gin bindings, registries and RNG state of one
run never leak into the next, and a crash (even a segfault or an out-of-memory
kill) only fails that run. Its console output goes to ``<run dir>/train.log``;
``<run dir>/sweep_run.json`` records the outcome, which is how a re-started
sweep knows to skip the run (completed) or to run it again (failed or never
finished; the trainer then resumes from its latest checkpoint).
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from rlkit.sweep.spec import RunSpec, SweepError

STATUS_FILE = "sweep_run.json"
LOG_FILE = "train.log"
COMPLETED, FAILED = "completed", "failed"
_KILL_GRACE_S = 10.0


@dataclass
class RunRecord:
    """How a run ended.

    Attributes:
        name: the run name.
        status: ``completed`` or ``failed``.
        run_dir: the run's output directory.
        log: the run's console log.
        returncode: the process's exit status (``None`` if it was stopped by the time limit).
        wall_s: seconds the run took (the original run's time when it was skipped).
        skipped: ``True`` if an earlier invocation had already completed it.
        error: why a failed run failed (exit status, time limit).
        args: the ``rlkit train`` arguments (configs and bindings) it ran with.
        config_sha256: digest of the contents of its config files (not of files they
            ``include``), so an edited experiment file is noticed on resume.
    """

    name: str
    status: str
    run_dir: str
    log: str
    returncode: int | None = None
    wall_s: float = 0.0
    skipped: bool = False
    error: str = ""
    args: tuple[str, ...] = ()
    config_sha256: str = ""


def config_digest(run: RunSpec) -> str:
    """SHA-256 of the run's config files' contents, in order."""
    digest = hashlib.sha256()
    for path in run.configs:
        digest.update(Path(path).read_bytes())
    return digest.hexdigest()


def train_command(run: RunSpec, run_dir: Path, launcher: str = "") -> list[str]:
    """The command line of one run: ``<launcher or python> -m rlkit.train <args>``."""
    prefix = shlex.split(launcher) if launcher.strip() else [sys.executable]
    return [*prefix, "-m", "rlkit.train", *run.train_args(run_dir)]


def previous_record(run: RunSpec, run_dir: Path) -> RunRecord | None:
    """The record an earlier invocation left in ``run_dir``, if any.

    Raises:
        SweepError: ``run_dir`` holds a run made with different arguments or from
            config files whose contents changed since (resuming it, or listing it
            as done, would mix two experiments).
    """
    path = run_dir / STATUS_FILE
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    data["args"] = tuple(data.get("args", ()))
    record = RunRecord(**data)
    if record.args != tuple(run.train_args(run_dir)):
        what = "bindings or config files"
    elif record.config_sha256 != config_digest(run):
        what = "config file contents (an experiment file was edited since)"
    else:
        return record
    raise SweepError(
        f"{run_dir} holds a run made with different {what} than sweep point {run.name!r}; "
        f"delete that directory or set Sweep.output_dir to a new folder"
    )


def execute(
    run: RunSpec, run_dir: Path, *, launcher: str = "", timeout_s: float | None = None
) -> RunRecord:
    """Run ``rlkit train`` for ``run`` into ``run_dir``; never raises for a failed run.

    Args:
        run: the grid point.
        run_dir: its output directory (created).
        launcher: command prefix (see :class:`~rlkit.sweep.spec.SweepSpec`).
        timeout_s: stop the run (its whole process group) after this many seconds.

    Returns:
        The :class:`RunRecord`, also written to ``run_dir/sweep_run.json``.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    log = run_dir / LOG_FILE
    command = train_command(run, run_dir, launcher)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    started = time.perf_counter()
    with open(log, "w", encoding="utf-8") as fh:
        fh.write("$ " + shlex.join(command) + "\n")
        fh.flush()
        # Its own process group, so a time-out also stops the workers a launcher starts.
        proc = subprocess.Popen(
            command, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        returncode, error = _wait(proc, timeout_s)
    status = COMPLETED if returncode == 0 and not error else FAILED
    if status == FAILED and not error:
        error = f"exit status {returncode}"
    record = RunRecord(
        run.name,
        status,
        str(run_dir),
        str(log),
        returncode,
        time.perf_counter() - started,
        error=error,
        args=tuple(run.train_args(run_dir)),
        config_sha256=config_digest(run),
    )
    (run_dir / STATUS_FILE).write_text(json.dumps(asdict(record), indent=2) + "\n")
    return record


def _wait(proc: subprocess.Popen, timeout_s: float | None) -> tuple[int | None, str]:
    try:
        return proc.wait(timeout=timeout_s), ""
    except subprocess.TimeoutExpired:
        _stop_group(proc)
        return None, f"stopped after the time limit of {timeout_s:g} s"
    except BaseException:  # Ctrl-C: do not leave an orphaned training run behind
        _stop_group(proc)
        raise


def _stop_group(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=_KILL_GRACE_S)
            return
        except subprocess.TimeoutExpired:
            continue
