#!/usr/bin/env bash
# A/B measurements of whole trees in one device call: bench/gpu.py from several commits of the
# repository, interleaved, so that each comparison shares the machine's state (clocks, power).
#   here:          bash bench/ab.sh prepare REV [REV ...]   # .ab/REV = `git archive REV`
#   on the device: bash bench/ab.sh run [bench/gpu.py args]  (device tool: carry .whl and .ab)
# Every tree runs the current bench/gpu.py (copied in by `prepare`), so only tilec differs.
# run's environment: TREES (default: each .ab/* tree, then this one, "."), ROUNDS (default 2).
set -u
cmd=${1:-}; shift || true
case $cmd in
prepare)
    [[ $# -gt 0 ]] || { echo "usage: bash bench/ab.sh prepare REV [REV ...]" >&2; exit 2; }
    for rev in "$@"; do
        dir=.ab/${rev//[^A-Za-z0-9._-]/_}
        rm -rf "$dir" && mkdir -p "$dir" && git archive "$rev" | tar -x -C "$dir" || exit 1
        cp bench/gpu.py "$dir/bench/gpu.py"
        echo "$dir: $(git rev-parse --short "$rev")"
    done ;;
run)
    OUT=${OUT:-/tmp/ab-out}; mkdir -p "$OUT"
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
    export PYTHONUNBUFFERED=1 TILEC_CACHE_DIR=/tmp/tilec-cache
    root=$PWD
    trees=${TREES:-$(ls -d .ab/*/ 2>/dev/null | sed 's:/$::') .}
    for round in $(seq "${ROUNDS:-2}"); do
        for tree in $trees; do
            echo "== $tree, round $round, $(date -u +%T) UTC" | tee -a "$OUT/ab.log"
            (cd "$root/$tree" && PYTHONPATH=/tmp/site:$root/$tree python3 bench/gpu.py "$@" \
                --build-dir "/tmp/ab_build_${tree//[^A-Za-z0-9]/_}") 2>&1 | tee -a "$OUT/ab.log" \
                | grep -E "^\| [a-z]|FAIL|MISMATCH|rror"
        done
    done ;;
*)
    echo "usage: bash bench/ab.sh prepare REV [REV ...] | run [bench/gpu.py args]" >&2; exit 2 ;;
esac
