"""`tilec run`: build, call the kernel through ctypes on fresh random inputs, compare with the
numpy reference interpreter, and time it."""

from __future__ import annotations

import ctypes
import math
import os
import statistics
from dataclasses import dataclass

from .diagnostics import TilecError, error
from .ir import tile as T
from .ir.graph import Graph
from .ir.types import DTYPES, PACKED, Dim, is_float, is_int
from .passes.tile import fp8_product, rounded_weights

DEFAULT_DIM = 100  # not a multiple of any default tile
BATCH_DIM = 3


def parse_dims(text: str | None) -> dict:
    """`--dims M=100,N=200`: each name once, each value at least 1."""
    out = {}
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        name, _, val = part.partition("=")
        name, val = name.strip(), val.strip()
        if not name or not val.lstrip("-").isdigit():
            raise error(f"--dims expects NAME=INT pairs separated by commas, got '{part}'")
        if name in out:
            raise error(f"--dims gives dimension '{name}' twice")
        if int(val) < 1:
            raise error(f"--dims {name}={val}: a dimension is at least 1")
        out[name] = int(val)
    return out


def _relations(g: Graph) -> list:
    """(condition, what it is) for the conditions on dims the launcher checks: the assumes,
    shape expressions >= 1, dequant group sizes."""
    conds = [(a.cond, f"assume {a.text}") for a in g.assumes]
    for p in g.params + g.outputs:
        for d in p.type.shape:
            if d.op not in ("sym", "const"):
                conds.append((Dim.bin("ge", d, 1), f"dimension {d} of {p.name} is at least 1"))
    ops = g.op_map()
    for o in g.ops:
        if o.kind == "dequant":
            K, R = ops[o.args[0]].type.shape[0], ops[o.args[1]].type.shape[0]
            conds.append((Dim.bin("ge", R * o.attr("group"), K),
                          f"dequant group={o.attr('group')} covers {K} rows"))
    return conds


def choose_dims(g: Graph, given: dict, inner: int | None = None, batch: int | None = None) -> dict:
    """Given dims, plus defaults for the others that satisfy the kernel's assumes: `inner` for
    symbols that size one of a tensor's last two axes, `batch` for the others."""
    inner = DEFAULT_DIM if inner is None else inner
    batch = BATCH_DIM if batch is None else batch
    for name in given:
        if name not in g.symbols:
            raise error(f"kernel {g.name} has no dimension '{name}' (it has: "
                        f"{', '.join(g.symbols) or 'none'})")
    dims = dict(given)
    conds = _relations(g)
    for c, what in conds:  # a condition the given dims decide alone
        if set(c.symbols()) <= set(dims) and not c.eval(dims):
            shown = ", ".join(f"{s}={dims[s]}" for s in c.symbols())
            raise error(f"{shown} breaks kernel {g.name}'s {what}")
    # symbols that only size leading (batch) axes default small: the work grows with their product
    inner_syms = {s for p in g.params for d in p.type.shape[-2:] for s in d.symbols()}
    for s in g.symbols:
        if s in dims:
            continue
        start = inner if s in inner_syms else batch
        for v in list(range(start, start + 4 * DEFAULT_DIM)) + [2 ** k for k in range(9, 14)]:
            trial = dict(dims, **{s: v})
            if all(c.eval(trial) for c, _ in conds if set(c.symbols()) <= set(trial)):
                dims[s] = v
                break
        else:
            raise error(f"cannot pick a value for dimension '{s}' that satisfies the kernel's "
                        f"assumes; pass --dims {s}=...")
    for c, what in conds:
        if not c.eval(dims):
            raise error(f"the dimensions {dims} break kernel {g.name}'s {what}")
    return dims


def reference_bytes(g: Graph, dims: dict) -> int:
    """About how much memory `tilec run` needs at `dims`: the reference interpreter holds every
    value in float64, plus the inputs and outputs in their storage form."""
    total = 0
    for o in g.ops:
        n = 1
        for d in o.type.shape:
            n *= d.eval(dims)
        total += 8 * n
    for p in g.params + g.outputs:
        n = 1
        for d in p.type.shape:
            n *= d.eval(dims)
        total += 8 * n
    return total


