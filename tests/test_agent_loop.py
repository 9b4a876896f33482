"""Multi-turn tool use: token-exact trajectories, inserted tokens never trained, errors counted."""

from __future__ import annotations

import functools
import math

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlkit.interactions import Interaction, InteractionReply
from rlkit.modeling.modules import ActorModule
from rlkit.rollout.agent_loop import AgentConfig, AgentRequest, agent_config, tool_agent
from rlkit.rollout.base import SamplingParams
from rlkit.rollout.embedded.engine import HFEngine
from rlkit.rollout.observations import ObservationRenderer
from rlkit.rollout.turns import GenerateOnly
from rlkit.tools import schemas
from rlkit.trainer.batch import build_batch
from tests.sglang.local_policy import LocalPolicyWeights

CHATML = (
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def calculator(expression: str) -> str:
    """A calculator that is always broken, to see tool errors reach the policy.

    Args:
        expression: ignored.
    """
    raise RuntimeError("the calculator is out of order")


def _requests(tokenizer, pairs):
    tools = schemas(["calculator"])
    out = []
    for a, b in pairs:
        messages = [{"role": "user", "content": f"{a}*{b}"}]
        text = tokenizer.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=True
        )
        out.append(AgentRequest(tokenizer(text, add_special_tokens=False)["input_ids"], messages))
    return out


def _roll(model_dir, pairs, *, n=1, temperature=0.0, tools=("calculator",), max_new=120):
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    engine = HFEngine(
        LocalPolicyWeights(model, version=5),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_ids=[tokenizer.eos_token_id],
    )
    params = SamplingParams(max_new_tokens=max_new, temperature=temperature, n=n, seed=0)
    config = AgentConfig(tools=tools, max_turns=3)
    trajectories, _ = tool_agent(
        engine,
        _requests(tokenizer, pairs),
        params,
        tokenizer=tokenizer,
        config=config,
        policy_version=5,
    )
    return tokenizer, model, trajectories


def test_renderer_adds_the_separator_the_policy_never_samples():
    from rlkit.models.tiny import train_byte_tokenizer

    tok = train_byte_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = CHATML
    renderer = ObservationRenderer(tok)
    assert renderer.turn_suffix == "<|im_end|>\n"
    ids = renderer.observation_ids(
        [{"role": "tool", "content": "42"}], policy_text_tail="...<|im_end|>"
    )
    # The "\n" after <|im_end|> comes first: the policy stopped at <|im_end|>.
    assert tok.decode(ids) == "\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n"
    # A turn cut by the budget (no stop token) gets the whole closing text.
    cut = renderer.observation_ids([{"role": "tool", "content": "42"}], policy_text_tail="4")
    assert tok.decode(cut).startswith("<|im_end|>\n<|im_start|>tool")


def test_a_template_without_chat_support_is_refused():
    from rlkit.models.tiny import train_byte_tokenizer

    with pytest.raises(ValueError, match="needs a tokenizer with a chat template"):
        ObservationRenderer(train_byte_tokenizer())


def test_greedy_tool_conversation_is_token_exact_with_the_template(tool_model_dir):
    tok, _, trajectories = _roll(tool_model_dir, [(23, 7), (58, 4)])
    used = [t for t in trajectories if t.stats["tool_calls"] > 0]
    assert used, "the warmed-up policy should call the calculator on some prompts"
    for traj in used:
        # Policy ids, then the tool result (mask 0), then the policy again.
        assert 0 in traj.loss_mask and traj.loss_mask[0] == 1 and traj.loss_mask[-1] == 1
        assert all(v == 5 for v, m in zip(traj.policy_version, traj.loss_mask) if m)
        assert all(
            v == -1 and lp == 0
            for v, lp, m in zip(traj.policy_version, traj.rollout_log_probs, traj.loss_mask)
            if not m
        )
        # Prompt + response ids are exactly the template's rendering of the conversation
        # (without the final "\n" after the last </s>, which nothing samples).
        full = tok.apply_chat_template(
            traj.conversation, tools=schemas(["calculator"]), tokenize=False
        )
        expected = tok(full.removesuffix("\n"), add_special_tokens=False)["input_ids"]
        assert traj.prompt_ids + traj.response_ids == expected
        assert [m["role"] for m in traj.conversation] == ["user", "assistant", "tool", "assistant"]


