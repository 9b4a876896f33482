"""Training runs whose rollouts come from REAL vLLM servers: a 3-step GRPO run on a server
the trainer starts, and the multi-turn tool agent on a server it attaches to by URL."""

from __future__ import annotations

import math

import pytest
import torch

from rlkit.registry import ROLLOUT_ENGINES
from rlkit.rollout.agent_loop import AgentConfig, tool_agent
from rlkit.rollout.base import SamplingParams
from rlkit.trainer.trainer import RLTrainer
from tests.experiment_factory import small_experiment
from tests.test_agent_loop import _engine, _requests
from tests.vllm.conftest import CPU_SERVER, require_vllm

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


@pytest.fixture(scope="module")
def arithmetic_model(tmp_path_factory) -> str:
    """The demo's warmed-up arithmetic policy with vLLM-CPU-sized heads (4 x 32)."""
    from rlkit.tasks.arithmetic import arithmetic_sft_model

    out = tmp_path_factory.mktemp("vllm_demo_sft") / "model"
    return arithmetic_sft_model(str(out), steps=40, batch_size=64, hidden_size=128, lr=3e-3)


@pytest.fixture(scope="module")
def tool_model(tmp_path_factory) -> str:
    """A tiny policy warmed up to call the calculator, with 2 heads of 32."""
    from rlkit.tasks.tool_arithmetic import tool_sft_model

    return tool_sft_model(
        str(tmp_path_factory.mktemp("vllm_tool_sft") / "model"), steps=200, num_heads=2
    )


@pytest.fixture(scope="module")
def tool_server(tool_model, tmp_path_factory):
    """A vLLM server serving the tool policy; yields (engine, its URL)."""
    require_vllm()
    from transformers import AutoTokenizer

    from rlkit.rollout import vllm  # noqa: F401  (registers "vllm")

    tok = AutoTokenizer.from_pretrained(tool_model)
    engine = ROLLOUT_ENGINES.get("vllm")(
        model_path=tool_model,
        tokenizer=tok,
        seed=0,
        num_servers=1,
        log_dir=str(tmp_path_factory.mktemp("vllm_tool_server")),
        request_timeout_s=120.0,
        **CPU_SERVER,
    )
    try:
        yield engine, engine.sync_endpoints[0].url
    finally:
        engine.close()


def test_grpo_on_vllm_servers_trains_and_keeps_them_in_sync(arithmetic_model, tmp_path):
    require_vllm()
    cfg = small_experiment(
        arithmetic_model,
        tmp_path / "run",
        rollout={"engine": "vllm", "engine_options": {"num_servers": 1, **CPU_SERVER}},
        trainer={"total_steps": 3, "save_at_end": False},
    )
    trainer = RLTrainer(cfg)
    history = trainer.run()
    assert len(history) == 3
    for metrics in history:
        assert math.isfinite(metrics["actor/pg_loss"])
        # Trainer and server agree on the sampled tokens' log-probs (float32, same weights).
        assert metrics["rollout/logprob_diff_max"] < 1e-3
        # The engine's counters reach the log: one request per prompt (n samples each).
        assert metrics["rollout/num_requests"] >= 4 and metrics["rollout/num_retries"] == 0
        assert metrics["rollout/servers_usable"] == 1.0
        assert metrics["rollout/server_restarts"] == 0.0
    # After every update the server reloaded the new weights and was checked against them.
    assert history[-1]["weight_sync/logprob_max_abs_diff"] < 1e-3
    assert trainer.weights.version >= 3


