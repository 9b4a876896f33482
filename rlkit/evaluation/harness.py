"""``rlkit eval MODEL_DIR --dataset gsm8k|math500|aime2024|aime2025|FILE [options]``.

A preset name reads ``$RLKIT_DATA_DIR/<name>/<split>.jsonl`` (or ``.parquet``) when
``RLKIT_DATA_DIR`` is set, else the public Hugging Face hub dataset (cached as usual);
see :mod:`rlkit.data.shared_datasets`.

Generates through a rollout engine (``--engine hf`` in this process, or
``--engine sglang`` with ``--engine-option key=value`` for the servers), scores
with the dataset's reward, prints accuracy (mean@n) and pass@k (Chen et al.
2021, arXiv:2107.03374) for k = 1, 2, 4, ..., n, each with its 95% interval over
problems, and writes one JSON record per problem to ``--output`` (plus
``<output>.summary.json``).

``--compare BASELINE_DIR`` evaluates a second model the same way on the same
problems and prints MODEL - BASELINE for accuracy and each pass@k, paired over
problems: the 95% t interval of the mean difference and the paired t-test's
p-value. The baseline's records go to ``<output stem>.baseline.jsonl``, the
comparison to ``<output stem>.comparison.json``.

Exit status: 0 done; 2 a user error (unusable data, e.g. a preset that is neither in
``$RLKIT_DATA_DIR`` nor reachable on the hub), reported as one message.

Examples::

    rlkit eval runs/models/smollm2-135m-instruct --dataset gsm8k --limit 100
    rlkit eval MODEL --dataset aime2024 --n 16 --temperature 0.6 --max-new-tokens 4096 \\
        --engine sglang --engine-option tp_size=2
    rlkit eval RUN/hf_model --compare BASE_MODEL --dataset gsm8k --limit 500 --n 4 --temperature 1
"""

from __future__ import annotations

import argparse
import ast
import shlex
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

from rlkit.data import SHARED_DATASETS

USER_ERROR_EXIT = 2


