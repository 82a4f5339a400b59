#!/usr/bin/env bash
# One call on the GPU machine (the device tool): install tilec from this checkout, run the GPU
# tests, compute-sanitizer on representative kernels, and bench/gpu.py; logs go to $OUT.
# TILEC_ARCH (default sm_90a) is the --arch of the profile, flagruns, knobbench and bench builds;
# TILEC_SANITIZE_ARCH that of the sanitizer's.
#   usage (from the repository root, with .whl holding the lark and interegular wheels):
#     bash bench/device_run.sh [tests] [sanitize] [bench] [ceiling] [profile] [variants] [probes] ... [bench args...]
set -u
OUT=${OUT:-/tmp/tilec-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TILEC_CACHE_DIR=/tmp/tilec-cache
what=${1:-all}; shift || true
bench_args=("$@")
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
nvcc --version | tail -2 | tee -a "$OUT/gpu.txt"
# (TILEC_COMMIT where set, as bench/gpu.py: the device's copy of the tree may carry a stale .git)
echo "${TILEC_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}" | tee -a "$OUT/gpu.txt"
# the SM clock, power and throttle reasons every 200 ms while this script runs (bench/gpu.py prints
# the UTC time of each section, to line the two up)
source bench/clock_log.sh
start_clock_log "$OUT/clocks.csv"
status=0
if [[ $what == all || $what == *tests* ]]; then
    # (TILEC_TESTS narrows the run, e.g. to one file, when device time is short)
    # -v: each test is logged as it ends (a run cut short by the time limit still says which ran)
    # a test that hangs (a kernel waiting at a barrier forever) fails after --timeout seconds
    # instead of spending the call's time
    timeout_opt=$(python3 -c "import pytest_timeout" 2>/dev/null && echo "--timeout=${TILEC_TEST_TIMEOUT:-180}")
    # once per architecture in TILEC_GPU_ARCHS (tests/test_cuda.py reads TILEC_GPU_ARCH)
    for gpu_arch in ${TILEC_GPU_ARCHS:-sm_90 sm_90a}; do
        echo "== GPU tests for $gpu_arch" | tee -a "$OUT/tests.log"
        TILEC_GPU_ARCH=$gpu_arch python3 -m pytest -v -m gpu ${TILEC_TESTS:-tests/} \
            -n ${TILEC_TEST_WORKERS:-15} $timeout_opt \
            -p no:cacheprovider -rf --durations=${TILEC_DURATIONS:-12} 2>&1 \
            | while IFS= read -r line; do printf '%(%T)T %s\n' -1 "$line"; done \
            | tee -a "$OUT/tests.log" | tail -25
        [[ ${PIPESTATUS[0]} == 0 ]] || status=1
    done
fi
if [[ $what == all || $what == *sanitize* ]]; then
    # (TILEC_SANITIZE, lines "sample dims", narrows the cases)
    cases=${TILEC_SANITIZE:-"gemm_bias_relu M=200,N=130,K=70
gemm_bias_relu M=256,N=384,K=320
attention B=1,H=2,L=130,S=70,D=64
causal_attention B=1,H=1,L=150,D=32
softmax R=5,C=300
w4a16 M=3,N=96,K=256
w4a16 M=2,N=200,K=1536
w4a16 M=1,N=304,K=1280
w4a16 M=1,N=136,K=128
w4a16_kmajor M=1,N=200,K=384
w4a16_kmajor M=1,N=1024,K=2048
w4a16_kmajor M=16,N=130,K=384
layernorm R=3,C=20000
rmsnorm R=3,C=5000
linear_tf32 M=100,N=72,K=300"}
    while read -r case; do
        [[ -z $case ]] && continue
        read -r sample dims <<< "$case"
        # a sample's name, or "file.tile@kernel"
        file=samples/$sample.tile; kernel_opt=()
        [[ $sample == *@* ]] && { file=${sample%%@*}; kernel_opt=(--kernel "${sample#*@}"); }
        for tool in memcheck racecheck; do
            echo "== compute-sanitizer --tool $tool $sample $dims" | tee -a "$OUT/sanitize.log"
            compute-sanitizer --tool $tool --error-exitcode 9 python3 -m tilec.cli run \
                "$file" "${kernel_opt[@]}" --target cuda --arch ${TILEC_SANITIZE_ARCH:-sm_90a} --dims $dims --seed 1 \
                < /dev/null >> "$OUT/sanitize.log" 2>&1 || { echo "   FAILED ($?)" | tee -a "$OUT/sanitize.log"; status=1; }
            tail -2 "$OUT/sanitize.log"
        done
    done <<< "$cases"
fi
if [[ $what == *ceiling* ]]; then
    # the mma.sync rate with no memory traffic (what tilec's tensor-core kernels can reach)
    nvcc -O3 -arch=sm_90 bench/mma_peak.cu -o /tmp/mma_peak && /tmp/mma_peak | tee "$OUT/mma_peak.txt"
fi
if [[ $what == *sustained* ]]; then
    # tilec's GEMM and cuBLAS each alone for seconds, with the clock and power meanwhile
    python3 bench/sustained.py 2>&1 | tee "$OUT/sustained.log" | tail -8
fi
if [[ $what == *profile* ]]; then
    # ncu (clocks left alone) on one launch of representative kernels, via `tilec run`
    cases=${TILEC_PROFILE:-"gemm_f16:M=4096,N=4096,K=4096 attention:B=1,H=16,L=4096,S=4096,D=128 softmax_f16:R=16384,C=8192 chain_f16:R=16384,C=8192 w4a16:M=1,N=8192,K=8192"}
    for case in $cases; do
        # "kernel:dims" (bench/gpu.tile) or "file.tile@kernel:dims"
        file=bench/gpu.tile
        [[ $case == *@* ]] && { file=${case%%@*}; case=${case#*@}; }
        kernel=${case%%:*}; dims=${case#*:}
        ncu --clock-control none -k "regex:${kernel}_k" -c 1 --section SpeedOfLight \
            --section WarpStateStats --section Occupancy --section LaunchStats \
            --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
            --section SourceCounters --section SchedulerStats --section InstructionStats \
            --section MemoryWorkloadAnalysis_Tables \
            --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,lts__t_bytes.sum.per_second,lts__throughput.avg.pct_of_peak_sustained_elapsed,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum.pct_of_peak_sustained_elapsed,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_elapsed,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,lts__t_sector_hit_rate.pct,sm__cycles_active.min,sm__cycles_active.max,sm__cycles_active.avg,sm__ctas_launched.min,sm__ctas_launched.max" \
            python3 -m tilec.cli run "$file" --kernel "$kernel" --target cuda --arch ${TILEC_ARCH:-sm_90a} \
            --dims "$dims" --seed 1 > "$OUT/ncu_$kernel.txt" 2>&1
        # (sm__cycles_active min/max against the elapsed cycles: SMs idle while others finish)
        grep -E "Duration|Elapsed Cycles|cycles_active|Throughput|Registers|Achieved Occupancy|Stall|Warp Cycles|Issued Ipc|ok|MISMATCH" \
            "$OUT/ncu_$kernel.txt" | head -40
        # the largest stall reasons (cycles per issued instruction)
        grep -E "issue_stalled" "$OUT/ncu_$kernel.txt" | sort -k3 -g -r | head -8
    done
    # the SASS of the profiled kernels (libraries built by these runs only)
    for so in $(find "$TILEC_CACHE_DIR" -name "*.so" -newer "$OUT/gpu.txt"); do
        for case in $cases; do
            cuobjdump -sass "$so" 2>/dev/null | awk -v k="${TILEC_SASS:-${case%%:*}_k}" \
                '/Function : / {keep = index($0, k) > 0} keep' >> "$OUT/sass.txt"
        done
    done
fi
if [[ ,$what, == *,variants,* ]]; then
    # GEMM schedules x fragment double buffering, timed by `tilec run` (CUDA events, checked)
    for db in ${TILEC_DB:-1 0}; do
        echo "== TILEC_FRAGMENT_DOUBLE_BUFFER=$db" | tee -a "$OUT/variants.log"
        NVCCFLAGS="-O3 -DTILEC_FRAGMENT_DOUBLE_BUFFER=$db" python3 -m tilec.cli run \
            bench/gemm_variants.tile --target cuda --arch sm_90 --dims M=4096,N=4096,K=4096 \
            --seed 1 2>&1 | tee -a "$OUT/variants.log" | grep -E "ms|MISMATCH|error"
    done
fi
if [[ $what == *flagruns* ]]; then
    # kernels of bench/gpu.tile under other nvcc flags or knobs, timed by `tilec run` (CUDA events,
    # checked); TILEC_RUNS holds lines "kernel dims [VAR=value ...]", "+" in a value for a space
    while read -r kernel dims vars; do
        [[ -z $kernel ]] && continue
        echo "== $kernel $dims $vars" | tee -a "$OUT/flagruns.log"
        assigns=()
        for v in $vars; do assigns+=("${v//+/ }"); done
        env "${assigns[@]}" python3 -m tilec.cli run bench/gpu.tile --kernel "$kernel" --target cuda \
            --arch ${TILEC_ARCH:-sm_90a} --dims "$dims" --seed 1 2>&1 | tee -a "$OUT/flagruns.log" | grep -E "ms|MISMATCH|error"
    done <<< "${TILEC_RUNS:-}"
fi
if [[ $what == *rowvariants* ]]; then
    # row kernels with 128 / 256 / 512 threads per row, timed by `tilec run` (CUDA events, checked)
    for dims in ${TILEC_ROW_DIMS:-R=16384,C=8192 R=4096,C=16384 R=32768,C=1024 R=16384,C=4096}; do
        python3 -m tilec.cli run bench/row_variants.tile --target cuda --arch sm_90 --dims $dims \
            --seed 1 2>&1 | tee -a "$OUT/rowvariants.log" | grep -E "ms|MISMATCH|error"
    done
fi
if [[ $what == *attnvariants* ]]; then
    # attention tiles and warps, timed by `tilec run` (CUDA events, checked)
    python3 -m tilec.cli run bench/attention_variants.tile --target cuda --arch sm_90 \
        --dims B=1,H=16,L=4096,S=4096,D=128 --seed 1 2>&1 | tee -a "$OUT/attnvariants.log" \
        | grep -E "ms|MISMATCH|error"
fi
if [[ $what == *w4variants* ]]; then
    for dims in M=1,N=8192,K=8192 M=16,N=8192,K=8192; do
        python3 -m tilec.cli run bench/w4a16_variants.tile --target cuda --arch sm_90 \
            --dims $dims --seed 1 2>&1 | tee -a "$OUT/w4variants.log" | grep -E "ms|MISMATCH|error"
    done
fi
if [[ $what == *splitvariants* ]]; then
    # decode GEMM variants on W4A16 (bench/gpu.py, peers in the same run), each entry
    # "DECODE_TILE|SPLIT_K|GEMV" (see docs/CUDA.md; an empty field keeps the default):
    # TILEC_DECODE_TILE = max M,BMxBNxBK,threads,stages; TILEC_SPLIT_K = blocks,least K tiles
    # per split,blocks per SM; TILEC_GEMV = columns,threads,blocks,least rows,blocks per SM;
    # an optional fourth field: NVCCFLAGS, "+" for a space
    for cfg in ${TILEC_SPLITS:-"||" "||off"}; do
        IFS='|' read -r tile split gemv flags <<< "$cfg"
        flags=${flags//+/ }
        echo "== TILEC_DECODE_TILE=$tile TILEC_SPLIT_K=$split TILEC_GEMV=$gemv NVCCFLAGS=${flags:--O3}" | tee -a "$OUT/splitvariants.log"
        TILEC_DECODE_TILE=$tile TILEC_SPLIT_K=$split TILEC_GEMV=$gemv NVCCFLAGS=${flags:--O3} python3 bench/gpu.py \
            --arch sm_90 --cases w4a16 --kernel w4a16 --no-compile \
            --build-dir "/tmp/split_${cfg//[^A-Za-z0-9]/_}" 2>&1 | tee -a "$OUT/splitvariants.log" \
            | grep -E "^\| w4a16" | head -8
    done
fi
if [[ $what == *probes* ]]; then
    # hand-written probes against the generated kernels and torch (bench/probes.py)
    python3 bench/probes.py --out "$OUT/probes" ${TILEC_PROBES:+--only $TILEC_PROBES} 2>&1 | tee "$OUT/probes.log"
fi
if [[ $what == *knobbench* ]]; then
    # bench/gpu.py cases (TILEC_KNOB_CASES, default gemm) under benchmark knobs, peers in the
    # same run: one line of TILEC_KNOBS ("VAR=value ...", e.g. TILEC_GEMM_TILE=128x256x64,256,3,8)
    # per run ("+" in a value for a space: NVCCFLAGS=-O3+-DTILEC_CP_ASYNC_PREFETCH=256); bench/gpu.py
    # arguments in TILEC_KNOB_ARGS (e.g. --copies 1)
    while read -r vars; do
        [[ -z $vars ]] && continue
        echo "== $vars" | tee -a "$OUT/knobbench.log"
        assigns=()
        for v in $vars; do assigns+=("${v//+/ }"); done
        env "${assigns[@]}" python3 bench/gpu.py --arch ${TILEC_ARCH:-sm_90a} --cases "${TILEC_KNOB_CASES:-gemm}" --no-compile \
            ${TILEC_KNOB_ARGS:-} \
            --build-dir "/tmp/knob_${vars//[^A-Za-z0-9]/_}" 2>&1 | tee -a "$OUT/knobbench.log" \
            | grep -E "^\| [a-z]|FAIL|MISMATCH|rror|run took|tilec build"
    done <<< "${TILEC_KNOBS:-}"
fi
if [[ $what == all || ,$what, == *,bench,* ]]; then
    python3 bench/gpu.py --arch ${TILEC_ARCH:-sm_90a} --json "$OUT/bench.json" "${bench_args[@]}" 2>&1 | tee "$OUT/bench.log" | tail -60
    [[ ${PIPESTATUS[0]} == 0 ]] || status=1
fi
exit $status
