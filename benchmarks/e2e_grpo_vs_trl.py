"""End-to-end GRPO speed: rlkit's ``RLTrainer`` vs TRL's ``GRPOTrainer`` on one workload.

Usage::

    .venv/bin/python benchmarks/e2e_grpo_vs_trl.py [--workload tiny|realistic|gsm8k_like]
        [--mixed-precision no|bf16] [--prompt-tokens 0] [--rounds 3 --steps 8 --warmup 2]
        [--prompts-per-step 16 --group-size 8 --max-completion-length 8 --micro-batch-size 32]
        [--hidden-size 64 --layers 2 --sft-steps 60 --threads 1] [--profile]

Both frameworks run the same GRPO workload (``benchmarks/e2e_workloads.py``): the
same tiny Qwen2 directory, the same arithmetic prompts, group size, prompts per
step, completion length, sampling, optimiser and micro-batch size, one optimizer
step per RL step, no KL term. Each run is a fresh subprocess; the rounds
alternate the order (rlkit, TRL, then TRL, rlkit, ...) so that drifting machine
load hits both sides alike. From every run the first ``--warmup`` steps are
dropped; the rest are pooled per framework into:

- median step s: the median wall time between consecutive step ends;
- tokens/s: prompt + generated tokens (EOS counted, padding not) over wall time;
- tokens/CPU-s: the same tokens over the worker's CPU time (less sensitive to
  other jobs on the machine than wall time);
- peak RSS MiB: the largest maximum resident set of any of the framework's
  worker processes (``wait4``); each run's peak after each step is listed below the
  table.

Prints a Markdown table with both rows and the ratio rlkit / TRL per metric,
the per-round paired tokens/s ratios, and rlkit's per-phase breakdown
(``timing_s/*``), then the FLOPs of its generation, log-prob and update phases
against this machine's matrix-product throughput, measured in the same run
(:func:`matmul_bound`, :func:`phase_flops`), and generation against its own products run
as a decode step runs them (:func:`streamed_bound`). ``--profile`` also runs each worker
under cProfile (CPU time) and prints its top functions (the timings of that run are then
perturbed). Target: rlkit at least 1.5x TRL's tokens/s on CPU.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

_HERE = Path(__file__).resolve().parent
# The repository root goes first: run as a script, this folder is sys.path[0], and its
# estimators.py would shadow the estimators package. This folder (for the helper module
# beside this file) goes last, for the same reason.
sys.path.insert(0, str(_HERE.parent))
if str(_HERE) not in sys.path:
    sys.path.append(str(_HERE))

from e2e_workloads import (  # noqa: E402
    FRAMEWORKS,
    RUNNERS,
    StepRecord,
    Workload,
    build_model,
    kernel_problems,
)

LABELS = {"rlkit": "rlkit", "trl": "TRL"}
#: The tokens/s ratio rlkit / TRL each workload is meant to reach.
TARGET_TOKENS_PER_S_RATIO = {"tiny": 1.5, "realistic": 1.2, "gsm8k_like": 1.5}


@dataclass
class Run:
    """One worker subprocess: its step records and its peak resident set."""

    framework: str
    round: int
    records: list[StepRecord]
    peak_rss_mib: float


# Named workloads: each sets the defaults of the options it lists (flags still win).
WORKLOADS: dict[str, dict[str, object]] = {
    # Framework overhead dominates: a 2-layer model, 8-token answers.
    "tiny": {},
    # Compute dominates: a random Qwen2 of ~31.5M non-embedding parameters, 64-token answers.
    "realistic": {
        "rounds": 2, "steps": 5, "warmup": 1, "prompts_per_step": 8, "group_size": 8,
        "max_completion_length": 64, "micro_batch_size": 16, "hidden_size": 512, "layers": 8,
        "sft_steps": 0,
    },
    # GSM8K's shape: ~206-token prompts (a 200-character preamble), 128-token responses,
    # n = 8, the realistic model.
    "gsm8k_like": {
        "rounds": 2, "steps": 4, "warmup": 1, "prompts_per_step": 8, "group_size": 8,
        "max_completion_length": 128, "micro_batch_size": 16, "hidden_size": 512, "layers": 8,
        "sft_steps": 0, "prompt_tokens": 200,
    },
}  # fmt: skip


def kernel_overrides(text: str) -> dict[str, str]:
    """``"op=name,op=name"`` -> ``{op: name}`` (the ``--rlkit-kernels`` flag)."""
    out = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        op, sep, name = item.partition("=")
        if not sep or not op.strip() or not name.strip():
            raise argparse.ArgumentTypeError(
                f"{item!r} is not OP=NAME; e.g. rms_norm=torch_lean,swiglu=torch_lean"
            )
        out[op.strip()] = name.strip()
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rounds", type=int, default=3, help="runs per framework, interleaved")
    p.add_argument("--steps", type=int, default=8, help="RL steps per run")
    p.add_argument("--warmup", type=int, default=2, help="steps dropped at the start of a run")
    p.add_argument("--prompts-per-step", type=int, default=16)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-completion-length", type=int, default=8)
    p.add_argument("--micro-batch-size", type=int, default=32)
    p.add_argument("--num-prompts", type=int, default=256, help="size of the prompt pool")
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hidden-size", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument(
        "--sft-steps",
        type=int,
        default=60,
        help="supervised warm-up steps of the model (0 = random weights)",
    )
    p.add_argument(
        "--model-dir",
        default=None,
        help="use this model directory as is (default: build one under runs/benchmarks/)",
    )
    p.add_argument(
        "--rlkit-decode-loop",
        choices=("rlkit", "generate"),
        default="rlkit",
        help="rlkit's HF engine decode loop ('generate' = transformers' generate, as TRL)",
    )
    p.add_argument(
        "--rlkit-linear-weights",
        choices=("auto", "packed", "plain"),
        default="auto",
        help="rlkit's HF engine linear_weights: 'auto' (bf16 layers laid out once per "
        "rollout for oneDNN), 'packed' (float32 ones too) or 'plain'",
    )
    p.add_argument("--frameworks", default="rlkit,trl", help="comma-separated subset")
    p.add_argument(
        "--workload",
        choices=sorted(WORKLOADS),
        default="tiny",
        help="a named workload: sets the defaults of the size options (flags still win)",
    )
    p.add_argument(
        "--prompt-tokens",
        type=int,
        default=0,
        help="lengthen prompts by a preamble of this many characters",
    )
    p.add_argument(
        "--mixed-precision",
        choices=("no", "bf16"),
        default="no",
        help="bf16 compute over float32 parameters, in both frameworks",
    )
    p.add_argument(
        "--rlkit-kernels",
        type=kernel_overrides,
        default={},
        metavar="OP=NAME[,OP=NAME]",
        help="force rlkit's kernel for these ops, e.g. rms_norm=torch_lean,swiglu=torch_lean "
        "(rlkit doctor lists them)",
    )
    p.add_argument("--profile", action="store_true", help="also print each worker's cProfile")
    p.add_argument("--keep-dir", default=None, help="keep worker outputs and logs here")
    # Internal: one framework's run inside a fresh process.
    p.add_argument("--worker", choices=FRAMEWORKS, help=argparse.SUPPRESS)
    p.add_argument("--workload-file", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    p.add_argument("--profile-out", help=argparse.SUPPRESS)
    known, _ = p.parse_known_args(argv)
    p.set_defaults(**WORKLOADS[known.workload])
    args = p.parse_args(argv)
    if args.worker is None:
        if args.rounds < 1:
            p.error("--rounds must be >= 1")
        if not 0 <= args.warmup < args.steps:
            p.error(f"--warmup ({args.warmup}) must be >= 0 and < --steps ({args.steps})")
        unknown = set(args.frameworks.split(",")) - set(FRAMEWORKS)
        if unknown:
            p.error(f"--frameworks: unknown {sorted(unknown)}; choose from {list(FRAMEWORKS)}")
        problems = kernel_problems(args.rlkit_kernels)
        if problems:
            p.error("--rlkit-kernels: " + "; ".join(problems))
    return args


# -------------------------------------------------------------------- worker
def worker_main(args: argparse.Namespace) -> int:
    """Run one framework's workload in this process; write its records as JSON."""
    import torch

    workload = Workload.from_json(Path(args.workload_file).read_text())
    torch.set_num_threads(workload.threads)
    out_dir = Path(args.result).with_suffix(".out")
    runner = RUNNERS[args.worker]
    if args.profile_out:
        import cProfile
        import time

        # CPU time, not wall time: other jobs on the machine would blur a wall-time profile.
        profiler = cProfile.Profile(time.process_time)
        records = profiler.runcall(runner, workload, out_dir)
        profiler.dump_stats(args.profile_out)
    else:
        records = runner(workload, out_dir)
    if len(records) != workload.steps:
        raise RuntimeError(
            f"{args.worker} ran {len(records)} steps, expected {workload.steps}: the step clock "
            f"missed steps"
        )
    Path(args.result).write_text(json.dumps([asdict(r) for r in records]))
    return 0