def parse_options(pairs: list[str], flag: str) -> dict[str, Any]:
    """``["a=1", "b=x", "c=[1, 2]"]`` -> ``{"a": 1, "b": "x", "c": [1, 2]}``.

    Values are Python literals where they parse as one, else strings.

    Raises:
        SystemExit: an item without ``=``.
    """
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise SystemExit(f"rlkit eval: {flag} expects key=value, got {pair!r}")
        try:
            value = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            value = raw
        out[key.strip()] = value
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rlkit eval",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("model", help="local Hugging Face model directory")
    parser.add_argument(
        "--compare",
        default=None,
        metavar="BASELINE_DIR",
        help="also evaluate this model directory on the same problems and report "
        "MODEL - BASELINE paired over problems (interval and p-value)",
    )
    parser.add_argument(
        "--dataset",
        required=True,
        help=f"a preset ({', '.join(SHARED_DATASETS)}) or a JSONL/Parquet file",
    )
    parser.add_argument("--split", default="test", help="split of a preset (default test)")
    parser.add_argument("--limit", type=int, default=None, help="evaluate the first N problems")
    parser.add_argument("--n", type=int, default=1, help="responses per problem (default 1)")
    parser.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="sampling temperature; default 0 (greedy) for n=1; n>1 needs a value > 0",
    )
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=-1)
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=16, help="problems per generate call")
    parser.add_argument(
        "--engine", default="hf", help="rollout engine: hf | sglang | pkg.module:factory"
    )
    parser.add_argument(
        "--engine-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="engine factory option (repeatable), e.g. num_servers=2 or device=cpu",
    )
    parser.add_argument("--reward", default=None, help="reward name (default: the dataset's)")
    parser.add_argument(
        "--reward-option", action="append", default=[], metavar="KEY=VALUE", help="(repeatable)"
    )
    parser.add_argument("--reward-timeout", type=float, default=10.0, help="seconds per call")
    parser.add_argument("--reward-workers", type=int, default=0)
    parser.add_argument("--no-chat-template", action="store_true", help="plain role: text prompt")
    parser.add_argument("--instruction", default=None, help="override the instruction suffix")
    parser.add_argument("--system-prompt", default=None)
    parser.add_argument("--question-key", default="question", help="(dataset files)")
    parser.add_argument("--answer-key", default="answer", help="(dataset files)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--dtype", default="auto", help="float32 | bfloat16 | float16 | auto (hf engine)"
    )
    parser.add_argument("--device", default=None, help="hf engine device (default: detected)")
    parser.add_argument(
        "--num-threads",
        type=int,
        default=None,
        help="torch CPU threads (default: torch's); 1 is fastest on an oversubscribed CPU",
    )
    parser.add_argument(
        "--output",
        default=None,
        help="per-problem JSON Lines (default runs/eval/<model>/<dataset>.jsonl)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    return parser


def load_dataset_for_eval(args: argparse.Namespace) -> tuple[Any, str]:
    """The prompt-schema dataset named by ``--dataset`` and the reward that scores it."""
    from rlkit.data import load_prompt_dataset, load_shared_dataset

    options: dict[str, Any] = {"system_prompt": args.system_prompt}
    if args.instruction is not None:
        options["instruction"] = args.instruction
    if args.dataset in SHARED_DATASETS:
        dataset = load_shared_dataset(args.dataset, args.split, **options)
        reward = args.reward or SHARED_DATASETS[args.dataset].reward
    elif Path(args.dataset).exists():
        if args.reward is None:
            raise ValueError(
                f"--dataset {args.dataset} is a file: name its reward with --reward "
                f"(e.g. gsm8k, math, exact_match; see `rlkit list rewards`)"
            )
        dataset = load_prompt_dataset(
            args.dataset,
            split=args.split,
            question_key=args.question_key,
            answer_key=args.answer_key,
            **options,
        )
        reward = args.reward
    else:
        raise ValueError(
            f"--dataset {args.dataset!r} is neither a shared set "
            f"({', '.join(SHARED_DATASETS)}) nor an existing JSONL/Parquet file"
        )
    if reward in ("by_data_source", "default"):
        from rewards.by_data_source import check_data_sources

        check_data_sources(dataset["data_source"], dataset["ground_truth"], reward=reward)
    if args.limit is not None:
        if args.limit < 1:
            raise SystemExit(f"rlkit eval: --limit must be >= 1, got {args.limit}")
        dataset = dataset.select(range(min(args.limit, len(dataset))))
    return dataset, reward


def load_tokenizer(model_dir: str) -> Any:
    """The model's tokenizer, with the EOS token as padding when it has none."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def generation_eos_ids(model_dir: str) -> list[int]:
    """EOS ids from the model's ``generation_config.json`` (instruct models often list several)."""
    from transformers import GenerationConfig

    try:
        eos = GenerationConfig.from_pretrained(model_dir).eos_token_id
    except OSError:  # no generation_config.json: the tokenizer's EOS is all there is
        return []
    if eos is None:
        return []
    return [eos] if isinstance(eos, int) else list(eos)


def build_engine(args: argparse.Namespace, tokenizer: Any, n: int, model: str | None = None) -> Any:
    """The rollout engine ``--engine`` names, for ``model`` (default: the model directory)."""
    from rlkit.evaluation.loaded_weights import LoadedModelWeights
    from rlkit.registry import ROLLOUT_ENGINES

    model = args.model if model is None else model
    options = parse_options(args.engine_option, "--engine-option")
    if args.engine in ("sglang", "vllm"):
        import rlkit.rollout  # noqa: F401  (registers the engines)
    if args.engine in ("hf", "transformers"):
        options.setdefault("generation_batch_size", args.batch_size * n)
        options.setdefault("extra_eos_token_ids", generation_eos_ids(model))
    weights = LoadedModelWeights(model, dtype=args.dtype, device=args.device)
    return ROLLOUT_ENGINES.get(args.engine)(
        model_path=model, tokenizer=tokenizer, weights=weights, seed=args.seed, **options
    )


def _default_output(args: argparse.Namespace) -> Path:
    model = Path(args.model).resolve().name
    dataset = Path(args.dataset).stem if Path(args.dataset).exists() else args.dataset
    suffix = f"-n{args.n}" if args.n > 1 else ""
    return Path("runs") / "eval" / model / f"{dataset}{suffix}.jsonl"


def _progress_printer(quiet: bool, started: float):
    if quiet:
        return None

    def show(done: int, total: int, correct: int, responses: int) -> None:
        print(
            f"[eval] {done}/{total} problems, accuracy so far {correct / responses:.3f}, "
            f"{time.perf_counter() - started:.0f} s",
            file=sys.stderr,
            flush=True,
        )

    return show


def _checked_temperature(args: argparse.Namespace) -> float:
    from rlkit.evaluation.evaluator import check_sampling

    temperature = args.temperature if args.temperature is not None else 0.0
    try:
        check_sampling(args.n, temperature)
    except ValueError as exc:
        _user_error(str(exc))
    for model in (args.model, args.compare):
        if model is not None:
            _check_model(model)
    return temperature


def _check_model(model: str) -> None:
    """One message (exit status 2) for a path that is not a model, before any loading."""
    path = Path(model)
    if not path.exists():
        _user_error(f"model directory {model!r} does not exist")
    if not path.is_dir():
        _user_error(f"{model!r} is a file; give a Hugging Face model directory")
    if not (path / "config.json").is_file() and not any(path.glob("*.gguf")):
        _user_error(
            f"{model!r} is not a Hugging Face model directory (no config.json nor .gguf file)"
        )


def _user_error(message: str) -> NoReturn:
    print(f"rlkit eval: {message}", file=sys.stderr)
    raise SystemExit(USER_ERROR_EXIT)


def _print_report(
    args: argparse.Namespace, report: Any, reward: str, output: Path, model: str
) -> None:
    temperature = report.settings["temperature"]
    mode = "greedy" if temperature == 0 else f"temperature {temperature}"
    print(
        f"rlkit eval: {model} on {args.dataset} ({args.split}, "
        f"{int(report.metrics['num_problems'])} problems), n={args.n}, {mode}, "
        f"max_new_tokens={args.max_new_tokens}, reward={reward}"
    )
    print(report.summary_table())
    print(f"per-problem results: {output}")


def _evaluate_model(
    args: argparse.Namespace, model: str, dataset: Any, reward: str, argv: list[str]
) -> Any:
    """Evaluate one model directory with the command's settings; its EvalReport."""
    from rlkit.evaluation.evaluator import evaluate

    started = time.perf_counter()
    tokenizer = load_tokenizer(model)
    with build_engine(args, tokenizer, args.n, model) as engine:
        report = evaluate(
            engine,
            tokenizer,
            dataset,
            reward=reward,
            n=args.n,
            temperature=args.temperature if args.temperature is not None else 0.0,
            top_p=args.top_p,
            top_k=args.top_k,
            max_new_tokens=args.max_new_tokens,
            batch_size=args.batch_size,
            use_chat_template=not args.no_chat_template,
            seed=args.seed,
            reward_options=parse_options(args.reward_option, "--reward-option"),
            reward_timeout_s=args.reward_timeout,
            reward_workers=args.reward_workers,
            progress=_progress_printer(args.quiet, started),
        )
    report.settings |= {
        "model": str(model),
        "dataset": args.dataset,
        "split": args.split,
        "limit": args.limit,
        "engine": args.engine,
        "command": shlex.join(["rlkit", "eval", *argv]),
    }
    return report


def _compare(
    args: argparse.Namespace, report: Any, dataset: Any, reward: str, output: Path, argv: list[str]
) -> None:
    """Evaluate ``--compare`` on the same problems, write its records and the comparison."""
    import json

    from rlkit.evaluation.comparison import compare_reports

    baseline = _evaluate_model(args, args.compare, dataset, reward, argv)
    baseline_output = output.with_name(output.stem + ".baseline.jsonl")
    baseline.write_jsonl(baseline_output)
    _print_report(args, baseline, reward, baseline_output, args.compare)
    comparison = compare_reports(report, baseline, names=(str(args.model), str(args.compare)))
    path = output.with_name(output.stem + ".comparison.json")
    path.write_text(json.dumps(comparison.to_json(), indent=2) + "\n", encoding="utf-8")
    print(
        f"\n{args.model} - {args.compare}, paired over {comparison.num_problems} problems "
        f"(95% t interval of the mean difference, two-sided paired t-test):"
    )
    print(comparison.table())
    print(f"comparison: {path}")


def every_call_failed(report: Any) -> str | None:
    """The message for an evaluation whose every reward call raised or timed out, else
    ``None``."""
    m = report.metrics
    total = sum(len(p.scores) for p in report.problems)
    if not total or m["reward/num_errors"] + m["reward/num_timeouts"] < total:
        return None
    first = next((i["error"] for p in report.problems for i in p.reward_infos if "error" in i), "")
    return (
        f"every reward call failed ({int(m['reward/num_errors'])} errors, "
        f"{int(m['reward/num_timeouts'])} timeouts); the first: {first}"
    )


def main(argv: list[str] | None = None) -> int:
    """``rlkit eval``; returns the exit status (see the module docstring)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    _checked_temperature(args)
    parse_options(args.reward_option, "--reward-option")  # a malformed option fails first
    if args.num_threads is not None:
        import torch

        torch.set_num_threads(max(1, args.num_threads))
    from rlkit.data import PromptDataError

    try:
        dataset, reward = load_dataset_for_eval(args)
    except (PromptDataError, FileNotFoundError, ValueError) as exc:
        # Unusable data is the user's to fix: one message and exit status 2, no traceback.
        print(f"rlkit eval: {exc}", file=sys.stderr)
        return USER_ERROR_EXIT
    report = _evaluate_model(args, args.model, dataset, reward, argv)
    failure = every_call_failed(report)
    if failure is not None:  # a broken reward, not a model that scored 0%
        print(f"rlkit eval: {failure}", file=sys.stderr)
        return USER_ERROR_EXIT
    output = Path(args.output) if args.output else _default_output(args)
    report.write_jsonl(output)
    _print_report(args, report, reward, output, args.model)
    if args.compare:
        _compare(args, report, dataset, reward, output, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
