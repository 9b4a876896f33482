"""score_batch: one score per input in order, time limits, errors counted, worker pools."""

import math
import os
import signal
import threading
import time
import warnings

import pytest

import rewards
import rewards.time_limit
from rewards import BatchScores, score_batch
from rewards.time_limit import call_with_time_limit
from rewards.worker_pool import RewardWorkerPool


def misbehaving(response: str, ground_truth: str, **extra):
    """A reward whose behaviour the response picks (module level: workers import it)."""
    if response == "hang":
        time.sleep(10**6)
    if response == "spin":  # one long C call: no signal interrupts it
        sum(range(10**15))
    if response == "swallow":  # a reward that catches Exception cannot hide a timeout
        try:
            time.sleep(10**6)
        except Exception:
            return 1.0
    if response == "boom":
        raise RuntimeError("boom")
    if response == "die":
        os._exit(3)
    returns = {"nan": math.nan, "str": "1", "nodict": {"acc": 1.0}, "none": None}
    if response in returns:
        return returns[response]
    if response == "dict":
        return {"score": 0.5, "acc": 1.0, "pred": ground_truth}
    return float(len(response))  # "ok" -> 2.0


def test_inline_errors_score_zero_are_counted_and_order_is_kept():
    responses = ["ok", "boom", "dict", "nan", "str", "nodict", "none", "a"]
    out = score_batch(misbehaving, responses, ["7"] * 8)
    # ok -> 2; boom/nan/str/nodict/none -> errors scored 0; dict -> 0.5; "a" -> 1.
    assert out.scores == [2.0, 0.0, 0.5, 0.0, 0.0, 0.0, 0.0, 1.0]
    assert out.num_errors == 5 and out.num_timeouts == 0
    assert out.infos[1] == {"error": "RuntimeError: boom"}
    assert out.infos[2] == {"acc": 1.0, "pred": "7"}
    assert "non-finite" in out.infos[3]["error"] and "without a 'score'" in out.infos[5]["error"]
    assert len(out.scores) == len(out.infos) == len(responses)


def test_inline_time_limit_interrupts_a_sleeping_reward_and_the_rest_is_scored():
    start = time.monotonic()
    out = score_batch(misbehaving, ["ok", "hang", "swallow", "a"], [""] * 4, timeout_s=0.3)
    elapsed = time.monotonic() - start
    assert out.scores == [2.0, 0.0, 0.0, 1.0]
    assert out.num_timeouts == 2 and out.num_errors == 0
    assert out.infos[1] == {"error": "time limit exceeded"}
    assert elapsed < 60.0  # two 0.3 s limits; a missed one would sleep for 10**6 s


def test_time_limit_puts_back_the_callers_handler_and_pending_alarm():
    fired = []
    handler = lambda signum, frame: fired.append(signum)  # noqa: E731
    previous = signal.signal(signal.SIGALRM, handler)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        assert call_with_time_limit(lambda: 3, 5.0) == 3
        assert signal.getsignal(signal.SIGALRM) is handler
        assert 0 < signal.getitimer(signal.ITIMER_REAL)[0] <= 0.5
        time.sleep(1.0)  # the caller's alarm still fires, in the caller's handler
        assert fired == [signal.SIGALRM]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_pool_bounds_hangs_c_loops_crashes_and_errors_in_one_batch():
    responses = ["ok", "hang", "boom", "spin", "die", "dict", "a", "ok"]
    start = time.monotonic()
    out = score_batch(misbehaving, responses, ["7"] * 8, timeout_s=1.0, num_workers=2)
    elapsed = time.monotonic() - start
    assert out.scores == [2.0, 0.0, 0.0, 0.0, 0.0, 0.5, 1.0, 2.0]
    assert out.num_timeouts == 2  # hang, spin
    assert out.num_errors == 2  # boom, die
    assert out.infos[4] == {"error": "worker died (exit code 3)"}
    assert elapsed < 120.0  # spawn start-up dominates; a missed limit would wait 10**6 s
    # The cached pool replaced its killed workers and serves the next batch.
    again = score_batch(misbehaving, ["ok", "a"], ["", ""], timeout_s=1.0, num_workers=2)
    assert again.scores == [2.0, 1.0] and again.num_errors == again.num_timeouts == 0


def test_pool_scores_a_row_with_unpicklable_extras_as_an_error_and_goes_on():
    extras = [{}, {"callback": lambda: 1}, {}]
    out = score_batch(misbehaving, ["ok", "ok", "a"], ["", "", ""], extras, num_workers=2)
    assert out.scores == [2.0, 0.0, 1.0] and out.num_errors == 1
    assert out.infos[1]["error"].startswith("cannot send the call to a worker")


def test_pool_and_inline_agree_on_a_registered_reward():
    responses = [f"#### {n}" for n in range(12)] + ["no answer"]
    truths = ["3"] * 13
    inline = score_batch("gsm8k", responses, truths)
    pooled = score_batch("gsm8k", responses, truths, num_workers=2)
    assert pooled.scores == inline.scores
    assert pooled.scores[3] == 1.0 and sum(pooled.scores) == 1.0
    assert pooled.infos == inline.infos