def test_teacher_forced_log_probs_equal_the_rollout_ones_on_policy_tokens(tool_model_dir):
    tok, model, trajectories = _roll(
        tool_model_dir, [(23, 7), (58, 4), (91, 3)], n=2, temperature=1.0
    )
    batch = build_batch(
        trajectories,
        pad_token_id=tok.pad_token_id,
        response_width=max(len(t) for t in trajectories),
        index=[0] * len(trajectories),
        scores=[0.0] * len(trajectories),
        acc=[0.0] * len(trajectories),
        data_sources=["toy"] * len(trajectories),
    )
    assert (
        (batch.loss_mask == 0).logical_and(batch.attention_mask[:, batch.prompt_width :] == 1).any()
    )
    actor = ActorModule(model)
    logp, _ = actor(batch.model_inputs(), batch.prompt_width, 1.0, False)
    mask = batch.loss_mask.bool()
    torch.testing.assert_close(logp[mask], batch.rollout_log_prob[mask], rtol=0, atol=1e-5)
    # The gradient of a loss over the policy tokens is exactly zero on inserted tokens.
    logp = logp.detach().requires_grad_()
    ((logp * batch.loss_mask).sum() / batch.loss_mask.sum()).backward()
    assert logp.grad[~mask].abs().max() == 0


def test_tool_errors_go_back_to_the_policy_and_are_counted(tool_model_dir):
    _, _, trajectories = _roll(
        tool_model_dir,
        [(23, 7), (58, 4)],
        tools=("tests.test_agent_loop:calculator",),
        max_new=240,  # room for the error message after the call
    )
    called = [t for t in trajectories if t.stats["tool_calls"] > 0]
    assert called
    for traj in called:
        assert traj.stats["tool_errors"] >= 1
        tool_messages = [m["content"] for m in traj.conversation if m["role"] == "tool"]
        assert any("out of order" in m for m in tool_messages)


def test_a_budget_that_runs_out_at_a_tool_result_truncates_and_counts(tool_model_dir):
    # 80 tokens hold the call (~75) but not the result after it.
    _, _, trajectories = _roll(tool_model_dir, [(23, 7)], max_new=80)
    (traj,) = trajectories
    assert traj.finish_reason == "length" and traj.stats["truncated"] == 1.0
    assert all(traj.loss_mask)  # nothing inserted that the budget had no room for
    assert len(traj) <= 80


def test_agent_settings_are_checked_by_name():
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['max_turn'\]"):
        agent_config({"max_turn": 3})
    assert agent_config({"tools": "calculator"}).tools == ("calculator",)
    assert AgentConfig(max_turns=0).problems() == [
        "RolloutConfig.agent max_turns must be >= 1, got 0"
    ]


def test_a_misspelt_tool_is_named_before_any_work():
    from rlkit.registry import UnknownNameError
    from rlkit.trainer.config import (
        AlgorithmConfig,
        DataConfig,
        RolloutConfig,
        check_registered_names,
    )

    for tools in ("calculator", ["calculator"]):  # one name or a list
        rollout = RolloutConfig(agent_loop="tool_agent", agent={"tools": tools})
        check_registered_names(AlgorithmConfig(), DataConfig(), rollout)
    bad = RolloutConfig(agent_loop="tool_agent", agent={"tools": ["calculater"]})
    with pytest.raises(UnknownNameError, match="Did you mean 'calculator'"):
        check_registered_names(AlgorithmConfig(), DataConfig(), bad)


def test_the_trainer_trains_steps_with_the_tool_agent(tool_model_dir, tmp_path):
    import functools

    from rlkit.tasks.tool_arithmetic import tool_arithmetic_dataset
    from rlkit.trainer.trainer import RLTrainer
    from tests.experiment_factory import small_experiment

    cfg = small_experiment(
        tool_model_dir,
        tmp_path / "run",
        data={
            "dataset_fn": functools.partial(tool_arithmetic_dataset, limit=16),
            # Lengths differ between samples, so advantages (and the update) are not zero.
            "reward": "length_penalty",
            "reward_options": {"max_response_length": 120},
            "max_prompt_length": 48,
        },
        rollout={
            "agent_loop": "tool_agent",
            "agent": {"tools": ["calculator"], "max_turns": 3},
            "max_response_length": 120,
            "val_n": 1,
            "val_temperature": 0.0,
        },
        optim={"ppo_mini_batch_size": 4, "micro_batch_size": 8},
        trainer={"total_steps": 2, "save_at_end": False},
    )
    history = RLTrainer(cfg).run()
    assert len(history) == 2
    # The first rollout comes from the tool-trained policy before any update: it calls the
    # tool and continues after the result. The length penalty then teaches the policy to
    # answer without the tool, so a later step may have no second turn (a call truncated
    # at the response budget counts as a call in a single turn).
    first = history[0]
    assert first["tool_calls/mean"] > 0 and first["num_turns/max"] >= 2
    assert first["response_length/inserted_tokens/mean"] > 0
    assert first["rollout/kv_reused_tokens"] > 0  # later turns continued their cache
    for metrics in history:
        assert metrics["num_turns/max"] >= 1 and "tool_calls/mean" in metrics
        assert metrics["reward/num_errors"] == 0  # sampled calls may be malformed: tool/errors
        assert math.isfinite(metrics["actor/pg_loss"]) and metrics["actor/grad_norm"] > 0
    assert "val/tool_arithmetic/tool_call_rate" in history[-1]


