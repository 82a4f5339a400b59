#!/usr/bin/env python3
"""Hand-written probes (bench/probes.cu) against tilec's generated kernels and torch, on the GPU, in one
process: what limits the W4A16 GEMV's reads, and RMSNorm against torch.compile. Prints tables; every
RMSNorm probe is checked against torch before it is timed.

    python3 bench/probes.py [--out DIR]     (on the device: bench/device_run.sh probes)
"""
from __future__ import annotations

import argparse
import ctypes
import pathlib
import statistics
import subprocess
import sys

import torch

HERE = pathlib.Path(__file__).resolve().parent
P, I64, I32, F32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float


def build(out: pathlib.Path) -> ctypes.CDLL:
    so = out / "probes.so"
    subprocess.run(["nvcc", "-O3", "-std=c++17", "-arch=sm_90", "-shared", "-Xcompiler", "-fPIC",
                    "-Xptxas", "-v", str(HERE / "probes.cu"), "-o", str(so)], check=True,
                   stderr=open(out / "probes_ptxas.txt", "w"))
    lib = ctypes.CDLL(str(so))
    lib.probe_read.argtypes = [I32, P, I64, I64, P, P]
    lib.probe_read_name.argtypes, lib.probe_read_name.restype = [I32], ctypes.c_char_p
    lib.probe_rms.argtypes = [I32, P, P, F32, P, I64, I32, P]
    lib.probe_copy.argtypes = [I32, P, P, I64, I32, P]
    lib.probe_rms_occupancy.restype = I32
    return lib


def tilec_lib(kernel: str, out: pathlib.Path) -> ctypes.CDLL:
    d = out / f"tilec_{kernel}"
    subprocess.run([sys.executable, "-m", "tilec.cli", "build", str(HERE / "gpu.tile"), "--kernel", kernel,
                    "--target", "cuda", "--arch", "sm_90", "-o", str(d)], check=True)
    return ctypes.CDLL(str(d / "libgpu.so"))


def time_all(entries: dict, rounds: int = 30, batch: int = 10) -> dict:
    """Median seconds per call of each entry (a callable), interleaved round by round."""
    for fn in entries.values():
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    samples = {k: [] for k in entries}
    names = list(entries)
    for r in range(rounds):
        for i in range(len(names)):
            k = names[(i + r) % len(names)]
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(200000)
            s.record()
            for _ in range(batch):
                entries[k]()
            e.record()
            samples[k].append((s, e))
    torch.cuda.synchronize()
    return {k: statistics.median(s.elapsed_time(e) / 1e3 / batch for s, e in v) for k, v in samples.items()}


def cycle(calls):
    state = {"i": 0}

    def f():
        state["i"] = (state["i"] + 1) % len(calls)
        return calls[state["i"]]()
    return f