def check_memory(g: Graph, dims: dict):
    """A user error, not a crash, when the run would not fit in this machine's memory."""
    try:
        avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return
    need = reference_bytes(g, dims)
    if need > avail // 2:
        raise error(f"kernel {g.name} at {', '.join(f'{k}={v}' for k, v in dims.items())} needs "
                    f"about {need / 2**30:.1f} GiB for its inputs, outputs and reference values; "
                    f"this machine has {avail / 2**30:.1f} GiB free", None,
                    "pass smaller --dims")


def reduction_length(g: Graph, dims: dict) -> int:
    """The longest sum or product chain a value of `g` accumulates at `dims` (matrix products'
    K, the reduced extent of reductions): rounding error grows with it."""
    ops, longest = g.op_map(), 1
    for o in g.ops:
        n = 1
        if o.kind == "matmul":
            n = ops[o.args[0]].type.shape[-1].eval(dims)
        elif o.kind in ("reduce", "mean", "softmax", "logsumexp"):
            shape = ops[o.args[0]].type.shape
            for ax in o.attr("axes"):
                n *= shape[ax].eval(dims)
        longest = max(longest, n)
    if g.tile is not None:  # a hand-written kernel: its longest loop of accumulation is unknown
        longest = max([longest] + list(dims.values()))
    return longest


def rounded_to(g: Graph, n: int) -> str:
    """The least precise float dtype output `n` of `g` is rounded to on its way from the inputs:
    its own dtype or that of a float value computed before it. A program means what it would
    with every value stored at its declared precision (LANGUAGE.md), and a sum reassociated in
    f32 may round such an intermediate to its neighbouring f16 value, so an f32 output of f16
    intermediates is checked at f16's tolerance. (Inputs are exact: their dtypes are no
    rounding. A tile-level kernel has no ops: the least precise of its float tiles, the
    conversions it writes, and the output's own dtype, for each of its outputs.)"""
    from . import interp

    if g.tile is not None:  # its float tiles and the conversions it writes
        body = list(T.walk_stmts(g.tile.body))
        rounded = [st.dtype for st in body if isinstance(st, T.Alloc)] + [
            x.dtype for st in body if isinstance(st, (T.Store, T.Let))
            for x in T.walk_exprs(st.value) if isinstance(x, T.Cast)]
        rounded = [dt for dt in rounded if is_float(dt)]
    else:  # the values computed on the output's way, inputs aside
        ops, seen, stack, rounded = g.op_map(), set(), [g.results[n]], []
        while stack:
            o = ops[stack.pop()]
            if o.id in seen or o.kind == "input":
                continue
            seen.add(o.id)
            rounded.append(o.type.dtype)
            stack += o.args
    # (the first of equally precise ones: the output's own dtype where it is one of them)
    return max([g.outputs[n].type.dtype] + rounded, key=lambda dt: interp.TOLERANCE.get(dt, 0.0))


@dataclass
class RunResult:
    name: str
    dims: dict
    errors: dict  # output -> max relative error
    tolerances: dict
    seconds: float
    flops: int = 0  # matrix-product flops of the call
    bytes: int = 0  # bytes of the inputs and outputs (each read or written once)
    samples: int = 0  # timed samples (seconds is their median)
    calls: int = 1  # calls per sample (seconds is per call)

    @property
    def ok(self) -> bool:
        return all(self.errors[k] <= self.tolerances[k] for k in self.errors)

    def rates(self) -> str:
        if self.seconds <= 0:
            return ""
        out = [f"{self.bytes / self.seconds / 1e9:.1f} GB/s"]
        if self.flops:
            out.append(f"{self.flops / self.seconds / 1e9:.1f} GFLOP/s")
        return ", ".join(out)


def work(g: Graph, dims: dict) -> tuple:
    """(matrix-product flops, bytes of inputs + outputs) of one call at `dims`."""
    ops = g.op_map()
    flops = 0
    for o in g.ops:
        if o.kind == "matmul":
            n = 1
            for d in o.type.shape:
                n *= d.eval(dims)
            flops += 2 * n * ops[o.args[0]].type.shape[-1].eval(dims)
    nbytes = 0
    for p in g.params + g.outputs:
        n = 1
        for d in p.type.shape:
            n *= d.eval(dims)
        bits = max(DTYPES[p.type.dtype][1], 4 if p.type.dtype in PACKED else 8)
        nbytes += (n * bits + 7) // 8
    return flops, nbytes


