"""Multi-turn tool use on a real SGLang server: the same greedy conversation as embedded."""

from __future__ import annotations

import pytest
import torch

from rlkit.registry import ROLLOUT_ENGINES
from rlkit.rollout.agent_loop import AgentConfig, tool_agent
from rlkit.rollout.base import SamplingParams
from tests.sglang.conftest import CPU_SERVER, require_sglang
from tests.test_agent_loop import _engine, _requests

pytestmark = [pytest.mark.sglang, pytest.mark.slow]


def test_sglang_and_the_embedded_engine_give_the_same_greedy_tool_conversation(
    tool_model_dir, tmp_path
):
    require_sglang()
    from rlkit.rollout import sglang  # noqa: F401  (registers "sglang")

    tok, embedded = _engine(tool_model_dir)
    requests = _requests(tok, [(23, 7), (58, 4), (91, 3), (7, 6)])
    params = SamplingParams(max_new_tokens=160, temperature=0.0, n=1)
    config = AgentConfig(tools=("calculator",), max_turns=3)

    def roll(engine):
        return tool_agent(engine, requests, params, tokenizer=tok, config=config, policy_version=0)

    served = ROLLOUT_ENGINES.get("sglang")(
        model_path=tool_model_dir,
        tokenizer=tok,
        seed=0,
        num_servers=1,
        log_dir=str(tmp_path / "logs"),
        request_timeout_s=120.0,
        extra_stop_token_ids=[tok.eos_token_id],
        **CPU_SERVER,
    )
    try:
        remote, metrics = roll(served)
    finally:
        served.close()
    local, _ = roll(embedded)
    assert sum(t.stats["tool_calls"] > 0 for t in local) >= 2, "the policy should use the tool"
    # One request per turn: at least as many requests as policy turns.
    assert metrics["rollout/num_requests"] >= sum(t.stats["num_turns"] for t in remote)
    for a, b in zip(local, remote):
        assert a.conversation == b.conversation
        assert a.response_ids == b.response_ids and a.loss_mask == b.loss_mask
        # Same float32 weights; the server's kernels sum in another order.
        torch.testing.assert_close(
            torch.tensor(a.rollout_log_probs), torch.tensor(b.rollout_log_probs), rtol=0, atol=1e-3
        )
