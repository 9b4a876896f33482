"""Run one sweep point as a ``rlkit train`` subprocess, and remember how it ended.

Each run is a separate process, so gin bindings, registries and RNG state of one
run never leak into the next, and a crash (even a segfault or an out-of-memory
kill) only fails that run. Its console output goes to ``<run dir>/train.log``
(each attempt appended after the last); ``<run dir>/sweep_run.json`` records the
outcome, which is how a re-started sweep knows to skip the run (completed) or to
run it again (failed or never finished; the trainer then resumes from its latest
checkpoint, ``TrainerConfig.resume_mode = "auto"``).

Runs may go several at once (``Sweep.max_parallel``): each then gets
``TrainerConfig.num_threads`` as a leading binding, which is not part of the
recorded arguments, so a sweep can be resumed with another parallelism.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from rlkit.sweep.spec import RunSpec, SweepError

STATUS_FILE = "sweep_run.json"
LOG_FILE = "train.log"
COMPLETED, FAILED = "completed", "failed"
_KILL_GRACE_S = 10.0
# The processes of runs under way, so that Ctrl-C can stop every one (several go at once).
_RUNNING: set[subprocess.Popen] = set()
_RUNNING_LOCK = threading.Lock()


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


def thread_binding(threads: int | None) -> tuple[str, ...]:
    """``("TrainerConfig.num_threads = N",)`` for a run given N threads, else ``()``."""
    return () if threads is None else (f"TrainerConfig.num_threads = {int(threads)}",)


def train_command(
    run: RunSpec, run_dir: Path, launcher: str = "", threads: int | None = None
) -> list[str]:
    """The command line of one run: ``<launcher or python> -m rlkit.train <args>``.

    ``threads`` (a parallel sweep's share of the cores) is bound before the run's own
    bindings, so a thread count set in ``Sweep.bindings`` or the grid still wins.
    """
    prefix = shlex.split(launcher) if launcher.strip() else [sys.executable]
    return [*prefix, "-m", "rlkit.train", *run.train_args(run_dir, thread_binding(threads))]


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
    run: RunSpec,
    run_dir: Path,
    *,
    launcher: str = "",
    timeout_s: float | None = None,
    threads: int | None = None,
) -> RunRecord:
    """Run ``rlkit train`` for ``run`` into ``run_dir``; never raises for a failed run.

    Args:
        run: the grid point.
        run_dir: its output directory (created).
        launcher: command prefix (see :class:`~rlkit.sweep.spec.SweepSpec`).
        timeout_s: stop the run (its whole process group) after this many seconds.
        threads: bind ``TrainerConfig.num_threads`` to this (``None``: leave it).

    Returns:
        The :class:`RunRecord`, also written to ``run_dir/sweep_run.json``.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    log = run_dir / LOG_FILE
    command = train_command(run, run_dir, launcher, threads)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    started = time.perf_counter()
    # Appended: the log of an attempt that failed or was interrupted stays readable.
    with open(log, "a", encoding="utf-8") as fh:
        fh.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')}\n$ {shlex.join(command)}\n")
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


def stop_running() -> None:
    """Stop every run under way (each whole process group): Ctrl-C in a parallel sweep."""
    with _RUNNING_LOCK:
        running = list(_RUNNING)
    for proc in running:
        _stop_group(proc)


def _wait(proc: subprocess.Popen, timeout_s: float | None) -> tuple[int | None, str]:
    with _RUNNING_LOCK:
        _RUNNING.add(proc)
    try:
        return proc.wait(timeout=timeout_s), ""
    except subprocess.TimeoutExpired:
        _stop_group(proc)
        return None, f"stopped after the time limit of {timeout_s:g} s"
    except BaseException:  # Ctrl-C: do not leave an orphaned training run behind
        _stop_group(proc)
        raise
    finally:
        with _RUNNING_LOCK:
            _RUNNING.discard(proc)


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
