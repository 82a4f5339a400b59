#!/usr/bin/env python3
"""GPU benchmark: tilec's CUDA kernels (bench/gpu.tile) against cuBLAS, cuBLASLt, torch.compile, SDPA and
tinygemm, in one process, on the same inputs, on one NVIDIA H200.

Ceilings, measured first: the device copy bandwidth (torch `dst.copy_(src)` on 2 GiB of f16; GB/s count the
bytes read + written), the f16 matrix rate (torch.matmul 8192^3), and tilec's own copy_f16 at 32768x8192.

Cases (goals in brackets; a missed goal is reported, it does not fail the run):
  gemm       C = A @ B, f16 at 2048^3, 4096^3, 8192^3 and 4000^3 (no tile multiple), bf16 at 4096^3,
             (Hopper: bf16 at 2048^3 and 8192^3 too, and f16 M=K=4096 N=4088, rows off 128-byte lines)
             vs torch.mm (cuBLAS)                                         [4096^3, 8192^3: >= 0.6x cuBLAS]
  fp8        C = bf16((A @ W.T) * scale) of e4m3 A and W (both K-major), 4096^3 and 8192^3, vs
             torch._scaled_mm (cuBLASLt's fp8 GEMM) with the same per-tensor scales, its sums
             promoted to f32 as tilec's (use_fast_accum=True, the tensor cores' sums: information)
                                                                   [Hopper: 8192^3 >= 0.9x _scaled_mm]
  tf32       C = A @ B and A @ W.T of f32 4096^3 under `precision tf32`, vs torch.mm in tf32 and f32 [no goal]
  f32        the same of exact f32 products (`precision ieee`, the scalar units), vs torch.mm in f32 [no goal]
  odd        C = A @ B at irregular shapes whose rows are not 16-byte aligned: f32 and f16 8205x2949x5921,
             f16 4096x4100x4100, 2048x2052x2052 and 1024x1028x1028, vs torch.mm           [no goal]
  epilogue   relu(A @ B + bias), f16 4096^3, fused and `fuse off`, vs torch.addmm + relu_ (the
             issue's peer), cuBLASLt's bias+ReLU epilogue (torch._addmm_activation), eager and
             torch.compile
                                                        [>= 0.6x cuBLASLt; fused faster than unfused by > 2%]
  linear     bf16 gelu_tanh(X @ W.T + bias), 8192x4096x4096, vs cuBLAS F.linear, eager and torch.compile
  linear3    f16 gelu(X @ W.T + bias) of X [B, S, K] at ViT-B, BERT-large, Llama-7B and decode sizes,
             then without the GELU, vs F.linear (+ gelu) and torch.compile                [no goal]
  decode     f16 X @ W.T + bias of 1, 8 and 16 rows through Llama-7B-sized weights (4096x4096,
             11008x4096, 4096x11008), vs cuBLAS F.linear and the copy ceiling (W read once) [no goal]
  softmax    softmax(X, -1), f16 32768x8192, vs torch.softmax and torch.compile
  rmsnorm    X * rsqrt(mean(X^2, -1) + eps) * w, same size, vs F.rms_norm and torch.compile
  chain      silu(X * 0.5 + 1) * X, same size, vs eager and torch.compile
             [these three: >= 0.9x the copy ceiling, counting one read + one write of X; >= 1x torch.compile]
  w4a16      bf16 A[M, 8192] @ dequant(u4 W[8192, 8192], one bf16 scale per 128 rows), M = 1, 4,
             8 and 16, the weights as u4[K, N]; w4a16_kmajor: the same packed along K (u4[N, K]),
             vs cuBLAS on the dense bf16 weights and tinygemm (torch._weight_int4pack_mm)
                                                        [M=1: >= 2.5x cuBLAS, >= 1x tinygemm]
  w4a16_decode  the same at M = 1, 8, 16 through Llama-7B-sized weights (4096x4096, 4096x11008,
             11008x4096), both layouts                                           [no goal]
  attention  softmax(Q K^T / sqrt(D)) V, f16, B4 H32 L=S=4096 D128, plain and causal, vs SDPA's flash backend
             (cuDNN's for information)                                          [>= 0.8x SDPA flash, both]

Method. Every case draws fresh random inputs (never zeros) from a printed seed. Each tilec output is
poisoned with NaN before its checked call, through both entry points (NAME and NAME_with_workspace); the
status must be 0 and max|out - ref| / max|ref| within 1e-2 (f16) or 3e-2 (bf16) of a torch reference computed
in float in the same run (attention: SDPA flash's output). Timing: each contender is warmed up (>= 3 calls and
>= 50 ms), then the contenders of a case are timed interleaved on the same inputs, in small batches between
CUDA events; before each batch a GPU sleep is queued so that the whole batch is enqueued before the GPU
reaches it (the events then time GPU work, not Python's launch overhead). Times are medians over the batches.
When one set of operands is smaller than 3x L2, the case rotates among copies ("rotN" in the table).
Ratios are speeds, tilec / peer = peer time / tilec time: > 1 means tilec is faster. tilec's kernels are timed
through NAME_with_workspace with a workspace torch allocated beforehand, so nothing is allocated while timed.

Run (the measurements take under a minute on the H200, torch.compile included; tilec's build comes on top.
A failing tilec kernel makes the exit code 1; --quick runs fewer repetitions at smaller sizes):
    python bench/gpu.py [--cases gemm,softmax,...] [--quick] [--no-compile] [--json out.json]
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import functools
import itertools
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
TILE = ROOT / "bench" / "gpu.tile"
F16, BF16 = torch.float16, torch.bfloat16
TOL = {F16: 1e-2, BF16: 3e-2}
P, I64, F32, SIZE, STATUS = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_size_t, ctypes.c_int
MiB = 1 << 20

# The C ABI of each kernel in bench/gpu.tile: the kinds of its inputs in declaration order (T: device tensor,
# f: f32 scalar by value), its number of outputs (device tensors), and its dimension symbols in order of first
# appearance in the inputs' shapes (one int64_t each). Every function also takes a cudaStream_t last.
ABI = {
    "gemm_f16": ("TT", 1, "M K N"),
    "gemm_bf16": ("TT", 1, "M K N"),
    "gemm_at_f16": ("TT", 1, "K M N"),
    "gemm_f32": ("TT", 1, "M K N"),
    "gemm_f32_bt": ("TT", 1, "M K N"),
    "gemm_tf32": ("TT", 1, "M K N"),
    "gemm_tf32_bt": ("TT", 1, "M K N"),
    "gemm_fp8": ("TTf", 1, "M K N"),
    "gemm_bias_relu": ("TTT", 1, "M K N"),
    "gemm_bias_relu_unfused": ("TTT", 1, "M K N"),
    "linear_gelu": ("TTT", 1, "M K N"),
    "linear3_gelu": ("TTT", 1, "B S K N"),
    "linear3_bias": ("TTT", 1, "B S K N"),
    "softmax_f16": ("T", 1, "R C"),
    "rmsnorm_f16": ("TTf", 1, "R C"),
    "chain_f16": ("T", 1, "R C"),
    "copy_f16": ("T", 1, "R C"),
    "w4a16": ("TTT", 1, "M K N"),
    "w4a16_kmajor": ("TTT", 1, "M K N"),
    "attention": ("TTT", 1, "B H L D S"),
    "causal_attention": ("TTT", 1, "B H L D"),
    "swiglu": ("TTT", 1, "T D F"),
    "linear_residual_tanh": ("TTTTf", 1, "M K N"),
    "gemm_logsumexp": ("TT", 1, "M K N"),
    "lm_head": ("TT", 1, "M K N"),
    "bmm_bias_gelu": ("TTT", 1, "G L D S"),
    "layernorm_bf16": ("TTT", 1, "R C"),
    "col_softmax_f16": ("T", 1, "R C"),
    "chan_softmax_f16": ("T", 1, "B K P"),
    "sum_mid": ("T", 1, "B L D"),
    "col_mean": ("T", 1, "R C"),
}


def short(ex: BaseException) -> str:
    lines = str(ex).strip().splitlines()
    return f"{type(ex).__name__}: {lines[0][:160] if lines else ''}"


# ----------------------------------------------------------------------------- environment

def sh(cmd: list[str]) -> str | None:
    try:
        r = subprocess.run(cmd, cwd=ROOT, text=True, capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def git_commit() -> str:
    if os.environ.get("TILEC_COMMIT"):  # the device's copy of the tree may carry a stale .git
        return os.environ["TILEC_COMMIT"]
    rev = sh(["git", "rev-parse", "--short", "HEAD"])
    if rev is None:  # the device machine gets a copy of the work tree without .git
        return "unknown"
    dirty = sh(["git", "status", "--porcelain", "--untracked-files=no"])
    return rev + ("+dirty" if dirty else "")


def gpu_state() -> str | None:
    out = sh(["nvidia-smi", "--query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw", "--format=csv"])
    return " | ".join(out.splitlines()) if out else None


def environment() -> dict:
    props = torch.cuda.get_device_properties(0)
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(0),
        "sm_count": props.multi_processor_count,
        "l2_bytes": getattr(props, "L2_cache_size", 0) or 60 * 10**6,
        "memory_gib": round(props.total_memory / 2**30, 1),
        "torch": torch.__version__,
        "triton": triton_version,
        "cuda": torch.version.cuda,
        "python": sys.version.split()[0],
        "commit": git_commit(),
        "nvidia_smi": gpu_state(),
    }


# ----------------------------------------------------------------------------- build & load tilec kernels

class TilecFailure(Exception):
    """A tilec kernel could not be built, loaded or bound, or returned a non-zero status."""


FASTER_MARGIN = 1.02  # a ">" goal (fused faster than unfused) needs at least this ratio


def build(out_dir: Path, arch: str, kernels: str | None = None) -> tuple[float, str | None]:
    """Build bench/gpu.tile (or only `kernels` of it, comma-separated) for CUDA into out_dir.
    Returns (wall seconds, None or what went wrong)."""
    base = [sys.executable, "-m", "tilec.cli"]
    opts = ["build", str(TILE), "--target", "cuda", "--arch", arch, "-o", str(out_dir)]
    for kernel in (kernels or "").split(","):
        opts += ["--kernel", kernel.strip()] if kernel.strip() else []
    t0 = time.perf_counter()

    def go(cmd):
        print(f"$ {' '.join(cmd)}", flush=True)
        return subprocess.run(cmd, cwd=ROOT, text=True, capture_output=True)

    r = go(base + opts)
    if r.returncode != 0 and "No module named" in r.stderr and shutil.which("tilec"):
        base = ["tilec"]  # not importable here, but installed as a command
        r = go(base + opts)
    if r.returncode != 0 and "no such option" in r.stderr.lower() and "--arch" in r.stderr:
        print(f"WARNING: this tilec has no --arch option; building without --arch {arch}")
        r = go(base + [o for o in opts if o not in ("--arch", arch)])
    seconds = time.perf_counter() - t0
    if r.returncode != 0:
        return seconds, f"exit status {r.returncode}\n{r.stdout[-3000:]}{r.stderr[-3000:]}".rstrip()
    if r.stdout.strip():
        print(r.stdout.strip())
    return seconds, None


class Tilec:
    """The built kernels: one shared library per kernel (libNAME.so) or one for the file (libgpu.so)."""

    def __init__(self, out_dir: Path, build_error: str | None):
        self.dir, self.build_error, self.kernels = out_dir, build_error, {}

    def kernel(self, name: str) -> Kernel:
        if self.build_error:
            raise TilecFailure("the tilec build failed")
        if name not in self.kernels:
            for path in (self.dir / f"lib{name}.so", self.dir / "libgpu.so"):
                if path.exists():
                    try:
                        lib = ctypes.CDLL(str(path))
                    except OSError as ex:
                        raise TilecFailure(f"cannot load {path.name}: {ex}") from ex
                    break
            else:
                raise TilecFailure(f"neither lib{name}.so nor libgpu.so in {self.dir}")
            self.kernels[name] = Kernel(name, lib)
        return self.kernels[name]


def typed(lib, symbol: str, argtypes: list, restype):
    try:
        fn = getattr(lib, symbol)
    except AttributeError as ex:
        raise TilecFailure(f"symbol {symbol} missing from the library") from ex
    fn.argtypes, fn.restype = argtypes, restype
    return fn


class Kernel:
    """One kernel's three entry points, typed from its ABI description."""

    def __init__(self, name: str, lib):
        kinds, n_out, dims = ABI[name]
        self.name, self.kinds, self.n_out, self.dims = name, kinds, n_out, dims.split()
        head = [F32 if k == "f" else P for k in kinds] + [P] * n_out + [I64] * len(self.dims)
        self.plain = typed(lib, name, [*head, P], STATUS)
        self.workspace_size = typed(lib, f"{name}_workspace_size", [I64] * len(self.dims), SIZE)
        self.with_workspace = typed(lib, f"{name}_with_workspace", [*head, P, SIZE, P], STATUS)

    def bind(self, inputs: Sequence, outputs: Sequence[torch.Tensor], dims: Sequence[int]) -> Call:
        return Call(self, inputs, outputs, dims)


