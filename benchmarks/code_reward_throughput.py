"""Solutions scored per second by the sandboxed ``code_unit_tests`` reward, by worker count.

Run from the repository root::

    .venv/bin/python benchmarks/code_reward_throughput.py                  # 48 solutions, 2 rounds
    .venv/bin/python benchmarks/code_reward_throughput.py --solutions 96 --rounds 3

The workload: four stdin/stdout problems (sum of a list, primes up to n, reversed words,
Fibonacci modulo 1e9+7), four cases each, one of them large, and a mix of responses as
a policy writes them (fenced Python in prose): per eight, four correct, two wrong
(off by one, or reversing characters instead of words), one that raises and one that is
too slow for the large case (it times out there and passes the small ones). Every solution is scored by ``rewards.score_batch``,
as the trainer does, with ``num_workers`` worker processes (``DataConfig.reward_workers``);
each case is one sandboxed interpreter. Worker pools are started and warmed up before
timing, and the worker counts are timed alternately, round by round, so background load
hits all alike. The table gives solutions/s and the ratio to the first worker count (the
baseline); the script also checks that every worker count gave the same scores.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

import rewards  # noqa: E402
from rewards.batch_scoring import close_pools  # noqa: E402
from rewards.code_unit_tests import KINDS  # noqa: E402

BIG_N = 60_000


def _sum_problem() -> dict[str, object]:
    sizes = [3, 5, 10, BIG_N]
    inputs = [f"{n}\n{' '.join(str(i % 97 - 40) for i in range(n))}\n" for n in sizes]
    outputs = [f"{sum(i % 97 - 40 for i in range(n))}\n" for n in sizes]
    head = "n = int(input())\na = list(map(int, input().split()))\n"
    return {
        "cases": {"inputs": inputs, "outputs": outputs},
        "correct": head + "print(sum(a))\n",
        "wrong": head + "print(sum(a[:-1]))\n",
        "error": head + "print(sum(a) // (len(a) - n))\n",
        "slow": head + "total = 0\nfor i in range(n):\n    total = sum(a[: i + 1])\nprint(total)\n",
    }


def _primes_up_to(n: int) -> int:
    sieve = bytearray([1]) * (n + 1)
    sieve[:2] = b"\0\0"
    for p in range(2, int(n**0.5) + 1):
        if sieve[p]:
            sieve[p * p :: p] = bytearray(len(range(p * p, n + 1, p)))
    return sum(sieve)


def _primes_problem() -> dict[str, object]:
    sizes = [13, 97, 1009, 2_000_003]
    sieve = (
        "n = int(input())\n"
        "sieve = bytearray([1]) * (n + 1)\n"
        "sieve[:2] = b'\\0\\0'\n"
        "for p in range(2, int(n ** 0.5) + 1):\n"
        "    if sieve[p]:\n"
        "        sieve[p * p :: p] = bytearray(len(range(p * p, n + 1, p)))\n"
    )
    trial = (
        "n = int(input())\n"
        "count = 0\n"
        "for k in range(2, n + 1):\n"
        "    if all(k % d for d in range(2, k)):\n"
        "        count += 1\n"
        "print(count)\n"
    )
    return {
        "cases": {
            "inputs": [f"{n}\n" for n in sizes],
            "outputs": [f"{_primes_up_to(n)}\n" for n in sizes],
        },
        "correct": sieve + "print(sum(sieve))\n",
        "wrong": sieve + "print(sum(sieve[:n]))\n",  # primes below n: n is prime in every case
        "error": sieve + "print(sum(sieve[n + 1]))\n",
        "slow": trial,
    }


def _words_problem() -> dict[str, object]:
    blocks = [["a b c"], ["hello world", "x"], ["one two three four"]]
    blocks.append([" ".join(f"w{i}" for i in range(BIG_N))])
    inputs = [f"{len(block)}\n" + "".join(f"{line}\n" for line in block) for block in blocks]
    outputs = ["".join(" ".join(line.split()[::-1]) + "\n" for line in b) for b in blocks]
    read = "t = int(input())\nrows = [input() for _ in range(t)]\n"
    prepend = "    out = []\n    for word in row.split():\n        out = [word] + out\n"
    return {
        "cases": {"inputs": inputs, "outputs": outputs},
        "correct": read + "for row in rows:\n    print(' '.join(row.split()[::-1]))\n",
        "wrong": read + "for row in rows:\n    print(row[::-1])\n",
        "error": read + "for row in rows:\n    print(' '.join(row.split()[::-1]), rows[t])\n",
        "slow": read + "for row in rows:\n" + prepend + "    print(' '.join(out))\n",
    }


def _fibonacci_problem() -> dict[str, object]:
    sizes = [1, 10, 20, 200_000]
    mod = 10**9 + 7

    def fib(n: int) -> int:
        a, b = 0, 1
        for _ in range(n):
            a, b = b, (a + b) % mod
        return a

    loop = "n = int(input())\na, b = 0, 1\nfor _ in range(n):\n    a, b = b, (a + b) % 1000000007\n"
    recursive = (
        "import sys\nsys.setrecursionlimit(10000)\n"
        "def fib(n):\n    return n if n < 2 else (fib(n - 1) + fib(n - 2)) % 1000000007\n"
        "n = int(input())\nprint(fib(n) if n < 40 else fib(40 + n % 3))\n"
    )
    return {
        "cases": {"inputs": [f"{n}\n" for n in sizes], "outputs": [f"{fib(n)}\n" for n in sizes]},
        "correct": loop + "print(a)\n",
        "wrong": loop + "print(b)\n",
        "error": loop + "print(a, fib)\n",
        "slow": recursive,
    }


PROBLEMS = (_sum_problem, _primes_problem, _words_problem, _fibonacci_problem)
#: The kinds of solution, in the order they repeat: half correct, a quarter wrong.
MIX = ("correct", "wrong", "correct", "slow", "correct", "error", "correct", "wrong")


def workload(count: int) -> tuple[list[str], list[str], list[str]]:
    """``count`` (response, ground truth, kind) triples, cycling problems and kinds."""
    problems = [make() for make in PROBLEMS]
    responses, truths, kinds = [], [], []
    for i in range(count):
        problem = problems[i % len(problems)]
        kind = MIX[(i // len(problems) + i) % len(MIX)]
        responses.append(f"Reading the input line by line:\n\n```python\n{problem[kind]}```\n")
        truths.append(json.dumps(problem["cases"]))
        kinds.append(kind)
    return responses, truths, kinds


def score(
    responses: Sequence[str], truths: Sequence[str], options: dict, workers: int, limit_s: float
) -> tuple[float, rewards.BatchScores]:
    """Seconds taken and scores of one ``score_batch`` call, as the trainer makes it."""
    start = time.perf_counter()
    out = rewards.score_batch(
        "code_unit_tests",
        responses,
        truths,
        [options] * len(responses),
        num_workers=workers,
        timeout_s=limit_s,
    )
    return time.perf_counter() - start, out


def main(argv: Sequence[str] | None = None) -> int:
    """Time the workload for each worker count; print the tables. Returns 0, or 1 if
    the worker counts disagree on a score."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--solutions", type=int, default=48, help="solutions per round (48)")
    parser.add_argument("--rounds", type=int, default=2, help="timed rounds per worker count (2)")
    parser.add_argument(
        "--workers",
        type=int,
        nargs="+",
        default=[1, 2],
        help="worker counts; the first is the baseline (1 2)",
    )
    parser.add_argument("--case-timeout-s", type=float, default=1.0, help="limit of one case (1.0)")
    args = parser.parse_args(argv)

    options = {
        "case_timeout_s": args.case_timeout_s,
        "total_timeout_s": 4 * args.case_timeout_s + 2,
    }
    limit_s = options["total_timeout_s"] + 5.0
    responses, truths, kinds = workload(args.solutions)
    warm = max(len(PROBLEMS), 2 * max(args.workers))
    for workers in args.workers:  # start the pools, outside the timing
        score(responses[:warm], truths[:warm], options, workers, limit_s)

    times: dict[int, list[float]] = {w: [] for w in args.workers}
    results: dict[int, rewards.BatchScores] = {}
    for r in range(args.rounds):
        order = args.workers if r % 2 == 0 else args.workers[::-1]
        for workers in order:
            elapsed, out = score(responses, truths, options, workers, limit_s)
            times[workers].append(elapsed)
            results[workers] = out
    close_pools()
    print(
        f"code_unit_tests: {args.solutions} solutions ({dict(Counter(kinds))}), 4 cases each, "
        f"case_timeout_s={args.case_timeout_s:g}, {args.rounds} round(s)\n"
    )
    _print_rates(args.solutions, times)
    print()
    _print_mix(kinds, results[args.workers[0]])
    baseline = results[args.workers[0]].scores
    same = all(out.scores == baseline for out in results.values())
    print(f"\nscores identical across worker counts: {'yes' if same else 'NO'}")
    return 0 if same else 1


