"""The end-to-end GRPO benchmark (rlkit vs TRL) runs at its tiniest size (no timing assertions).

TRL is a benchmark-only dependency (the ``bench`` extra). It is imported here on
purpose, without a skip: CI installs it, and a missing TRL must fail this test.
"""

from __future__ import annotations

import math
import re

import pytest
import torch
import trl  # noqa: F401  (fails loudly when the bench extra is not installed)

from tests.benchmark_scripts import load_benchmark


def table_rows(text: str) -> dict[str, list[str]]:
    """First cell -> the other cells, for every Markdown table row of the framework table."""
    rows = {}
    for line in text.splitlines():
        if line.startswith("| ") and "---" not in line:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            rows[cells[0]] = cells[1:]
    return rows


def test_benchmark_prints_both_frameworks_and_their_ratio_with_finite_numbers(tmp_path, capsys):
    benchmark = load_benchmark("e2e_grpo_vs_trl.py")
    # 2 prompts x 2 completions, <= 3 new tokens, a random 1-layer model: 2 steps, 1 dropped.
    argv = ["--rounds", "1", "--steps", "2", "--warmup", "1", "--prompts-per-step", "2"]
    argv += ["--group-size", "2", "--max-completion-length", "3", "--micro-batch-size", "2"]
    model = benchmark.build_model(tmp_path / "model", hidden_size=16, num_layers=1, sft_steps=0)
    argv += ["--num-prompts", "4", "--model-dir", model]
    assert benchmark.main(argv + ["--keep-dir", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    assert "matmul bound (float32, 1 thread(s), 1024 x 1024 products):" in out
    rows = table_rows(out)
    assert rows["rlkit phase"] == [
        "median s",
        "GFLOP as plain rows",
        "GFLOP/s",
        "of bound",
        "rows per product",
        "shape bound GFLOP/s",
        "of shape bound",
    ]
    for phase in ("gen", "update_actor"):
        assert rows[phase][3].endswith("%") and rows[phase][6].endswith("%"), rows[phase]
        assert float(rows[phase][5]) > 0
    # gen decodes the step's 2 x 2 rows; the update runs micro-batches of 2 rows.
    assert rows["gen"][4] == "4"
    streamed = re.search(
        r"Decode products with weights streamed \(1 layers' own weights in order, 4 rows, .*\): "
        r"([0-9.]+) GFLOP/s by F.linear, ([0-9.]+) on weights packed for oneDNN; the faster "
        r"is [0-9]+% of the matmul bound, and gen reached [0-9]+% of it\.",
        out,
    )
    assert streamed and float(streamed.group(1)) > 0 and float(streamed.group(2)) > 0, out
    # Each framework's step split into its rollout and the rest (TRL's timed around its
    # _generate_and_score_completions).
    assert rows["part of the step"] == ["rlkit median s", "TRL median s", "TRL / rlkit"]
    for part in ("rollout (generation, rewards)", "the rest (update, optimizer)"):
        assert all(float(c) > 0 for c in rows[part]), (part, rows[part])
    header = rows["framework"]
    assert header[:4] == ["median step s", "tokens/s", "tokens/CPU-s", "peak RSS MiB"]
    for name in ("rlkit", "TRL", "rlkit / TRL"):
        values = [float(c.replace(",", "")) for c in rows[name][:4]]
        assert all(math.isfinite(v) and v > 0 for v in values), (name, rows[name])
    for name in ("rlkit", "TRL"):
        steps, tokens_per_step = int(rows[name][4]), float(rows[name][5].replace(",", ""))
        assert steps == 1  # one round x (2 steps - 1 warm-up step)
        # 4 completions of 1..3 generated tokens after prompts "a+b=" of 4..6 byte tokens:
        # between 4 x (4 + 1) = 20 and 4 x (6 + 3) = 36 tokens per step.
        assert 20 <= tokens_per_step <= 36, (name, tokens_per_step)
    # Each worker's peak RSS after each of its 2 steps: a high-water mark, so it never
    # falls, and the table's peak (from wait4 after the worker exits) is at least the last.
    for name in ("rlkit", "TRL"):
        line = re.search(rf"^{name} round 1: ([0-9,]+), ([0-9,]+)$", out, re.MULTILINE)
        assert line, out
        first, last = (float(g.replace(",", "")) for g in line.groups())
        assert 0 < first <= last <= float(rows[name][3].replace(",", "")) + 1, (name, line)


def test_rlkit_alone_with_the_generate_decode_loop_and_a_forced_kernel(tmp_path, capsys):
    # The ablation switches: rlkit's engine on transformers' generate, a kernel forced, no
    # TRL run.
    benchmark = load_benchmark("e2e_grpo_vs_trl.py")
    model = benchmark.build_model(tmp_path / "model", hidden_size=16, num_layers=1, sft_steps=0)
    argv = ["--rounds", "1", "--steps", "2", "--warmup", "1", "--prompts-per-step", "2"]
    argv += ["--group-size", "2", "--max-completion-length", "3", "--micro-batch-size", "2"]
    argv += ["--num-prompts", "4", "--model-dir", model, "--frameworks", "rlkit"]
    argv += ["--rlkit-kernels", "rms_norm=torch_lean"]
    assert benchmark.main(argv + ["--rlkit-decode-loop", "generate"]) == 0
    out = capsys.readouterr().out
    assert "rlkit decode loop 'generate'" in out
    assert "rlkit kernels {'rms_norm': 'torch_lean'}" in out
    rows = table_rows(out)
    assert "TRL" not in rows and "rlkit / TRL" not in rows
    values = [float(c.replace(",", "")) for c in rows["rlkit"][:4]]
    assert all(math.isfinite(v) and v > 0 for v in values), rows["rlkit"]


def test_a_named_workload_sets_defaults_that_flags_still_override():
    benchmark = load_benchmark("e2e_grpo_vs_trl.py")
    args = benchmark.parse_args(["--workload", "gsm8k_like"])
    assert (args.prompt_tokens, args.max_completion_length, args.group_size) == (200, 128, 8)
    assert (args.hidden_size, args.layers, args.sft_steps) == (512, 8, 0)
    args = benchmark.parse_args(["--workload", "realistic", "--max-completion-length", "16"])
    assert args.max_completion_length == 16 and args.hidden_size == 512
    assert benchmark.parse_args([]).max_completion_length == 8  # tiny: the defaults


def test_streamed_bound_times_every_layers_products_and_restores_the_thread_count():
    from transformers import Qwen2Config

    benchmark = load_benchmark("e2e_grpo_vs_trl.py")
    config = Qwen2Config(
        vocab_size=32, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2,
    )  # fmt: skip
    threads = torch.get_num_threads()
    for packed in (False, True):
        rate = benchmark.streamed_bound(
            config, rows=4, threads=1, dtype="no", seconds=0.05, packed=packed
        )
        assert math.isfinite(rate) and rate > 0
        assert torch.get_num_threads() == threads


def test_linear_shapes_are_the_decoder_layers_own_linear_layers():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    benchmark = load_benchmark("e2e_grpo_vs_trl.py")
    config = Qwen2Config(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=24,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    shapes = benchmark.linear_shapes(config)
    # q 16 -> 4 heads x 4 = 16, k and v 16 -> 2 x 4 = 8, o 16 -> 16, gate and up
    # 16 -> 24, down 24 -> 16.
    assert shapes == [(16, 16), (16, 8), (16, 8), (16, 16), (16, 24), (16, 24), (24, 16)]
    layer = Qwen2ForCausalLM(config).model.layers[0]
    linears = [m for m in layer.modules() if isinstance(m, torch.nn.Linear)]
    assert sorted((m.in_features, m.out_features) for m in linears) == sorted(shapes)


def test_every_named_workload_passes_the_trainers_checks_on_the_model_it_builds(tmp_path):
    # The trainer refuses prompt + response lengths past the model's positions before
    # loading it; each named workload must fit the model build_model makes for it
    # (gsm8k_like: 32 + 2 x 200 prompt + 128 response tokens).
    benchmark = load_benchmark("e2e_grpo_vs_trl.py")  # puts benchmarks/ on sys.path
    from e2e_workloads import Workload, rlkit_config

    model = benchmark.build_model(tmp_path / "model", hidden_size=16, num_layers=1, sft_steps=0)
    for name in sorted(benchmark.WORKLOADS):
        args = benchmark.parse_args(["--workload", name])
        rlkit_config(Workload.from_args(args, model_dir=model), tmp_path / name).validate()


def test_rlkit_kernels_flag_reaches_the_trainers_config_and_survives_the_worker_file(tmp_path):
    benchmark = load_benchmark("e2e_grpo_vs_trl.py")
    from e2e_workloads import Workload, rlkit_config

    args = benchmark.parse_args(["--rlkit-kernels", "rms_norm=torch_lean, swiglu=torch_lean"])
    assert args.rlkit_kernels == {"rms_norm": "torch_lean", "swiglu": "torch_lean"}
    model = benchmark.build_model(tmp_path / "model", hidden_size=16, num_layers=1, sft_steps=0)
    workload = Workload.from_args(args, model_dir=model)
    # The worker process reads the workload back from JSON.
    assert Workload.from_json(workload.to_json()).rlkit_kernels == args.rlkit_kernels
    config = rlkit_config(workload, tmp_path / "run")
    config.validate()
    assert config.model.kernel_overrides == {"rms_norm": "torch_lean", "swiglu": "torch_lean"}
    assert benchmark.parse_args([]).rlkit_kernels == {}


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("rms_norm", "'rms_norm' is not OP=NAME"),
        ("norm=hf", "unknown kernel op 'norm'; ops: rms_norm, rotary, swiglu"),
        ("rms_norm=fast", "unknown rms_norm kernel 'fast'. Known: hf, liger"),
        ("rms_norm=liger", "cannot run on platform 'cpu'"),
    ],
)
def test_rlkit_kernels_flag_refuses_what_cannot_run_before_any_work(flag, message, capsys):
    benchmark = load_benchmark("e2e_grpo_vs_trl.py")
    with pytest.raises(SystemExit) as exit_info:
        benchmark.parse_args(["--rlkit-kernels", flag])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
