"""Pieces of the vLLM weight check and top-k log-probs that need no server: the worker
extension's grouping rule and checksums (on plain torch modules standing in for vLLM's
packed CPU layers), the request body and answer parsing for top log-probs, and the
launch flags that load the extension."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM

from rlkit.rollout.base import SamplingParams
from rlkit.rollout.sampling import TopLogProbs
from rlkit.rollout.servers import weight_check
from rlkit.rollout.servers.errors import RequestError
from rlkit.rollout.vllm import server
from rlkit.rollout.vllm.client import completion_body, parse_choices
from rlkit.rollout.vllm.server import VLLMServerConfig
from rlkit.rollout.vllm.worker_extension import rlkit_vllm_worker as extension

NAMES = [
    # Hugging Face names (the trainer's) ...
    "model.embed_tokens.weight",
    "model.layers.0.self_attn.q_proj.weight",
    "model.layers.0.self_attn.k_proj.bias",
    "model.layers.11.mlp.down_proj.weight",
    "model.norm.weight",
    "lm_head.weight",
    # ... vLLM's fused ones, and prefixes of other architectures.
    "model.layers.3.self_attn.qkv_proj.weight",
    "model.layers.3.mlp.gate_up_proj.weight",
    "model.language_model.layers.2.input_layernorm.weight",
    "layers.7.attention.wqkv.weight",
    "model.mylayers.3.w",
    "transformer.wte.weight",
    "model.visual.patch_embed.proj.bias",
]


def test_the_extensions_grouping_rule_is_rlkits():
    # The extension runs in vLLM's environment and carries its own copy of the rule.
    for name in NAMES:
        assert extension.parameter_group(name) == weight_check.parameter_group(name), name
    assert [extension.parameter_group(n) for n in NAMES] == [
        "embed_tokens",
        "layers.0",
        "layers.0",
        "layers.11",
        "norm",
        "lm_head",
        "layers.3",  # q, k and v fused: the same group as their separate names
        "layers.3",
        "layers.2",
        "layers.7",
        "mylayers.3.w",  # not a decoder layer: "layers." must start a name component
        "transformer.wte",
        "visual.patch_embed.proj",
    ]


def test_the_extension_imports_only_the_standard_library_and_torch():
    tree = ast.parse(Path(extension.__file__).read_text())
    imported = {
        (node.module if isinstance(node, ast.ImportFrom) else alias.name).split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert imported == {"__future__", "re", "typing", "torch"}


def test_a_plain_models_checksums_equal_the_trainers(tiny_model_dir):
    # Tied embeddings: the head shares the embedding's parameter and counts as both
    # groups, as the state dict (the trainer's named tensors) lists it twice.
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    sums = extension.model_checksums(model)
    assert sums == weight_check.group_checksums(model.state_dict().items())
    assert set(sums) == {"embed_tokens", "layers.0", "layers.1", "norm", "lm_head"}
    assert sums["lm_head"] == sums["embed_tokens"]


class _PackedLinear(nn.Module):
    """A linear layer as vLLM's CPU backend leaves it: an empty ``weight`` parameter and a
    kernel that multiplies by a copy of the weight the module no longer shows."""

    def __init__(self, packed: torch.Tensor, keep_weight: torch.Tensor | None = None) -> None:
        super().__init__()
        kept = keep_weight if keep_weight is not None else torch.empty(0)
        self.weight = nn.Parameter(kept, requires_grad=False)
        self.input_size_per_partition = packed.shape[1]
        self.cpu_linear = lambda x, weight, bias: nn.functional.linear(x, packed, bias)


def test_a_packed_weight_is_read_back_through_its_kernel():
    torch.manual_seed(0)
    proj, head_new, head_old = (torch.randn(3, 300) for _ in range(3))
    model = nn.Module()
    model.layers = nn.ModuleList([nn.Module()])
    model.layers[0].proj = _PackedLinear(proj)  # 300 inputs: two blocks of identity rows
    # The head's parameter was reloaded, its packed copy was not.
    model.lm_head = _PackedLinear(head_old, keep_weight=head_new.clone())
    sums = extension.model_checksums(model)
    # Exactly the hidden weight's sums: reading back through the identity rounds nothing.
    assert sums["layers.0"] == pytest.approx(weight_check.checksum(proj), rel=1e-12)
    assert sums["lm_head"] == pytest.approx(weight_check.checksum(head_old), rel=1e-12)
    assert sums["lm_head"][2] != pytest.approx(weight_check.checksum(head_new)[2], rel=1e-6)


def test_the_completion_body_asks_for_top_logprobs_keyed_by_token_id():
    body = completion_body([1, 2], SamplingParams(top_logprobs=5), extra_stop_ids=(), seed=None)
    assert body["logprobs"] == 5 and body["return_tokens_as_token_ids"] is True
    plain = completion_body([1, 2], SamplingParams(), extra_stop_ids=(), seed=None)
    assert plain["logprobs"] == 0 and "return_tokens_as_token_ids" not in plain


def _top_answer(top: list[dict[str, float]]) -> dict:
    # The shape of a real vLLM 0.32 answer to logprobs=3, top_k=3 (values shortened).
    return {
        "choices": [
            {
                "index": 0,
                "token_ids": [30, 108],
                "logprobs": {"token_logprobs": [-0.9, -1.2], "top_logprobs": top},
                "finish_reason": "length",
            }
        ]
    }


def test_top_log_probs_are_read_by_token_id_and_filtered_tokens_left_out():
    answer = _top_answer(
        [
            {"token_id:30": -0.9, "token_id:108": -1.1, "token_id:6": -1.3},
            # The sampled token (108) is listed besides the top 3; -9999 is vLLM's -inf:
            # a token top-k removed.
            {
                "token_id:108": -1.2,
                "token_id:30": -0.8,
                "token_id:210": -1.0,
                "token_id:7": -9999.0,
            },
        ]
    )
    (sample,) = parse_choices(answer, n=1, version="0", top_logprobs=3)
    assert sample.top_log_probs == [
        {30: -0.9, 108: -1.1, 6: -1.3},
        {108: -1.2, 30: -0.8, 210: -1.0},
    ]
    top = TopLogProbs.from_lists(sample.top_log_probs, 3)
    assert top.ids.tolist() == [[30, 108, 6], [30, 210, 108]]  # most likely first
    # Without top log-probs asked for, none are read.
    assert parse_choices(answer, n=1, version="0")[0].top_log_probs is None


@pytest.mark.parametrize(
    "top, message",
    [
        ([{"<": -0.9}, {"a": -1.2}], "ignored return_tokens_as_token_ids"),
        ([{"token_id:30": -0.9}], "2 tokens but top log-probs of 1"),
        (None, "no top_logprobs list"),
    ],
)
def test_malformed_top_log_probs_are_a_request_error(top, message):
    with pytest.raises(RequestError, match=message):
        parse_choices(_top_answer(top), n=1, version="0", top_logprobs=3)


def test_started_servers_load_the_extension_and_answer_64_top_logprobs():
    config = VLLMServerConfig(model_path="/m", python="/env/bin/python", device="cpu")
    flags = " ".join(config.command(8123))
    assert "--worker-extension-cls rlkit_vllm_worker.RlkitWorkerExtension" in flags
    assert "--max-logprobs 64" in flags and config.served_max_logprobs == 64
    # Only the extension's folder is on the server's path, never the trainer's.
    env = config.environment({"PYTHONPATH": "/trainer"})
    assert env["PYTHONPATH"] == str(server.EXTENSION_DIR)
    assert (
        os.listdir(server.EXTENSION_DIR)
        and (server.EXTENSION_DIR / "rlkit_vllm_worker.py").is_file()
    )
    # A user's own flags replace rlkit's; a PYTHONPATH of theirs comes after the folder.
    own = VLLMServerConfig(
        model_path="/m",
        extra_args=("--worker-extension-cls", "mine.Ext", "--max-logprobs=8"),
        env={"PYTHONPATH": "/mine"},
    )
    cmd = own.command(8123)
    assert cmd.count("--worker-extension-cls") == 1 and "--max-logprobs" not in cmd
    assert own.served_max_logprobs == 8
    # vLLM's -1 is the whole vocabulary: no limit rlkit checks.
    assert VLLMServerConfig(model_path="/m", max_logprobs=-1).served_max_logprobs is None
    assert own.environment({})["PYTHONPATH"] == f"{server.EXTENSION_DIR}{os.pathsep}/mine"