def _engine(model_dir):
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    weights = LocalPolicyWeights(model, version=0)
    return tok, HFEngine(weights, pad_token_id=tok.pad_token_id, eos_token_ids=[tok.eos_token_id])


def test_kv_cache_continuation_gives_the_conversation_of_a_full_re_prefill(tool_model_dir):
    tok = AutoTokenizer.from_pretrained(tool_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tool_model_dir)
    engine = HFEngine(
        LocalPolicyWeights(model, version=5),
        pad_token_id=tok.pad_token_id,
        eos_token_ids=[tok.eos_token_id],
    )
    requests = _requests(tok, [(23, 7), (58, 4), (91, 3), (7, 6)])
    params = SamplingParams(max_new_tokens=160, temperature=0.0, n=2)
    config = AgentConfig(tools=("calculator",), max_turns=3)
    run = functools.partial(
        tool_agent, requests=requests, params=params, tokenizer=tok, config=config,
        policy_version=5,
    )  # fmt: skip
    continued, metrics = run(engine)
    reprefilled, _ = run(GenerateOnly(engine))
    # Tool rows came back to the batch with their cache: their earlier ids were not run again.
    assert sum(t.stats["tool_calls"] > 0 for t in continued) >= 2
    assert metrics["rollout/kv_reused_tokens"] > 0
    for a, b in zip(continued, reprefilled):
        assert a.response_ids == b.response_ids and a.loss_mask == b.loss_mask
        torch.testing.assert_close(
            torch.tensor(a.rollout_log_probs), torch.tensor(b.rollout_log_probs), rtol=0, atol=1e-5
        )


def test_a_trajectory_waiting_for_its_tool_never_blocks_the_others(tool_model_dir):
    """Trajectory 0 waits until trajectory 1 has finished two turns: only a loop that keeps
    decoding the others while one waits can finish (a lock-step loop would deadlock)."""
    import asyncio

    tok, engine = _engine(tool_model_dir)
    turns = engine.turns(SamplingParams(temperature=0.0))
    prompt = _requests(tok, [(23, 7)])[0].prompt_ids
    other_done = None

    async def waiting():
        first = await turns.generate(0, prompt, 8)
        await asyncio.wait_for(other_done.wait(), timeout=60)  # "the tool"
        second = await turns.generate(0, prompt + first.response_ids + [tok.eos_token_id], 8)
        return first, second

    async def other():
        context = list(prompt)
        for _ in range(2):
            got = await turns.generate(1, context, 8)
            context += got.response_ids
        other_done.set()
        return context

    async def main():
        nonlocal other_done
        other_done = asyncio.Event()
        return await asyncio.gather(waiting(), other())

    from rlkit.rollout.turns import run_turns

    (first, second), context = run_turns(turns, main())
    # Both finished (a deadlock would have timed out), each turn within its budget.
    assert 1 <= len(first.response_ids) <= 8 and 1 <= len(second.response_ids) <= 8
    assert len(prompt) + 2 <= len(context) <= len(prompt) + 16


