"""Pieces of the SGLang engine that need no server: payloads, buckets, snapshots, stand-ins."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlkit.registry import ROLLOUT_ENGINES
from rlkit.rollout.base import SamplingParams
from rlkit.rollout.servers import logprob_check, snapshots
from rlkit.rollout.servers.errors import RequestError
from rlkit.rollout.sglang import weight_sync
from rlkit.rollout.sglang.client import parse_samples, sampling_payload
from rlkit.rollout.sglang.server import ServerConfig, launch_command, server_env
from tests.sglang.conftest import require_sglang

STANDINS = Path(__file__).resolve().parents[2] / "tools" / "sglang_cpu_standins" / "python"


def test_sglang_is_registered_as_a_rollout_engine():
    import rlkit.rollout.sglang  # noqa: F401

    assert "sglang" in ROLLOUT_ENGINES.names()


def test_factory_without_servers_names_the_three_ways_to_get_some():
    import rlkit.rollout.sglang  # noqa: F401

    with pytest.raises(ValueError, match="model_path.*urls.*router_url"):
        ROLLOUT_ENGINES.get("sglang")()


def test_unknown_weight_sync_mode_is_rejected_with_the_choices():
    import rlkit.rollout.sglang  # noqa: F401

    with pytest.raises(ValueError, match="disk.*tensor.*distributed"):
        ROLLOUT_ENGINES.get("sglang")(urls=["http://127.0.0.1:1"], weight_sync="nfs")


def test_top_p_alone_is_sent_with_top_k_equal_to_the_vocabulary():
    params = SamplingParams(max_new_tokens=5, temperature=0.7, top_p=0.9, n=2, stop_token_ids=(7,))
    out = sampling_payload(params, extra_stop_ids=(2,), vocab_size=259)
    # top_k = vocab keeps every token (same distribution) but lets SGLang return the
    # renormalised log-probs; EOS (2) and the stop id (7) both end a response.
    assert out == {
        "max_new_tokens": 5,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 259,
        "n": 2,
        "stop_token_ids": [2, 7],
    }


def test_parse_samples_reads_ids_logprobs_and_finish_reason():
    response = [
        {
            "output_ids": [5, 2],
            "meta_info": {
                "output_token_logprobs": [[-0.5, 5, None], [-1.25, 2, None]],
                "finish_reason": {"type": "stop", "matched": 2},
                "weight_version": "3",
            },
        }
    ]
    (sample,) = parse_samples(response, n=1, want_filtered=False)
    assert (sample.response_ids, sample.log_probs) == ([5, 2], [-0.5, -1.25])
    assert (sample.finish_reason, sample.weight_version) == ("stop", "3")


def test_parse_samples_rejects_a_wrong_sample_count_as_retryable():
    with pytest.raises(RequestError, match="expected n=2"):
        parse_samples([{"output_ids": [], "meta_info": {}}], n=2, want_filtered=False)


def test_buckets_keep_order_and_respect_the_byte_limit():
    # float32: 4 bytes per element; sizes 16, 16, 40, 8 bytes with a 32-byte limit.
    named = [(f"t{i}", torch.zeros(k)) for i, k in enumerate([4, 4, 10, 2])]
    groups = [[n for n, _ in b] for b in weight_sync.buckets(named, bucket_bytes=32)]
    # 16+16 = 32 fits; the 40-byte tensor is alone (too big for any bucket); 8 goes next.
    assert groups == [["t0", "t1"], ["t2"], ["t3"]]


def test_serialized_cpu_bucket_round_trips_through_sglang_safe_unpickler():
    require_sglang()
    import base64
    import io

    from sglang.srt.utils.common import SafeUnpickler

    bucket = [("w", torch.arange(6, dtype=torch.float32).reshape(2, 3))]
    raw = base64.b64decode(weight_sync.serialize_bucket(bucket))
    ((name, tensor),) = SafeUnpickler(io.BytesIO(raw)).load()
    assert name == "w" and torch.equal(tensor, bucket[0][1])


def test_snapshots_appear_complete_and_only_the_newest_are_kept(tmp_path):
    # Published in the order 1, 3, 2: "newest" means most recently published, not the
    # highest version, so re-publishing an older version never deletes it at once.
    for version in (1, 3, 2):
        tmp = snapshots.new_tmp_dir(tmp_path)
        (tmp / "model.safetensors").write_text(str(version))
        final = snapshots.publish_snapshot(tmp, tmp_path, version, keep=2)
        assert final == tmp_path / f"policy_v{version:08d}"
    # keep=2: the last two published (3, then 2) remain, no temporary folder is left behind.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["policy_v00000002", "policy_v00000003"]
    assert (tmp_path / "policy_v00000002" / "model.safetensors").read_text() == "2"


def test_probe_ids_skip_special_tokens_and_stay_in_the_vocabulary():
    # vocab 259, offset 3: 3 + (7 * i) mod 256 -> 3, 10, 17, 24
    assert logprob_check.probe_token_ids(259, length=4) == [3, 10, 17, 24]
    assert max(logprob_check.probe_token_ids(10, length=50)) < 10


def test_max_abs_diff_is_inf_for_a_length_mismatch_or_nan():
    ref = torch.tensor([-1.0, -2.0])
    assert logprob_check.max_abs_diff([-1.0, -2.5], ref) == 0.5
    assert logprob_check.max_abs_diff([-1.0], ref) == float("inf")
    assert logprob_check.max_abs_diff([-1.0, float("nan")], ref) == float("inf")


def test_cpu_launch_sets_the_cpu_engine_and_forces_temperature_scaled_logprobs(monkeypatch):
    monkeypatch.setenv("SGLANG_RETURN_ORIGINAL_LOGPROB", "1")
    config = ServerConfig(model_path="/m", device="cpu", dtype="float32", max_total_tokens=4096)
    env = server_env(config)
    assert env["SGLANG_USE_CPU_ENGINE"] == "1"
    assert env["SGLANG_RETURN_ORIGINAL_LOGPROB"] == "0"
    cmd = launch_command(config, port=1234)
    assert cmd[1:3] == ["-m", "sglang.launch_server"]
    assert cmd[cmd.index("--max-total-tokens") + 1] == "4096"
    assert cmd[cmd.index("--dtype") + 1] == "float32"


def test_server_does_not_inherit_the_launchers_process_group():
    base = {
        "PATH": "/bin",
        "RANK": "1",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
        "TORCHELASTIC_RUN_ID": "x",
        "CUDA_VISIBLE_DEVICES": "0,1",
    }
    env = server_env(ServerConfig(model_path="/m", env={"EXTRA": "1"}), base)
    assert env["PATH"] == "/bin" and env["CUDA_VISIBLE_DEVICES"] == "0,1" and env["EXTRA"] == "1"
    assert not {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"} & set(env)
    assert "TORCHELASTIC_RUN_ID" not in env


def test_sleep_on_idle_flag_is_sent_only_when_asked():
    asleep = ServerConfig(model_path="/m", device="cpu", sleep_on_idle=True)
    assert "--sleep-on-idle" in launch_command(asleep, port=1234)
    assert "--sleep-on-idle" not in launch_command(ServerConfig(model_path="/m"), port=1234)


def test_standin_imports_anything_but_raises_and_marks_the_log_when_called():
    code = (
        "import sgl_kernel, torchvision.transforms as T\n"
        "from sgl_kernel.kvcacheio import transfer_kv_all_layer\n"
        "print(sgl_kernel.__version__, T.InterpolationMode.BICUBIC)\n"
        "transfer_kv_all_layer(1)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env={"PYTHONPATH": str(STANDINS), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert "0.0.0+cpu-standin" in proc.stdout
    assert "SGLANG-CPU-STANDIN-CALLED: sgl_kernel.kvcacheio.transfer_kv_all_layer" in proc.stderr
    assert "StandinCalledError" in proc.stderr


def _sglang_server(monkeypatch, **options):
    """The server config ``make_sglang_engine`` builds (no server starts)."""
    from rlkit.rollout.sglang import factory

    built = {}

    def engine(options_, server=None, num_servers=0, **own):
        built.update(options=options_, server=server)
        return built

    monkeypatch.setattr("rlkit.rollout.sglang.engine.SGLangEngine", engine)
    factory.make_sglang_engine(model_path="/m", **options)
    return built


def test_on_a_cpu_platform_the_server_gets_the_cpu_and_a_kv_cache_sized_for_the_run(
    monkeypatch, tmp_path
):
    from rlkit.rollout.servers.run import FLOOR_TOKENS, ServerRun

    run = ServerRun(tmp_path / "run", 512, 256, prompts_per_step=32, samples_per_prompt=8)
    built = _sglang_server(monkeypatch, run=run)  # no engine options at all
    cmd = " ".join(launch_command(built["server"], port=1234))
    for expected in ["--device cpu", "--dtype float32", "--attention-backend torch_native"]:
        assert expected in cmd
    assert f"--max-total-tokens {32 * 8 * 768}" in cmd and "--mem-fraction-static" not in cmd
    assert built["options"].log_dir == str(tmp_path / "run" / "servers")
    # Without a run (an engine built directly): the floor, and logs in the engine's default.
    built = _sglang_server(monkeypatch)
    assert built["server"].max_total_tokens == FLOOR_TOKENS and built["options"].log_dir is None


@pytest.mark.parametrize(
    "options, tokens",
    [
        ({"max_total_tokens": 4096}, 4096),
        ({"mem_fraction_static": 0.3}, None),
        ({"server_args": ["--max-total-tokens", "2048"]}, None),
        ({"log_dir": "/elsewhere"}, 16384),
    ],
)
def test_what_the_user_gives_wins_over_the_cpu_defaults(monkeypatch, tmp_path, options, tokens):
    from rlkit.rollout.servers.run import ServerRun

    built = _sglang_server(monkeypatch, run=ServerRun(tmp_path), **options)
    assert built["server"].max_total_tokens == tokens
    assert built["options"].log_dir == options.get("log_dir", str(tmp_path / "servers"))


def test_on_an_accelerator_platform_the_server_defaults_to_cuda(monkeypatch):
    from types import SimpleNamespace

    monkeypatch.setattr("rlkit.device.current", lambda: SimpleNamespace(name="cuda"))
    server = _sglang_server(monkeypatch)["server"]
    assert server.device == "cuda" and server.max_total_tokens is None
    assert server.attention_backend is None and not server.sleep_on_idle
