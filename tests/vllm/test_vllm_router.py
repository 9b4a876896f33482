"""Generation through a REAL ``vllm-router`` (installed in .venv-vllm) in front of the
package's vLLM server: requests go to the router, weights to the worker directly, and the
router's answers follow the synced policy."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlkit.registry import ROLLOUT_ENGINES
from rlkit.rollout.base import SamplingParams
from rlkit.rollout.vllm.server import find_vllm_python
from tests.router_process import running_router
from tests.sglang.local_policy import LocalPolicyWeights
from tests.sglang.test_sglang_rollout import max_rollout_diff
from tests.vllm.test_vllm_rollout import PROMPTS

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


@pytest.fixture(scope="module")
def router_url(engine, tmp_path_factory):
    router = Path(find_vllm_python()).parent / "vllm-router"
    if not router.is_file():
        pytest.fail(f"{router} is missing: scripts/install_vllm.sh installs vllm-router")
    yield from running_router(
        [str(router)], [e.url for e in engine.sync_endpoints], tmp_path_factory.mktemp("router")
    )


def test_rollout_through_the_router_follows_weights_synced_to_its_worker(
    engine, hf_models, router_url, tmp_path
):
    via_router = ROLLOUT_ENGINES.get("vllm")(
        router_url=router_url,
        urls=[e.url for e in engine.sync_endpoints],
        num_servers=0,
        log_dir=str(tmp_path),
        verify_tolerance=1e-4,
    )
    try:
        via_router.sync_weights(LocalPolicyWeights(hf_models["b"], version=60))
        batch = via_router.generate(PROMPTS * 4, SamplingParams(max_new_tokens=12, n=2))
        assert batch.prompt_index == [i for i in range(16) for _ in range(2)]
        assert max_rollout_diff(batch, hf_models["b"], 1.0) < 1e-4
        assert max_rollout_diff(batch, hf_models["a"], 1.0) > 1e-2
    finally:
        via_router.close()
        engine.sync_weights(LocalPolicyWeights(hf_models["a"], version=61))