def _ctype(dtype: str):
    return {"f32": ctypes.c_float, "f64": ctypes.c_double, "f16": ctypes.c_uint16,
            "bf16": ctypes.c_uint16, "i8": ctypes.c_int8, "u8": ctypes.c_uint8,
            "fp8e4m3": ctypes.c_uint8, "fp8e5m2": ctypes.c_uint8,
            "i16": ctypes.c_int16, "i32": ctypes.c_int32, "i64": ctypes.c_int64}[dtype]


class _Call:
    """Kernel `g` of the library at `lib_path`, called on `inputs` in the runtime's memory."""

    def __init__(self, lib_path, g: Graph, inputs: dict, dims: dict, runtime: str):
        import numpy as np

        from . import interp, runtimes
        self.g, self.dims = g, dims
        lib = ctypes.CDLL(str(lib_path))
        self.fn = getattr(lib, g.name)
        self.fn.restype = ctypes.c_int
        self.rt = runtimes.get(runtime)
        args, self.outs = [], {}
        for p in g.params:
            if p.is_scalar:
                v = interp.to_storage(inputs[p.name], p.type.dtype)
                if p.type.dtype == "f16":  # passed as its bits (tilec_f16)
                    v = v.view(np.uint16)
                args.append(_ctype(p.type.dtype)(v.item()))
            else:
                args.append(self.rt.upload(interp.to_storage(inputs[p.name], p.type.dtype)))
        for p in g.outputs:
            shape = interp.storage_shape(tuple(d.eval(dims) for d in p.type.shape), p.type.dtype)
            a = np.empty(shape, dtype=interp.np_storage_dtype(p.type.dtype))
            # (poison: NaN where the dtype has one)
            a.fill(0x7F if p.type.dtype in interp.FP8 else 0x7E if a.dtype.itemsize == 1 else
                   (np.nan if a.dtype.kind == "f" else 0x7E7E))
            self.outs[p.name] = (a, self.rt.output(a))
            args.append(self.outs[p.name][1])
        args += [ctypes.c_int64(dims[s]) for s in g.symbols]
        # a kernel that needs a workspace gets one allocated here, once, and is called through
        # NAME_with_workspace: the timed calls time the kernels, not the plain entry point's
        # allocation of a workspace per call
        size = getattr(lib, f"{g.name}_workspace_size")
        size.restype = ctypes.c_size_t
        size.argtypes = [ctypes.c_int64] * len(g.symbols)
        nbytes = size(*[dims[s] for s in g.symbols])
        if nbytes:
            self.fn = getattr(lib, f"{g.name}_with_workspace")
            self.fn.restype = ctypes.c_int
            args += [self.rt.output(np.zeros(nbytes, np.uint8)), ctypes.c_size_t(nbytes)]
        self.args = args + self.rt.trailing_args()

    def __call__(self) -> int:
        return self.fn(*self.args)

    def check(self):
        from .targets.abi import STATUSES
        status = self()
        if status != 0:
            text = dict((v, t) for _, v, t in STATUSES).get(status, "unknown status")
            raise TilecError(f"{self.g.name} returned status {status}: {text}")

    def outputs(self) -> dict:
        from . import interp
        return {p.name: interp.from_storage(self.rt.download(self.outs[p.name][1],
                                                             self.outs[p.name][0]), p.type.dtype)
                for p in self.g.outputs}


def call_library(lib_path, g: Graph, inputs: dict, dims: dict, runtime: str = "cpu") -> dict:
    """The outputs (name -> values) of one call of kernel `g` of a built library on `inputs`."""
    c = _Call(lib_path, g, inputs, dims, runtime)
    try:
        c.check()
        return c.outputs()
    finally:
        c.rt.close()