def run_worker(
    framework: str, round_index: int, workload: Workload, work_dir: Path, profile: bool
) -> Run:
    """Run ``framework`` in a fresh subprocess; return its records and its peak RSS."""
    tag = f"{framework}_round{round_index}"
    workload_file, result_file = work_dir / f"{tag}.workload.json", work_dir / f"{tag}.json"
    log_file = work_dir / f"{tag}.log"
    workload_file.write_text(workload.to_json())
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        framework,
        "--workload-file",
        str(workload_file),
        "--result",
        str(result_file),
    ]
    if profile:
        cmd += ["--profile-out", str(work_dir / f"{tag}.prof")]
    env = os.environ | {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": str(workload.threads),
        "PYTHONUNBUFFERED": "1",
    }
    with log_file.open("w") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=_HERE.parent
        )
        # wait4 rather than wait: it returns this child's own resource usage (peak RSS).
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        tail = "\n".join(log_file.read_text().splitlines()[-40:])
        raise RuntimeError(
            f"the {LABELS[framework]} worker failed (exit {proc.returncode}); "
            f"last lines of {log_file}:\n{tail}"
        )
    records = [StepRecord(**r) for r in json.loads(result_file.read_text())]
    return Run(framework, round_index, records, usage.ru_maxrss / 1024)  # ru_maxrss is in KiB


