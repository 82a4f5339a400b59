#!/usr/bin/env bash
# One call on the GPU machine (the device tool): install tilec from this checkout, run the GPU
# tests, compute-sanitizer on representative kernels, and bench/gpu.py; logs go to $OUT.
#   usage (from the repository root, with .whl holding the lark and interegular wheels):
#     bash bench/device_run.sh [tests] [sanitize] [bench] [bench args...]
set -u
OUT=${OUT:-/tmp/tilec-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TILEC_CACHE_DIR=/tmp/tilec-cache
what=${1:-all}; shift || true
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
nvcc --version | tail -2 | tee -a "$OUT/gpu.txt"
git rev-parse --short HEAD 2>/dev/null | tee -a "$OUT/gpu.txt"
status=0
if [[ $what == all || $what == *tests* ]]; then
    python3 -m pytest -q -m gpu tests/test_cuda.py -n 12 -p no:cacheprovider -rf 2>&1 \
        | tee "$OUT/tests.log" | tail -40
    [[ ${PIPESTATUS[0]} == 0 ]] || status=1
fi
if [[ $what == all || $what == *sanitize* ]]; then
    for case in "gemm_bias_relu M=200,N=130,K=70" "attention B=1,H=2,L=130,S=70,D=64" \
                "causal_attention B=1,H=1,L=150,D=32" "softmax R=5,C=300" "w4a16 M=3,N=96,K=256" \
                "layernorm R=3,C=20000"; do
        set -- $case
        for tool in memcheck racecheck; do
            echo "== compute-sanitizer --tool $tool $1 $2" | tee -a "$OUT/sanitize.log"
            compute-sanitizer --tool $tool --error-exitcode 9 python3 -m tilec.cli run \
                samples/$1.tile --target cuda --arch sm_90 --dims $2 --seed 1 \
                >> "$OUT/sanitize.log" 2>&1 || { echo "   FAILED ($?)" | tee -a "$OUT/sanitize.log"; status=1; }
            tail -2 "$OUT/sanitize.log"
        done
    done
fi
if [[ $what == all || $what == *bench* ]]; then
    python3 bench/gpu.py --arch sm_90 --json "$OUT/bench.json" "$@" 2>&1 | tee "$OUT/bench.log" | tail -60
    [[ ${PIPESTATUS[0]} == 0 ]] || status=1
fi
exit $status