def test_vllm_and_the_embedded_engine_give_the_same_greedy_tool_conversation(
    tool_model, tool_server
):
    served, _ = tool_server
    tok, embedded = _engine(tool_model)
    requests = _requests(tok, [(23, 7), (58, 4), (91, 3), (7, 6)])
    params = SamplingParams(max_new_tokens=160, temperature=0.0, n=1)
    config = AgentConfig(tools=("calculator",), max_turns=3)

    def roll(engine):
        return tool_agent(engine, requests, params, tokenizer=tok, config=config, policy_version=0)

    remote, metrics = roll(served)
    local, _ = roll(embedded)
    assert sum(t.stats["tool_calls"] > 0 for t in local) >= 2, "the policy should use the tool"
    # One request per turn, the whole context as ids: at least one per policy turn.
    assert metrics["rollout/num_requests"] >= sum(t.stats["num_turns"] for t in remote)
    for a, b in zip(local, remote):
        assert a.conversation == b.conversation
        assert a.response_ids == b.response_ids and a.loss_mask == b.loss_mask
        torch.testing.assert_close(
            torch.tensor(a.rollout_log_probs), torch.tensor(b.rollout_log_probs), rtol=0, atol=1e-3
        )


def test_a_tool_agent_run_trains_on_an_attached_vllm_server(tool_model, tool_server, tmp_path):
    from rlkit.tasks.tool_arithmetic import tool_arithmetic_dataset

    _, url = tool_server
    cfg = small_experiment(
        tool_model,
        tmp_path / "run",
        data={
            "dataset_fn": tool_arithmetic_dataset,
            "reward": "final_turn_match",
            "max_prompt_length": 48,
        },
        rollout={
            "engine": "vllm",
            "engine_options": {"num_servers": 0, "urls": [url]},
            "agent_loop": "tool_agent",
            "agent": {"tools": ["calculator"], "max_turns": 3},
            "max_response_length": 120,
        },
        trainer={"total_steps": 2, "save_at_end": False},
    )
    trainer = RLTrainer(cfg)
    history = trainer.run()
    assert len(history) == 2
    for metrics in history:
        assert math.isfinite(metrics["actor/pg_loss"])
        assert metrics["rollout/logprob_diff_max"] < 1e-3
    # Multi-turn: the policy called the calculator, and each call's result began a new turn.
    assert max(m["tool_calls/max"] for m in history) >= 1
    assert max(m["num_turns/max"] for m in history) >= 2
    # The attached server was synced after each update and checked against the trainer.
    assert history[-1]["weight_sync/logprob_max_abs_diff"] < 1e-3


def test_one_step_off_runs_the_tool_loop_on_vllm_one_version_behind(
    tool_model, tool_server, tmp_path
):
    import functools

    from rlkit.tasks.tool_arithmetic import tool_arithmetic_dataset
    from tests.sglang.test_sglang_one_step_off import train

    _, url = tool_server
    cfg = small_experiment(
        tool_model,
        tmp_path / "run",
        data={
            "dataset_fn": functools.partial(tool_arithmetic_dataset, limit=16),
            "reward": "final_turn_match",
            "max_prompt_length": 48,
            "reward_workers": 1,  # one_step_off scores in a worker process
        },
        rollout={
            "engine": "vllm",
            "engine_options": {"num_servers": 0, "urls": [url]},
            "agent_loop": "tool_agent",
            "agent": {"tools": ["calculator"], "max_turns": 3},
            "max_response_length": 120,
        },
        algorithm={"use_kl_loss": False, "rollout_is_level": "token"},
        optim={"lr": 1e-4, "ppo_mini_batch_size": 4, "micro_batch_size": 8},
        trainer={"rollout_mode": "one_step_off", "total_steps": 3, "save_at_end": False},
    )
    trainer = RLTrainer(cfg)
    trainer.setup()
    trainer.rollout.sync_weights()  # the shared server: this run's starting weights
    history = train(trainer)
    # Batch 1 from the starting weights; each later one generated during the previous
    # update, from weights one optimizer step older than those that train on it.
    assert [m["async/staleness/max"] for m in history] == [0.0, 1.0, 1.0]
    assert all(m["num_turns/max"] >= 2 for m in history)
    assert history[-1]["weight_sync/logprob_max_abs_diff"] < 1e-3