# ------------------------------------------------------------------ analysis
def summarize(runs: list[Run], warmup: int) -> dict[str, float]:
    """Median step s, tokens/s, tokens/CPU-s, peak RSS MiB over the measured steps of ``runs``."""
    measured = [r for run in runs for r in run.records[warmup:]]
    wall = sum(r.wall_s for r in measured)
    cpu = sum(r.cpu_s for r in measured)
    tokens = sum(r.tokens for r in measured)
    return {
        "median_step_s": statistics.median(r.wall_s for r in measured),
        "tokens_per_s": tokens / wall if wall > 0 else math.nan,
        "tokens_per_cpu_s": tokens / cpu if cpu > 0 else math.nan,
        "peak_rss_mib": max(run.peak_rss_mib for run in runs),
        "steps": float(len(measured)),
        "tokens_per_step": tokens / max(len(measured), 1),
    }


def ratio(a: float, b: float) -> float:
    return a / b if b > 0 and math.isfinite(a) and math.isfinite(b) else math.nan


COLUMNS = (
    ("median_step_s", "median step s", "{:.3f}"),
    ("tokens_per_s", "tokens/s", "{:,.0f}"),
    ("tokens_per_cpu_s", "tokens/CPU-s", "{:,.0f}"),
    ("peak_rss_mib", "peak RSS MiB", "{:,.0f}"),
)


def markdown(summaries: dict[str, dict[str, float]], workload: Workload) -> str:
    """Both rows and, with both frameworks, the ratio row rlkit / TRL."""
    lines = [
        f"GRPO on CPU: {workload.prompts_per_step} prompts x {workload.group_size} completions "
        f"per step, <= {workload.max_completion_length} new tokens, micro-batch "
        f"{workload.micro_batch_size}, 1 optimizer step per RL step, torch threads "
        f"{workload.threads}, rlkit decode loop {workload.rlkit_decode_loop!r} on "
        f"{workload.rlkit_linear_weights} linear weights, prompts "
        f"+{workload.prompt_tokens} characters, mixed precision {workload.mixed_precision!r}"
        + (f", rlkit kernels {workload.rlkit_kernels}" if workload.rlkit_kernels else ""),
        "",
        "| framework | " + " | ".join(c[1] for c in COLUMNS) + " | steps | tokens/step |",
        "|---|" + "---:|" * (len(COLUMNS) + 2),
    ]
    for fw, s in summaries.items():
        cells = [fmt.format(s[key]) for key, _, fmt in COLUMNS]
        lines.append(
            f"| {LABELS[fw]} | "
            + " | ".join(cells)
            + f" | {s['steps']:.0f} | {s['tokens_per_step']:,.0f} |"
        )
    if set(summaries) == set(FRAMEWORKS):
        a, b = summaries["rlkit"], summaries["trl"]
        cells = [f"{ratio(a[key], b[key]):.2f}" for key, _, _ in COLUMNS]
        lines.append("| rlkit / TRL | " + " | ".join(cells) + " | | |")
    return "\n".join(lines)


