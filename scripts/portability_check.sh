#!/usr/bin/env bash
# Run the test suite under four CPU configurations that change float32 rounding:
# torch intra-op threads 1 and 2, each with torch's default CPU kernels (the best vector
# width this CPU has: AVX-512 or AVX2) and with ATEN_CPU_CAPABILITY=avx2. A test that
# passes in all four does not depend on how reductions are split or vectorised, which is
# what differs between machines of the same kind. Not part of CI's default path.
#
#   bash scripts/portability_check.sh                       # the whole suite, 4 times
#   bash scripts/portability_check.sh tests/test_trainer_microbatching.py -k gradients
#
# Arguments go to `pytest -q` unchanged. Threads are set through RLKIT_TEST_NUM_THREADS
# (tests/conftest.py: torch.set_num_threads when pytest starts, and OMP_NUM_THREADS /
# MKL_NUM_THREADS exported to subprocesses). PORTABILITY_CONFIGS="threads:capability ..."
# picks other configurations: capability "native" leaves ATEN_CPU_CAPABILITY unset, any
# other value is exported as is (torch knows default = scalar, avx2, avx512; a value
# the CPU lacks is ignored with a warning; the summary shows what torch really used).
# Each run's output goes to a log in PORTABILITY_LOG_DIR (default: a new temporary
# directory). Prints one summary line per configuration; exits 1 if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
read -r -a CONFIGS <<<"${PORTABILITY_CONFIGS:-1:native 1:avx2 2:native 2:avx2}"
LOG_DIR=${PORTABILITY_LOG_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/rlkit_portability.XXXXXX")}
mkdir -p "$LOG_DIR"

# The environment of one configuration, as `env` arguments.
config_env() {
    local threads=$1 capability=$2
    local args=(-u ATEN_CPU_CAPABILITY "RLKIT_TEST_NUM_THREADS=$threads"
        "OMP_NUM_THREADS=$threads" "MKL_NUM_THREADS=$threads")
    [ "$capability" = native ] || args+=("ATEN_CPU_CAPABILITY=$capability")
    printf '%s\n' "${args[@]}"
}

summaries=()
failed=0
for config in "${CONFIGS[@]}"; do
    threads=${config%%:*}
    capability=${config#*:}
    mapfile -t envs < <(config_env "$threads" "$capability")
    # What torch really uses: a capability this CPU lacks is ignored (with a warning).
    effective=$(env "${envs[@]}" "$PY" -W ignore -c "import torch
print(f'{torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} thread(s)')" \
        2>/dev/null || echo "unknown")
    log="$LOG_DIR/threads${threads}_${capability}.log"
    echo "=== threads=$threads capability=$capability (torch: $effective) -> $log"
    start=$(date +%s)
    env "${envs[@]}" "$PY" -m pytest -q "$@" >"$log" 2>&1
    rc=$?
    seconds=$(($(date +%s) - start))
    # pytest's last line: "N passed, M failed, ... in Xs" (or an error message).
    result=$(grep -E '^(=+ )?[0-9]+ (passed|failed|error|skipped|deselected)|no tests ran' "$log" |
        tail -n 1 | sed -E 's/^=+ //; s/ =+$//')
    grep -E '^(FAILED|ERROR) ' "$log" | sed 's/^/    /'
    status=PASS
    if [ "$rc" -ne 0 ]; then
        status="FAIL (exit $rc)"
        failed=1
    fi
    summaries+=("$(printf 'threads=%s capability=%-7s (torch: %s)  %-14s %s [%ss]' \
        "$threads" "$capability" "$effective" "$status" "${result:-no pytest summary}" \
        "$seconds")")
done

echo
echo "=== portability summary (logs: $LOG_DIR)"
printf '%s\n' "${summaries[@]}"
exit "$failed"
