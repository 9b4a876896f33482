"""experiments/smollm2_gsm8k_calculator.gin trains the real SmolLM2-135M-Instruct on GSM8K
with the calculator (multi-turn ``tool_agent`` rollouts) for 2 steps on CPU."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from rlkit.data import render_prompt
from rlkit.data.chat_templates import SMOLLM2_TOOLS_TEMPLATE
from rlkit.logging import read_metrics

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
MAX_RESPONSE = 48
MAX_TURNS = 3


def _tokenizer(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir)


def test_smollm2_tools_template_renders_smollm2s_own_conversations_unchanged(smollm2_dir):
    tok = _tokenizer(smollm2_dir)
    assert "tools" not in tok.chat_template  # why the experiment replaces it
    conversations = [
        [{"role": "user", "content": "What is 2+2?"}],
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "Bye"},
        ],
    ]
    own = [
        tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True)
        for c in conversations
    ]
    tok.chat_template = SMOLLM2_TOOLS_TEMPLATE
    ours = [
        tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True)
        for c in conversations
    ]
    assert ours == own


def test_a_tool_turn_with_smollm2s_tokenizer_is_the_templates_own_rendering(smollm2_dir):
    """Prompt + the policy's call (ending in <|im_end|>) + the inserted tool result are,
    id for id, the tokenised rendering of the whole conversation."""
    from rlkit.rollout.observations import ObservationRenderer
    from rlkit.tools import schemas

    tok = _tokenizer(smollm2_dir)
    tok.chat_template = SMOLLM2_TOOLS_TEMPLATE
    tools = schemas(["calculator"])
    user = {"role": "user", "content": "3 boxes of 6 eggs: how many eggs?"}
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "3*6"}}\n</tool_call>'

    def ids(text):
        return tok(text, add_special_tokens=False)["input_ids"]

    prompt = ids(render_prompt([user], tok, tools=tools))
    policy = ids(call) + [tok.eos_token_id]
    result = [{"role": "tool", "content": "18"}]
    inserted = ObservationRenderer(tok, tools).observation_ids(
        result, policy_text_tail=tok.decode(policy[-4:], skip_special_tokens=False)
    )
    whole = tok.apply_chat_template(
        [user, {"role": "assistant", "content": call}, *result],
        tools=tools,
        tokenize=False,
        add_generation_prompt=True,
    )
    assert prompt + policy + inserted == ids(whole)


def test_smollm2_calculator_experiment_runs_two_multi_turn_grpo_steps(smollm2_dir, tmp_path):
    from rlkit.tools import schemas

    out = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlkit.train",
            "experiments/smollm2_gsm8k_calculator.gin",
            "--gin_param",
            f"smollm2_model_dir.cache_dir = '{smollm2_dir}'",  # converted already: reused
            "--gin_param",
            f"TrainerConfig.output_dir = '{out}'",
            "--gin_param",
            f"RolloutConfig.max_response_length = {MAX_RESPONSE}",
            "--gin_param",
            "DataConfig.val_limit = 1",
            "--gin_param",
            "TrainerConfig.progress_bar = False",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    # Every prompt carries the calculator: at least as many tokens as the tools block adds.
    tok = _tokenizer(smollm2_dir)
    tok.chat_template = SMOLLM2_TOOLS_TEMPLATE
    question = [{"role": "user", "content": "?"}]
    with_tools, without = (
        len(tok(render_prompt(question, tok, tools=t), add_special_tokens=False)["input_ids"])
        for t in (schemas(["calculator"]), None)
    )
    tools_block = with_tools - without
    assert tools_block > 200

    records = read_metrics(out / "metrics.jsonl")
    steps = [r for r in records if "actor/pg_loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        for key in ("num_turns/mean", "num_turns/max", "tool_calls/mean", "tool/errors"):
            assert math.isfinite(r[key]), (key, r[key])
        assert 1.0 <= r["num_turns/min"] <= r["num_turns/mean"] <= r["num_turns/max"] <= MAX_TURNS
        assert 0.0 <= r["tool_calls/mean"] <= r["tool_calls/max"]
        assert 0 <= r["num_truncated_trajectories"] <= 4  # of 2 prompts x n = 2
        assert r["prompt_length/min"] > tools_block
        assert 1 <= r["response_length/max"] <= MAX_RESPONSE
        assert 0.0 <= r["critic/score/mean"] <= 1.0
        assert math.isfinite(r["actor/pg_loss"]) and math.isfinite(r["actor/grad_norm"])
        # A second turn exists exactly when tool results were inserted into a response;
        # then the policy's and the inserted tokens add up to the response.
        if r["num_turns/max"] >= 2:
            policy = r["response_length/policy_tokens/mean"]
            inserted = r["response_length/inserted_tokens/mean"]
            assert inserted > 0 and r["tool_calls/max"] >= 1
            assert policy + inserted == pytest.approx(r["response_length/mean"])
        else:
            assert "response_length/inserted_tokens/mean" not in r
    validations = [r for r in records if "val/gsm8k/tool_call_rate" in r]
    assert [r["step"] for r in validations] == [0, 2]  # before and after training
    for r in validations:
        assert 0.0 <= r["val/gsm8k/tool_call_rate"] <= 1.0
        assert 0.0 <= r["val/gsm8k/score/mean"] <= 1.0
    assert (out / "checkpoints" / "latest").read_text().strip().endswith("global_step_2")
    assert (out / "checkpoints" / "global_step_2" / "COMPLETE").exists()
