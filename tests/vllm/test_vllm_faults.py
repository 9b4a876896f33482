"""A REAL vLLM server killed (``kill -9``, its whole process tree) mid-rollout: the step
completes with every prompt, from the current policy, and the restart shows in its metrics."""

from __future__ import annotations

import os
import signal
import threading
import time

import psutil
import pytest

from rlkit.rollout.base import SamplingParams
from tests.sglang.local_policy import LocalPolicyWeights
from tests.sglang.server_faults import alive, killed_at_the_next_load, wait_until
from tests.sglang.test_sglang_rollout import max_rollout_diff

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_killing_the_server_mid_rollout_loses_no_prompt(engine, hf_models):
    engine.sync_weights(LocalPolicyWeights(hf_models["b"], version=40))
    (victim,) = engine.pool.endpoints
    tree = [victim.server.process.pid] + [
        c.pid for c in psutil.Process(victim.server.process.pid).children(recursive=True)
    ]
    prompts = [[1, 3 + i, 40 + i] for i in range(32)]
    params = SamplingParams(max_new_tokens=32, temperature=1.0, n=2)
    result: dict = {}
    worker = threading.Thread(target=lambda: result.update(batch=engine.generate(prompts, params)))
    worker.start()
    try:
        # Killed once it has answered some requests and holds others (at most 16 in flight).
        wait_until(lambda: victim.served >= 2 and victim.inflight > 0, 120, "requests in flight")
        os.killpg(tree[0], signal.SIGKILL)  # the API server and its engine-core process
        worker.join(timeout=600)
    finally:  # the package's other tests expect policy a
        engine.pool.wait_restarts(timeout_s=300)
        engine.sync_weights(LocalPolicyWeights(hf_models["a"], version=41))
    batch = result["batch"]

    # 32 prompts x n=2: rows 2i and 2i+1 belong to prompt i, nothing lost or doubled.
    assert batch.prompt_index == [i for i in range(32) for _ in range(2)]
    assert batch.prompt_ids == [p for p in prompts for _ in range(2)]
    # The in-flight requests were re-sent to the restarted server, which the metrics show.
    assert batch.metrics["rollout/num_retries"] >= 1
    assert batch.metrics["rollout/server_restarts"] == 1.0
    assert batch.metrics["rollout/servers_usable"] == 1.0
    # The restart loaded the newest snapshot: every row was sampled by policy b (version 40).
    assert max_rollout_diff(batch, hf_models["b"], 1.0) < 1e-4
    time.sleep(1.0)
    assert not [p for p in tree if alive(p)], "the killed server left processes behind"


def test_a_server_killed_during_a_weight_sync_is_restarted_and_synced_again(engine, hf_models):
    engine.sync_weights(LocalPolicyWeights(hf_models["a"], version=50))
    (victim,) = engine.pool.endpoints
    restarts = victim.restarts
    budget = engine.pool.max_restarts  # the mid-rollout test above used one restart
    engine.pool.max_restarts = restarts + 1
    killed_at_the_next_load(engine, victim)
    try:
        metrics = engine.sync_weights(LocalPolicyWeights(hf_models["b"], version=51))
        # Pushed again to the restarted server, then checked as every sync is.
        assert metrics["weight_sync/retries"] == 1.0
        assert victim.restarts == restarts + 1 and victim.usable
        assert metrics["weight_sync/params_checked"] > 0
        assert metrics["weight_sync/logprob_max_abs_diff"] < 1e-3
        batch = engine.generate(
            [[1, 3 + i, 40 + i] for i in range(8)], SamplingParams(max_new_tokens=8, n=2)
        )
        assert max_rollout_diff(batch, hf_models["b"], 1.0) < 1e-4  # policy b, every row
    finally:  # the package's other tests expect policy a
        engine.__dict__.pop("_load", None)
        engine.pool.max_restarts = budget
        engine.pool.wait_restarts(timeout_s=300)
        engine.sync_weights(LocalPolicyWeights(hf_models["a"], version=52))