def test_pool_rejects_rewards_it_cannot_send_to_workers():
    with pytest.raises(TypeError, match="cannot be sent to a worker"):
        score_batch(lambda r, g: 1.0, ["x"], ["y"], num_workers=1)


def test_pool_raises_when_the_reward_cannot_be_loaded_in_the_worker():
    with pytest.raises(KeyError, match="unknown reward"):
        RewardWorkerPool("no_such_reward", 1)


def test_extras_reach_the_reward_per_row():
    out = score_batch(
        "overlong_buffer",
        ["a", "b"],
        ["", ""],
        [{"response_length": 10}, {"response_length": 90}],
        timeout_s=None,
    )
    assert out.num_errors == 2  # max_response_length missing: a TypeError each, counted
    shaped = rewards.compose(
        "gsm8k", shaping=[("overlong_buffer", {"max_response_length": 100, "buffer_length": 20})]
    )
    out = score_batch(
        shaped, ["#### 1", "#### 1"], ["1", "1"], [{"response_length": 10}, {"response_length": 90}]
    )
    # 1 + 0 and 1 - (90-80)/20 = 0.5
    assert out.scores == [1.0, 0.5]


def test_metrics_are_hand_computable():
    batch = BatchScores(
        scores=[1.0, 0.0, 0.5, 0.0],
        infos=[{"acc": 1.0}, {"acc": 0.0}, {"acc": 1.0, "pred": "x"}, {"error": "boom"}],
        num_errors=1,
        num_timeouts=0,
    )
    assert batch.metrics() == {
        "reward/num_errors": 1.0,
        "reward/num_timeouts": 0.0,
        "reward/num_past_deadline": 0.0,
        "reward/mean": 0.375,  # 1.5 / 4
        "reward/min": 0.0,
        "reward/max": 1.0,
        "reward/acc": 2.0 / 3.0,  # over the three rows that report acc
    }


def test_empty_batch_gives_empty_scores_and_no_nan():
    out = score_batch("gsm8k", [], [])
    assert out.scores == [] and out.infos == []
    assert out.metrics() == {
        "reward/num_errors": 0.0,
        "reward/num_timeouts": 0.0,
        "reward/num_past_deadline": 0.0,
    }


def test_astronomical_math_answer_does_not_hang_an_inline_step():
    start = time.monotonic()
    out = score_batch("math", ["$\\boxed{9^{9^{9^{9}}}}$", "$\\boxed{5}$"], ["5", "5"])
    assert out.scores == [0.0, 1.0] and out.num_timeouts == 0
    assert time.monotonic() - start < 10.0


def test_off_main_thread_inline_scoring_warns_and_still_scores(monkeypatch):
    monkeypatch.setattr(rewards.time_limit, "_warned_off_main_thread", False)
    result = {}

    def run():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result["out"] = score_batch("gsm8k", ["#### 1"], ["1"], timeout_s=1.0)
            result["warned"] = any("main thread" in str(w.message) for w in caught)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=60)
    assert result["out"].scores == [1.0]
    assert result["warned"]


@pytest.mark.parametrize(
    "args,kwargs,error,match",
    [
        ((["a"], ["b", "c"]), {}, ValueError, "1 responses but 2 ground truths"),
        (("a", "b"), {}, TypeError, "must be a list of strings"),
        (([1], ["b"]), {}, TypeError, "decode it first"),
        ((["a"], ["b"], [{}, {}]), {}, ValueError, "2 extras for 1 responses"),
        ((["a"], ["b"]), {"timeout_s": 0}, ValueError, "timeout_s must be > 0"),
        ((["a"], ["b"]), {"num_workers": -1}, ValueError, "num_workers must be"),
    ],
)
def test_bad_inputs_raise_clear_errors(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        score_batch("gsm8k", *args, **kwargs)


def test_unknown_reward_name_lists_the_known_ones():
    with pytest.raises(KeyError, match="gsm8k"):
        score_batch("gsm8kk", ["a"], ["b"])


def test_threads_scoring_at_once_share_the_worker_pool_one_batch_at_a_time():
    # Rollouts generated ahead of the trainer score from several threads; the shared
    # pool's pipes must not mix their batches. 6 threads x 40 responses each: response
    # "#### k" against truth "k" scores 1, against "k + 1" scores 0.
    results: dict[int, list[float]] = {}
    errors: list[BaseException] = []

    def score(t: int) -> None:
        try:
            responses = [f"#### {t * 100 + i}" for i in range(40)]
            truths = [str(t * 100 + i + (i % 2)) for i in range(40)]
            results[t] = score_batch("gsm8k", responses, truths, num_workers=2).scores
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=score, args=(t,)) for t in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    for t in range(6):
        assert results[t] == [1.0 if i % 2 == 0 else 0.0 for i in range(40)]
