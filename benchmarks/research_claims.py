"""Three published effects tested on the demo task, from the sweeps that measure them.

Each claim compares two grid points of one sweep seed by seed (``rlkit.sweep.claims``):

| claim | sweep | statistic |
|---|---|---|
| DAPO's clip-higher keeps entropy from collapsing | claim_clip_higher | ``actor/entropy``, mean of the last 10 steps |
| Dr. GRPO stops incorrect responses growing longer | claim_dr_grpo | ``response_length/incorrect/mean``, last 10 steps minus first 10 |
| a KL penalty (coefficient 0.1, and 1.0) slows learning at equal steps | claim_kl | held-out mean@4 over every evaluation after step 0 |

Run the sweeps first (about 25 minutes each on 2 cores, two runs at a time), then read them:

    rlkit sweep experiments/sweeps/claim_clip_higher.gin
    rlkit sweep experiments/sweeps/claim_dr_grpo.gin
    rlkit sweep experiments/sweeps/claim_kl.gin
    .venv/bin/python benchmarks/research_claims.py --json docs/research_results.json \\
        --figures docs/figures

Prints one table (per claim: each point's mean statistic, the paired difference with its
95% interval and p-value, the verdict); ``--json`` keeps the curves and numbers
(``notebooks/research_results.ipynb`` draws them), ``--figures`` writes one PNG per claim.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from benchmarks.host_cpu import cpu_name  # noqa: E402
from rlkit.logging.figures import write_png  # noqa: E402
from rlkit.sweep.claims import Claim, evaluate, plot_claim, write_results  # noqa: E402

CLAIMS = (
    Claim(
        name="clip_higher",
        statement=(
            "DAPO's clip-higher (epsilon_high 0.28 vs 0.2) keeps the policy's entropy from "
            "collapsing (arXiv:2503.14476, Fig. 2)"
        ),
        sweep="claim_clip_higher",
        baseline="clip_ratio_high=0.2",
        treatment="clip_ratio_high=0.28",
        metric="actor/entropy",
        statistic="tail_mean",
        direction=+1,
    ),
    Claim(
        name="dr_grpo",
        statement=(
            "Dr. GRPO (no per-response length or std normalisation) stops the growth of "
            "incorrect responses' length that GRPO shows (arXiv:2503.20783, Fig. 5)"
        ),
        sweep="claim_dr_grpo",
        baseline="grpo_per_response_mean",
        treatment="dr_grpo",
        metric="response_length/incorrect/mean",
        statistic="growth",
        direction=-1,
    ),
    *(
        Claim(
            name=f"kl_{coef}",
            statement=(
                f"A KL penalty to the reference policy (k3, coefficient {coef}) slows "
                "learning at equal steps"
            ),
            sweep="claim_kl",
            baseline="kl_loss_coef=0.0",
            treatment=f"kl_loss_coef={coef}",
            metric="val/arithmetic/mean@4",
            statistic="curve_mean",
            direction=-1,
        )
        for coef in ("0.1", "1.0")
    ),
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sweeps-dir", default="runs/sweeps", help="where the sweeps wrote")
    p.add_argument("--json", help="write every claim's curves and numbers here")
    p.add_argument("--figures", help="write <dir>/research_<claim>.png")
    p.add_argument("--claims", help="comma-separated claim names (default: all)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    wanted = set(args.claims.split(",")) if args.claims else {c.name for c in CLAIMS}
    results = [evaluate(c, args.sweeps_dir) for c in CLAIMS if c.name in wanted]
    print(f"{cpu_name()}; sweeps under {args.sweeps_dir}\n")
    print("| claim | statistic | baseline | treatment | difference [95% CI] | p | verdict |")
    print("|---|---|---:|---:|---:|---:|---|")
    for r in results:
        c, d = r.claim, r.difference
        base = sum(r.baseline_values) / len(r.seeds)
        treat = sum(r.treatment_values) / len(r.seeds)
        ci = f"[{d['low']:+.4g}, {d['high']:+.4g}]" if d["low"] is not None else "-"
        p = f"{d['p_value']:.3f}" if d["p_value"] is not None else "-"
        print(
            f"| {c.name} | {c.metric}: {c.describe_statistic()} | {c.baseline} {base:.4g} | "
            f"{c.treatment} {treat:.4g} | {d['mean']:+.4g} {ci} | {p} | {r.verdict} |"
        )
    print()
    for r in results:
        print(r.report())
    if args.json:
        print(f"\nwrote {write_results(results, args.json)}")
    if args.figures:
        for r in results:
            path = write_png(plot_claim(r), Path(args.figures) / f"research_{r.claim.name}.png")
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
