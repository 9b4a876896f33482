"""A step's reward phase is bounded: one deadline per batch, a watchdog for C hangs, and a
failure rate that stops the run."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

import rewards
from rewards.batch_scoring import BatchScores
from rlkit.trainer.scoring import RewardFailure, check_failure_rate
from tests.faulty_components import sleepy_reward


def test_a_reward_that_hangs_everywhere_costs_the_batch_one_deadline_inline(caplog):
    # 8 calls of a reward that sleeps 30 s, 1 s limit each: 8 s in series; the deadline
    # (2 s) stops the batch after the first two calls, the other six are never started.
    start = time.monotonic()
    out = rewards.score_batch(
        sleepy_reward, ["x"] * 8, ["y"] * 8, timeout_s=1.0, deadline_s=2.0, num_workers=0
    )
    assert time.monotonic() - start < 4.0
    assert out.scores == [0.0] * 8 and out.num_timeouts == 8
    assert sum("deadline" in i["error"] for i in out.infos) == out.num_past_deadline >= 5
    assert out.metrics()["reward/num_past_deadline"] == out.num_past_deadline
    warned = [r.getMessage() for r in caplog.records if "reward deadline (2 s)" in r.getMessage()]
    assert warned and "DataConfig.reward_deadline_s" in warned[0]


def test_the_deadline_bounds_a_worker_pool_batch_too():
    out = rewards.score_batch(
        sleepy_reward, ["x"] * 6, ["y"] * 6, timeout_s=5.0, deadline_s=1.0, num_workers=2
    )
    assert out.num_timeouts == out.num_past_deadline == 6  # 2 in flight killed, 4 never sent


def run_stuck_scoring(score_call: str, stuck_when: str = "True") -> str:
    """Run ``rewards.<score_call>`` in a fresh process on a reward stuck in one C call
    where ``stuck_when`` holds (else it returns 1.0); the process must be ended by the
    watchdog, status 1, within 30 s. Returns its stderr.

    sum(range(10**11)) is one C call: SIGALRM's handler cannot run until it returns
    (minutes), so only the watchdog stops it."""
    code = (
        "import rewards\n"
        "def stuck(response, ground_truth, **extra):\n"
        f"    return float(sum(range(10**11))) if {stuck_when} else 1.0\n"
        f"rewards.{score_call}\n"
    )
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    # One line: the stuck call by name and line, the fix, and where every stack went.
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert line.startswith("rlkit: a reward call hung inside one C call")
    assert "stuck in stuck (<string>, line 3)" in line
    assert "DataConfig.reward_workers >= 1" in line
    stacks = Path(line.rsplit("every thread's stack: ", 1)[1])
    assert "in stuck" in stacks.read_text()  # the watchdog's full dump, kept
    assert time.monotonic() - start < 30
    return proc.stderr


def test_a_reward_stuck_in_one_c_call_ends_the_process_with_a_message():
    # The call's limit (0.5 s) + the hard limit (0.5 s).
    stderr = run_stuck_scoring("score_batch(stuck, ['x'], ['y'], timeout_s=0.5, hard_limit_s=0.5)")
    assert "Timeout (0:00:01)!" in stderr


def test_with_a_deadline_one_watchdog_ends_a_batch_stuck_in_a_c_call():
    # The first call returns; the second is stuck in C past its 0.5 s limit: the batch's
    # watchdog fires at the deadline (1 s) + the hard limit (0.5 s), about 1.5 s.
    call = (
        "score_batch(stuck, ['ok', 'x'], ['y', 'y'], timeout_s=0.5, deadline_s=1.0, "
        "hard_limit_s=0.5)"
    )
    assert "Timeout (0:00:01." in run_stuck_scoring(call, stuck_when="response == 'x'")


def test_a_batch_that_finishes_disarms_its_watchdog():
    out = rewards.score_batch(
        "exact_match", ["12"] * 4, ["12"] * 4, timeout_s=1.0, deadline_s=0.5, hard_limit_s=0.1
    )
    time.sleep(1.0)  # past deadline + hard limit: an armed watchdog would end this process
    assert out.scores == [1.0] * 4


@pytest.mark.parametrize(
    ("failed", "rate", "stops"), [(4, 1.0, True), (3, 1.0, False), (2, 0.5, True), (1, 0.5, False)]
)
def test_the_failure_rate_stops_the_run_with_the_first_error(failed, rate, stops):
    errors = [{"error": f"ZeroDivisionError: row {i}"} for i in range(failed)]
    result = BatchScores([0.0] * 4, errors + [{}] * (4 - failed), num_errors=failed)
    if not stops:
        check_failure_rate(result, rate)
        return
    with pytest.raises(RewardFailure, match="first: ZeroDivisionError: row 0"):
        check_failure_rate(result, rate)