def test_a_math_tutor_asks_again_after_a_wrong_answer_and_scores_the_last(tool_model_dir):
    tok, engine = _engine(tool_model_dir)
    requests = [
        AgentRequest(r.prompt_ids, r.messages, ground_truth="not a number the model writes")
        for r in _requests(tok, [(23, 7), (58, 4)])
    ]
    config = AgentConfig(
        interaction="math_tutor", interaction_options={"max_attempts": 2}, max_turns=4
    )
    trajectories, _ = tool_agent(
        engine, requests, SamplingParams(max_new_tokens=200, temperature=0.0),
        tokenizer=tok, config=config, policy_version=0,
    )  # fmt: skip
    for traj in trajectories:
        roles = [m["role"] for m in traj.conversation]
        # Wrong twice: the tutor's feedback between the answers, then the end (score 0).
        assert roles == ["user", "assistant", "user", "assistant"], roles
        assert traj.conversation[2]["content"] == "Incorrect, try again."
        assert traj.stats["user_turns"] == 1.0 and traj.finish_reason == "stop"
        assert traj.token_rewards is not None and sum(traj.token_rewards) == 0.0
        assert 0 in traj.loss_mask and traj.loss_mask[-1] == 1  # the feedback is not trained


def test_the_math_tutor_scores_right_answers_less_after_each_retry():
    from rlkit.interactions import make_interaction

    tutor = make_interaction("math_tutor", {"max_attempts": 3, "retry_penalty": 0.25})
    ask = [{"role": "user", "content": "2+2?"}]
    kw = {"ground_truth": "4", "data_source": "toy", "extra_info": {}}
    assert tutor.reply([*ask, {"role": "assistant", "content": "4"}], **kw) == InteractionReply(
        None, 1.0
    )
    retry = [*ask, {"role": "assistant", "content": "5"}]
    assert tutor.reply(retry, **kw) == InteractionReply("Incorrect, try again.", 0.0)
    second = [*retry, {"role": "user", "content": "Incorrect, try again."}]
    # Right at the 2nd attempt: 1 - 0.25 * 1 = 0.75.
    assert tutor.reply([*second, {"role": "assistant", "content": "4"}], **kw).score == 0.75
    third = [*second, {"role": "assistant", "content": "3"}]
    third += [{"role": "user", "content": "Incorrect, try again."}]
    # Wrong at the 3rd and last attempt: the conversation ends with 0.
    assert tutor.reply([*third, {"role": "assistant", "content": "1"}], **kw) == InteractionReply(
        None, 0.0
    )
    assert (
        AgentConfig(interaction="math_tutr")
        .problems()[0]
        .startswith("RolloutConfig.agent interaction:")
    )


class AskTwice(Interaction):
    """Asks for a second answer (score 0.25 for the first), then ends (0.5 for the second)."""

    def reply(self, conversation, **_):
        if any(m["role"] == "user" and m["content"] == "Again?" for m in conversation):
            return InteractionReply(None, 0.5)
        return InteractionReply("Again?", 0.25)


def test_the_trainer_trains_on_an_interactions_scores_as_token_rewards(tool_model_dir, tmp_path):
    import functools

    from rlkit.tasks.tool_arithmetic import tool_arithmetic_dataset
    from rlkit.trainer.trainer import RLTrainer
    from tests.experiment_factory import small_experiment

    cfg = small_experiment(
        tool_model_dir,
        tmp_path / "run",
        data={
            "dataset_fn": functools.partial(tool_arithmetic_dataset, limit=16),
            "reward": "zero",  # the interaction's scores are the whole reward
            "max_prompt_length": 48,
        },
        rollout={
            "agent_loop": "tool_agent",
            "agent": {
                "tools": ["calculator"],
                "max_turns": 4,
                "interaction": "tests.test_agent_loop:AskTwice",
            },
            "max_response_length": 200,
            "val_n": 1,
            "val_temperature": 0.0,
        },
        optim={"ppo_mini_batch_size": 4, "micro_batch_size": 8},
        trainer={"total_steps": 1, "save_at_end": False, "test_freq": 0},
    )
    (metrics,) = RLTrainer(cfg).run()
    assert metrics["critic/score/mean"] == 0.0  # the outcome reward is "zero"
    # Per trajectory 0.25 + 0.5 = 0.75 when it answered twice, 0.25 once (the budget cut
    # it), 0 never: the token rewards summed per response, averaged over 4 x 4 responses,
    # are a multiple of 0.25 / 16 and at most 0.75.
    rewards = metrics["critic/rewards/mean"]
    assert 0.0 < rewards <= 0.75 and rewards * 64 == pytest.approx(round(rewards * 64))
    assert metrics["user_turns/mean"] > 0
    assert math.isfinite(metrics["actor/pg_loss"])