def device_ptr(t: torch.Tensor) -> P:
    if not (t.is_cuda and t.is_contiguous()):
        raise TilecFailure("tilec takes dense row-major device tensors")
    return P(t.data_ptr())


class Call:
    """A kernel call with its arguments converted once (a timed call is one ctypes call) and its workspace
    allocated by torch here, outside any timed region."""

    def __init__(self, k: Kernel, inputs: Sequence, outputs: Sequence[torch.Tensor], dims: Sequence[int]):
        if (len(inputs), len(outputs), len(dims)) != (len(k.kinds), k.n_out, len(k.dims)):
            raise TilecFailure(f"{k.name} takes {len(k.kinds)} inputs, {k.n_out} outputs and dims "
                               f"{' '.join(k.dims)}")
        args = [F32(x) if kind == "f" else device_ptr(x) for kind, x in zip(k.kinds, inputs)]
        args += [device_ptr(t) for t in outputs] + [I64(d) for d in dims]
        stream = P(torch.cuda.current_stream().cuda_stream)
        n = k.workspace_size(*dims)
        if n > 64 << 30:
            raise TilecFailure(f"{k.name}_workspace_size returned {n} bytes")
        self.workspace = torch.empty(n, dtype=torch.uint8, device="cuda") if n else None
        ws = P(self.workspace.data_ptr()) if n else P(None)
        self.k, self.outputs, self.workspace_bytes = k, list(outputs), n
        self.plain_args = (*args, stream)
        self.ws_args = (*args, ws, SIZE(n), stream)

    def __call__(self) -> None:  # the timed entry point
        self._status(self.k.with_workspace(*self.ws_args), "_with_workspace")

    def call_plain(self) -> None:
        self._status(self.k.plain(*self.plain_args), "")

    def _status(self, st: int, suffix: str) -> None:
        if st != 0:  # tilec_status_string is a static inline in the header: the number is all we get
            raise TilecFailure(f"{self.k.name}{suffix} returned status {st}")


def rotate(calls: Sequence[Callable]) -> Callable:
    """One callable that goes round the copies of a case's operands, copy 0 first."""
    if len(calls) == 1:
        return calls[0]
    it = itertools.cycle(calls)
    return lambda: next(it)()


# ----------------------------------------------------------------------------- checking

def rel_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    """max|got - ref| / max|ref| in float32; inf when got has a NaN or an infinity."""
    g, r = got.float(), ref.float()
    if not bool(torch.isfinite(g).all()):
        return math.inf
    return float((g - r).abs().max()) / max(float(r.abs().max()), 1e-30)


def poison(t: torch.Tensor) -> None:
    t.fill_(float("nan") if t.is_floating_point() else 0x7E)


def check_tilec(call: Call, refs: Sequence[torch.Tensor]) -> float:
    """Run the kernel through both entry points (NAME_with_workspace, which is timed, and NAME) on poisoned
    outputs and return the worst relative error of all outputs. A non-zero status raises TilecFailure,
    which also names the error of the other entry point."""
    worst, statuses = 0.0, []
    for entry in (call, call.call_plain):
        for out in call.outputs:
            poison(out)
        try:
            entry()
        except TilecFailure as ex:
            statuses.append(str(ex))
            continue
        torch.cuda.synchronize()
        worst = max([worst, *(rel_error(o, r) for o, r in zip(call.outputs, refs))])
    if statuses:
        other = f" (the other entry point: max rel error {worst:.1e})" if len(statuses) == 1 else ""
        raise TilecFailure("; ".join(statuses) + other)
    return worst


# ----------------------------------------------------------------------------- timing

# torch.cuda._sleep spins for a number of SM clock cycles. The H200 clocks at most 1.98 GHz, so a sleep asked
# for at 2e9 cycles/s lasts at least as long as asked.
SLEEP_HZ = 2.0e9
BATCH_GPU_S = 2e-4  # a batch of calls between two events lasts about this long (event resolution ~0.5 us)
MAX_BATCH = 20
MAX_SLEEP_S = 0.02


def gpu_sleep(seconds: float) -> None:
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is not None:
        sleep(int(seconds * SLEEP_HZ))


def event() -> torch.cuda.Event:
    return torch.cuda.Event(enable_timing=True)


@dataclass
class Entry:
    """A contender in a case: a tilec kernel or a peer."""
    label: str
    fn: Callable[[], object] | None = None  # None: it could not be set up, or it failed (see why)
    why: str = ""
    is_tilec: bool = False
    err: float | None = None  # tilec: its checked error; a peer: the error of its first result, if it has one
    tol: float | None = None
    failed: str | None = None  # tilec: why it failed its check (then it is still timed)
    time: float | None = None  # median seconds per call
    stats: dict = field(default_factory=dict)


def warm_up(fn: Callable) -> tuple[float, float]:
    """At least 3 calls and 50 ms. Returns (GPU seconds per call, CPU seconds to enqueue one call)."""
    t0, n = time.perf_counter(), 0
    while n < 3 or time.perf_counter() - t0 < 0.05:
        fn()
        torch.cuda.synchronize()
        n += 1
    start, end = event(), event()
    gpu_sleep(0.005)
    t1 = time.perf_counter()
    start.record()
    for _ in range(3):
        fn()
    end.record()
    enqueue = (time.perf_counter() - t1) / 3
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 3e3, enqueue  # elapsed_time is in milliseconds


