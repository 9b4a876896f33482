"""Generation through a REAL ``sglang-router`` in front of the session's two servers.

The engine sends every request to the router (which balances them itself) and syncs
weights to each worker directly; afterwards the router's answers follow the new policy.
"""

from __future__ import annotations

import importlib.util
import sys

import pytest

from rlkit.registry import ROLLOUT_ENGINES
from rlkit.rollout.base import SamplingParams
from tests.router_process import running_router
from tests.sglang.local_policy import LocalPolicyWeights
from tests.sglang.test_sglang_rollout import PROMPTS, max_rollout_diff

pytestmark = [pytest.mark.sglang, pytest.mark.slow]


@pytest.fixture(scope="module")
def router_url(engine, tmp_path_factory):
    if importlib.util.find_spec("sglang_router") is None:
        pytest.fail("sglang-router is missing: scripts/install_sglang.sh installs it")
    yield from running_router(
        [sys.executable, "-m", "sglang_router.launch_router"],
        [e.url for e in engine.sync_endpoints],
        tmp_path_factory.mktemp("router"),
    )


def test_rollout_through_the_router_follows_weights_synced_to_its_workers(
    engine, hf_models, router_url, tmp_path
):
    via_router = ROLLOUT_ENGINES.get("sglang")(
        router_url=router_url,
        urls=[e.url for e in engine.sync_endpoints],
        num_servers=0,
        log_dir=str(tmp_path),
        verify_tolerance=1e-4,
    )
    try:
        greedy = SamplingParams(max_new_tokens=12, temperature=0.0, n=2)
        via_router.sync_weights(LocalPolicyWeights(hf_models["b"], version=50))
        batch = via_router.generate(PROMPTS * 4, greedy)
        assert batch.prompt_index == [i for i in range(16) for _ in range(2)]
        assert max_rollout_diff(batch, hf_models["b"], 0.0) < 1e-5
        assert max_rollout_diff(batch, hf_models["a"], 0.0) > 1e-2
    finally:
        via_router.close()
        engine.sync_weights(LocalPolicyWeights(hf_models["a"], version=51))