def paired_ratios(runs: list[Run], warmup: int, key: str) -> list[float]:
    """rlkit / TRL of metric ``key`` within each round (neighbouring runs share the load)."""
    out = []
    for r in sorted({run.round for run in runs}):
        by_fw = {run.framework: summarize([run], warmup) for run in runs if run.round == r}
        if set(by_fw) == set(FRAMEWORKS):
            out.append(ratio(by_fw["rlkit"][key], by_fw["trl"][key]))
    return out


def rollout_split_table(runs: list[Run], warmup: int) -> str:
    """Both frameworks' median seconds in the rollout (generation, rewards, advantages) and
    in the rest of the step (log-probs, update, optimizer): rlkit's ``gen`` + ``reward`` +
    ``adv`` phases, TRL's ``_generate_and_score_completions``."""

    def split(framework: str) -> tuple[float, float] | None:
        records = [r for run in runs if run.framework == framework for r in run.records[warmup:]]
        if not records or "gen" not in records[0].phases_s:
            return None
        rollout = [sum(r.phases_s.get(p, 0.0) for p in ("gen", "reward", "adv")) for r in records]
        rest = [r.wall_s - g for r, g in zip(records, rollout, strict=True)]
        return statistics.median(rollout), statistics.median(rest)

    sides = {fw: split(fw) for fw in FRAMEWORKS}
    if any(v is None for v in sides.values()):
        return ""
    (rl_roll, rl_rest), (trl_roll, trl_rest) = sides["rlkit"], sides["trl"]
    return "\n".join(
        [
            "| part of the step | rlkit median s | TRL median s | TRL / rlkit |",
            "|---|---:|---:|---:|",
            f"| rollout (generation, rewards) | {rl_roll:.3f} | {trl_roll:.3f} | "
            f"{ratio(trl_roll, rl_roll):.2f} |",
            f"| the rest (update, optimizer) | {rl_rest:.3f} | {trl_rest:.3f} | "
            f"{ratio(trl_rest, rl_rest):.2f} |",
        ]
    )


def rss_by_step(runs: list[Run]) -> str:
    """Each run's peak resident set after each of its steps (warm-up included), in MiB: a
    run whose peak keeps rising piles memory up (caches, fragmentation) and would end
    higher the longer it trained."""
    lines = []
    for run in sorted(runs, key=lambda run: (run.framework, run.round)):
        steps = ", ".join(f"{r.peak_rss_mib:,.0f}" for r in run.records)
        lines.append(f"{LABELS[run.framework]} round {run.round + 1}: {steps}")
    return "\n".join(["peak RSS MiB after each step:", *lines])


def phase_table(runs: list[Run], warmup: int) -> str:
    """rlkit's median seconds per phase (its ``timing_s/*``) and share of the median step."""
    measured = [r for run in runs if run.framework == "rlkit" for r in run.records[warmup:]]
    if not measured or not measured[0].phases_s:
        return ""
    step = statistics.median(r.phases_s.get("step", r.wall_s) for r in measured)
    lines = ["| rlkit phase | median s | share of step |", "|---|---:|---:|"]
    for phase in measured[0].phases_s:
        median = statistics.median(r.phases_s.get(phase, 0.0) for r in measured)
        lines.append(f"| {phase} | {median:.4f} | {median / step:.0%} |")
    return "\n".join(lines)


def _seconds_per_call(product, a, b, seconds: float) -> float:
    """Mean seconds of ``product(a, b)`` repeated for about ``seconds`` (first call untimed)."""
    import time

    product(a, b)  # the first call pays one-off costs
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        product(a, b)
        done += 1
    return (time.perf_counter() - start) / done