def time_all(entries: Sequence[Entry], reps: int, ref: torch.Tensor | None = None) -> None:
    """Time the entries that have a callable, interleaved: `reps` rounds, each one batch of each entry, in an
    order that rotates from round to round. Sets e.time (median seconds per call) and e.stats; an entry
    that raises gets fn = None and why. A peer whose first call returns a tensor shaped like `ref` gets its
    error against ref in e.err."""
    plans = []
    for e in entries:
        if e.fn is None:
            continue
        try:
            first = e.fn()
            if ref is not None and isinstance(first, torch.Tensor) and first.shape == ref.shape:
                e.err = rel_error(first, ref)
            t_gpu, t_enqueue = warm_up(e.fn)
        except Exception as ex:  # a peer missing in this torch, a tilec status: reported, the run goes on
            e.fn, e.why = None, ("FAIL: " if e.is_tilec else "n/a: ") + short(ex)
            continue
        batch = max(1, min(MAX_BATCH, math.ceil(BATCH_GPU_S / max(t_gpu, 1e-7))))
        # sleep long enough for the whole batch to be enqueued behind it (doubled below if it was not)
        sleep = min(MAX_SLEEP_S, max(1e-4, 2 * batch * t_enqueue))
        plans.append({"e": e, "batch": batch, "sleep": sleep, "samples": []})
    for r in range(reps):
        for i in range(len(plans)):
            p = plans[(i + r) % len(plans)]
            e = p["e"]
            if e.fn is None:
                continue
            start, end = event(), event()
            gpu_sleep(p["sleep"])
            t0 = time.perf_counter()
            start.record()
            try:
                for _ in range(p["batch"]):
                    e.fn()
            except Exception as ex:
                e.fn, e.why = None, ("FAIL: " if e.is_tilec else "n/a: ") + short(ex)
                continue
            end.record()
            enqueue = time.perf_counter() - t0
            p["samples"].append((start, end, enqueue <= p["sleep"]))
            if enqueue > p["sleep"]:  # the GPU may have waited for Python in this batch: sleep longer
                p["sleep"] = min(MAX_SLEEP_S, 2 * enqueue)  # capped: a call that synchronizes never fits
    torch.cuda.synchronize()  # also surfaces an asynchronous fault of any kernel timed above
    for p in plans:
        e, samples = p["e"], p["samples"]
        if e.fn is None or not samples:
            continue
        clean = [s.elapsed_time(t) / 1e3 / p["batch"] for s, t, ok in samples if ok]
        every = [s.elapsed_time(t) / 1e3 / p["batch"] for s, t, _ in samples]
        use = clean if len(clean) >= max(3, len(samples) // 2) else every
        e.time = statistics.median(use)
        e.stats = {"median_ms": e.time * 1e3, "min_ms": min(use) * 1e3, "max_ms": max(use) * 1e3,
                   "batch": p["batch"], "batches": len(use), "launch_bound": use is every and
                   len(clean) < len(every)}


# ----------------------------------------------------------------------------- the run: rows, goals, table

@dataclass
class Work:
    flops: float = 0.0
    bytes: float = 0.0

    def rate(self, seconds: float) -> str:
        if self.flops:
            return f"{self.flops / seconds / 1e12:.1f} TFLOP/s"
        return f"{self.bytes / seconds / 1e9:.0f} GB/s"


Goal = tuple[str, float]  # (">=" or ">", minimum speed ratio tilec / peer)


def n_copies(set_bytes: float, l2: int, forced: int | None = None) -> int:
    """Copies of one case's operands to rotate among so that together they exceed 3x L2 (1 when one set
    already does): a timed call then finds none of its operands left in L2 by the call before. `forced`
    (--copies) overrides it, to measure what a warm L2 is worth."""
    return forced if forced else max(1, math.ceil(3 * l2 / set_bytes))


class Bench:
    def __init__(self, args, env: dict, tilec: Tilec):
        self.args, self.env, self.tilec = args, env, tilec
        self.reps = 8 if args.quick else 40
        self.l2 = env["l2_bytes"]
        self.rows: list[dict] = []
        self.failures: list[str] = []
        self.timings: list[dict] = []
        self.compile_s: dict[str, float] = {}
        self.ceilings: dict[str, float] = {}
        self.copy_Bps: float | None = None
        self.case, self.where, self.n_sections = "", "", 0

    def section(self, case: str, what: str) -> None:
        """Start one measurement: print it, and reseed so its inputs are fresh and reproducible."""
        seed = self.args.seed * 1000 + self.n_sections
        self.n_sections += 1
        torch.manual_seed(seed)
        self.case, self.where = case, f"{case} {what}"
        # (the UTC time, to hundredths, lines a section up with the clock log of bench/device_run.sh)
        now = datetime.datetime.now(datetime.timezone.utc).strftime("%H:%M:%S.%f")[:-4]
        print(f"\n-- {self.where}  (seed {seed}, {now})", flush=True)

    def fail(self, msg: str) -> None:
        self.failures.append(f"{self.where}: {msg}")
        print(f"  FAIL: {msg}", flush=True)

    def tilec_entry(self, kernel: str, make_calls: Callable[[Kernel], list[Call]],
                    refs: Sequence[torch.Tensor], tol: float, label: str | None = None) -> Entry:
        """Load `kernel`, bind it to each copy of the operands (make_calls, copy 0 first) and check copy 0."""
        label = label or f"tilec {kernel}"
        try:
            calls = make_calls(self.tilec.kernel(kernel))
            e = Entry(label, rotate(calls), is_tilec=True, tol=tol)
            e.err = check_tilec(calls[0], refs)
        except TilecFailure as ex:
            self.fail(f"{label}: {ex}")
            return Entry(label, why=f"FAIL: {ex}", is_tilec=True, tol=tol, failed=str(ex))
        if not e.err <= tol:  # NaN-safe
            e.failed = f"max rel error {e.err:.2e} > {tol:.0e}"
            self.fail(f"{label}: {e.failed}")
        else:
            print(f"  {label}: max rel error {e.err:.2e} (tol {tol:.0e}) ok", flush=True)
        return e

    def peer(self, label: str, make: Callable[[], Callable[[], object]]) -> Entry:
        """A peer built by make(); anything it raises (an API this torch lacks) makes it n/a."""
        try:
            return Entry(label, make())
        except Exception as ex:
            print(f"  {label}: n/a ({short(ex)})", flush=True)
            return Entry(label, why=f"n/a: {short(ex)}")

    def compiled(self, fn: Callable, arg_sets: Sequence[tuple], label: str = "torch.compile") -> Entry:
        """torch.compile(fn) as a peer, called on each set of arguments in turn; compiled here, untimed."""
        if self.args.no_compile:
            return Entry(label, why="n/a: --no-compile")

        sparse = []

        def make():
            cf = torch.compile(fn, dynamic=False)
            t0 = time.perf_counter()
            out = cf(*arg_sets[0])
            torch.cuda.synchronize()
            self.compile_s[f"{self.where}: {label}"] = dt = time.perf_counter() - t0
            print(f"  {label}: compiled in {dt:.1f} s", flush=True)
            if isinstance(out, torch.Tensor) and not out.is_contiguous():
                # (inductor may pad an output's rows, e.g. an odd vocabulary's to 16 bytes, and
                # return a strided view: tilec's outputs are dense)
                sparse.append(out.stride())
            return rotate([functools.partial(cf, *a) for a in arg_sets])
        e = self.peer(label, make)
        if sparse:
            e.label += f" (not dense: strides {sparse[0]})"
        return e

    def compare(self, size: str, work: Work, entries: list[Entry], goals: dict[str, Goal] | None = None,
                ref: torch.Tensor | None = None) -> None:
        """Time the entries interleaved and add one table row per peer of entries[0] (the tilec kernel); a
        memory-bound measurement (bytes, no flops) also gets a row against the copy ceiling."""
        goals = goals or {}
        time_all(entries, self.reps, ref)
        for e in entries:
            if e.is_tilec and e.time is None and e.failed is None:
                e.failed = e.why.removeprefix("FAIL: ")
                self.fail(f"{e.label}: {e.failed}")
        for e in entries:
            self.timings.append({"where": self.where, "size": size, "label": e.label, "why": e.why,
                                 "err": e.err, **e.stats})
        main, peers = entries[0], entries[1:]
        if work.bytes and not work.flops and self.copy_Bps:
            peers.append(Entry("copy ceiling", time=work.bytes / self.copy_Bps))
        for e in entries:  # one line per contender, as it is measured
            if e.time is None:
                print(f"  {e.label:34s} {e.why}")
                continue
            vs = f"  tilec {e.time / main.time:.2f}x" if main.time and e is not main else ""
            wrong = not e.is_tilec and e.err is not None and main.tol is not None and not e.err <= main.tol
            bad = f"  (its error vs the reference: {e.err:.1e}!)" if wrong else ""
            lb = "  (launch-bound)" if e.stats.get("launch_bound") else ""
            print(f"  {e.label:34s} {e.time * 1e3:9.4f} ms  {work.rate(e.time):>14s}{vs}{bad}{lb}",
                  flush=True)
        for peer in peers:
            ratio = peer.time / main.time if (peer.time and main.time) else None
            goal = goals.get(peer.label)
            met = None
            if goal and ratio is not None and not main.failed:
                # "faster" must be more than the run-to-run spread of equal code (~2%), or an
                # equal time would count as a win
                met = ratio >= goal[1] if goal[0] == ">=" else ratio > goal[1] * FASTER_MARGIN
            self.rows.append({
                "case": self.case, "size": size, "tilec": main.label,
                "tilec_ms": main.time * 1e3 if main.time else None,
                "tilec_rate": work.rate(main.time) if main.time else None,
                "pct_of_copy": (100 * work.bytes / main.time / self.copy_Bps
                                if main.time and work.bytes and not work.flops and self.copy_Bps else None),
                "tilec_failed": main.failed, "err": main.err, "tol": main.tol,
                "peer": peer.label, "peer_ms": peer.time * 1e3 if peer.time else None,
                "peer_rate": work.rate(peer.time) if peer.time else None, "peer_why": peer.why,
                "peer_err": peer.err,
                "peer_wrong": bool(not peer.is_tilec and peer.err is not None and main.tol is not None
                                   and not peer.err <= main.tol),
                "ratio": ratio, "goal": f"{goal[0]}{goal[1]:g}x" if goal else "", "met": met,
                "has_goal": goal is not None, "flops": work.flops, "bytes": work.bytes,
            })

    def table(self) -> str:
        lines = ["| case | size | tilec | peer | peer time | ratio | goal | met | err |",
                 "|---|---|---:|---|---:|---:|---:|:-:|---:|"]
        for r in self.rows:
            if r["tilec_ms"] is None:
                tc = f"FAIL: {r['tilec_failed'][:40]}"
            else:
                pct = f" {r['pct_of_copy']:.0f}%cp" if r["pct_of_copy"] is not None else ""
                tc = f"{'FAIL ' if r['tilec_failed'] else ''}{r['tilec_ms']:.3f} ms {r['tilec_rate']}{pct}"
            pt = (f"{r['peer_ms']:.3f} ms {r['peer_rate']}" if r["peer_ms"] is not None
                  else r["peer_why"][:48])
            ratio = f"{r['ratio']:.2f}x" if r["ratio"] is not None else "-"
            met = {True: "yes", False: "**no**", None: "-" if r["has_goal"] else ""}[r["met"]]
            err = "-" if r["err"] is None else f"{r['err']:.1e}" + (" FAIL" if r["tilec_failed"] else "")
            peer = r["peer"] + (" (!)" if r["peer_wrong"] else "")
            lines.append(f"| {r['case']} | {r['size']} | {tc} | {peer} | {pt} | {ratio} | {r['goal']} "
                         f"| {met} | {err} |")
        return "\n".join(lines)


# ----------------------------------------------------------------------------- cases

def randn(*shape: int, dtype=F16, scale: float = 1.0) -> torch.Tensor:
    t = torch.randn(*shape, device="cuda", dtype=dtype)
    return t.mul_(scale) if scale != 1.0 else t


def copies_of(n: int, *tensors: torch.Tensor) -> list[tuple[torch.Tensor, ...]]:
    """n sets of the tensors: the originals, then clones (same values, other addresses)."""
    return [tensors] + [tuple(t.clone() for t in tensors) for _ in range(n - 1)]


def rot(n: int) -> str:
    return f" rot{n}" if n > 1 else ""


def rows_cols(bench: Bench) -> tuple[int, int]:
    return (8192, 8192) if bench.args.quick else (32768, 8192)


def ceilings(bench: Bench) -> None:
    # Bring the GPU up from its idle clocks (345 MHz) before the first measurement: 0.3 s of matmuls.
    A = randn(8192, 8192)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 0.3:
        torch.mm(A, A)
        torch.cuda.synchronize()
    del A
    n = (1 << 28) if bench.args.quick else (1 << 30)  # f16 elements: 512 MiB or 2 GiB
    bench.section("ceiling", f"device copy, {2 * n // MiB} MiB f16 -> {2 * n // MiB} MiB")
    src = randn(n)
    dst = torch.empty_like(src)
    copy = Entry("torch copy_", lambda: dst.copy_(src))
    bench.compare(f"{2 * n // MiB} MiB", Work(bytes=2 * src.nbytes), [copy])
    if copy.time is None:
        print("  no copy ceiling: the memory-bound rows get no '% of copy'")
    else:
        bench.copy_Bps = 2 * src.nbytes / copy.time
        bench.ceilings["copy_GBps"] = bench.copy_Bps / 1e9

    s = 8192
    bench.section("ceiling", f"matrix rate, torch.matmul f16 {s}^3")
    A, B = randn(s, s, scale=0.5), randn(s, s, scale=0.5)
    C = torch.empty(s, s, dtype=F16, device="cuda")
    mm = Entry("torch.matmul", functools.partial(torch.matmul, A, B, out=C))
    bench.compare(f"{s}^3", Work(flops=2 * s**3), [mm])
    if mm.time:
        bench.ceilings["matmul_f16_TFLOPs"] = 2 * s**3 / mm.time / 1e12

    if bench.args.kernel and "copy_f16" not in bench.args.kernel.split(","):
        return  # (tilec's copy was not built)
    R, Cc = rows_cols(bench)
    bench.section("copy", f"tilec copy_f16 {R}x{Cc}")
    X = randn(R, Cc)
    Y = torch.empty_like(X)
    tc = bench.tilec_entry("copy_f16", lambda k: [k.bind([X], [Y], (R, Cc))], [X], tol=0.0)
    bench.compare(f"{R}x{Cc}", Work(bytes=2 * X.nbytes), [tc])


def gemm_one(bench: Bench, kernel: str, dtype, M: int, K: int, N: int, goal: Goal | None,
             case: str = "gemm") -> None:
    """C = A @ B against torch.mm (cuBLAS) on the same operands; f32 as exact products (the
    reference in f64, cuBLAS in f32: tf32 off)."""
    name = {F16: "f16", BF16: "bf16", torch.float32: "f32"}[dtype]
    torch.backends.cuda.matmul.allow_tf32 = False
    bench.section(case, f"{name} C = A @ B, M={M} K={K} N={N}")
    A, B = randn(M, K, dtype=dtype, scale=0.5), randn(K, N, dtype=dtype, scale=0.5)
    exact = dtype == torch.float32
    ref = (A.double() @ B.double()).float() if exact else (A.float() @ B.float()).to(dtype)
    n = n_copies((M * K + K * N + M * N) * A.element_size(), bench.l2, bench.args.copies)
    sets = [(a, b, torch.empty(M, N, dtype=dtype, device="cuda")) for a, b in copies_of(n, A, B)]
    tc = bench.tilec_entry(kernel, lambda k: [k.bind([a, b], [c], (M, K, N)) for a, b, c in sets],
                           [ref], 1e-4 if exact else TOL[dtype])
    # the peer writes into the same outputs (out=), so both sides touch the same memory
    cublas = bench.peer("cuBLAS (torch.mm)",
                        lambda: rotate([functools.partial(torch.mm, a, b, out=c) for a, b, c in sets]))
    size = f"{name} {M}^3" if M == K == N else f"{name} {M}x{K}x{N}"
    bench.compare(size + rot(n), Work(flops=2 * M * N * K), [tc, cublas],
                  {"cuBLAS (torch.mm)": goal} if goal else {}, ref)


def hopper(bench: Bench) -> bool:
    """Built for sm_90a: the warp-specialized TMA + wgmma kernels, judged by the Hopper goals."""
    return "sm_90a" in bench.args.arch.split(",")


def case_gemm(bench: Bench) -> None:
    sizes = [2048, 4096, 4000] if bench.args.quick else [2048, 4096, 8192, 4000]
    if hopper(bench):  # cuBLAS speed at 4096^3 and 8192^3, 0.9x at 2048^3, f16 and bf16
        goals = {2048: (">=", 0.9), 4096: (">=", 1.0), 8192: (">=", 1.0)}
        for dtype, kernel in ((F16, "gemm_f16"), (BF16, "gemm_bf16")):
            for s in sizes if dtype == F16 else [x for x in sizes if x in goals]:
                gemm_one(bench, kernel, dtype, s, s, s, goals.get(s))
        # rows of B and C 8176 bytes apart: each starts inside a 128-byte line, which costs the
        # copy engine more L2 requests per box row (docs/PERFORMANCE.md); information, no goal
        gemm_one(bench, "gemm_f16", F16, 4096, 4096, 4088, None)
        return
    for s in sizes:
        gemm_one(bench, "gemm_f16", F16, s, s, s, (">=", 0.6) if s in (4096, 8192) else None)
    gemm_one(bench, "gemm_bf16", BF16, 4096, 4096, 4096, None)


def case_gemm_at(bench: Bench) -> None:
    """C = A.T @ B with A stored [K, M] (no goal: informational), against cuBLAS on the same
    transposed view (torch.mm of A.t(), which cuBLAS reads as a transposed operand)."""
    for s in [4096] if bench.args.quick else [4096, 8192]:
        M = K = N = s
        bench.section("gemm_at", f"f16 C = A.T @ B, A[K, M], M=K=N={s}")
        A, B = randn(K, M, scale=0.5), randn(K, N, scale=0.5)
        ref = (A.float().t() @ B.float()).to(F16)
        n = n_copies((M * K + K * N + M * N) * 2, bench.l2, bench.args.copies)
        sets = [(a, b, torch.empty(M, N, dtype=F16, device="cuda")) for a, b in copies_of(n, A, B)]
        # (the lambdas run at once, inside this iteration; their defaults say so to the linter)
        tc = bench.tilec_entry("gemm_at_f16",
                               lambda k, sets=sets, dims=(K, M, N):
                               [k.bind([a, b], [c], dims) for a, b, c in sets],
                               [ref], TOL[F16])
        cublas = bench.peer("cuBLAS (torch.mm of A.t())", lambda sets=sets: rotate(
            [functools.partial(torch.mm, a.t(), b, out=c) for a, b, c in sets]))
        bench.compare(f"f16 {s}^3{rot(n)}", Work(flops=2 * M * N * K), [tc, cublas], {}, ref)


def mm_tf32(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, tf32: bool) -> None:
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.mm(a, b, out=c)


def f32_one(bench: Bench, kernel: str, bt: bool) -> None:
    """f32 4096^3 C = A @ B (`bt`: A @ W.T) in the kernel's precision against torch.mm (a tf32
    kernel, case tf32: in tf32 and f32; an exact one, case f32: in f32)."""
    M = K = N = 4096
    form = "A @ W.T" if bt else "A @ B"
    tf32 = "tf32" in kernel  # (exact f32 products: within f32's tolerance of the f64 product)
    bench.section("tf32" if tf32 else "f32",
                  f"f32 C = {form}{' under precision tf32' if tf32 else ''}, M=K=N={M}")
    # (with bt, B holds W: [N, K], read transposed)
    A, B = randn(M, K, dtype=torch.float32, scale=0.5), randn(K, N, dtype=torch.float32, scale=0.5)
    ref = (A.double() @ (B.double().t() if bt else B.double())).float()
    n = n_copies((M * K + K * N + M * N) * 4, bench.l2, bench.args.copies)
    sets = [(a, b, torch.empty(M, N, dtype=torch.float32, device="cuda")) for a, b in copies_of(n, A, B)]
    tc = bench.tilec_entry(kernel, lambda k: [k.bind([a, b], [c], (M, K, N)) for a, b, c in sets],
                           [ref], TOL[F16] if tf32 else 1e-4)
    # (cuBLAS in tf32 and f32 for a tf32 kernel; in f32 alone for an exact one, tf32's errors
    # being over its tolerance)
    peers = [bench.peer(f"cuBLAS {'tf32' if t else 'f32'} (torch.mm{' of W.t()' if bt else ''})",
                        lambda t=t: rotate([functools.partial(mm_tf32, a, b.t() if bt else b, c, t)
                                            for a, b, c in sets]))
             for t in ((True, False) if tf32 else (False,))]
    bench.compare(f"f32 {form} {M}^3{rot(n)}", Work(flops=2 * M * N * K), [tc, *peers], {}, ref)
    torch.backends.cuda.matmul.allow_tf32 = False


def case_odd(bench: Bench) -> None:
    """GEMMs at irregular shapes, whose rows are not 16-byte aligned, so neither TMA nor 16-byte
    copies can read them (no goal: informational): KernelBench's "irregular shapes" matmul,
    8205 x 2949 x 5921, in exact f32 (rows 4-byte aligned) and f16 (2-byte), and f16 at
    4096 x 4100 x 4100 (8-byte aligned rows), then 2048 x 2052 x 2052 and 1024 x 1028 x 1028
    (sizes near the least that copies them to padded rows for the Hopper kernels), each against
    cuBLAS (torch.mm) on the same data."""
    for kernel, dtype, (M, K, N) in (("gemm_f32", torch.float32, (8205, 2949, 5921)),
                                     ("gemm_f16", F16, (8205, 2949, 5921)),
                                     ("gemm_f16", F16, (4096, 4100, 4100)),
                                     ("gemm_f16", F16, (2048, 2052, 2052)),
                                     ("gemm_f16", F16, (1024, 1028, 1028))):
        gemm_one(bench, kernel, dtype, M, K, N, None, case="odd")

def case_tf32(bench: Bench) -> None:
    """f32 GEMM under `precision tf32` against cuBLAS in tf32 and in f32 (no goal: informational):
    C = A @ B (B row-major: tilec's mma.sync kernel) and C = A @ W.T (both operands K-major: on
    Hopper, tilec's tf32 wgmma)."""
    f32_one(bench, "gemm_tf32", False)
    f32_one(bench, "gemm_tf32_bt", True)


def case_f32(bench: Bench) -> None:
    """f32 GEMM of exact f32 products (the scalar units: `precision ieee`, the default) against
    cuBLAS's f32 (no goal: informational)."""
    f32_one(bench, "gemm_f32", False)
    f32_one(bench, "gemm_f32_bt", True)


def fp8_one(bench: Bench, s: int) -> None:
    """e4m3 C = bf16((A @ W.T) * scale) at s^3 against torch._scaled_mm with the same per-tensor
    scales: its default (sums promoted to f32, as tilec's) for the goal, fast_accum (the tensor
    cores' sums over all of K) for information."""
    E4M3 = torch.float8_e4m3fn
    M = K = N = s
    bench.section("fp8", f"e4m3 C = bf16((A @ W.T) * scale), M={M} K={K} N={N}")
    A, W = randn(M, K, dtype=torch.float32).to(E4M3), randn(N, K, dtype=torch.float32).to(E4M3)
    sa = torch.tensor(0.5, device="cuda")
    sw = torch.tensor(0.25, device="cuda")
    scale = float(sa * sw)
    ref = ((A.float() @ W.float().T) * scale).to(BF16)
    n = n_copies((M * K + N * K) + M * N * 2, bench.l2, bench.args.copies)
    sets = [(a, w, torch.empty(M, N, dtype=BF16, device="cuda")) for a, w in copies_of(n, A, W)]
    tc = bench.tilec_entry("gemm_fp8", lambda k: [k.bind([a, w, scale], [c], (M, K, N))
                                                  for a, w, c in sets], [ref], TOL[BF16])

    def scaled_mm(fast: bool) -> Callable[[], object]:
        return rotate([functools.partial(torch._scaled_mm, a, w.t(), scale_a=sa, scale_b=sw,
                                         out_dtype=BF16, use_fast_accum=fast) for a, w, _ in sets])
    lt = bench.peer("torch._scaled_mm", lambda: scaled_mm(False))
    fast = bench.peer("torch._scaled_mm fast_accum", lambda: scaled_mm(True))
    goal = {"torch._scaled_mm": (">=", 0.9)} if hopper(bench) and s == 8192 else {}
    bench.compare(f"e4m3 {s}^3{rot(n)}", Work(flops=2 * M * N * K), [tc, lt, fast], goal, ref)


def case_fp8(bench: Bench) -> None:
    """fp8 e4m3 GEMMs against torch._scaled_mm (cuBLASLt's fp8 GEMM): at least 0.9x at 8192^3
    (Hopper)."""
    for s in [4096] if bench.args.quick else [4096, 8192]:
        fp8_one(bench, s)


def linear_relu(A: torch.Tensor, B: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return torch.relu(A @ B + bias)


def case_epilogue(bench: Bench) -> None:
    M = K = N = 4096
    bench.section("epilogue", f"f16 C = relu(A @ B + bias), M=K=N={M}")
    A, B, bias = randn(M, K, scale=0.5), randn(K, N, scale=0.5), randn(N)
    ref = torch.relu(A.float() @ B.float() + bias.float()).half()
    n = n_copies((M * K + K * N + M * N) * 2, bench.l2, bench.args.copies)
    sets = [(a, b, c, torch.empty(M, N, dtype=F16, device="cuda")) for a, b, c in copies_of(n, A, B, bias)]

    def tilec(kernel):
        return bench.tilec_entry(kernel, lambda k: [k.bind([a, b, c], [o], (M, K, N)) for a, b, c, o in sets],
                                 [ref], TOL[F16])
    fused, unfused = tilec("gemm_bias_relu"), tilec("gemm_bias_relu_unfused")
    # the peer: torch.addmm (cuBLASLt, the bias in its epilogue) then relu_ (a pass over C)
    two = bench.peer("torch.addmm + relu_", lambda: rotate(
        [lambda a=a, b=b, c=c: torch.addmm(c, a, b).relu_() for a, b, c, _ in sets]))
    peers = [two]
    if hasattr(torch, "_addmm_activation"):  # cuBLASLt's GEMM with the bias+ReLU epilogue too
        lt = bench.peer("cuBLASLt bias+relu (_addmm_activation)", lambda: rotate(
            [functools.partial(torch._addmm_activation, c, a, b) for a, b, c, _ in sets]))
        peers.append(lt)
    eager = bench.peer("eager relu(A @ B + bias)",
                       lambda: rotate([functools.partial(linear_relu, a, b, c) for a, b, c, _ in sets]))
    comp = bench.compiled(linear_relu, [(a, b, c) for a, b, c, _ in sets])
    # on Hopper the epilogue is to be free: faster than addmm + relu_ by the pass relu_ costs;
    # elsewhere at least 0.6x of cuBLASLt's fused epilogue (the CUDA target's goal)
    goals = {two.label: (">=", 1.05)} if hopper(bench) else {peers[-1].label: (">=", 0.6)}
    bench.compare(f"f16 {M}^3{rot(n)}", Work(flops=2 * M * N * K), [fused, unfused, *peers, eager, comp],
                  {**goals, unfused.label: (">", 1.0)}, ref)


def linear_gelu(X: torch.Tensor, W: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(torch.nn.functional.linear(X, W, bias), approximate="tanh")


def case_linear(bench: Bench) -> None:
    """A model layer: nn.Linear (weights [out, in]) + GELU in bf16, against cuBLAS's linear
    (with and without the activation) and torch.compile (no goal: informational)."""
    M, K, N = 8192, 4096, 4096
    bench.section("linear", f"bf16 Y = gelu_tanh(X @ W.T + bias), M={M} K={K} N={N}")
    X, W, bias = (randn(M, K, dtype=BF16, scale=0.5), randn(N, K, dtype=BF16, scale=0.5),
                  randn(N, dtype=BF16))
    linear_layer(bench, "linear_gelu", linear_gelu, X, W, bias, (M, K, N), f"bf16 {M}x{K}x{N}")


def linear3_gelu(X: torch.Tensor, W: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(torch.nn.functional.linear(X, W, bias))


def case_linear3(bench: Bench) -> None:
    """A model layer on a batch of sequences, X: [B, S, K] (tilec merges B and S into the rows of
    one GEMM): ViT-B's MLP (197 tokens, not a tile multiple), BERT and Llama sizes, and decode
    (one token per sequence), f16, against eager F.linear + gelu and torch.compile, then the same
    linear without the GELU against cuBLAS's F.linear alone (no goal: informational)."""
    bench.section("linear3", "f16 Y = gelu(X @ W.T + bias), X: [B, S, K]; then without gelu")
    # ViT-B's MLP (fc1, fc2), BERT-large's fc1, Llama-7B's up projection, decode
    for B, S, K, N in ((32, 197, 768, 3072), (32, 197, 3072, 768), (8, 512, 1024, 4096),
                       (4, 1024, 4096, 11008), (8, 1, 4096, 4096)):
        X, W, bias = (randn(B, S, K, scale=0.5), randn(N, K, scale=0.5), randn(N))
        label = f"B={B} S={S} K={K} N={N}"
        linear_layer(bench, "linear3_gelu", linear3_gelu, X, W, bias, (B, S, K, N), label)
        linear_layer(bench, "linear3_bias", torch.nn.functional.linear, X, W, bias, (B, S, K, N),
                     f"{label} no gelu")


def case_decode(bench: Bench) -> None:
    """Decode-size linears: M tokens (1, 8, 16) through Llama-7B-sized weights (the attention
    projections, the MLP's up and down), f16 Y = X @ W.T + bias, against cuBLAS's F.linear and the
    copy ceiling: each call reads W once, so it is memory-bound (no goal: informational)."""
    bench.section("decode", "f16 Y = X @ W.T + bias, X: [M, 1, K], W: [N, K]")
    for M in (1, 8, 16):
        for K, N in ((4096, 4096), (4096, 11008), (11008, 4096)):
            X, W, bias = randn(M, 1, K, scale=0.5), randn(N, K, scale=0.5), randn(N)
            nbytes = (X.numel() + W.numel() + bias.numel() + M * N) * X.element_size()
            linear_layer(bench, "linear3_bias", torch.nn.functional.linear, X, W, bias,
                         (M, 1, K, N), f"M={M} K={K} N={N}", Work(bytes=nbytes))


def linear_layer(bench: Bench, kernel: str, fn: Callable, X: torch.Tensor, W: torch.Tensor,
                 bias: torch.Tensor, dims: tuple, label: str, work: Work | None = None) -> None:
    """tilec's `kernel` (Y = fn(X, W, bias), nn.Linear's weights [out, in]; `dims` its dimension
    arguments) against cuBLAS's F.linear alone, eager `fn` and torch.compile, on rotated copies
    of the operands; rated by `work` (default: the product's flops)."""
    ref = fn(X.float(), W.float(), bias.float()).to(X.dtype)
    out_shape = (*X.shape[:-1], W.shape[0])
    n = n_copies((X.numel() + W.numel() + math.prod(out_shape)) * X.element_size(), bench.l2,
                 bench.args.copies)
    sets = [(x, w, b, torch.empty(out_shape, dtype=X.dtype, device="cuda"))
            for x, w, b in copies_of(n, X, W, bias)]
    tc = bench.tilec_entry(kernel, lambda k: [k.bind([x, w, b], [y], dims) for x, w, b, y in sets],
                           [ref], TOL[X.dtype])
    plain = fn is torch.nn.functional.linear  # the linear alone: cuBLAS is the eager form
    lin = bench.peer("cuBLAS F.linear" + ("" if plain else " (no GELU)"), lambda: rotate(
        [functools.partial(torch.nn.functional.linear, x, w, b) for x, w, b, _ in sets]))
    eager = [] if plain else [bench.peer("eager F.linear + gelu", lambda: rotate(
        [functools.partial(fn, x, w, b) for x, w, b, _ in sets]))]
    comp = bench.compiled(fn, [(x, w, b) for x, w, b, _ in sets])
    work = work or Work(flops=2 * X.numel() // X.shape[-1] * W.shape[0] * W.shape[1])
    bench.compare(f"{label}{rot(n)}", work, [tc, lin, *eager, comp], {}, ref)


def memory_bound(bench: Bench, kernel: str, inputs: list, ref: torch.Tensor, peers: list[Entry]) -> None:
    """A row-wise f16 kernel: one read and one write of X (+ small vectors) against the copy ceiling and
    torch.compile."""
    X = inputs[0]
    R, C = X.shape
    Y = torch.empty_like(X)
    tc = bench.tilec_entry(kernel, lambda k: [k.bind(inputs, [Y], (R, C))], [ref], TOL[F16])
    nbytes = 2 * X.nbytes + sum(t.nbytes for t in inputs[1:] if isinstance(t, torch.Tensor))
    bench.compare(f"f16 {R}x{C}", Work(bytes=nbytes), [tc, *peers],
                  {"copy ceiling": (">=", 0.9), "torch.compile": (">=", 1.0)}, ref)


def softmax_eager(X: torch.Tensor) -> torch.Tensor:
    return torch.softmax(X, -1)


def case_softmax(bench: Bench) -> None:
    R, C = rows_cols(bench)
    bench.section("softmax", f"f16 Y = softmax(X, -1), {R}x{C}")
    X = randn(R, C, scale=2.0)
    ref = torch.softmax(X.float(), -1).half()
    peers = [bench.peer("torch.softmax", lambda: functools.partial(softmax_eager, X)),
             bench.compiled(softmax_eager, [(X,)])]
    memory_bound(bench, "softmax_f16", [X], ref, peers)


RMS_EPS = 1e-6


def rmsnorm_eager(X: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """In float (X.float() promotes the whole product), cast to X's dtype as the last step."""
    return (X * torch.rsqrt((X.float() ** 2).mean(-1, keepdim=True) + RMS_EPS) * w).to(X.dtype)


def case_rmsnorm(bench: Bench) -> None:
    R, C = rows_cols(bench)
    bench.section("rmsnorm", f"f16 Y = X * rsqrt(mean(X^2, -1) + {RMS_EPS:g}) * w, {R}x{C}")
    X, w = randn(R, C), (1 + 0.1 * torch.randn(C, device="cuda")).half()
    ref = rmsnorm_eager(X, w)
    peers = [bench.peer("F.rms_norm", lambda: functools.partial(F.rms_norm, X, (C,), w, RMS_EPS)),
             bench.compiled(rmsnorm_eager, [(X, w)])]
    memory_bound(bench, "rmsnorm_f16", [X, w, RMS_EPS], ref, peers)


def chain_eager(X: torch.Tensor) -> torch.Tensor:
    return F.silu(X * 0.5 + 1.0) * X


def case_chain(bench: Bench) -> None:
    R, C = rows_cols(bench)
    bench.section("chain", f"f16 Y = silu(X * 0.5 + 1) * X, {R}x{C}")
    X = randn(R, C)
    ref = chain_eager(X.float()).half()
    peers = [bench.peer("eager", lambda: functools.partial(chain_eager, X)),
             bench.compiled(chain_eager, [(X,)])]
    memory_bound(bench, "chain_f16", [X], ref, peers)


W4_GROUP = 128


def pack_u4(q: torch.Tensor) -> torch.Tensor:
    """tilec's u4[K, N]: uint8 [K, N/2], element n even in the low nibble, n+1 in the high one."""
    return (q[:, 0::2] | (q[:, 1::2] << 4)).contiguous()


def tinygemm_weights(q: torch.Tensor, scales: torch.Tensor, A: torch.Tensor, ref: torch.Tensor, tol: float):
    """(packed weight, scales_and_zeros) for torch._weight_int4pack_mm from the same q and scales.

    Since torch 2.5 the CUDA _convert_weight_to_int4pack takes uint8 [N, K/2]: q^T packed along K, the even
    k in the high nibble (torchao's layout); innerKTiles = 8. The nibble order is the part most likely to
    differ between versions, so both are tried against the reference and the one that matches is kept.
    tinygemm computes (q - 8) * scale + zero: zeros = 0."""
    qt = q.t().contiguous()
    sz = torch.stack([scales, torch.zeros_like(scales)], -1).contiguous()  # [K/128, N, 2]
    tried = []
    for even_high in (True, False):
        hi, lo = (qt[:, 0::2], qt[:, 1::2]) if even_high else (qt[:, 1::2], qt[:, 0::2])
        packed = torch._convert_weight_to_int4pack((hi << 4 | lo).contiguous(), 8)
        err = rel_error(torch._weight_int4pack_mm(A, packed, W4_GROUP, sz), ref)
        tried.append((err, even_high, packed))
        print(f"  tinygemm, even k in the {'high' if even_high else 'low'} nibble: max rel error {err:.2e}")
        if err <= tol:
            break
    err, even_high, packed = min(tried, key=lambda t: t[0])
    if not err <= tol:
        print(f"  WARNING: tinygemm differs from the reference with either nibble order (best {err:.2e})")
    print(f"  tinygemm is timed with the even k in the {'high' if even_high else 'low'} nibble")
    return packed, sz


def w4a16_one(bench: Bench, M: int, K: int, N: int, kmajor: bool = False,
              goal: bool = True) -> None:
    """kmajor: tilec reads the weights packed along K (u4 [N, K] and scales [N, K / 128], the
    GPTQ-style layout, kernel w4a16_kmajor) instead of u4 [K, N]; the peers are the same."""
    layout = "packed along K: Wq u4[N, K]" if kmajor else "Wq u4[K, N]"
    bench.section("w4a16", f"bf16 C = A @ ((Wq - 8) * scales), group {W4_GROUP}, M={M} K={K} N={N}, "
                           f"{layout}")
    A = randn(M, K, dtype=BF16)
    q = torch.randint(0, 16, (K, N), dtype=torch.uint8, device="cuda")
    scales = ((torch.rand(K // W4_GROUP, N, device="cuda") + 0.5) / 64).to(BF16)
    W = (q.float() - 8) * scales.float().repeat_interleave(W4_GROUP, 0)
    ref = (A.float() @ W).to(BF16)
    dense = W.to(BF16)
    del W
    wq = pack_u4(q.t().contiguous()) if kmajor else pack_u4(q)
    ws = scales.t().contiguous() if kmajor else scales
    # the 32 MiB of packed weights fit in L2: every contender rotates among the same number of copies
    n = n_copies(wq.nbytes + scales.nbytes, bench.l2, bench.args.copies)
    sets = [(w, s, torch.empty(M, N, dtype=BF16, device="cuda")) for w, s in copies_of(n, wq, ws)]
    tc = bench.tilec_entry("w4a16_kmajor" if kmajor else "w4a16",
                           lambda k: [k.bind([A, w, s], [c], (M, K, N)) for w, s, c in sets],
                           [ref], TOL[BF16])
    dense_sets = [(d[0], c) for d, (_, _, c) in zip(copies_of(n, dense), sets)]
    cublas = bench.peer("cuBLAS bf16 dense (A @ W)",
                        lambda: rotate([functools.partial(torch.mm, A, d, out=c) for d, c in dense_sets]))

    def tinygemm():
        packed, sz = tinygemm_weights(q, scales, A, ref, TOL[BF16])
        return rotate([functools.partial(torch._weight_int4pack_mm, A, p, W4_GROUP, z)
                       for p, z in copies_of(n, packed, sz)])
    tiny = bench.peer("tinygemm (_weight_int4pack_mm)", tinygemm)
    goals = {"cuBLAS bf16 dense (A @ W)": (">=", 2.5), "tinygemm (_weight_int4pack_mm)": (">=", 1.0)}
    work = Work(flops=2 * M * N * K, bytes=wq.nbytes + scales.nbytes + A.nbytes + M * N * 2)
    size = f"N=K={K}" if N == K else f"K={K} N={N}"
    bench.compare(f"M={M} {size}{' K-major' if kmajor else ''}{rot(n)}", work, [tc, cublas, tiny],
                  goals if M == 1 and goal else {}, ref)
    if tc.time:
        print(f"  tilec streams {work.bytes / tc.time / 1e9:.0f} GB/s of weights + activations")


# decode batches: one row of A, and a few (the GEMV of several rows reads the weights once)
W4A16_ROWS = (1, 4, 8, 16)


def case_w4a16(bench: Bench) -> None:
    for M in W4A16_ROWS:
        w4a16_one(bench, M, 8192, 8192)


def case_w4a16_kmajor(bench: Bench) -> None:
    for M in W4A16_ROWS:
        w4a16_one(bench, M, 8192, 8192, kmajor=True)


def case_w4a16_decode(bench: Bench) -> None:
    """W4A16 at Llama-7B decode shapes (the attention projections, the MLP's up and down), both
    weight layouts: grids of fewer column blocks than the device has SMs, split over K (no
    goal: informational)."""
    for kmajor in (False, True):
        for M in (1, 8, 16):
            for K, N in ((4096, 4096), (4096, 11008), (11008, 4096)):
                w4a16_one(bench, M, K, N, kmajor=kmajor, goal=False)


def sdpa(q, k, v, causal: bool, backend_name: str) -> Callable[[], torch.Tensor]:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = getattr(SDPBackend, backend_name)

    def run():
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return run


def attention_reference(q, k, v, causal: bool) -> torch.Tensor:
    """Float attention, one batch entry at a time (only used when SDPA's flash backend is unavailable)."""
    out = torch.empty_like(q)
    L, S = q.shape[-2], k.shape[-2]
    mask = torch.ones(L, S, dtype=torch.bool, device=q.device).triu(1) if causal else None
    for b in range(q.shape[0]):
        s = q[b].float() @ k[b].float().transpose(-1, -2) * q.shape[-1] ** -0.5
        if mask is not None:
            s.masked_fill_(mask, -math.inf)
        out[b] = (torch.softmax(s, -1) @ v[b].float()).to(q.dtype)
    return out


def attention_one(bench: Bench, B: int, H: int, L: int, D: int, causal: bool, goal: bool = True) -> None:
    kernel = "causal_attention" if causal else "attention"
    S = L
    bench.section("attention", f"f16 {kernel} B={B} H={H} L=S={L} D={D}")
    q, k, v = randn(B, H, L, D), randn(B, H, S, D), randn(B, H, S, D)
    O = torch.empty_like(q)
    try:
        ref = sdpa(q, k, v, causal, "FLASH_ATTENTION")()
    except Exception as ex:
        print(f"  SDPA flash unavailable ({short(ex)}): checking against float attention instead")
        ref = attention_reference(q, k, v, causal)
    dims = (B, H, L, D) if causal else (B, H, L, D, S)
    tc = bench.tilec_entry(kernel, lambda kern: [kern.bind([q, k, v], [O], dims)], [ref], TOL[F16])
    flash = bench.peer("SDPA flash", lambda: sdpa(q, k, v, causal, "FLASH_ATTENTION"))
    cudnn = bench.peer("SDPA cuDNN", lambda: sdpa(q, k, v, causal, "CUDNN_ATTENTION"))
    flops = 4 * B * H * L * S * D / (2 if causal else 1)
    bench.compare(f"B{B} H{H} L{L} D{D}{' causal' if causal else ''}", Work(flops=flops),
                  [tc, flash, cudnn], {"SDPA flash": (">=", 0.8)} if goal else {}, ref)


def case_attention(bench: Bench) -> None:
    shape = (2, 16, 2048, 128) if bench.args.quick else (4, 32, 4096, 128)
    dims = [int(d) for d in bench.args.head_dims.split(",")]
    if 128 in dims:
        for causal in (False, True):
            attention_one(bench, *shape, causal)
    # other head dims (no goal): 64 and 96 have their own variants, 80 runs the D <= 96 one
    for D in dims:
        if D != 128:
            attention_one(bench, *shape[:3], D, False, goal=False)


# ----------------------------------------------------------------------------- model layers, fusions

def swiglu_eager(X, Wg, Wu):
    return F.silu(F.linear(X, Wg)) * F.linear(X, Wu)


def residual_tanh_eager(X, W, b, R, s):
    return torch.tanh(F.linear(X, W, b) * s) + R


def logsumexp_eager(X, W):
    return torch.logsumexp(F.linear(X, W).float(), -1)


def bmm_gelu_eager(A, B, bias):
    return F.gelu(torch.bmm(A, B) + bias, approximate="tanh")


def layernorm_eager(X, g, b):
    return F.layer_norm(X, (X.shape[-1],), g, b, 1e-5)


def col_softmax_eager(X):
    return torch.softmax(X, 0)


def chan_softmax_eager(X):
    return torch.softmax(X, 1)


def sum_mid_eager(X):
    return X.sum(1)


def col_mean_eager(X):
    return X.mean(0)


def discard(fn: Callable) -> Callable[[], None]:
    """fn, its result dropped."""
    def call() -> None:
        fn()
    return call


def fusion_one(bench: Bench, kernel: str, fn: Callable, inputs: tuple, dims: tuple, size: str,
               work: Work, bound: tuple[str, Callable] | None = None) -> None:
    """tilec's `kernel` against eager `fn` (the reference computed by fn in f32) and torch.compile, and
    against `bound`: the part of the program a library does in one call (the product alone), which a
    fused kernel can at best match; each on rotated copies of the operands."""
    ref = fn(*(x.float() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs))
    out = fn(*inputs)
    ref = ref.to(out.dtype)
    tensors = [x for x in inputs if isinstance(x, torch.Tensor)]
    n = n_copies(sum(t.nbytes for t in tensors) + out.nbytes, bench.l2, bench.args.copies)
    sets = []
    for c in copies_of(n, *tensors):
        it = iter(c)
        args = tuple(next(it) if isinstance(x, torch.Tensor) else x for x in inputs)
        sets.append((args, torch.empty_like(out)))
    tol = max(TOL.get(out.dtype, 1e-2), TOL.get(tensors[0].dtype, 1e-2))
    tc = bench.tilec_entry(kernel, lambda k: [k.bind(list(a), [o], dims) for a, o in sets], [ref], tol)
    eager = bench.peer("eager", lambda: rotate([functools.partial(fn, *a) for a, _ in sets]))
    peers = [eager, bench.compiled(fn, [a for a, _ in sets])]
    if bound:  # (its result is part of the program's: not compared with the reference)
        label, make = bound
        peers.append(bench.peer(label, lambda: rotate([discard(make(*a)) for a, _ in sets])))
    bench.compare(f"{size}{rot(n)}", work, [tc, *peers], {}, ref)


def case_fusions(bench: Bench) -> None:
    """Model layers and KernelBench-style fusions written as a user would, none with a schedule (no
    goal: how tilec does on programs that are not its own samples)."""
    q = bench.args.quick
    T, D, Fh = (1024, 4096, 11008) if q else (4096, 4096, 11008)
    bench.section("fusions", f"bf16 swiglu: silu(X @ Wg.T) * (X @ Wu.T), T={T} D={D} F={Fh}")
    X = randn(T, D, dtype=BF16, scale=0.5)
    Wg, Wu = randn(Fh, D, dtype=BF16, scale=0.03), randn(Fh, D, dtype=BF16, scale=0.03)
    Wgu = torch.cat([Wg, Wu])  # both weights in one [2F, D]: the two products as one cuBLAS call
    fusion_one(bench, "swiglu", swiglu_eager, (X, Wg, Wu), (T, D, Fh), f"T={T} D={D} F={Fh}",
               Work(flops=2 * 2 * T * D * Fh),
               ("cuBLAS X @ [Wg; Wu].T (one GEMM)", lambda x, g, u: functools.partial(F.linear, x, Wgu)))

    M = K = N = 2048 if q else 4096
    bench.section("fusions", f"f16 tanh((X @ W.T + b) * s) + R, M=K=N={M}")
    X, W, b, R = randn(M, K, scale=0.5), randn(N, K, scale=0.03), randn(N), randn(M, N)
    fusion_one(bench, "linear_residual_tanh", residual_tanh_eager, (X, W, b, R, 0.7), (M, K, N),
               f"f16 {M}^3", Work(flops=2 * M * N * K),
               ("cuBLAS F.linear", lambda x, w, b_, r, s: functools.partial(F.linear, x, w, b_)))

    bench.section("fusions", f"f16 logsumexp(X @ W.T, -1), M=K=N={M}")
    X, W = randn(M, K, scale=0.5), randn(N, K, scale=0.03)
    fusion_one(bench, "gemm_logsumexp", logsumexp_eager, (X, W), (M, K, N), f"f16 {M}^3",
               Work(flops=2 * M * N * K), ("cuBLAS F.linear", lambda x, w: functools.partial(F.linear, x, w)))

    M, K, N = (1024 if q else 4096), 768, 50257
    bench.section("fusions", f"f16 LM head X @ W.T, M={M} K={K} N={N}")
    X, W = randn(M, K, scale=0.5), randn(N, K, scale=0.03)
    # the library's way to a dense output: cuBLAS on weights padded to 8 rows (its fast path),
    # then the logits' rows made dense (what torch.compile returns: the padded rows, strided)
    Wp = torch.zeros(-(-N // 8) * 8, K, dtype=W.dtype, device="cuda")
    Wp[:N] = W

    def padded_linear(x):
        return F.linear(x, Wp)[:, :N].contiguous()
    fusion_one(bench, "lm_head", F.linear, (X, W), (M, K, N), f"f16 M={M} K={K} N={N}",
               Work(flops=2 * M * N * K),
               ("cuBLAS on 8-row padded W, made dense", lambda x, w: functools.partial(padded_linear, x)))

    G, L, Dd, S = (8 if q else 32), 1024, 1024, 1024
    bench.section("fusions", f"f16 gelu_tanh(A @ B + bias), batched, G={G} L={L} D={Dd} S={S}")
    A, B, bias = randn(G, L, Dd, scale=0.5), randn(G, Dd, S, scale=0.03), randn(S)
    fusion_one(bench, "bmm_bias_gelu", bmm_gelu_eager, (A, B, bias), (G, L, Dd, S), f"f16 G={G} {L}^3",
               Work(flops=2 * G * L * Dd * S),
               ("cuBLAS torch.bmm", lambda a, b_, c: functools.partial(torch.bmm, a, b_)))

    R, C = rows_cols(bench)
    bench.section("fusions", f"bf16 LayerNorm (affine), {R}x{C}")
    X, g, b = randn(R, C, dtype=BF16), (1 + 0.1 * randn(C, dtype=BF16)), randn(C, dtype=BF16, scale=0.1)
    fusion_one(bench, "layernorm_bf16", layernorm_eager, (X, g, b), (R, C), f"bf16 {R}x{C}",
               Work(bytes=2 * X.nbytes))



def case_columns(bench: Bench) -> None:
    """Reductions that keep the innermost axis (column reductions): a softmax down the columns
    (few and many blocks of columns), a softmax over channels, a sum over a middle axis and a
    column mean of a tall matrix, against eager PyTorch, torch.compile and the copy ceiling (no
    goal)."""
    q = bench.args.quick
    R, C = (4096, 4096) if q else (8192, 8192)
    bench.section("columns", f"f16 softmax(X, axis=0), {R}x{C}")
    X = randn(R, C, scale=2.0)
    fusion_one(bench, "col_softmax_f16", col_softmax_eager, (X,), (R, C), f"f16 {R}x{C}",
               Work(bytes=2 * X.nbytes))

    R, C = (1024, 32768) if q else (2048, 65536)  # (many blocks of columns)
    bench.section("columns", f"f16 softmax(X, axis=0), {R}x{C}")
    X = randn(R, C, scale=2.0)
    fusion_one(bench, "col_softmax_f16", col_softmax_eager, (X,), (R, C), f"f16 {R}x{C}",
               Work(bytes=2 * X.nbytes))

    B, K, P = (16, 256, 1024) if q else (32, 256, 4096)
    bench.section("columns", f"f16 softmax over channels (axis 1), B={B} C={K} H*W={P}")
    X = randn(B, K, P, scale=2.0)
    fusion_one(bench, "chan_softmax_f16", chan_softmax_eager, (X,), (B, K, P), f"f16 {B}x{K}x{P}",
               Work(bytes=2 * X.nbytes))

    B, L, D = (4, 1024, 4096) if q else (8, 2048, 4096)
    bench.section("columns", f"f32 sum(X, axis=1), B={B} L={L} D={D}")
    X = randn(B, L, D, dtype=torch.float32)
    fusion_one(bench, "sum_mid", sum_mid_eager, (X,), (B, L, D), f"f32 {B}x{L}x{D}",
               Work(bytes=X.nbytes + B * D * 4))

    R, C = (65536, 512) if q else (262144, 512)
    bench.section("columns", f"f32 mean(X, axis=0), {R}x{C} (rows split over blocks)")
    X = randn(R, C, dtype=torch.float32)
    fusion_one(bench, "col_mean", col_mean_eager, (X,), (R, C), f"f32 {R}x{C}",
               Work(bytes=X.nbytes + C * 4))


CASES = {"gemm": case_gemm, "gemm_at": case_gemm_at, "fp8": case_fp8, "tf32": case_tf32, "f32": case_f32,
         "odd": case_odd, "epilogue": case_epilogue, "linear": case_linear, "linear3": case_linear3,
         "decode": case_decode,
         "softmax": case_softmax, "rmsnorm": case_rmsnorm,
         "chain": case_chain, "w4a16": case_w4a16,
         "w4a16_kmajor": case_w4a16_kmajor, "w4a16_decode": case_w4a16_decode,
         "attention": case_attention, "fusions": case_fusions,
         "columns": case_columns}


# ----------------------------------------------------------------------------- main

def plain_json(x):
    """Standard JSON has no NaN or Infinity: an error that is inf (a NaN output) is written as "inf"."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {k: plain_json(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [plain_json(v) for v in x]
    return x


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default=",".join(CASES),
                    help=f"comma-separated, from {','.join(CASES)} (the ceilings are always measured)")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions, smaller sizes")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile peers")
    ap.add_argument("--json", metavar="PATH", help="also write every number as JSON")
    ap.add_argument("--build-dir", metavar="DIR",
                    help="build here (and reuse it) instead of in a temporary directory")
    ap.add_argument("--arch", default="sm_90a", help="passed to tilec build")
    ap.add_argument("--kernel", metavar="NAME,...",
                    help="build only these kernels of bench/gpu.tile (for --cases using only them)")
    ap.add_argument("--head-dims", default="128,64,80,96", metavar="D,...",
                    help="the attention case's head dims (128: causal and not, with the goals)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--copies", type=int, metavar="N",
                    help="rotate among N copies of each GEMM and W4A16 case's operands (default: "
                         "enough to exceed 3x L2; 1: the same operands every call, L2 warm)")
    args = ap.parse_args()
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        ap.error(f"unknown case(s) {', '.join(unknown)}; choose from {', '.join(CASES)}")
    if not torch.cuda.is_available():
        print("no CUDA device visible to torch", file=sys.stderr)
        return 2
    t_run = time.perf_counter()

    env = environment()
    print(f"# tilec GPU benchmark  {env['date_utc']}  commit {env['commit']}")
    print(f"env: {env['device']}, {env['sm_count']} SMs, L2 {env['l2_bytes'] / 1e6:.0f} MB, "
          f"{env['memory_gib']} GiB | torch {env['torch']} | triton {env['triton']} | CUDA {env['cuda']} "
          f"| python {env['python']}")
    print(f"nvidia-smi: {env['nvidia_smi'] or 'not available'}")

    tmp = None
    if args.build_dir:
        out_dir = Path(args.build_dir).resolve()
    else:
        tmp = tempfile.TemporaryDirectory(prefix="tilec_gpu_bench_")
        out_dir = Path(tmp.name)
    build_s, build_error = build(out_dir, args.arch, args.kernel)
    print(f"tilec build: {build_s:.1f} s{', FAILED' if build_error else ''} -> {out_dir}", flush=True)
    bench = Bench(args, env, Tilec(out_dir, build_error))
    if build_error:
        print(build_error)
        bench.failures.append(f"tilec build failed: {build_error.splitlines()[0]}")

    for name, fn in [("ceilings", ceilings)] + [(c, CASES[c]) for c in cases]:
        try:
            fn(bench)
        except Exception as ex:  # a crash (or a CUDA fault) in one case: report it, go on with the next
            traceback.print_exc()
            bench.failures.append(f"{bench.where if bench.case else name}: crashed: {short(ex)}")
        torch.cuda.empty_cache()

    env["nvidia_smi_end"] = gpu_state()
    judged = [r for r in bench.rows if r["has_goal"]]
    met = sum(bool(r["met"]) for r in judged)
    not_judged = sum(r["met"] is None for r in judged)
    copy_txt = f"{bench.ceilings['copy_GBps']:.0f} GB/s" if "copy_GBps" in bench.ceilings else "n/a"
    mm_txt = (f"{bench.ceilings['matmul_f16_TFLOPs']:.0f} TFLOP/s" if "matmul_f16_TFLOPs" in bench.ceilings
              else "n/a")
    print(f"\n# tilec GPU benchmark {env['date_utc']} commit {env['commit']} on {env['device']}; "
          f"torch {env['torch']}, build {build_s:.0f} s, compile {sum(bench.compile_s.values()):.0f} s")
    print(f"ceilings: copy {copy_txt} (read + write), torch.matmul f16 8192^3 {mm_txt}; "
          f"nvidia-smi at the end: {env['nvidia_smi_end'] or 'n/a'}")
    print("ratio = tilec speed / peer speed (> 1: tilec faster); %cp = tilec GB/s / copy ceiling; rotN = N "
          "operand copies rotated (> L2); (!) = the peer's result differs from the reference\n")
    print(bench.table())
    print(f"\ngoals met: {met}/{len(judged)}" + (f" ({not_judged} not judged: tilec failed or peer n/a)"
                                                 if not_judged else "")
          + f"   (run took {time.perf_counter() - t_run:.0f} s)")

    if args.json:
        Path(args.json).write_text(json.dumps(plain_json({
            "env": env, "args": vars(args), "build": {"seconds": build_s, "error": build_error,
                                                      "dir": str(out_dir)},
            "ceilings": bench.ceilings, "compile_seconds": bench.compile_s, "rows": bench.rows,
            "timings": bench.timings, "failures": bench.failures}), indent=2, default=str) + "\n")
        print(f"wrote {args.json}")
    if tmp:
        tmp.cleanup()
    if bench.failures:
        print("\nTILEC FAILURES:\n  " + "\n  ".join(bench.failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
