"""The weight gate between generation calls and weight syncs (real threads)."""

from __future__ import annotations

import threading
import time

from rlkit.trainer.weight_gate import WeightGate


def test_a_sync_waits_for_the_call_running_and_the_call_keeps_its_version():
    gate = WeightGate(version=3)
    inside, release = threading.Event(), threading.Event()
    seen: list[int] = []

    def call() -> None:
        with gate.generating() as version:
            seen.append(version)
            inside.set()
            release.wait(5)

    worker = threading.Thread(target=call)
    worker.start()
    assert inside.wait(5)
    gate.begin_sync()  # returns at once: it only stops new calls
    drained = threading.Thread(target=gate.wait_drained)
    drained.start()
    drained.join(0.2)
    assert drained.is_alive()  # the call started with version 3 is still running
    release.set()
    drained.join(5)
    assert not drained.is_alive()
    gate.end_sync(4)
    worker.join(5)
    assert seen == [3] and gate.version == 4
    assert gate.finished_across_sync == 1  # one call finished under the older weights


def test_calls_that_start_during_a_sync_wait_for_it_and_sample_the_new_version():
    gate = WeightGate(version=0)
    gate.begin_sync()
    seen: list[int] = []
    started = threading.Event()

    def call() -> None:
        started.set()
        with gate.generating() as version:
            seen.append(version)

    worker = threading.Thread(target=call)
    worker.start()
    assert started.wait(5)
    time.sleep(0.1)
    assert seen == []  # held at the gate while the sync runs
    gate.end_sync(1)
    worker.join(5)
    assert seen == [1]


def test_a_failed_sync_keeps_the_version_and_reopens_the_gate():
    gate = WeightGate(version=2)
    try:
        with gate.syncing(3):
            raise RuntimeError("server refused the weights")
    except RuntimeError:
        pass
    with gate.generating() as version:  # not blocked
        assert version == 2