def matmul_bound(threads: int, dtype: str, size: int = 1024, seconds: float = 1.0) -> float:
    """This machine's matrix-product FLOP/s at ``threads`` threads: square products of
    ``size``, float32 (``dtype="no"``) or bf16, repeated for about ``seconds``."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        kind = torch.bfloat16 if dtype == "bf16" else torch.float32
        a, b = torch.randn(size, size).to(kind), torch.randn(size, size).to(kind)
        return 2 * size**3 / _seconds_per_call(torch.matmul, a, b, seconds)
    finally:
        torch.set_num_threads(before)


def linear_shapes(config) -> list[tuple[int, int]]:
    """(in, out) features of one decoder layer's linear layers: q, k, v, o, gate, up, down."""
    hidden, heads = config.hidden_size, config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    inner = config.intermediate_size
    return [
        (hidden, heads * head_dim),
        (hidden, kv * head_dim),
        (hidden, kv * head_dim),
        (heads * head_dim, hidden),
        (hidden, inner),
        (hidden, inner),
        (inner, hidden),
    ]


def shape_bound(
    config, tokens: int, threads: int, dtype: str, backward: bool, seconds: float = 0.25
) -> float:
    """FLOP/s of the model's own layer products at ``tokens`` rows, ``dtype`` at ``threads``.

    The rate a phase would reach if it did nothing but its decoder-layer matrix products,
    each as fast as this machine runs that shape: the forward ``x @ W.T`` and, with
    ``backward``, also the two products of the backward (``grad @ W`` for the input,
    ``grad.T @ x`` for the weight). Shapes count by their FLOPs, so the result is
    total FLOPs over total seconds. Thin products (decoding: one row per sequence) run
    well below :func:`matmul_bound`'s square ones; this is the bound such a phase faces.
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    kind = torch.bfloat16 if dtype == "bf16" else torch.float32
    total_flops = total_seconds = 0.0
    try:
        for k, n in linear_shapes(config):
            x, w = torch.randn(tokens, k).to(kind), torch.randn(n, k).to(kind)
            grad = torch.randn(tokens, n).to(kind)
            products = [(torch.nn.functional.linear, x, w)]
            if backward:
                products += [(torch.matmul, grad, w), (torch.matmul, grad.t(), x)]
            for product, a, b in products:
                total_seconds += _seconds_per_call(product, a, b, seconds)
                total_flops += 2 * tokens * k * n
        return total_flops / total_seconds
    finally:
        torch.set_num_threads(before)


def streamed_bound(
    config, rows: int, threads: int, dtype: str, seconds: float = 1.0, packed: bool = False
) -> float:
    """FLOP/s of one decode step's layer products as the model runs them: every layer's
    own weights, layer after layer, each used once at ``rows`` rows.

    :func:`shape_bound` repeats one product on one weight, which then stays in the CPU's
    cache; a decode step reads each of its ``num_hidden_layers`` layers' weights once per
    token, so at a few rows they stream from memory. This is the bound a decode step's
    products face; everything else the step does (attention, norms, sampling) comes on top.

    ``packed``: each weight laid out for oneDNN once beforehand, as rlkit's rollouts run
    them under bf16 (and in float32 with ``linear_weights="packed"``;
    :mod:`rlkit.kernels.packed_linear`), instead of ``F.linear`` on the plain weight.
    """
    import time

    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    kind = torch.bfloat16 if dtype == "bf16" else torch.float32
    shapes = linear_shapes(config) * config.num_hidden_layers
    try:
        layers = [
            torch.nn.Linear(k, n, bias=False).to(kind).requires_grad_(False) for k, n in shapes
        ]
        inputs = {k: torch.randn(rows, k).to(kind) for k, _ in shapes}

        def one_step() -> None:
            for layer in layers:
                layer(inputs[layer.in_features])

        with torch.no_grad(), _packed(layers, packed):
            one_step()  # the first pass pays one-off costs
            done, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds:
                one_step()
                done += 1
            elapsed = time.perf_counter() - start
        flops = sum(2 * rows * k * n for k, n in shapes)
        return flops * done / elapsed
    finally:
        torch.set_num_threads(before)


def _packed(layers: list, packed: bool):
    """The layers packed for oneDNN (:func:`rlkit.kernels.packed_linear.packed_linears`),
    or a context that leaves them plain."""
    from contextlib import nullcontext

    import torch

    from rlkit.kernels.packed_linear import packed_linears

    return packed_linears(torch.nn.ModuleList(layers)) if packed else nullcontext()


def phase_flops(config, lengths: dict[str, float]) -> dict[str, float]:
    """The FLOPs each phase of one step would do on plain rows, from the batch's mean lengths.

    Per token, the decoder layers' matrix products cost 2 · N_layers (N_layers: their
    weights); the LM head, 2 · vocab · hidden, runs on response tokens only (both
    frameworks compute logits for those alone, and generation for those it emits). Causal
    attention costs 2 · s² · head_dim · heads per layer for a sequence of s tokens (QKᵀ
    and AV over the lower triangle). Generation with a KV cache does one forward's work;
    a backward twice that, so the update is 3 forwards. Padding is not counted: work on
    it is waste, and shows as a lower fraction of the bound. Shared-prefix passes
    (``ModelConfig.share_prompt_prefix``) compute a prompt once per group, fewer FLOPs
    than this count: their fraction can exceed 100%.
    """
    from rlkit.metrics.flops import dense_parameters

    head = config.vocab_size * config.hidden_size
    layers = dense_parameters(config) - 2 * head
    rows, prompt, response = lengths["rows"], lengths["prompt_mean"], lengths["response_mean"]
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    attention = 2 * (prompt + response) ** 2 * head_dim * heads * config.num_hidden_layers
    forward = rows * (2 * layers * (prompt + response) + 2 * head * response + attention)
    return {"gen": forward, "old_log_prob": forward, "update_actor": 3 * forward}


def bound_table(runs: list[Run], warmup: int, workload: Workload) -> str:
    """rlkit's FLOPs per phase and the fraction reached of two bounds: this machine's square
    matmul rate (:func:`matmul_bound`) and the rate of the model's own layer products at
    the phase's row count (:func:`shape_bound`); then generation's fraction of its
    products' rate with the weights streamed (:func:`streamed_bound`)."""
    measured = [r for run in runs if run.framework == "rlkit" for r in run.records[warmup:]]
    if not measured or not measured[0].lengths:
        return ""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(workload.model_dir)
    threads, precision = workload.threads, workload.mixed_precision
    bound = matmul_bound(threads, precision)
    lengths = measured[0].lengths
    tokens = round(lengths["prompt_mean"] + lengths["response_mean"])
    # Generation decodes one token per unfinished sequence: products of `rows` rows. Each
    # forward or backward pass runs a micro-batch of rows at once.
    phase_rows = {
        "gen": int(lengths["rows"]),
        "old_log_prob": workload.micro_batch_size * tokens,
        "update_actor": workload.micro_batch_size * tokens,
    }
    kind = "bf16" if precision == "bf16" else "float32"
    lines = [
        f"matmul bound ({kind}, {threads} thread(s), 1024 x 1024 products): "
        f"{bound / 1e9:.1f} GFLOP/s",
        "",
        "| rlkit phase | median s | GFLOP as plain rows | GFLOP/s | of bound | rows per "
        "product | shape bound GFLOP/s | of shape bound |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for phase in ("gen", "old_log_prob", "update_actor"):
        seconds = statistics.median(r.phases_s.get(phase, 0.0) for r in measured)
        flops = statistics.median(phase_flops(config, r.lengths)[phase] for r in measured)
        if seconds <= 0:
            lines.append(f"| {phase} | 0 | {flops / 1e9:,.1f} | not run | | | | |")
            continue
        rate = flops / seconds
        rows = phase_rows[phase]
        shaped = shape_bound(config, rows, threads, precision, backward=phase == "update_actor")
        lines.append(
            f"| {phase} | {seconds:.3f} | {flops / 1e9:,.1f} | {rate / 1e9:.1f} | "
            f"{rate / bound:.0%} | {rows:,} | {shaped / 1e9:.1f} | {rate / shaped:.0%} |"
        )
    lines.append(
        "\nAbove 100%: the phase computed each prompt once per group (shared-prefix "
        "passes; generation's shared prefill), fewer FLOPs than the plain rows' count."
    )
    gen_seconds = statistics.median(r.phases_s.get("gen", 0.0) for r in measured)
    if gen_seconds > 0:
        rows = phase_rows["gen"]
        plain = streamed_bound(config, rows, threads, precision)
        packed = streamed_bound(config, rows, threads, precision, packed=True)
        streamed = max(plain, packed)
        gen_rate = statistics.median(phase_flops(config, r.lengths)["gen"] for r in measured)
        gen_rate /= gen_seconds
        lines.append(
            f"\nDecode products with weights streamed ({config.num_hidden_layers} layers' own "
            f"weights in order, {rows} rows, as one decode step reads them): "
            f"{plain / 1e9:.1f} GFLOP/s by F.linear, {packed / 1e9:.1f} on weights packed "
            f"for oneDNN; the faster is {streamed / bound:.0%} of the matmul bound, and gen "
            f"reached {gen_rate / streamed:.0%} of it."
        )
    return "\n".join(lines)


def profile_summary(path: Path, top: int = 25) -> str:
    """The ``top`` functions of a cProfile dump by cumulative time."""
    import io
    import pstats

    buffer = io.StringIO()
    pstats.Stats(str(path), stream=buffer).sort_stats("cumulative").print_stats(top)
    return buffer.getvalue()


# ---------------------------------------------------------------------- main
def prepare_model(args: argparse.Namespace) -> str:
    if args.model_dir:
        return args.model_dir
    name = f"e2e_h{args.hidden_size}_l{args.layers}_sft{args.sft_steps}_s{args.seed}"
    return build_model(
        _HERE.parent / "runs" / "benchmarks" / name,
        hidden_size=args.hidden_size,
        num_layers=args.layers,
        sft_steps=args.sft_steps,
        seed=args.seed,
    )


def run_rounds(args: argparse.Namespace, workload: Workload, work_dir: Path) -> list[Run]:
    frameworks = [f for f in FRAMEWORKS if f in args.frameworks.split(",")]
    runs = []
    for r in range(args.rounds):
        order = frameworks if r % 2 == 0 else frameworks[::-1]  # ABBA: cancels linear drift
        for fw in order:
            print(f"round {r + 1}/{args.rounds}: {LABELS[fw]} ...", file=sys.stderr, flush=True)
            runs.append(run_worker(fw, r, workload, work_dir, args.profile))
    return runs


def report(args: argparse.Namespace, workload: Workload, runs: list[Run], work_dir: Path) -> None:
    summaries = {
        fw: summarize([run for run in runs if run.framework == fw], args.warmup)
        for fw in FRAMEWORKS
        if any(run.framework == fw for run in runs)
    }
    print(markdown(summaries, workload))
    for key, label in (("tokens_per_s", "tokens/s"), ("tokens_per_cpu_s", "tokens/CPU-s")):
        pairs = paired_ratios(runs, args.warmup, key)
        if pairs:
            print(
                f"\nrlkit / TRL {label} per round: "
                + ", ".join(f"{p:.2f}" for p in pairs)
                + f" (median {statistics.median(pairs):.2f})"
            )
    if len(summaries) == len(FRAMEWORKS):
        got = ratio(summaries["rlkit"]["tokens_per_s"], summaries["trl"]["tokens_per_s"])
        target = TARGET_TOKENS_PER_S_RATIO[args.workload]
        verdict = "met" if got >= target else "NOT met"
        print(f"\ntarget ({args.workload}) rlkit >= {target}x TRL tokens/s: {verdict} ({got:.2f}x)")
    print("\n" + rss_by_step(runs))
    split = rollout_split_table(runs, args.warmup)
    if split:
        print("\n" + split)
    phases = phase_table(runs, args.warmup)
    if phases:
        print("\n" + phases)
    bounds = bound_table(runs, args.warmup, workload)
    if bounds:
        print("\n" + bounds)
    if args.profile:
        for prof in sorted(work_dir.glob("*round0.prof")):
            print(f"\n### cProfile: {prof.name}\n```\n{profile_summary(prof)}```")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker is not None:
        return worker_main(args)
    workload = Workload.from_args(args, model_dir=prepare_model(args))
    if args.keep_dir:
        work_dir = Path(args.keep_dir)
        work_dir.mkdir(parents=True, exist_ok=True)
        report(args, workload, run_rounds(args, workload, work_dir), work_dir)
        return 0
    with tempfile.TemporaryDirectory(prefix="e2e_grpo_") as tmp:
        report(args, workload, run_rounds(args, workload, Path(tmp)), Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