def reduced_precision(m, g: Graph, target) -> bool:
    """Whether kernel `g` of module `m` may compute its f32 products in less than f32 precision
    on `target`: it multiplies f32 in tf32 on a target whose matrix units take tf32 (its
    schedule for the target says `precision tf32`, or, a tile-level kernel, one of its gemms
    says `precision=tf32`), it multiplies fp8 matrices on a target with matrix units (Hopper's
    accumulate fp8 products in less than f32 precision within each K tile), or dequantized
    weights with 16-bit scales on them (rounded to the scales' dtype: tile.rounded_weights)."""
    if target.resources.mma_dtypes and g.tile is None and any(
            o.kind == "matmul" and (fp8_product(g, o) or rounded_weights(g, o, target))
            for o in g.ops):
        return True
    if not target.resources.tf32:
        return False
    if target.tf32(m.schedule_for(g.name, target.name)):
        return True
    return g.tile is not None and any(isinstance(s, T.Gemm) and s.tf32
                                      for s in T.walk_stmts(g.tile.body))


SAMPLE_SECONDS = 1e-3  # a timed sample's length at least (a batch of calls to a short kernel)
MAX_BATCH = 1000
PROBE_SECONDS = 0.25  # calls timed alone to size the batches: at most this long in all


def probe(time_one) -> list:
    """Seconds of single calls (`time_one()` times one and returns [seconds]) to size the timed
    batches: until one is shorter than a sample, for PROBE_SECONDS at most. The first calls of
    a short kernel can be slow for the machine's reasons, not the kernel's: on a 2-core VM, a
    4 us kernel's calls took 4-16 ms each for the first 50 ms after a build (other threads
    held its cores, a scheduler tick at a time), so one probe alone would have timed it one
    call per sample, mostly the host's overhead."""
    seen = []
    while sum(seen) < PROBE_SECONDS:
        t = time_one()
        seen += t
        if t[0] < SAMPLE_SECONDS:
            break
    return seen


def calls_per_sample(probes: list) -> int:
    """Calls per timed sample, from `probes` (seconds of single calls; the fastest counts):
    enough that a sample lasts SAMPLE_SECONDS (at most MAX_BATCH). A short kernel is then
    timed over many calls, each issued while the last runs, instead of one call whose time is
    mostly the host's (ctypes, the launcher) and the clock's resolution."""
    fastest = min(probes, default=0.0)
    if fastest <= 0:
        return 1
    return max(1, min(MAX_BATCH, math.ceil(SAMPLE_SECONDS / fastest)))


def run_kernel(lib_path, g: Graph, dims: dict, seed: int, repeat: int = 5,
               runtime: str = "cpu", full_ints: bool = False, reduced: bool = False) -> RunResult:
    """Call kernel `g` of the library on fresh random inputs in the target runtime's memory,
    compare every output with the reference interpreter (f32 outputs of a kernel whose products
    have `reduced` precision with a 16-bit tolerance: reduced_precision), and time `repeat` more
    calls."""
    try:
        import numpy  # noqa: F401
    except ImportError:
        raise error("tilec run needs numpy for its reference interpreter: pip install numpy") from None
    from . import interp

    inputs = interp.random_inputs(g, dims, seed, full_ints)
    # A hand-written tile-level kernel may index a tensor outside its shape: the reference runs
    # first, and reports that as an error at the access, before the built kernel writes past its
    # buffers. tilec's own kernels stay in bounds: their reference runs after the timed calls,
    # since numpy's BLAS threads keep spinning for a while after a matmul, and on a machine with
    # few cores they would share the kernel's cores while timed.
    ref = interp.run_graph(g, inputs, dims) if g.tile is not None else None
    c = _Call(lib_path, g, inputs, dims, runtime)
    try:
        c.check()
        got = c.outputs()  # the first call's results (copies), compared below; it warmed up
        batch = calls_per_sample(probe(lambda: c.rt.time(c, 1))) if repeat > 1 else 1
        times = c.rt.time(c, repeat, batch)
    finally:
        c.rt.close()
    if ref is None:
        ref = interp.run_graph(g, inputs, dims)
    # an integer output of float values may round the other way where a value is near .5
    rounded = {p.name: rounded_to(g, n) for n, p in enumerate(g.outputs)}
    errors = {p.name: interp.rel_error(got[p.name], ref[p.name], slack=1.0 if is_int(
        p.type.dtype) and is_float(rounded[p.name]) else 0.0) for p in g.outputs if p.name in got}
    tols = {p.name: interp.tolerance(rounded[p.name], reduction_length(g, dims), reduced)
            for p in g.outputs}
    flops, nbytes = work(g, dims)
    return RunResult(g.name, dims, errors, tols, statistics.median(times) if times else 0.0,
                     flops, nbytes, len(times), batch)
