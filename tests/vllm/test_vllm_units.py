"""The vLLM engine's pieces that need no server: request bodies, answer parsing, the launch
command and environment, the untied checkpoint copy, the head-size check."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM

from rlkit.rollout.base import SamplingParams
from rlkit.rollout.servers.errors import RequestError, ServerStartError
from rlkit.rollout.vllm.client import (
    completion_body,
    parse_choices,
    parse_prompt_log_probs,
)
from rlkit.rollout.vllm.server import EXTENSION_DIR, VLLMServerConfig, check_servable
from rlkit.rollout.vllm.untied import is_tied, untied_copy


def test_the_completion_body_states_every_sampling_setting():
    params = SamplingParams(max_new_tokens=7, temperature=0.8, top_p=0.9, n=3, stop_token_ids=(9,))
    body = completion_body([1, 2, 3], params, extra_stop_ids=(2,), seed=11)
    assert body == {
        "prompt": [1, 2, 3],  # token ids, never text
        "max_tokens": 7,
        "n": 3,
        "temperature": 0.8,
        "top_p": 0.9,
        "top_k": -1,  # vLLM's "off"; rlkit's is any k <= 0
        "logprobs": 0,  # the sampled token's own log-prob
        "return_token_ids": True,
        "skip_special_tokens": False,
        "stop_token_ids": [2, 9],  # the request's and the engine's (EOS), merged
        "seed": 11,
    }


def _choice(index, ids, lps, reason="length"):
    return {
        "index": index,
        "token_ids": ids,
        "logprobs": {"token_logprobs": lps},
        "finish_reason": reason,
    }


def test_choices_are_read_in_index_order_with_their_finish_reasons():
    answer = {
        "choices": [_choice(1, [7, 2], [-0.5, -0.1], "stop"), _choice(0, [5, 6, 8], [-1, -2, -3])]
    }
    samples = parse_choices(answer, n=2, version="4")
    assert [s.response_ids for s in samples] == [[5, 6, 8], [7, 2]]
    assert [s.finish_reason for s in samples] == ["length", "stop"]
    assert samples[1].log_probs == [-0.5, -0.1] and samples[0].weight_version == "4"
    # An aborted choice is not a stopped one: it counts as cut at the length.
    aborted = parse_choices({"choices": [_choice(0, [5], [-1.0], "abort")]}, n=1, version="4")
    assert aborted[0].finish_reason == "length"


@pytest.mark.parametrize(
    "answer, message",
    [
        ({"error": "boom"}, "malformed /v1/completions answer"),
        ({"choices": [_choice(0, [5], [-1.0])]}, "returned 1 choices, expected n=2"),
        ({"choices": [_choice(0, [5, 6], [-1.0]), _choice(1, [5], [-1.0])]}, "2 tokens but 1"),
    ],
)
def test_a_malformed_answer_is_a_request_error(answer, message):
    with pytest.raises(RequestError, match=message):
        parse_choices(answer, n=2, version="0")


def test_prompt_log_probs_are_read_per_position_by_token_id():
    # vLLM keys each position's log-probs by the token id as a string; position 0 is None.
    answer = {
        "choices": [
            {"prompt_logprobs": [None, {"8": {"logprob": -1.5}}, {"3": {"logprob": -0.25}}]}
        ]
    }
    assert parse_prompt_log_probs(answer, [1, 8, 3]) == [-1.5, -0.25]
    with pytest.raises(RequestError, match="malformed prompt_logprobs"):
        parse_prompt_log_probs(answer, [1, 8, 4])


def test_the_launch_command_and_environment_of_a_cpu_server():
    config = VLLMServerConfig(
        model_path="/m",
        python="/env/bin/python",
        device="cpu",
        dtype="float32",
        max_model_len=256,
        enable_chunked_prefill=False,
        kv_cache_bytes=1 << 30,
        extra_args=("--enforce-eager",),
        env={"EXTRA": "1"},
    )
    cmd = config.command(8123)
    assert cmd[:3] == ["/env/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    flags = " ".join(cmd[3:])
    for expected in [
        "--model /m",
        "--port 8123",
        "--dtype float32",
        "--logprobs-mode processed_logprobs",  # log-probs of the distribution sampled from
        "--generation-config vllm",  # the model's generation_config.json sets no defaults
        "--max-model-len 256",
        "--kv-cache-memory-bytes 1073741824",  # a size, not a fraction of the machine
        "--no-enable-chunked-prefill",
    ]:
        assert expected in flags
    assert cmd[-1] == "--enforce-eager"
    env = config.environment(
        {
            "PYTHONPATH": "/trainer",
            "VIRTUAL_ENV": "/trainer/.venv",
            "RANK": "1",
            "VLLM_CPU_KVCACHE_SPACE": "40",  # would override the flag
        }
    )
    assert env["VLLM_SERVER_DEV_MODE"] == "1"  # pause / reload / version routes
    assert "VLLM_CPU_KVCACHE_SPACE" not in env and env["EXTRA"] == "1"
    # The trainer's interpreter paths and launcher variables stay out of vLLM's process;
    # its PYTHONPATH is rlkit's worker extension alone (the weight checksums).
    assert not {"VIRTUAL_ENV", "RANK"} & set(env)
    assert env["PYTHONPATH"] == str(EXTENSION_DIR)
    # A restart from a snapshot swaps the weights only.
    assert config.with_weights("/snap", "3").command(8123)[4] == "/snap"


def test_an_untied_copy_computes_the_same_function_with_its_own_output_layer(
    tiny_model_dir, tmp_path
):
    assert is_tied(tiny_model_dir)
    copy = untied_copy(tiny_model_dir, tmp_path / "untied")
    assert not is_tied(copy) and is_tied(tiny_model_dir)  # the original is untouched
    with safe_open(str(copy / "model.safetensors"), framework="pt") as f:
        head, embedding = f.get_tensor("lm_head.weight"), f.get_tensor("model.embed_tokens.weight")
    assert torch.equal(head, embedding)
    ids = torch.tensor([[1, 20, 30, 40]])
    tied = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    untied = AutoModelForCausalLM.from_pretrained(copy).eval()
    assert untied.lm_head.weight.data_ptr() != untied.model.embed_tokens.weight.data_ptr()
    with torch.no_grad():
        assert torch.equal(tied(input_ids=ids).logits, untied(input_ids=ids).logits)
    # An untied model is served as it is: no copy.
    assert untied_copy(copy, tmp_path / "again") == copy


def test_a_head_size_the_cpu_attention_lacks_is_refused(tiny_model_dir, tmp_path):
    with pytest.raises(ServerStartError, match="attention head size is 16"):
        check_servable(str(tiny_model_dir), "cpu")
    check_servable(str(tiny_model_dir), "cuda")  # GPU attention takes it
    config = json.loads((tiny_model_dir / "config.json").read_text())
    wide = tmp_path / "wide"
    wide.mkdir()
    (wide / "config.json").write_text(json.dumps(config | {"head_dim": 32}))
    check_servable(str(wide), "cpu")


def _factory_servers(monkeypatch, model_path, **options):
    """The server configs ``make_vllm_engine`` builds (no server starts, no vLLM probe)."""
    from rlkit.rollout.vllm import factory, server

    monkeypatch.setattr(server, "find_vllm_python", lambda python=None: "/env/bin/python")
    monkeypatch.setattr(server, "check_vllm_install", lambda python: "0.32.0")
    built = {}

    def engine(options_, servers=(), seed=None, **own):
        built.update(options=options_, servers=list(servers))
        return built

    monkeypatch.setattr("rlkit.rollout.vllm.engine.VLLMEngine", engine)
    factory.make_vllm_engine(model_path=str(model_path), **options)
    return built


def _long_context_model(tmp_path):
    config = {
        "architectures": ["Qwen2ForCausalLM"],
        "hidden_size": 64,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "num_hidden_layers": 2,
        "max_position_embeddings": 32768,
        "torch_dtype": "float32",
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_on_a_cpu_platform_servers_get_the_cpu_and_a_kv_cache_sized_for_the_run(
    monkeypatch, tmp_path
):
    from rlkit.rollout.servers.run import FLOOR_TOKENS, ServerRun

    (tmp_path / "model").mkdir()
    model = _long_context_model(tmp_path / "model")
    run = ServerRun(tmp_path / "run", 512, 256, prompts_per_step=32, samples_per_prompt=8)
    built = _factory_servers(monkeypatch, model, run=run)  # no engine options at all
    (config,) = built["servers"]
    assert config.device == "cpu" and config.dtype == "float32"  # this machine's platform
    # 32 prompts x 8 samples x 768 tokens, 2 layers x 1 head x 32 x K,V x 4 bytes a token.
    assert config.kv_cache_bytes == 32 * 8 * 768 * 512  # 96 MiB
    assert "--kv-cache-memory-bytes" in config.command(1) and config.max_model_len is None
    assert built["options"].log_dir == str(tmp_path / "run" / "servers")

    # No run known (an engine built directly): the floor, and the model's 32k context cut
    # to what that KV cache holds (vLLM refuses to start otherwise).
    (config,) = _factory_servers(monkeypatch, model)["servers"]
    assert config.kv_cache_bytes == 64 << 20 and config.max_model_len == FLOOR_TOKENS


@pytest.mark.parametrize(
    "options, expected_bytes",
    [
        ({"kv_cache_gib": 0.5}, 1 << 29),
        ({"gpu_memory_utilization": 0.3}, None),
        ({"server_args": ["--kv-cache-memory-bytes=1G"]}, None),
        ({"server_env": {"VLLM_CPU_KVCACHE_SPACE": "2"}}, None),
    ],
)
def test_a_kv_cache_size_the_user_gives_wins(monkeypatch, tmp_path, options, expected_bytes):
    (config,) = _factory_servers(monkeypatch, _long_context_model(tmp_path), **options)["servers"]
    assert config.kv_cache_bytes == expected_bytes and config.max_model_len is None


def test_on_an_accelerator_platform_servers_default_to_cuda(monkeypatch, tmp_path):
    from types import SimpleNamespace

    monkeypatch.setattr("rlkit.device.current", lambda: SimpleNamespace(name="cuda"))
    (config,) = _factory_servers(monkeypatch, _long_context_model(tmp_path))["servers"]
    assert config.device == "cuda" and config.kv_cache_bytes is None
    assert config.dtype == "auto"
