"""Faults against REAL servers: a server killed mid-rollout, a server that never answers.

No prompt may be lost and none counted twice: the batch must hold exactly n rows
per prompt, in prompt order, every row from the current policy.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time

import psutil
import pytest

from rlkit.registry import ROLLOUT_ENGINES
from rlkit.rollout.base import SamplingParams
from rlkit.rollout.servers.errors import RolloutError
from tests.sglang.local_policy import LocalPolicyWeights
from tests.sglang.server_faults import alive, killed_at_the_next_load, wait_until
from tests.sglang.test_sglang_rollout import max_rollout_diff

pytestmark = [pytest.mark.sglang, pytest.mark.slow]


@pytest.fixture
def engine_serving_again(engine):
    """The shared engine; after the test every server it killed serves again, also when the
    test failed midway (a dead server left behind would cost the next tests retries)."""
    yield engine
    for e in engine.pool.endpoints:
        if e.server.alive:
            os.killpg(e.server.process.pid, signal.SIGCONT)  # one left frozen mid-test
        elif not e.restarting:
            engine.pool.report_failure(e, "killed by a fault test")
    engine.pool.wait_restarts(timeout_s=300)
    engine.pool.mark_synced(engine.pool.endpoints)


def test_killing_a_server_mid_rollout_loses_no_prompt(engine_serving_again, hf_models):
    engine = engine_serving_again
    engine.sync_weights(LocalPolicyWeights(hf_models["a"], version=30))
    other, victim = engine.pool.endpoints
    tree = [victim.server.process.pid] + [
        c.pid for c in psutil.Process(victim.server.process.pid).children(recursive=True)
    ]
    prompts = [[1, 3 + i, 40 + i] for i in range(48)]
    params = SamplingParams(max_new_tokens=48, temperature=1.0, n=2)
    result: dict = {}
    worker = threading.Thread(target=lambda: result.update(batch=engine.generate(prompts, params)))
    served_before = victim.served
    # The kill must find requests in flight on the victim, whatever the two servers' speeds:
    # the victim alone serves until it has answered some requests, then it is frozen
    # (SIGSTOP: what it holds stays in flight) until the rollout's next requests reach it.
    other.stale = True  # out of rotation (as after a restart with old weights)
    worker.start()
    wait_until(lambda: victim.served >= served_before + 2, 120, "the victim answered twice")
    os.killpg(tree[0], signal.SIGSTOP)
    # 48 requests, at most 16 in flight: after the first answers the rest go to the victim.
    wait_until(lambda: victim.inflight > 0, 60, "a request is in flight on the frozen victim")
    engine.pool.mark_synced([other])
    os.killpg(tree[0], signal.SIGKILL)  # the whole server: HTTP process, scheduler, detokenizer
    worker.join(timeout=300)
    batch = result["batch"]

    # 48 prompts x n=2: rows 2i and 2i+1 belong to prompt i, nothing lost or doubled.
    assert len(batch) == 96
    assert batch.prompt_index == [i for i in range(48) for _ in range(2)]
    assert batch.prompt_ids == [p for p in prompts for _ in range(2)]
    assert batch.metrics["rollout/num_retries"] >= 1  # in-flight requests were re-sent
    # Every row was sampled by a server holding policy a (version 30).
    assert max_rollout_diff(batch, hf_models["a"], 1.0) < 1e-4
    # The killed tree is gone: no orphaned scheduler or detokenizer.
    time.sleep(1.0)
    assert not [p for p in tree if alive(p)]

    # Its restart is killed too, while the new server starts: the pool tries again
    # (restarts remain), and the server is restarted from the newest snapshot and serves.
    wait_until(
        lambda: (
            victim.restarting
            and victim.server.process is not None
            and victim.server.process.pid != tree[0]
            and alive(victim.server.process.pid)
        ),
        120,
        "the restarted server's process is running",
    )
    os.killpg(victim.server.process.pid, signal.SIGKILL)
    engine.pool.wait_restarts(timeout_s=300)
    assert victim.usable and victim.restarts == 2
    assert "restart failed" in victim.last_error
    # What the trainer's warning prints: the server's address and its restarts.
    assert engine.restarted_servers() == [f"{victim.url} (restarted 2 of 2: {victim.last_error})"]
    served = victim.served
    batch = engine.generate(prompts[:16], SamplingParams(max_new_tokens=8, temperature=0.0))
    assert victim.served > served
    assert max_rollout_diff(batch, hf_models["a"], 0.0) < 1e-5


def test_an_unhealthy_server_beside_a_good_one_costs_retries_not_prompts(engine):
    # A socket that accepts connections but never answers: every request to it times out.
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(64)
    good = engine.sync_endpoints[0].url
    attached = ROLLOUT_ENGINES.get("sglang")(
        urls=[good, f"http://127.0.0.1:{hole.getsockname()[1]}"],
        num_servers=0,
        request_timeout_s=5.0,  # the hole costs 5 s per request; the good server answers sooner
        retry_backoff_s=0.05,
        max_concurrency=4,
    )
    try:
        prompts = [[1, 5 + i] for i in range(12)]
        batch = attached.generate(prompts, SamplingParams(max_new_tokens=4, n=2))
        assert batch.prompt_index == [i for i in range(12) for _ in range(2)]
        assert batch.metrics["rollout/num_retries"] >= 1
        assert batch.metrics["rollout/servers_usable"] == 1.0  # the hole was taken out
    finally:
        attached.close()
        hole.close()


def test_no_server_left_raises_a_clear_error_after_bounded_retries():
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(64)
    attached = ROLLOUT_ENGINES.get("sglang")(
        urls=[f"http://127.0.0.1:{hole.getsockname()[1]}"],
        num_servers=0,
        request_timeout_s=0.5,
        retry_backoff_s=0.01,
        max_retries=2,
    )
    start = time.monotonic()
    try:
        with pytest.raises(RolloutError, match="timed out"):
            attached.generate([[1, 2, 3]], SamplingParams(max_new_tokens=4))
    finally:
        attached.close()
        hole.close()
    assert time.monotonic() - start < 30


def test_a_server_killed_during_a_weight_sync_is_restarted_and_synced_again(
    engine_serving_again, hf_models
):
    engine = engine_serving_again
    engine.sync_weights(LocalPolicyWeights(hf_models["a"], version=60))
    _, victim = engine.pool.endpoints
    restarts = victim.restarts
    budget = engine.pool.max_restarts  # the mid-rollout test above may have used it up
    engine.pool.max_restarts = restarts + 1
    killed_at_the_next_load(engine, victim)
    try:
        metrics = engine.sync_weights(LocalPolicyWeights(hf_models["b"], version=61))
    finally:
        engine.__dict__.pop("_load", None)
        engine.pool.max_restarts = budget
    # The sync went on without the dead server, which was restarted (with the old weights)
    # and then synced again: both serve policy b, and it shows in the step's metrics.
    assert metrics["weight_sync/retries"] == 1.0
    assert victim.restarts == restarts + 1 and victim.usable
    assert all(e.usable for e in engine.pool.endpoints)
    batch = engine.generate(
        [[1, 3 + i, 40 + i] for i in range(16)], SamplingParams(max_new_tokens=8, n=2)
    )
    assert max_rollout_diff(batch, hf_models["b"], 1.0) < 1e-4
    engine.sync_weights(LocalPolicyWeights(hf_models["a"], version=62))
