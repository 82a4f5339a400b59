# Sourced by bench/device_run.sh and bench/ab.sh: `start_clock_log FILE` logs the SM clock,
# power, temperature and throttle reasons every 200 ms into FILE (CSV, one line per sample,
# with its time) until `stop_clock_log` or the script's exit, to line up with the UTC times the
# benchmarks print.
start_clock_log() {
    nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active \
        --format=csv,noheader -lms 200 > "$1" 2>&1 &
    clock_log=$!
    trap 'kill $clock_log 2>/dev/null' EXIT
}

stop_clock_log() {
    kill "$clock_log" 2>/dev/null
    sleep 0.3  # (its last line written)
}
