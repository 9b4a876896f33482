#!/usr/bin/env bash
# rlkit's end-to-end GRPO step speed at an earlier revision vs this working tree, in one
# run: the same workload (benchmarks/e2e_grpo_vs_trl.py, rlkit only), rounds alternating
# the order (before, after, then after, before, ...) so that drifting machine load hits
# both sides alike. Prints each run's table row (median step s | tokens/s | tokens/CPU-s |
# peak RSS MiB | steps | tokens/step) and the per-round tokens/s ratio after / before.
#
#   bash benchmarks/e2e_before_after.sh REV [ROUNDS] [-- extra e2e_grpo_vs_trl.py args]
#
# REV is checked out in a temporary git worktree (removed at the end); both sides use
# this checkout's .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:?usage: bash benchmarks/e2e_before_after.sh REV [ROUNDS] [-- args]}
rounds=${2:-4}
shift $(( $# >= 2 ? 2 : 1 ))
[ "${1:-}" = "--" ] && shift
here=$(pwd)
before=$(mktemp -d "${TMPDIR:-/tmp}/rlkit_before.XXXXXX")
git worktree add -q --detach "$before" "$rev"
trap 'git -C "$here" worktree remove --force "$before"' EXIT
row() {  # $1 = source tree, then extra arguments; prints the rlkit row of one run
    local tree=$1
    shift
    (cd "$tree" && PYTHONPATH="$tree" "$here/.venv/bin/python" benchmarks/e2e_grpo_vs_trl.py \
        --frameworks rlkit --rounds 1 --steps 30 --warmup 3 "$@" 2>/dev/null | grep -E '^\| rlkit \|')
}
for r in $(seq 1 "$rounds"); do
    if [ $((r % 2)) -eq 1 ]; then order="before after"; else order="after before"; fi
    declare -A tps=()
    for side in $order; do
        if [ "$side" = before ]; then tree=$before; else tree=$here; fi
        line=$(row "$tree" "$@")
        echo "round $r $side: $line"
        tps[$side]=$(echo "$line" | awk -F'|' '{gsub(/[ ,]/, "", $4); print $4}')
    done
    python3 -c "print(f'round $r after/before tokens/s: {${tps[after]} / ${tps[before]}:.3f}')"
done
