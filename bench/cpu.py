#!/usr/bin/env python3
"""CPU benchmark: tilec's generated C++ kernels against numpy, in one process, on the same inputs.

Cases (kernels in bench/cpu.tile):
  gemm      C = A @ B, f32, 1024^3                     goal: tilec >= 0.9x numpy (OpenBLAS) speed
  gemm16    C = A @ B, f16 operands and result, 1024^3, against numpy's f32 GEMM on the same
            values                                     goal: >= 0.9x numpy
  gemv      the same kernel at M = 1, N = K = 4096     goal: >= 0.9x numpy, >= 0.8x copy bandwidth
  skinnyk   the same kernel at 4096 x 4096, K = 64     goal: >= 0.9x numpy
  w4a16     A @ dequant(4-bit W, f32 scales, g128), M = 1, N = K = 4096, against numpy's
            matmul on the weights dequantized beforehand (f32)     goal: >= 3x numpy
  w4a16m16  the same at M = 16                         (no goal; the issue's table row)
  small     relu(A @ B + bias) at 16x16x16, per call in a loop, against numpy's expression
                                                       goal: < 20 us per call
  softmax   softmax(X, axis=-1), f32 4096x4096          goal: >= 2x numpy, >= 0.7x copy bandwidth
  softmax16 the same on f16 values, against numpy in f32 on them   no goal
  rmsnorm   X * rsqrt(mean(X*X, -1) + eps) * w          goal: the same
  ewchain   Z = silu(X * s + Y) * X  (4 ops)             goal: the same
  where     Z = where(X > Y, exp(X - Y), X * Y)          no goal
  actchain  Z = mish(X) * tanh(Y) + log(|X| + 1)          goal: >= 2x numpy
  layernorm (X - mean) * rsqrt(var + eps) * gamma + beta  goal: the same
  longrow   softmax over one row of 64M f32 values      goal: matches numpy at the f32 tolerance
  sumall    the sum of 8192 x 8192 f32 values           goal: matches numpy at the f32 tolerance
  softcols  softmax(X, axis=0), f32 2048x2048           no goal (column reductions)
  summid    sum(X, axis=1), f32 8x512x2048              no goal
  causal    causal attention against non-causal (tilec both), B1 H2 L=S=4096 D64 f32:
            goal: causal >= 1.7x faster (masked key tiles skipped)
plus the f32 FMA peak (bench/fma_peak.cpp: vector FMA chains from registers on every core) and
the copy-bandwidth ceiling (64 MiB): tilec's copy kernel (Y = X, OpenMP threads) on the
4096x4096 matrix and on the same memory seen as 16384x1024 (a flat stream), and np.copyto. A
memory-bound row's "% of copy" is against the copy kernel on 4096x4096 timed in that row's own
rounds (this VM's bandwidth drifts by 2x within an hour, so a ceiling minutes apart misleads).

Every tilec result is checked against numpy on fresh uniform[-1, 1] inputs (max |tilec - numpy| /
max |numpy|, the metric of `tilec run`); the run fails if any error is above the tolerance.
Timing: warm-up, then numpy and tilec in alternating blocks of 5 calls on the same inputs; each
block starts after a 0.25 s pause (OpenBLAS's idle workers busy-wait after a GEMM and would halve a
tilec kernel started at once) and one untimed call. The CPU time other processes take is measured
per round (this is a shared 2-core VM); times are medians over the rounds in which others used
< 5% of the CPUs, over all rounds (flagged "noisy") when fewer than 3 were clean.

Run (numpy at its best: unset the OpenBLAS overrides that may be set on the dev machine):
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/cpu.py [--json out.json]
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
TILE = ROOT / "bench" / "cpu.tile"
TOL_F32 = 1e-4
TOL_F16 = 1e-2  # a result rounded to f16 (2^-11 relative), as `tilec run` allows it
F32 = ctypes.c_float
P = ctypes.c_void_p
I64 = ctypes.c_int64


# ----------------------------------------------------------------------------- environment

def cpu_model() -> str:
    name, fam, model = "unknown", None, None
    try:
        for line in open("/proc/cpuinfo"):
            k, _, v = line.partition(":")
            k, v = k.strip(), v.strip()
            if k == "model name" and name == "unknown":
                name = v
            elif k == "cpu family" and fam is None:
                fam = int(v)
            elif k == "model" and model is None:
                model = int(v)
    except OSError:
        return platform.processor() or "unknown"
    if "AMD" in name and fam == 25 and model is not None and model >= 0x10:
        name += " (family 25 model %d: Zen 4)" % model
    elif "AMD" in name and fam == 26:
        name += f" (family 26 model {model}: Zen 5)"
    elif "AMD" in name and fam == 23:
        name += f" (family 23 model {model}: Zen or Zen 2, AVX2)"
    flags = open("/proc/cpuinfo").read()
    if " avx512f" in flags:
        name += ", AVX-512"
    return name


def blas_info() -> str:
    try:
        from threadpoolctl import threadpool_info  # optional
        parts = [f"{d.get('internal_api')} {d.get('version')} {d.get('architecture')} "
                 f"threads={d.get('num_threads')}" for d in threadpool_info()
                 if d.get("user_api") == "blas"]
        if parts:
            return "; ".join(parts)
    except ImportError:
        pass
    try:
        cfg = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        text = f"{cfg.get('name')} {cfg.get('version')}"
    except Exception:  # numpy < 1.25
        text = "unknown BLAS"
    # ask the bundled OpenBLAS which kernel set it picked at run time, and its thread count
    libdir = Path(np.__file__).resolve().parent.parent / "numpy.libs"
    for lib in sorted(libdir.glob("*openblas*")):
        try:
            so = ctypes.CDLL(str(lib))
        except OSError:
            continue
        for pre in ("scipy_openblas_", "openblas_", ""):
            for suf in ("64_", ""):
                core = getattr(so, f"{pre}get_corename{suf}", None)
                nthr = getattr(so, f"{pre}get_num_threads{suf}", None)
                if core is not None:
                    core.restype = ctypes.c_char_p
                    text += f", core={core().decode()}"
                    if nthr is not None:
                        nthr.restype = ctypes.c_int
                        text += f", threads={nthr()}"
                    return text
    return text


def git_commit() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                             capture_output=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               text=True, capture_output=True).stdout.strip()
        return rev + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def environment() -> dict:
    return {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "blas": blas_info(),
        "commit": git_commit(),
        "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE"),
        "OPENBLAS_L2_SIZE": os.environ.get("OPENBLAS_L2_SIZE"),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
    }


# ----------------------------------------------------------------------------- build & load

def build(out_dir: Path, march: str) -> dict:
    args = ["build", str(TILE), "--target", "cpu", "--arch", march, "-o", str(out_dir), "--force"]
    cmd = [sys.executable, "-m", "tilec.cli"] + args
    if not (ROOT / "tilec" / "cli.py").exists():
        cmd = ["tilec"] + args
    r = subprocess.run(cmd, cwd=ROOT, text=True, capture_output=True)
    if r.returncode != 0:
        sys.exit(f"tilec build failed ({' '.join(cmd)}):\n{r.stdout}\n{r.stderr}")
    sigs = {  # C ABI: inputs (pointers, scalars) in order, outputs, int64 dims in first-use order
        "gemm_f32": [P, P, P, I64, I64, I64],            # A, B, C, M, K, N
        "gemm_f16": [P, P, P, I64, I64, I64],            # A, B, C (f16), M, K, N
        "softmax_rows": [P, P, I64, I64],                # X, Y, R, C
        "softmax_rows_f16": [P, P, I64, I64],            # X, Y (f16), R, C
        "where_chain": [P, P, P, I64, I64],              # X, Y, Z, R, C
        "rmsnorm_f32": [P, P, F32, P, I64, I64],         # X, w, eps, Y, R, C
        "elementwise_chain": [P, P, F32, P, I64, I64],   # X, Y, s, Z, R, C
        "activation_chain": [P, P, P, I64, I64],         # X, Y, Z, R, C
        "copy_f32": [P, P, I64, I64],                    # X, Y, R, C
        "w4a16_f32": [P, P, P, P, I64, I64, I64],        # A, Wq, scales, C, M, K, N
        "layernorm_f32": [P, P, P, F32, P, I64, I64],    # X, gamma, beta, eps, Y, R, C
        "attention_f32": [P, P, P, P, I64, I64, I64, I64],         # Q, K, V, O, B, H, L, D
        "causal_attention_f32": [P, P, P, P, I64, I64, I64, I64],  # Q, K, V, O, B, H, L, D
        "linear_small": [P, P, P, P, I64, I64, I64],     # A, B, bias, C, M, K, N
        "sum_all": [P, P, I64, I64],                     # X, s, R, C
        "softmax_cols": [P, P, I64, I64],                # X, Y, R, C
        "sum_mid": [P, P, I64, I64, I64],                # X, Y, B, L, D
    }
    fns = {}
    for name, argtypes in sigs.items():
        lib = ctypes.CDLL(str(out_dir / f"lib{TILE.stem}.so"))
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, ctypes.c_int
        fns[name] = fn
    return fns


def fma_peak(out_dir: Path, march: str) -> float:
    """The f32 FMA rate of all cores (GFLOP/s), from bench/fma_peak.cpp built for `march` (the
    kernels' instruction set)."""
    lib = out_dir / "libfma_peak.so"
    r = subprocess.run(["g++", "-O3", f"-march={march}", "-ffp-contract=fast", "-fopenmp", "-shared",
                        "-fPIC", str(ROOT / "bench" / "fma_peak.cpp"), "-o", str(lib)],
                       text=True, capture_output=True)
    if r.returncode != 0:
        sys.exit(f"building bench/fma_peak.cpp failed:\n{r.stderr}")
    fn = ctypes.CDLL(str(lib)).fma_peak_gflops
    fn.argtypes, fn.restype = [ctypes.c_double], ctypes.c_double
    fn(0.2)  # warm-up: clocks up
    return max(fn(0.5) for _ in range(3))


def checked(fn, *args):
    def call():
        st = fn(*args)
        if st != 0:
            raise RuntimeError(f"{fn.__name__} returned status {st}")
    return call


def ptr(a: np.ndarray) -> int:
    assert a.flags.c_contiguous
    return a.ctypes.data


# ----------------------------------------------------------------------------- measurement

def rel_error(got: np.ndarray, ref: np.ndarray) -> float:
    got, ref = got.astype(np.float64), ref.astype(np.float64)
    if not np.all(np.isfinite(got)):
        return float("inf")
    return float(np.max(np.abs(got - ref)) / max(float(np.max(np.abs(ref))), 1e-30))


class CpuLoad:
    """CPU time used by other processes (and stolen by the hypervisor) while timing: this is a
    shared 2-core VM, and a foreign load of even 20% skews every number here."""
    HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    @staticmethod
    def _read():
        try:
            f = [int(x) for x in open("/proc/stat").readline().split()[1:]]
            me = open("/proc/self/stat").read().rsplit(")", 1)[1].split()
            return sum(f[:3]) + sum(f[5:7]), f[7] if len(f) > 7 else 0, int(me[11]) + int(me[12])
        except (OSError, ValueError, IndexError):
            return None

    def __enter__(self):
        self.t0, self.s0 = time.perf_counter(), self._read()
        return self

    def __exit__(self, *exc):
        s1, wall = self._read(), time.perf_counter() - self.t0
        if self.s0 is None or s1 is None or wall <= 0:
            self.foreign = self.steal = float("nan")
            return
        cap = wall * (os.cpu_count() or 1) * self.HZ
        busy, steal, mine = (b - a for a, b in zip(self.s0, s1))
        self.foreign = max(0.0, (busy - mine) / cap)
        self.steal = steal / cap


def time_rounds(fns, budget_s: float, max_s: float, block: int = 5, settle_s: float = 0.25) -> dict:
    """Time the callables in fns in alternating blocks ("rounds": one block of each, in turn), on
    the same inputs. Each block starts after a pause of settle_s (OpenBLAS's worker threads
    busy-wait ~0.1-0.2 s after a BLAS call: a tilec kernel started at once on this 2-core machine
    shares a core with them and runs at half speed) and with one untimed call (wakes this side's
    threads, refills its caches). A round counts as clean when other processes and the hypervisor
    took < 5% of the CPUs during it; timing goes on until budget_s is spent and at least 4 rounds
    are clean, or max_s is spent. Returns per-callable medians over the clean rounds (over all
    rounds if fewer than 3 were clean) and the load seen."""
    for _ in range(2):  # warm-up
        for f in fns:
            f()
    rounds = []  # (times per fn, foreign, steal)
    t_start = time.perf_counter()
    while True:
        with CpuLoad() as load:
            times = []
            for f in fns:
                time.sleep(settle_s)  # let the other side's idle threads stop spinning
                f()
                ts = []
                for _ in range(block):
                    t0 = time.perf_counter()
                    f()
                    ts.append(time.perf_counter() - t0)
                times.append(ts)
        rounds.append((times, load.foreign, load.steal))
        clean = [r for r in rounds if r[1] < 0.05 and r[2] < 0.05]
        spent = time.perf_counter() - t_start
        if (spent > budget_s and len(clean) >= 4 and len(rounds) >= 3) or spent > max_s \
                or len(rounds) * block >= 400:
            break
    use = clean if len(clean) >= 3 else rounds
    out = {"rounds": len(rounds), "clean_rounds": len(clean), "noisy": len(clean) < 3,
           "foreign_cpu": statistics.mean(r[1] for r in rounds),
           "steal": statistics.mean(r[2] for r in rounds), "median": [], "best": [], "p90": [],
           "median_all": []}
    for i in range(len(fns)):
        ts = [t for r in use for t in r[0][i]]
        all_ts = [t for r in rounds for t in r[0][i]]
        out["median"].append(statistics.median(ts))
        out["best"].append(min(ts))
        out["p90"].append(statistics.quantiles(ts, n=10)[-1] if len(ts) > 1 else ts[0])
        out["median_all"].append(statistics.median(all_ts))
    return out


# ----------------------------------------------------------------------------- main

def wait_quiet(max_s: float) -> str:
    """Wait (up to max_s) for a 2-second window in which other processes use < 5% of the CPUs."""
    t_end = time.perf_counter() + max_s
    while True:
        with CpuLoad() as load:
            time.sleep(2.0)
        if load.foreign + load.steal < 0.05:
            return f"machine quiet ({100 * (load.foreign + load.steal):.0f}% busy)"
        if time.perf_counter() > t_end:
            return (f"machine still busy after waiting {max_s:.0f} s "
                    f"({100 * (load.foreign + load.steal):.0f}% of the CPUs used by others)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    ap.add_argument("--budget", type=float, default=5.0,
                    help="seconds of timing per case (more, up to 3x, while other load is seen)")
    ap.add_argument("--wait-quiet", type=float, default=20.0, metavar="S",
                    help="first wait up to S seconds for the other processes to go idle")
    ap.add_argument("--build-dir", help="build here instead of a temporary directory")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cases", help="comma-separated case names (the list above; default: all)")
    ap.add_argument("--march", default="native",
                    help="the kernels' -march (tilec build --arch): x86-64-v3 builds the AVX2 code "
                         "on an AVX-512 machine; with OPENBLAS_CORETYPE=Haswell numpy runs AVX2 "
                         "kernels too, which approximates an AVX2 machine")
    args = ap.parse_args()
    t_run = time.perf_counter()

    env = environment()
    env["march"] = args.march
    print(f"# tilec CPU benchmark  {env['date']}  commit {env['commit']}")
    print(f"env: {env['cpu']}, {env['cores']} cores | python {env['python']} | numpy {env['numpy']} "
          f"| BLAS {env['blas']}")
    print(f"env: OPENBLAS_CORETYPE={env['OPENBLAS_CORETYPE']} OPENBLAS_L2_SIZE={env['OPENBLAS_L2_SIZE']} "
          f"OMP_NUM_THREADS={env['OMP_NUM_THREADS']}")
    print(f"env: kernels built with -march={args.march}")
    if env["OPENBLAS_CORETYPE"] or env["OPENBLAS_L2_SIZE"]:
        print("WARNING: OpenBLAS overrides are set and may slow numpy; the documented run is\n"
              "         env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/cpu.py")

    tmp = None
    if args.build_dir:
        out_dir = Path(args.build_dir)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="tilec_bench_")
        out_dir = Path(tmp.name)
    t0 = time.perf_counter()
    fns = build(out_dir, args.march)
    print(f"built {TILE} -> {out_dir} in {time.perf_counter() - t0:.1f} s")
    if args.wait_quiet > 0:
        env["quiet"] = wait_quiet(args.wait_quiet)
        print(env["quiet"])
    print()

    rng = np.random.default_rng(args.seed)
    U = lambda *shape: rng.uniform(-1.0, 1.0, size=shape).astype(np.float32)
    results, failures = [], []

    def timed(fns_):
        st = time_rounds(fns_, args.budget, 3 * args.budget)
        note = (f"{st['rounds']} rounds, {st['clean_rounds']} clean; other processes "
                f"{100 * st['foreign_cpu']:.0f}%, steal {100 * st['steal']:.0f}% of the CPUs")
        if st["noisy"]:
            note += "; NOISY: medians over all rounds"
        return st, note

    # ---- ceiling: the FMA rate (f32, all cores, from registers)
    peak = fma_peak(out_dir, args.march)
    print(f"FMA peak (f32, {os.cpu_count()} threads, vector FMA chains from registers): "
          f"{peak:.0f} GFLOP/s\n", flush=True)

    # ---- ceiling: copy bandwidth, 64 MiB read + 64 MiB written. Three ways: tilec's copy kernel on
    # the 4096x4096 matrix (the tiling every elementwise kernel here gets: 8 x 1024 tiles, i.e. 4 KiB
    # pieces of 8 rows), the same kernel on the same memory seen as 16384 x 1024 (each tile is then
    # 32 KiB of contiguous memory: a flat stream), and np.copyto (1 thread). The ceiling is the best.
    R = Cc = 4096
    X = U(R, Cc)
    Y = np.empty_like(X)
    FLAT = 1024
    copy_tc = checked(fns["copy_f32"], ptr(X), ptr(Y), R, Cc)
    copy_flat = checked(fns["copy_f32"], ptr(X), ptr(Y), R * Cc // FLAT, FLAT)
    for f in (copy_tc, copy_flat):
        Y.fill(np.nan)
        f()
        if not np.array_equal(Y, X):
            failures.append("copy_f32 result differs from its input")
    st, note = timed([copy_tc, copy_flat, lambda: np.copyto(Y, X)])
    nbytes = 2 * X.nbytes
    ceil = {"noisy": st["noisy"]}
    for i, k in enumerate(("tilec_copy", "tilec_copy_flat", "numpy_copyto")):
        ceil[k + "_ms"] = st["median"][i] * 1e3
        ceil[k + "_GBps"] = nbytes / st["median"][i] / 1e9
    copy_bw = ceil["copy_GBps"] = max(ceil[k] for k in list(ceil) if k.endswith("_GBps"))
    print(f"copy ceiling (64 MiB -> 64 MiB, 128 MiB counted): tilec copy_f32 4096x4096 "
          f"{ceil['tilec_copy_GBps']:.1f} GB/s ({ceil['tilec_copy_ms']:.2f} ms), as {R * Cc // FLAT}x"
          f"{FLAT} {ceil['tilec_copy_flat_GBps']:.1f} GB/s ({ceil['tilec_copy_flat_ms']:.2f} ms), "
          f"np.copyto {ceil['numpy_copyto_GBps']:.1f} GB/s ({ceil['numpy_copyto_ms']:.2f} ms)\n"
          f"{'':13s}[{note}]\n", flush=True)
    copy_bytes = nbytes  # (X and Y stay: memory-bound cases time copy_tc in their own rounds)

    wanted = set(args.cases.split(",")) if args.cases else None

    def case(name, desc, f_np, f_tc, got, tol, goal, flops=None, nbytes=None, copy_goal=None):
        if wanted is not None and name not in wanted:
            return {}  # (not run: what callers add to it goes nowhere)
        ref = f_np()
        f_tc()
        err = rel_error(got(), ref)
        ok = err <= tol
        print(f"{name:8s} max rel error {err:.2e} (tol {tol:.0e}) {'ok' if ok else 'FAILED'}", flush=True)
        if not ok:
            failures.append(f"{name}: max relative error {err:.3e} > {tol:.0e}")
        # a memory-bound case also times tilec's copy kernel (4096x4096) in the same rounds: its
        # share of copy bandwidth then compares timings taken together, not minutes apart on a
        # machine whose bandwidth drifts (seen: 23 to 52 GB/s within an hour on a shared VM)
        st, note = timed([f_np, f_tc] + ([copy_tc] if nbytes else []))
        t_np, t_tc = st["median"][:2]
        ratio = t_np / t_tc  # > 1: tilec faster
        r = {"case": name, "desc": desc, "tilec_ms": t_tc * 1e3, "numpy_ms": t_np * 1e3,
             "speedup": ratio, "goal": goal, "met": None if goal is None else ratio >= goal,
             "max_rel_error": err, "tol": tol,
             "tilec_ms_best_p90": [st["best"][1] * 1e3, st["p90"][1] * 1e3],
             "numpy_ms_best_p90": [st["best"][0] * 1e3, st["p90"][0] * 1e3],
             "speedup_all_rounds": st["median_all"][0] / st["median_all"][1],
             **{k: st[k] for k in ("rounds", "clean_rounds", "noisy", "foreign_cpu", "steal")}}
        if flops:
            r.update(flops=flops, tilec_GFLOPs=flops / t_tc / 1e9, numpy_GFLOPs=flops / t_np / 1e9)
        if nbytes:
            copy_here = copy_bytes / st["median"][2] / 1e9
            r.update(bytes=nbytes, tilec_GBps=nbytes / t_tc / 1e9, numpy_GBps=nbytes / t_np / 1e9,
                     copy_GBps_same_rounds=copy_here,
                     tilec_frac_of_copy=nbytes / t_tc / 1e9 / copy_here,
                     tilec_frac_of_run_ceiling=nbytes / t_tc / 1e9 / copy_bw)
        if copy_goal is not None:  # also a share of the copy timed in the same rounds
            r.update(copy_goal=copy_goal, met=r["met"] and r["tilec_frac_of_copy"] >= copy_goal)
        rate = (f"{r['tilec_GFLOPs']:.0f} vs {r['numpy_GFLOPs']:.0f} GFLOP/s" if flops else
                f"{r['tilec_GBps']:.1f} vs {r['numpy_GBps']:.1f} GB/s, copy in the same rounds "
                f"{r['copy_GBps_same_rounds']:.1f} GB/s" if nbytes else "per call")
        goals = (f"goal {goal}x" + (f" and {copy_goal:.0%} of copy" if copy_goal is not None else "")
                 + (" MET" if r["met"] else " MISSED")) if goal is not None else "no speed goal"
        print(f"{'':8s} tilec {t_tc * 1e3:.2f} ms, numpy {t_np * 1e3:.2f} ms ({rate}), "
              f"{ratio:.2f}x, {goals}  [{note}]", flush=True)
        results.append(r)
        return r

    # ---- 1. GEMM
    M = N = K = 1024
    A, B = U(M, K), U(K, N)
    Cm = np.empty((M, N), np.float32)
    case("gemm", "f32 C = A @ B, 1024^3",
         lambda: A @ B, checked(fns["gemm_f32"], ptr(A), ptr(B), ptr(Cm), M, K, N),
         lambda: Cm, TOL_F32, 0.9, flops=2 * M * N * K)
    del A, B, Cm

    # ---- 1a. f16 GEMM (f32 accumulation) against numpy's f32 GEMM on the same values (numpy's
    # own f16 matmul does not use BLAS)
    A16, B16 = U(M, K).astype(np.float16), U(K, N).astype(np.float16)
    A32, B32 = A16.astype(np.float32), B16.astype(np.float32)
    C16 = np.empty((M, N), np.float16)
    case("gemm16", "f16 C = A @ B, 1024^3 (numpy: f32 on the same values)",
         lambda A32=A32, B32=B32: A32 @ B32,
         checked(fns["gemm_f16"], ptr(A16), ptr(B16), ptr(C16), M, K, N),
         lambda C16=C16: C16.astype(np.float32), TOL_F16, 0.9, flops=2 * M * N * K)
    del A16, B16, A32, B32, C16

    # ---- 1b. GEMV (decode: one row of A; bound by reading B) and a skinny K
    for name, (M, N, K), goal in (("gemv", (1, 4096, 4096), 0.9), ("skinnyk", (4096, 4096, 64), 0.9)):
        A, B = U(M, K), U(K, N)
        Cm = np.empty((M, N), np.float32)
        case(name, f"f32 C = A @ B, M={M} N={N} K={K}", lambda A=A, B=B: A @ B,
             checked(fns["gemm_f32"], ptr(A), ptr(B), ptr(Cm), M, K, N),
             lambda Cm=Cm: Cm, TOL_F32, goal, flops=2 * M * N * K,
             nbytes=A.nbytes + B.nbytes + Cm.nbytes, copy_goal=0.8 if M == 1 else None)
        del A, B, Cm

    # ---- 1c. W4A16 decode: 4-bit weights (8x fewer bytes than f32) against numpy's matmul on
    # the f32 weights dequantized beforehand
    M, N, K = 1, 4096, 4096
    A = U(M, K)
    q = rng.integers(0, 16, size=(K, N)).astype(np.uint8)
    packed = np.ascontiguousarray(q[:, 0::2] | (q[:, 1::2] << 4))
    scales = (U(K // 128, N) * 0.1).astype(np.float32)
    W = ((q.astype(np.float32) - 8.0) * np.repeat(scales, 128, axis=0)).astype(np.float32)
    Cm = np.empty((M, N), np.float32)
    case("w4a16", f"A @ dequant(u4 W, f32 scales, g128), M={M} N={N} K={K} (numpy: A @ W f32)",
         lambda: A @ W, checked(fns["w4a16_f32"], ptr(A), ptr(packed), ptr(scales), ptr(Cm), M, K, N),
         lambda: Cm, TOL_F32, 3.0, flops=2 * M * N * K,
         nbytes=A.nbytes + packed.nbytes + scales.nbytes + Cm.nbytes)
    M = 16
    A = U(M, K)
    Cm = np.empty((M, N), np.float32)
    r = case("w4a16m16", f"the same at M={M}", lambda A=A, W=W: A @ W,
         checked(fns["w4a16_f32"], ptr(A), ptr(packed), ptr(scales), ptr(Cm), M, K, N),
         lambda Cm=Cm: Cm, TOL_F32, None, flops=2 * M * N * K,
         nbytes=A.nbytes + packed.nbytes + scales.nbytes + Cm.nbytes)
    r.update(goal_text="(no goal)")
    del A, q, packed, scales, W, Cm

    # ---- 1d. a small call (16x16x16 with an epilogue), timed per call over a loop of calls
    M = N = K = 16
    A, B, bias = U(M, K), U(K, N), U(N)
    Cm = np.empty((M, N), np.float32)
    small = checked(fns["linear_small"], ptr(A), ptr(B), ptr(bias), ptr(Cm), M, K, N)
    calls = 2000

    def loop_tc(small=small):
        for _ in range(calls):
            small()

    def loop_np(A=A, B=B, bias=bias):
        for _ in range(calls):
            out = np.maximum(A @ B + bias, 0)
        return out
    r = case("small", f"relu(A @ B + bias), {M}x{N}x{K}, {calls} calls in a loop (ms for all)",
             loop_np, loop_tc, lambda Cm=Cm: Cm, TOL_F32, None)
    if r:
        per_call = r["tilec_ms"] * 1e3 / calls
        r.update(us_per_call=per_call, met=per_call < 20.0, goal_text="< 20 us per call")
        print(f"{'':8s} {per_call:.1f} us per call, goal < 20 us "
              f"{'MET' if per_call < 20.0 else 'MISSED'}", flush=True)
    del A, B, bias, Cm

    # ---- 2. softmax (reads X, writes Y)
    Ys = np.empty_like(X)

    def softmax_np():
        e = np.exp(X - X.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)
    case("softmax", "softmax(X, axis=-1), 4096x4096 f32", softmax_np,
         checked(fns["softmax_rows"], ptr(X), ptr(Ys), R, Cc), lambda: Ys, TOL_F32, 2.0,
         nbytes=2 * X.nbytes, copy_goal=0.7)
    del Ys

    # ---- 2a. softmax of f16 values (computed in f32, as numpy does here on the same values)
    X16, Y16 = X.astype(np.float16), np.empty(X.shape, np.float16)

    def softmax16_np(X16=X16):
        x = X16.astype(np.float32)
        e = np.exp(x - x.max(-1, keepdims=True))
        return (e / e.sum(-1, keepdims=True)).astype(np.float16)
    case("softmax16", "softmax(X, axis=-1), 4096x4096 f16 (numpy: in f32 on the same values)",
         softmax16_np, checked(fns["softmax_rows_f16"], ptr(X16), ptr(Y16), R, Cc),
         lambda Y16=Y16: Y16, TOL_F16, None, nbytes=2 * X16.nbytes)
    del X16, Y16

    # ---- 3. RMSNorm (reads X and w, writes Y)
    w = U(Cc)
    eps = 1e-6
    Yr = np.empty_like(X)
    case("rmsnorm", "X * rsqrt(mean(X*X, -1) + eps) * w, 4096x4096 f32",
         lambda: X * (1 / np.sqrt(np.mean(X * X, -1, keepdims=True) + eps)) * w,
         checked(fns["rmsnorm_f32"], ptr(X), ptr(w), F32(eps), ptr(Yr), R, Cc), lambda: Yr,
         TOL_F32, 2.0, nbytes=2 * X.nbytes + w.nbytes, copy_goal=0.7)
    del Yr

    # ---- 4. elementwise chain (reads X and Y, writes Z)
    Y2 = U(R, Cc)
    s = np.float32(0.75)
    Z = np.empty_like(X)

    def chain_np():
        T = X * s + Y2
        return T / (1 + np.exp(-T)) * X  # silu(T) * X
    case("ewchain", "Z = silu(X * s + Y) * X, 4096x4096 f32", chain_np,
         checked(fns["elementwise_chain"], ptr(X), ptr(Y2), F32(s), ptr(Z), R, Cc), lambda: Z,
         TOL_F32, 2.0, nbytes=3 * X.nbytes, copy_goal=0.7)

    # ---- 4a. a where() over two computed sides (reads X and Y, writes Z)
    Zw = np.empty_like(X)
    case("where", "Z = where(X > Y, exp(X - Y), X * Y), 4096x4096 f32",
         lambda: np.where(X > Y2, np.exp(X - Y2), X * Y2),
         checked(fns["where_chain"], ptr(X), ptr(Y2), ptr(Zw), R, Cc), lambda: Zw,
         TOL_F32, None, nbytes=3 * X.nbytes)
    del Zw

    # ---- 4b. a chain of transcendental activations (reads X and Y, writes Z): numpy's own
    # vectorized tanh, exp, log1p and log against tilec_cpu.h's (softplus as log1p(exp(X)), which
    # cannot overflow on these inputs and is faster in numpy than logaddexp)
    def activations_np():
        return X * np.tanh(np.log1p(np.exp(X))) * np.tanh(Y2) + np.log(np.abs(X) + 1)
    case("actchain", "Z = mish(X) * tanh(Y) + log(|X| + 1), 4096x4096 f32", activations_np,
         checked(fns["activation_chain"], ptr(X), ptr(Y2), ptr(Z), R, Cc), lambda: Z,
         TOL_F32, 2.0, nbytes=3 * X.nbytes)

    # ---- 5. LayerNorm (reads X, gamma and beta, writes Y)
    gamma, beta = U(Cc), U(Cc)
    Yl = np.empty_like(X)

    def layernorm_np():
        d = X - X.mean(-1, keepdims=True)
        return d * (1 / np.sqrt((d * d).mean(-1, keepdims=True) + eps)) * gamma + beta
    case("layernorm", "(X - mean) * rsqrt(var + eps) * gamma + beta, 4096x4096 f32", layernorm_np,
         checked(fns["layernorm_f32"], ptr(X), ptr(gamma), ptr(beta), F32(eps), ptr(Yl), R, Cc),
         lambda Yl=Yl: Yl, TOL_F32, 2.0, nbytes=2 * X.nbytes + gamma.nbytes + beta.nbytes,
         copy_goal=0.7)
    del Yl

    # ---- 5a. reductions over a few long rows or a whole tensor, split across the threads, and
    # accurate (blocked sums): one softmax row of 64M values; the sum of 8192 x 8192 values
    Xl = U(1, 1 << 26)
    Yl = np.empty_like(Xl)

    def softmax_row_np(Xl=Xl):
        e = np.exp(Xl - Xl.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True, dtype=np.float64).astype(np.float32)
    r = case("longrow", "softmax over one row of 64M f32 values", softmax_row_np,
         checked(fns["softmax_rows"], ptr(Xl), ptr(Yl), 1, Xl.shape[1]), lambda Yl=Yl: Yl, TOL_F32, None,
         nbytes=2 * Xl.nbytes)
    r.update(goal_text=f"error <= {TOL_F32:.0e}", met=r.get("max_rel_error", 0.0) <= TOL_F32)
    del Xl, Yl
    Xs = U(8192, 8192)
    s1 = np.empty((1, 1), np.float32)
    r = case("sumall", "the sum of 8192 x 8192 f32 values",
         lambda Xs=Xs: np.sum(Xs, dtype=np.float64).reshape(1, 1),
         checked(fns["sum_all"], ptr(Xs), ptr(s1), *Xs.shape), lambda s1=s1: s1, TOL_F32, None,
         nbytes=Xs.nbytes)
    r.update(goal_text=f"error <= {TOL_F32:.0e}", met=r.get("max_rel_error", 0.0) <= TOL_F32)
    del Xs

    # ---- 5b. column reductions (the innermost axis kept): softmax down the columns, a sum over
    # the middle axis (no goal)
    Xc, Yc = U(2048, 2048), np.empty((2048, 2048), np.float32)

    def softmax_cols_np(Xc=Xc):
        e = np.exp(Xc - Xc.max(0, keepdims=True))
        return e / e.sum(0, keepdims=True)
    case("softcols", "softmax(X, axis=0), 2048x2048 f32", softmax_cols_np,
         checked(fns["softmax_cols"], ptr(Xc), ptr(Yc), *Xc.shape), lambda Yc=Yc: Yc, TOL_F32, None,
         nbytes=2 * Xc.nbytes)
    Xm, Ym = U(8, 512, 2048), np.empty((8, 2048), np.float32)
    case("summid", "sum(X, axis=1), 8x512x2048 f32", lambda Xm=Xm: Xm.sum(1),
         checked(fns["sum_mid"], ptr(Xm), ptr(Ym), *Xm.shape), lambda Ym=Ym: Ym, TOL_F32, None,
         nbytes=Xm.nbytes + Ym.nbytes)
    del Xc, Yc, Xm, Ym

    # ---- 6. attention, causal against not: the masked key tiles are skipped (goal: causal at
    # least 1.7x faster than non-causal at L = S = 4096; the ideal is just under 2x)
    if wanted is None or "causal" in wanted:
        Bq, Hq, Lq, Dq = 1, 2, 4096, 64
        Q, Kt, V = U(Bq, Hq, Lq, Dq), U(Bq, Hq, Lq, Dq), U(Bq, Hq, Lq, Dq)
        Oa, Oc = np.empty_like(Q), np.empty_like(Q)
        att = checked(fns["attention_f32"], ptr(Q), ptr(Kt), ptr(V), ptr(Oa), Bq, Hq, Lq, Dq)
        catt = checked(fns["causal_attention_f32"], ptr(Q), ptr(Kt), ptr(V), ptr(Oc), Bq, Hq, Lq, Dq)
        att()
        catt()
        for causal, got in ((False, Oa), (True, Oc)):
            sc = (Q @ Kt.transpose(0, 1, 3, 2)) / np.sqrt(np.float32(Dq))
            if causal:
                sc = np.where(np.triu(np.ones((Lq, Lq), bool), 1), -np.inf, sc)
            p_ = np.exp(sc - sc.max(-1, keepdims=True))
            ref = (p_ / p_.sum(-1, keepdims=True)) @ V
            err = rel_error(got, ref)
            name = "causal attention" if causal else "attention"
            print(f"{name}: max rel error {err:.2e} (tol {TOL_F32:.0e}) {'ok' if err <= TOL_F32 else 'FAILED'}")
            if err > TOL_F32:
                failures.append(f"{name}: max relative error {err:.3e} > {TOL_F32:.0e}")
            del sc, p_, ref
        st, note = timed([att, catt])
        t_full, t_causal = st["median"]
        flops = 4 * Bq * Hq * Lq * Lq * Dq  # QK^T and PV, every key tile
        speedup = t_full / t_causal
        print(f"attention B{Bq} H{Hq} L=S={Lq} D{Dq} f32: non-causal {t_full * 1e3:.1f} ms "
              f"({flops / t_full / 1e9:.0f} GFLOP/s), causal {t_causal * 1e3:.1f} ms: causal "
              f"{speedup:.2f}x faster, goal 1.7x {'MET' if speedup >= 1.7 else 'MISSED'}  [{note}]")
        results.append({"case": "causal", "desc": f"causal vs non-causal attention, B{Bq} H{Hq} "
                        f"L=S={Lq} D{Dq} f32 (numpy column: non-causal tilec)",
                        "tilec_ms": t_causal * 1e3, "numpy_ms": t_full * 1e3, "speedup": speedup,
                        "goal": 1.7, "met": speedup >= 1.7, "max_rel_error": err, "tol": TOL_F32,
                        "flops": flops / 2, "tilec_GFLOPs": flops / 2 / t_causal / 1e9,
                        "numpy_GFLOPs": flops / t_full / 1e9,
                        **{k: st[k] for k in ("rounds", "clean_rounds", "noisy", "foreign_cpu", "steal")}})
        del Q, Kt, V, Oa, Oc

    # ---- table
    def goal_text(r):
        if "goal_text" in r:
            return r["goal_text"]
        parts = [f">= {r['goal']}x"] if r["goal"] else []
        if r.get("copy_goal"):
            parts.append(f">= {r['copy_goal']:.0%} of copy")
        return ", ".join(parts) or "matches"
    print("\n| case | tilec | numpy | tilec rate | numpy rate | speed vs numpy | goal | met | max rel err |")
    print("|---|---:|---:|---:|---:|---:|---:|:-:|---:|")
    for r in results:
        if "flops" in r:
            rt = f"{r['tilec_GFLOPs']:.0f} GFLOP/s ({100 * r['tilec_GFLOPs'] / peak:.0f}% of FMA peak)"
            rn = f"{r['numpy_GFLOPs']:.0f} GFLOP/s"
        elif "us_per_call" in r:
            rt = f"{r['us_per_call']:.1f} us per call"
            rn = f"{r['numpy_ms'] * 1e3 / calls:.1f} us per call"
        else:
            rt = (f"{r['tilec_GBps']:.1f} GB/s ({100 * r['tilec_frac_of_copy']:.0f}% of copy: "
                  f"{r['copy_GBps_same_rounds']:.1f} GB/s in its rounds)")
            rn = f"{r['numpy_GBps']:.1f} GB/s"
        print(f"| {r['desc']} | {r['tilec_ms']:.2f} ms | {r['numpy_ms']:.2f} ms | {rt} | {rn} "
              f"| {r['speedup']:.2f}x{' (noisy)' if r['noisy'] else ''} | {goal_text(r)} "
              f"| {'' if r['met'] is None else 'yes' if r['met'] else '**no**'} "
              f"| {r['max_rel_error']:.1e} |")
    print(f"\nFMA peak {peak:.0f} GFLOP/s (f32, all cores, from registers).")
    print(f"copy ceiling {copy_bw:.1f} GB/s (best of: tilec copy_f32 on 4096x4096 "
          f"{ceil['tilec_copy_GBps']:.1f}, on the same memory as {R * Cc // FLAT}x{FLAT} "
          f"{ceil['tilec_copy_flat_GBps']:.1f}, np.copyto {ceil['numpy_copyto_GBps']:.1f}); each "
          f"memory-bound row's % of copy is against tilec copy_f32 on 4096x4096 timed in that row's "
          f"rounds. GB/s count the minimum traffic: inputs read once + outputs written once (1e9 "
          f"bytes/s).\n"
          f"Times are medians over the clean rounds.")
    noisy = [r["case"] for r in results if r["noisy"]] + (["copy"] if ceil["noisy"] else [])
    if noisy:
        print(f"WARNING: other processes were busy during {', '.join(noisy)}: those numbers are "
              f"unreliable; run again on a quiet machine")
    goals = [r for r in results if r["met"] is not None]
    met = sum(bool(r["met"]) for r in goals)
    print(f"goals met: {met}/{len(goals)}   (run took {time.perf_counter() - t_run:.0f} s)")

    if args.json:
        Path(args.json).write_text(json.dumps({"env": env, "ceilings": {**ceil, "fma_GFLOPs": peak},
                                               "results": results,
                                               "failures": failures}, indent=2) + "\n")
        print(f"wrote {args.json}")
    if tmp:
        tmp.cleanup()
    if failures:
        print("\nCORRECTNESS FAILURES:\n  " + "\n  ".join(failures), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
