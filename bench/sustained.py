#!/usr/bin/env python3
"""Each contender alone on the GPU for a few seconds, back to back, with the SM clock and the power
that nvidia-smi reports meanwhile: is a kernel slower because it runs at a lower clock (the board's
power cap) rather than because it does more per cycle? bench/gpu.py interleaves the contenders in
short batches, so its clock samples cannot tell them apart; this can.

    python3 bench/sustained.py [--seconds S] [--build-dir DIR]   (on the device: bench/device_run.sh sustained)

Prints, per contender: TFLOP/s over the window (CUDA events), the median SM clock and power of the
samples inside it, the throttle reasons seen, and TFLOP/s per GHz (work per cycle).
"""
from __future__ import annotations

import argparse
import functools
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu  # noqa: E402  (bench/gpu.py: the build and the ctypes bindings)

QUERY = "timestamp,clocks.sm,power.draw,clocks_event_reasons.active"


def sampler() -> subprocess.Popen:
    return subprocess.Popen(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits", "-lms", "50"],
                            stdout=subprocess.PIPE, text=True)


def parse(lines: list[str]) -> list[tuple[float, float, float, str]]:
    out = []
    for line in lines:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 4:
            continue
        try:
            t = time.mktime(time.strptime(parts[0].split(".")[0], "%Y/%m/%d %H:%M:%S"))
            t += float("0." + parts[0].split(".")[1]) if "." in parts[0] else 0.0
            out.append((t, float(parts[1]), float(parts[2]), parts[3]))
        except ValueError:
            continue
    return out


def run_for(fn, seconds: float) -> tuple[float, float, float]:
    """Call fn back to back for about `seconds`; returns (start, end) wall times of the steady part
    (the first 0.5 s left out) and the seconds per call there (CUDA events)."""
    torch.cuda.synchronize()
    t0 = time.time()
    while time.time() - t0 < 0.5:  # reach the steady clock first
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
    start = time.time()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    n = 0
    while time.time() - start < seconds:
        for _ in range(10):
            fn()
        n += 10
        torch.cuda.synchronize()
    e.record()
    torch.cuda.synchronize()
    return start, time.time(), s.elapsed_time(e) / 1e3 / n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--build-dir", default="/tmp/sustained_build")
    args = ap.parse_args()
    out = Path(args.build_dir)
    secs, err = gpu.build(out, "sm_90", "gemm_f16")
    if err:
        print(err)
        return 1
    tilec = gpu.Tilec(out, None)
    n = args.size
    A, B = gpu.randn(n, n, scale=0.5), gpu.randn(n, n, scale=0.5)
    C = torch.empty(n, n, dtype=torch.float16, device="cuda")
    call = tilec.kernel("gemm_f16").bind([A, B], [C], (n, n, n))
    call()
    ref = A.float() @ B.float()
    err = float(((C.float() - ref).abs().max() / ref.abs().max()))
    print(f"tilec gemm_f16 {n}^3: max error {err:.1e} of the largest |C|")
    if err > 1e-2:
        print("MISMATCH")
        return 1
    contenders = {"tilec gemm_f16": call, "cuBLAS torch.mm": functools.partial(torch.mm, A, B, out=C)}
    order = ["tilec gemm_f16", "cuBLAS torch.mm", "tilec gemm_f16", "cuBLAS torch.mm"]
    proc = sampler()
    time.sleep(0.3)
    windows = []
    for name in order:
        start, end, per_call = run_for(contenders[name], args.seconds)
        windows.append((name, start, end, per_call))
        time.sleep(1.0)  # let the clock and power settle between contenders
    proc.terminate()
    samples = parse(proc.communicate()[0].splitlines())
    flops = 2 * n**3
    print(f"\n| contender ({n}^3 f16, alone for {args.seconds:.0f} s) | TFLOP/s | SM MHz (median) | W (median) "
          f"| TFLOP/s per GHz | throttle reasons |")
    print("|---|---:|---:|---:|---:|---|")
    for name, start, end, per_call in windows:
        inside = [s for s in samples if start <= s[0] <= end]
        mhz = statistics.median(s[1] for s in inside) if inside else float("nan")
        watts = statistics.median(s[2] for s in inside) if inside else float("nan")
        reasons = ",".join(sorted({s[3] for s in inside})) or "-"
        tf = flops / per_call / 1e12
        print(f"| {name} | {tf:.0f} | {mhz:.0f} | {watts:.0f} | {tf / (mhz / 1e3):.0f} | {reasons} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