def reads(lib, stream) -> None:
    K, NB = 8192, 4096  # u4[8192, 8192]: 4 KB per row
    bufs = [torch.randint(0, 255, (K, NB), dtype=torch.uint8, device="cuda") for _ in range(6)]
    sink = torch.zeros(1024, dtype=torch.int32, device="cuda")
    entries, names = {}, {}
    for c in range(64):
        name = lib.probe_read_name(c)
        if name is None:
            break

        def call(b, c=c):
            st = lib.probe_read(c, b.data_ptr(), NB, K, sink.data_ptr(), stream)
            assert st == 0, st
        entries[c] = cycle([lambda b=b, call=call: call(b) for b in bufs])
        names[c] = name.decode()
    src = torch.empty(K * NB // 2, dtype=torch.float16, device="cuda")
    dst = torch.empty_like(src)
    entries["copy"] = lambda: dst.copy_(src)
    t = time_all(entries)
    print(f"\n## reads of u4[{K}, {2 * NB}] (32 MiB), 6 copies rotated; torch copy_ of 32 MiB for scale")
    print("| pattern | us | GB/s |\n|---|---:|---:|")
    for c, name in names.items():
        print(f"| {name} | {t[c] * 1e6:.1f} | {K * NB / t[c] / 1e9:.0f} |")
    print(f"| torch copy_ 32 MiB -> 32 MiB | {t['copy'] * 1e6:.1f} | {2 * K * NB / t['copy'] / 1e9:.0f} |")


RMS_EPS = 1e-6


def rms_eager(X, w):
    """bench/gpu.py's RMSNorm: in f32, cast to X's dtype as the last step."""
    return (X * torch.rsqrt((X.float() ** 2).mean(-1, keepdim=True) + RMS_EPS) * w).to(X.dtype)


def rms_inputs():
    """(R, C, X, w, Y) of the RMSNorm probes: bench/gpu.py's shape and values."""
    R, C = 32768, 8192
    X = torch.randn(R, C, device="cuda", dtype=torch.float16)
    w = (1 + 0.1 * torch.randn(C, device="cuda")).half()
    return R, C, X, w, torch.empty_like(X)


# the RMSNorm probes (bench/probes.cu's probe_rms variants) and what each changes
RMS_PROBES = {
    0: "", 1: "", 4: "two passes", 5: "two passes, cache hints", 6: "512 threads, 32 registers",
    7: "512 threads, 32 registers, two passes, hints", 8: "as 6, the row loaded evict_first",
    9: "as 8, the stores evict_first too", 10: "as 6, the row and w loaded evict_last",
    11: "as 6, plain ld.global loads, not .nc", 12: "as 10, the row's lines back to evict_normal once read",
    13: "as 10, evict_last fraction 0.5", 2: "", 3: "",
}
# the copy probes (probe_copy variants): blocks (0: one per 512 vectors) and what each changes
COPY_PROBES = [(0, 0, ""), (1, 8, ""), (1, 32, ""), (2, 0, "loads evict_first"), (3, 0, "stores evict_first"),
               (4, 0, "both evict_first"), (5, 0, "ld/st .cs"), (6, 0, "loads evict_last"),
               (7, 0, "plain ld.global, not .nc")]


def rms(lib, stream, out: pathlib.Path) -> None:
    R, C, X, w, Y = rms_inputs()
    eps = RMS_EPS
    ref = rms_eager(X, w)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    occ = lib.probe_rms_occupancy()
    entries = {}
    # the persistent probes (2, 3) run as many blocks as fit at once; the others one per row
    for v in RMS_PROBES:
        blocks = sms * occ if v in (2, 3) else 0

        def call(v=v, blocks=blocks):
            assert lib.probe_rms(v, X.data_ptr(), w.data_ptr(), eps, Y.data_ptr(), R, blocks, stream) == 0
        Y.fill_(float("nan"))
        call()
        torch.cuda.synchronize()
        err = float((Y.float() - ref.float()).abs().max())
        label = f"probe {v}" + (f" ({RMS_PROBES[v]})" if RMS_PROBES[v] else "") + \
            (f", {blocks} blocks" if blocks else "")
        print(f"  {label}: max abs error {err:.2e}")
        assert err < 2e-2, label
        entries[label] = call
    glib = tilec_lib("rmsnorm_f16", out)
    glib.rmsnorm_f16.argtypes = [P, P, F32, P, I64, I64, P]
    entries["tilec rmsnorm_f16"] = lambda: glib.rmsnorm_f16(X.data_ptr(), w.data_ptr(), eps, Y.data_ptr(), R, C,
                                                            stream)
    clib = tilec_lib("copy_f16", out)
    clib.copy_f16.argtypes = [P, P, I64, I64, P]
    entries["tilec copy_f16"] = lambda: clib.copy_f16(X.data_ptr(), Y.data_ptr(), R, C, stream)
    n16 = X.numel() * 2 // 16
    for v, per_sm, what in COPY_PROBES:
        blocks = sms * per_sm
        label = f"copy probe {v}" + (f", {blocks} blocks" if blocks else "") + (f" ({what})" if what else "")
        entries[label] = lambda v=v, blocks=blocks: lib.probe_copy(v, X.data_ptr(), Y.data_ptr(), n16, blocks,
                                                                  stream)
    entries["torch copy_"] = lambda: Y.copy_(X)
    cf = torch.compile(rms_eager, dynamic=False)
    from torch._inductor.utils import run_and_get_code
    got, codes = run_and_get_code(cf, X, w)
    (out / "rmsnorm_inductor.py").write_text("\n\n# ----\n".join(codes))
    print(f"  torch.compile: max abs error {float((got.float() - ref.float()).abs().max()):.2e}; its code in "
          f"{out / 'rmsnorm_inductor.py'}")
    entries["torch.compile"] = lambda: cf(X, w)
    t = time_all(entries)
    print(f"\n## RMSNorm f16 {R}x{C} (one read + one write: {2 * X.nbytes / 2**20:.0f} MiB); "
          f"{sms} SMs, {occ} probe blocks per SM")
    print("| kernel | us | GB/s |\n|---|---:|---:|")
    for k, s in t.items():
        print(f"| {k} | {s * 1e6:.1f} | {2 * X.nbytes / s / 1e9:.0f} |")


def pollution(lib, stream) -> None:
    """Does a kernel that streams 512 MiB through L2 with evict_last loads leave L2 to later kernels?
    Eight copies of 16 MiB (L2-resident when L2 is free) timed after RMSNorm probe 6 (plain loads),
    after probes 10, 12 and 13 (the row loaded evict_last; 12 puts the lines back to evict_normal
    once read, 13 marks half of them) and after nothing."""
    R, C, X, w, Y = rms_inputs()
    small = torch.randn(8 << 20, device="cuda", dtype=torch.float16)
    dst = torch.empty_like(small)

    def rms_probe(v):
        return lambda: lib.probe_rms(v, X.data_ptr(), w.data_ptr(), RMS_EPS, Y.data_ptr(), R, 0, stream)

    def copies():
        for _ in range(8):
            dst.copy_(small)
    entries = {"copies alone": copies}
    for v in (6, 10, 12, 13):
        entries[f"probe {v}"] = rms_probe(v)
        entries[f"probe {v}, then the copies"] = lambda f=rms_probe(v): (f(), copies())
    t = time_all(entries)
    print("\n## L2 after an evict_last stream: 8 copies of 16 MiB -> 16 MiB")
    print("| sequence | us | the copies' us |\n|---|---:|---:|")
    for k, s in t.items():
        alone = t.get(k.split(", then")[0]) if ", then" in k else None
        print(f"| {k} | {s * 1e6:.1f} | {(s - alone) * 1e6 if alone else s * 1e6:.1f} |")


def rms_once(out: pathlib.Path) -> None:
    """torch.compile's RMSNorm and tilec's, one call each between cudaProfilerStart and Stop (for
    `ncu --profile-from-start off`: the compile's autotuning launches stay outside)."""
    R, C, X, w, Y = rms_inputs()
    eps = RMS_EPS
    cf = torch.compile(rms_eager, dynamic=False)
    for _ in range(3):
        cf(X, w)
    glib = tilec_lib("rmsnorm_f16", out)
    glib.rmsnorm_f16.argtypes = [P, P, F32, P, I64, I64, P]
    stream = torch.cuda.current_stream().cuda_stream
    glib.rmsnorm_f16(X.data_ptr(), w.data_ptr(), eps, Y.data_ptr(), R, C, stream)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    cf(X, w)
    glib.rmsnorm_f16(X.data_ptr(), w.data_ptr(), eps, Y.data_ptr(), R, C, stream)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/probes")
    ap.add_argument("--only", default="reads,rms")
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.only == "rmsonce":
        return rms_once(out)
    lib = build(out)
    stream = torch.cuda.current_stream().cuda_stream
    if "reads" in args.only:
        reads(lib, stream)
    if "rms" in args.only:
        rms(lib, stream, out)
    if "pollution" in args.only:
        pollution(lib, stream)


if __name__ == "__main__":
    main()
