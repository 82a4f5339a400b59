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
        git rev-parse --short "$rev" > "$dir/.ab_commit"  # (what bench/gpu.py's header names)
        echo "$dir: $(git rev-parse --short "$rev")"
    done ;;
run)
    OUT=${OUT:-/tmp/ab-out}; mkdir -p "$OUT"
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
    export PYTHONUNBUFFERED=1 TILEC_CACHE_DIR=/tmp/tilec-cache
    # the SM clock, power and throttle reasons every 200 ms (a tree that runs hotter may lose
    # clock, not instructions: line the log's times up with each tree's start below)
    source bench/clock_log.sh
    start_clock_log "$OUT/clocks.csv"
    root=$PWD
    trees=${TREES:-$(ls -d .ab/*/ 2>/dev/null | sed 's:/$::') .}
    for round in $(seq "${ROUNDS:-2}"); do
        for tree in $trees; do
            echo "== $tree, round $round, $(date -u +%T) UTC" | tee -a "$OUT/ab.log"
            # (an exported tree has no .git of its own: git would name the enclosing checkout)
            commit=$(cat "$root/$tree/.ab_commit" 2>/dev/null)
            (cd "$root/$tree" && TILEC_COMMIT=${commit:-${TILEC_COMMIT:-}} \
                PYTHONPATH=/tmp/site:$root/$tree python3 bench/gpu.py "$@" \
                --build-dir "/tmp/ab_build_${tree//[^A-Za-z0-9]/_}") 2>&1 | tee -a "$OUT/ab.log" \
                | grep -E "^\| [a-z]|FAIL|MISMATCH|rror"
        done
    done
    stop_clock_log
    # each tree's run: the mean SM clock and power while it ran (from clocks.csv)
    python3 - "$OUT/ab.log" "$OUT/clocks.csv" <<'PY'
import re, sys
from datetime import datetime
marks = [(m[1], m[2], m[3]) for m in re.finditer(r"^== (\S+), round (\d+), (\S+) UTC", open(sys.argv[1]).read(), re.M)]
samples = []
for line in open(sys.argv[2]):
    f = [x.strip() for x in line.split(",")]
    try:
        t = datetime.strptime(f[0], "%Y/%m/%d %H:%M:%S.%f").time()
        samples.append((t.hour * 3600 + t.minute * 60 + t.second, float(f[1].split()[0]), float(f[2].split()[0])))
    except (ValueError, IndexError):
        continue
secs = [sum(int(x) * w for x, w in zip(t.split(":"), (3600, 60, 1))) for _, _, t in marks]
for i, (tree, rnd, t) in enumerate(marks):
    end = secs[i + 1] if i + 1 < len(secs) else float("inf")
    got = [(c, p) for s, c, p in samples if secs[i] <= s < end]
    if got:
        print(f"{tree} round {rnd}: mean SM clock {sum(c for c, _ in got) / len(got):.0f} MHz, "
              f"power {sum(p for _, p in got) / len(got):.0f} W ({len(got)} samples)")
PY
    ;;
*)
    echo "usage: bash bench/ab.sh prepare REV [REV ...] | run [bench/gpu.py args]" >&2; exit 2 ;;
esac
