"""``rlkit diagnose``: the per-token comparison by hand, then whole diagnoses of real runs on
the embedded engine, healthy and with a fault planted in one path (a chat template that
drops the newline at every turn boundary; a mixture-of-experts router with noise in the
engine's decode only). The server engines' diagnoses are in tests/sglang and tests/vllm.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from rlkit.diagnose import comparison, settings, turns
from rlkit.diagnose.cli import MISMATCH_EXIT, main
from rlkit.rollout.trajectory import Trajectory

# ---------------------------------------------------------------- the arithmetic


def test_kl_over_the_whole_vocabulary_is_the_exact_kl():
    # engine p = (0.5, 0.5), trainer q = (0.25, 0.75) over a vocabulary of 2:
    # KL(p||q) = 0.5 ln(0.5/0.25) + 0.5 ln(0.5/0.75) = 0.5 (0.693147) + 0.5 (-0.405465) = 0.143841
    p = torch.tensor([[0.5, 0.5]]).log()
    q = torch.tensor([[0.25, 0.75]]).log()
    stats = comparison.token_stats(
        engine_log_probs=p[:, 0],  # sampled token 0
        trainer_log_probs=q[:, 0],
        engine_top_ids=torch.tensor([[0, 1]]),
        engine_top_log_probs=p,
        trainer_full_log_probs=q,
    )
    assert stats.kl.item() == pytest.approx(0.143841, abs=1e-6)
    # |ln 0.25 - ln 0.5| = ln 2, from float32 inputs
    assert stats.gap.item() == pytest.approx(math.log(2), abs=1e-6)
    assert stats.mass.item() == pytest.approx(1.0)
    assert stats.top1_agree.item() == 0.0  # engine's top-1 is id 0 (tie, first), trainer's is 1


def test_kl_over_a_top_k_renormalises_both_sides():
    # vocabulary of 3; the engine reports its top 2: ids 2 and 0 with p = (0.6, 0.3) (0.1 on
    # id 1). Trainer q = (0.2, 0.2, 0.6). Renormalised over {2, 0}: p' = (2/3, 1/3),
    # q' = (0.6/0.8, 0.2/0.8) = (0.75, 0.25).
    # KL = 2/3 ln((2/3)/0.75) + 1/3 ln((1/3)/0.25) = 2/3 (-0.117783) + 1/3 (0.287682)
    #    = -0.078522 + 0.095894 = 0.017372
    q = torch.tensor([[0.2, 0.2, 0.6]]).log()
    stats = comparison.token_stats(
        torch.tensor([0.6]).log(),
        torch.tensor([0.6]).log(),
        torch.tensor([[2, 0]]),
        torch.tensor([[0.6, 0.3]]).log(),
        q,
    )
    assert stats.kl.item() == pytest.approx(0.017372, abs=1e-6)
    assert stats.mass.item() == pytest.approx(0.8)  # the trainer's mass on {2, 0}
    assert stats.top1_agree.item() == 1.0
    assert stats.gap.item() == pytest.approx(0.0)


def test_missing_top_k_entries_are_left_out_of_the_kl():
    # a server answered one entry of two (id -1, -inf pads): KL over {1} alone is 0.
    stats = comparison.token_stats(
        torch.tensor([-1.0]),
        torch.tensor([-1.0]),
        torch.tensor([[1, -1]]),
        torch.tensor([[-0.5, float("-inf")]]),
        torch.tensor([[0.3, 0.7]]).log(),
    )
    assert stats.kl.item() == pytest.approx(0.0, abs=1e-12)


def test_position_buckets_double_in_width():
    # 48 positions, weights 1:2:4:8 of 15: edges 0, 3.2->3, 3+6.4->9, 9+12.8->22, 48
    assert comparison.position_buckets(48) == [(0, 3), (3, 9), (9, 22), (22, 48)]
    assert comparison.position_buckets(3) == [(0, 1), (1, 2), (2, 3)]


def test_growth_with_position_is_last_bucket_over_first():
    rows = [
        comparison.TokenStats(
            torch.arange(8),
            torch.tensor([1e-6] * 4 + [1e-5] * 4, dtype=torch.float64),
            *(torch.full((8,), float("nan"), dtype=torch.float64),) * 3,
        )
    ]
    summary = comparison.summarize(rows, buckets=2)
    # buckets [0, 3) and [3, 8): means 1e-6 and (1e-6 + 4e-5)/5 = 8.2e-6
    assert comparison.growth_with_position(summary) == pytest.approx(8.2)


def test_causes_rank_a_template_fault_above_a_dtype_difference():
    listed = [
        settings.Setting("dtype", "bfloat16", "float32", True, ""),
        settings.Setting("model configuration", "x", "x", False, ""),
        settings.Setting("attention and kernels", "a", "b", True, ""),
        settings.Setting("sampling", "", "", False, ""),
        settings.Setting("chat template", "override", "own", True, ""),
        settings.Setting("shared prefix / remove padding", "", "", False, ""),
    ]
    causes = settings.rank_causes(
        listed, {"gap_mean": 0.02, "bound": 1e-3, "turn_differences": 3, "kl_bound": 1e-6}
    )
    assert [c.name for c in causes] == ["chat template", "dtype"]
    healthy = settings.rank_causes(listed, {"gap_mean": 1e-6, "bound": 1e-3})
    assert healthy == []  # a dtype difference with a gap in bounds is not a cause


def test_a_dropped_newline_is_found_at_each_turn_boundary(tool_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tool_model_dir)
    conversation = [
        {"role": "user", "content": "6*7"},
        {"role": "assistant", "content": "call"},
        {"role": "tool", "content": "42"},
        {"role": "assistant", "content": "42"},
    ]
    prompt = tok("Q: 6*7\nA: ", add_special_tokens=False)["input_ids"]
    policy1 = tok("call</s>", add_special_tokens=False)["input_ids"]
    inserted = tok("R: 42\nA: ", add_special_tokens=False)["input_ids"]  # no "\n" after </s>
    policy2 = tok("42</s>", add_special_tokens=False)["input_ids"]
    response = policy1 + inserted + policy2
    mask = [1] * len(policy1) + [0] * len(inserted) + [1] * len(policy2)
    trajectory = Trajectory(
        prompt,
        response,
        mask,
        [0.0] * len(response),
        [0] * len(response),
        0,
        conversation=conversation,
    )
    found = turns.compare_rendering(0, trajectory, tok)
    assert len(found) == 1
    # boundaries: 1 = end of prompt, 2 = start of the inserted tool turn
    assert found[0].turn == 2
    assert found[0].position == len(prompt) + len(policy1)
    assert found[0].rendered.startswith("\n") and not found[0].trained.startswith("\n")
    fixed = Trajectory(
        prompt,
        policy1 + tok("\nR: 42\nA: ", add_special_tokens=False)["input_ids"] + policy2,
        [1] * len(policy1) + [0] * (len(inserted) + 1) + [1] * len(policy2),
        [0.0] * (len(response) + 1),
        [0] * (len(response) + 1),
        0,
        conversation=conversation,
    )
    assert turns.compare_rendering(0, fixed, tok) == []


# ---------------------------------------------------------------- whole diagnoses


def _diagnose(
    tmp_path: Path, configs: list[str], params: list[str], *extra: str
) -> tuple[int, dict]:
    out = tmp_path / "report"
    argv = [*configs, *[a for p in params for a in ("--gin_param", p)], "--out", str(out), *extra]
    status = main(argv)
    return status, json.loads((out / "report.json").read_text())


def test_the_demo_is_healthy_on_the_embedded_engine(tmp_path, demo_model_dir, capsys):
    status, report = _diagnose(
        tmp_path,
        ["experiments/demo.gin"],
        [f"ModelConfig.path = '{demo_model_dir}'"],
        "--prompts",
        "6",
    )
    assert status == 0, report["causes"]
    assert report["passed"] and report["causes"] == []
    overall = report["tokens"]["overall"]
    # float32 on both sides, the same module: rounding only
    assert overall["gap_mean"] < 1e-4 and overall["kl_mean"] < 1e-8
    assert overall["top1_agree_mean"] == 1.0 and overall["mass_mean"] == pytest.approx(1.0)
    assert report["top_k"] > 200  # the whole vocabulary of the byte tokenizer
    printed = capsys.readouterr().out
    assert "| tokens | gap mean |" in printed and "healthy" in printed
    assert (tmp_path / "report" / "gap_by_position.png").stat().st_size > 0


def test_a_diagnosis_in_process_leaves_no_gin_binding_behind(tmp_path, demo_model_dir):
    # demo.gin binds DataConfig's fields: a configuration built afterwards in this
    # process (another test's, a notebook's) takes the dataclasses' defaults instead.
    import gin

    from rlkit.trainer.config import DataConfig

    status, _ = _diagnose(
        tmp_path,
        ["experiments/demo.gin"],
        [f"ModelConfig.path = '{demo_model_dir}'", "DataConfig.max_prompt_length = 40"],
        "--prompts",
        "1",
    )
    assert status == 0
    with pytest.raises(ValueError, match="no bound parameters"):
        gin.query_parameter("DataConfig.max_prompt_length")
    assert DataConfig().max_prompt_length != 40


BROKEN_NEWLINE = "A: {{ m.content }}</s>\\n"


def _tool_params(tool_model_dir: str) -> list[str]:
    return [f"ModelConfig.path = '{tool_model_dir}'"]


def test_a_template_that_drops_the_newline_between_turns_is_named(tmp_path, tool_model_dir):
    from rlkit.tasks.tool_arithmetic import TOOL_CHAT_TEMPLATE

    assert BROKEN_NEWLINE in repr(TOOL_CHAT_TEMPLATE)[1:-1]
    broken = TOOL_CHAT_TEMPLATE.replace("A: {{ m.content }}</s>\n", "A: {{ m.content }}</s>")
    status, report = _diagnose(
        tmp_path,
        ["experiments/tool_demo.gin"],
        [*_tool_params(tool_model_dir), f"ModelConfig.chat_template = {json.dumps(broken)}"],
        "--prompts",
        "32",  # the warmed-up model calls the calculator in a few of them
    )
    assert status == MISMATCH_EXIT
    assert report["causes"][0]["name"] == "chat template"
    at_boundaries = [d for d in report["template_differences"] if d["kind"] == "template"]
    assert at_boundaries, "the planted fault was not found"
    first = at_boundaries[0]
    assert first["turn"] >= 2  # at a turn boundary, not in the prompt
    assert first["rendered"].startswith("\n") and not first["trained"].startswith("\n")
    assert report["turns"] and report["turns"][0]["turn"] == 1
    # Both sides saw the same (wrong) tokens: the log-prob gap cannot show this fault.
    assert report["tokens"]["overall"]["gap_mean"] < report["bound"]


def test_the_tool_run_with_its_own_template_renders_every_boundary(tmp_path, tool_model_dir):
    status, report = _diagnose(
        tmp_path, ["experiments/tool_demo.gin"], _tool_params(tool_model_dir), "--prompts", "32"
    )
    assert status == 0, report["causes"]
    # A sampled byte sequence that is not valid UTF-8 re-encodes differently: that is
    # inside the policy's turn, not the template's doing.
    assert all(d["kind"] == "retokenized" for d in report["template_differences"])
    assert [t["turn"] for t in report["turns"]][:2] == [1, 2]  # second turns were checked


@pytest.fixture(scope="module")
def moe_model_dir(tmp_path_factory) -> str:
    from rlkit.models.tiny_families import build_tiny_family

    return str(build_tiny_family("qwen3_moe", tmp_path_factory.mktemp("moe") / "model"))


def _moe_params(path: str) -> list[str]:
    return [
        f"ModelConfig.path = '{path}'",
        "DataConfig.use_chat_template = False",
        "DataConfig.max_prompt_length = 32",
        "RolloutConfig.max_response_length = 12",
    ]


def test_a_moe_model_routes_alike_in_both_passes(tmp_path, moe_model_dir):
    status, report = _diagnose(
        tmp_path, ["experiments/demo.gin"], _moe_params(moe_model_dir), "--prompts", "4"
    )
    assert status == 0, report["causes"]
    assert report["routing"] and min(report["routing"].values()) == 1.0


def test_router_noise_in_the_engine_path_only_is_named(tmp_path, moe_model_dir, monkeypatch):
    from transformers.models.qwen3_moe import modeling_qwen3_moe as qwen3_moe

    clean = qwen3_moe.Qwen3MoeTopKRouter.forward
    noise = torch.Generator().manual_seed(0)

    def decode_noise(self, hidden_states):
        # One token per call is the engine's decode step; the trainer's forward sees the
        # whole sequence at once: only the engine's routing gets the jitter.
        if hidden_states.reshape(-1, hidden_states.shape[-1]).shape[0] == 1:
            hidden_states = hidden_states + 5.0 * torch.randn(hidden_states.shape, generator=noise)
        return clean(self, hidden_states)

    monkeypatch.setattr(qwen3_moe.Qwen3MoeTopKRouter, "forward", decode_noise)
    status, report = _diagnose(
        tmp_path, ["experiments/demo.gin"], _moe_params(moe_model_dir), "--prompts", "4"
    )
    assert status == MISMATCH_EXIT
    assert min(report["routing"].values()) < 1.0
    assert "MoE routing" in [c["name"] for c in report["causes"]]