def _print_rates(solutions: int, times: dict[int, list[float]]) -> None:
    """One row per worker count: seconds per round, solutions/s, ratio to the first."""
    print("| workers | seconds per round | solutions/s | vs baseline |")
    print("|---:|---|---:|---:|")
    rates = {w: solutions * len(rounds) / sum(rounds) for w, rounds in times.items()}
    base = next(iter(rates.values()))
    for workers, rounds in times.items():
        per_round = ", ".join(f"{t:.2f}" for t in rounds)
        print(f"| {workers} | {per_round} | {rates[workers]:.2f} | {rates[workers] / base:.2f} |")


def _print_mix(kinds: Sequence[str], result: rewards.BatchScores) -> None:
    """One row per kind of solution: its mean score and its cases by outcome."""
    print("| solution kind | solutions | mean score | cases by outcome |")
    print("|---|---:|---:|---|")
    for kind in sorted(set(kinds), key=list(kinds).index):
        rows = [i for i, k in enumerate(kinds) if k == kind]
        outcome = {"passed": sum(result.infos[i].get("tests_passed", 0) for i in rows)}
        for name in KINDS:
            total = sum(result.infos[i].get(f"code/{name}", 0.0) for i in rows)
            if total:
                outcome[name] = int(total)
        mean = sum(result.scores[i] for i in rows) / len(rows)
        cases = ", ".join(f"{k} {v}" for k, v in outcome.items())
        print(f"| {kind} | {len(rows)} | {mean:.2f} | {cases} |")


if __name__ == "__main__":
    sys.exit(main())
