#!/usr/bin/env bash
# Per-call time of small fused GEMMs on the CPU target: bash bench/small_calls/run.sh [sizes...]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=$(mktemp -d)
tilec build "$here/linear.tile" -o "$out/lib" > /dev/null
g++ -std=c++17 -O2 "$here/main.cpp" -I"$out/lib" -L"$out/lib" -llinear -fopenmp \
    -Wl,-rpath,"$out/lib" -o "$out/app"
grep -m1 "model name" /proc/cpuinfo || true
sizes=("$@")
[[ ${#sizes[@]} -gt 0 ]] || sizes=(16 32 64)
for n in "${sizes[@]}"; do "$out/app" "$n"; done
rm -rf "$out"
