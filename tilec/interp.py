"""numpy reference interpreter for the Graph IR: the oracle every test compares against.

Each op is computed in float64 (int64 for integers) and rounded to its declared dtype, i.e. the
program runs "as if each statement ran on its own and every intermediate were materialized at its
declared precision" (LANGUAGE.md). Values are held as float64/int64/bool arrays.
"""

from __future__ import annotations

import math

import numpy as np

from .ir.graph import Graph
from .ir.types import is_float

_INT_RANGE = {"i4": (-8, 7), "u4": (0, 15), "i8": (-128, 127), "u8": (0, 255),
              "i16": (-2**15, 2**15 - 1), "i32": (-2**31, 2**31 - 1), "i64": (-2**63, 2**63 - 1)}
_erf = np.frompyfunc(math.erf, 1, 1)


def erf(x):
    return np.asarray(_erf(x), dtype=np.float64)


_erfc = np.frompyfunc(math.erfc, 1, 1)


def erfc(x):
    return np.asarray(_erfc(x), dtype=np.float64)


def sigmoid(x):
    """1 / (1 + exp(-x)), computed without overflow for large |x|."""
    with np.errstate(all="ignore"):
        e = np.exp(-np.abs(x))
        s = 1.0 / (1.0 + e)
        return np.where(x >= 0, s, e * s)


def round_bf16(x: np.ndarray) -> np.ndarray:
    """Round float64 values to bfloat16 (nearest even), returned as float64."""
    f = np.asarray(x, dtype=np.float64).astype(np.float32)
    bits = f.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    out = rounded.astype(np.uint32).view(np.float32)
    out = np.where(np.isnan(f), f, out)
    return out.astype(np.float64)


# 8-bit floats (OCP FP8): (exponent bias, mantissa bits, largest finite value). fp8e4m3 has no
# infinities (its NaN is S.1111.111); fp8e5m2 is IEEE-like. A conversion rounds to nearest even
# and saturates: finite values and infinities beyond the range become the largest finite value
# of their sign (as NVIDIA's cvt ... .satfinite does); NaN stays NaN.
FP8 = {"fp8e4m3": (7, 3, 448.0), "fp8e5m2": (15, 2, 57344.0)}


def round_fp8(x, dtype: str) -> np.ndarray:
    """Round values to `dtype` (fp8e4m3 or fp8e5m2), returned as float64."""
    bias, mant, top = FP8[dtype]
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        a = np.abs(x)
        _, e = np.frexp(np.where(np.isfinite(a) & (a > 0), a, 1.0))
        # the spacing of representable values at |x|: 2^(exponent - mantissa bits), the
        # subnormal spacing below the smallest normal
        q = np.ldexp(1.0, np.maximum(e - 1, 1 - bias) - mant)
        r = np.rint(a / q) * q  # (nearest even: rint)
        r = np.where(np.isinf(a) | (r > top), top, r)
        return np.where(np.isnan(x), np.nan, np.copysign(r, x))


def fp8_bits(v, dtype: str) -> np.ndarray:
    """fp8 values (already representable: round_fp8) -> their 8-bit codes."""
    bias, mant, _ = FP8[dtype]
    v = np.asarray(v, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        a = np.abs(np.nan_to_num(v, nan=0.0))
        _, e = np.frexp(np.where(a > 0, a, 1.0))
        normal = a >= np.ldexp(1.0, 1 - bias)
        exp = np.where(normal, e - 1 + bias, 0)
        frac = np.where(normal, a / np.ldexp(1.0, e - 1) - 1.0, a / np.ldexp(1.0, 1 - bias))
        code = (exp.astype(np.int64) << mant) | np.rint(frac * (1 << mant)).astype(np.int64)
    code = np.where(np.signbit(v), code | 0x80, code)
    return np.where(np.isnan(v), 0x7F, code).astype(np.uint8)


def fp8_values(codes, dtype: str) -> np.ndarray:
    """8-bit codes -> their fp8 values as float64."""
    bias, mant, _ = FP8[dtype]
    c = np.asarray(codes).astype(np.int64)
    exp, frac = (c >> mant) & ((1 << (7 - mant)) - 1), c & ((1 << mant) - 1)
    mag = np.where(exp == 0, np.ldexp(frac.astype(np.float64), 1 - bias - mant),
                   np.ldexp(1.0 + frac / (1 << mant), exp - bias))
    top_exp = (1 << (7 - mant)) - 1
    if dtype == "fp8e4m3":
        mag = np.where((exp == top_exp) & (frac == (1 << mant) - 1), np.nan, mag)
    else:
        mag = np.where(exp == top_exp, np.where(frac == 0, np.inf, np.nan), mag)
    return np.where(c & 0x80, -mag, mag)


def wrap(x, dtype: str) -> np.ndarray:
    """The result of integer arithmetic in `dtype`: two's complement wrap-around, as NumPy's
    fixed-width integers compute (other dtypes: `quantize`)."""
    if dtype not in _INT_RANGE or dtype == "i64":  # int64 arithmetic already wraps
        return quantize(x, dtype)
    x = np.asarray(x)
    if x.dtype.kind not in "iub":
        return quantize(x, dtype)
    lo, hi = _INT_RANGE[dtype]
    span = hi - lo + 1
    return (x.astype(np.int64) - lo) % span + lo


def quantize(x, dtype: str) -> np.ndarray:
    """Convert values to what `dtype` can hold, as a cast does (floats: nearest even; integers:
    saturate)."""
    x = np.asarray(x)
    if dtype == "bool":
        return x.astype(bool)
    if dtype == "f64":
        return x.astype(np.float64)
    if dtype == "f32":
        return x.astype(np.float64).astype(np.float32).astype(np.float64)
    if dtype == "f16":
        with np.errstate(over="ignore"):
            return x.astype(np.float64).astype(np.float16).astype(np.float64)
    if dtype == "bf16":
        return round_bf16(x)
    if dtype in FP8:
        return round_fp8(x, dtype)
    lo, hi = _INT_RANGE[dtype]
    if x.dtype.kind == "f":
        x = np.where(np.isnan(x), 0, np.rint(np.clip(x, lo, hi)))
        return x.astype(np.int64)
    if x.dtype.kind == "b":
        return x.astype(np.int64)
    return np.clip(x.astype(np.int64), lo, hi)


def _unary(fn: str, x):
    with np.errstate(all="ignore"):
        f = {
            "neg": lambda: -x, "not": lambda: ~x,
            "abs": lambda: np.abs(x), "exp": lambda: np.exp(x),
            "exp_nonpos": lambda: np.exp(x), "exp2": lambda: np.exp2(x),
            "log": lambda: np.log(x), "log2": lambda: np.log2(x), "sqrt": lambda: np.sqrt(x),
            "rsqrt": lambda: 1.0 / np.sqrt(x), "sin": lambda: np.sin(x), "cos": lambda: np.cos(x),
            "tanh": lambda: np.tanh(x), "erf": lambda: erf(x),
            "sigmoid": lambda: sigmoid(x),
            "relu": lambda: np.maximum(x, 0),
            "gelu": lambda: 0.5 * x * erfc(-x / math.sqrt(2.0)),  # no cancellation for x << 0
            "gelu_tanh": lambda: x * sigmoid(2.0 * math.sqrt(2.0 / math.pi) *
                                             (x + 0.044715 * x ** 3)),
            "silu": lambda: x * sigmoid(x),
            "softplus": lambda: np.logaddexp(0.0, x),
            "mish": lambda: x * np.tanh(np.logaddexp(0.0, x)),
        }[fn]
        return f()


def _binary(fn: str, a, b, dtype: str):
    with np.errstate(all="ignore"):
        if fn in ("floordiv", "mod"):  # integers only; a zero divisor gives 0, as in NumPy
            b0 = np.where(b == 0, 1, b)
            r = np.floor_divide(a, b0) if fn == "floordiv" else np.mod(a, b0)
            return np.where(b == 0, 0, r)
        return {
            "add": lambda: a + b, "sub": lambda: a - b, "mul": lambda: a * b,
            "div": lambda: a / b, "maximum": lambda: np.maximum(a, b),
            "minimum": lambda: np.minimum(a, b), "and": lambda: a & b, "or": lambda: a | b,
        }[fn]()


def _compare(fn, a, b):
    return {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
            "eq": np.equal, "ne": np.not_equal}[fn](a, b)


def run_graph(g: Graph, inputs: dict, dims: dict) -> dict:
    """Evaluate `g` on `inputs` (name -> value array) with dimension values `dims`. (inf and
    NaN a program computes are its results: numpy does not warn about them.)"""
    with np.errstate(all="ignore"):
        return _run_graph(g, inputs, dims)


def _run_graph(g: Graph, inputs: dict, dims: dict) -> dict:
    if g.tile is not None:  # a hand-written tile-level kernel
        from .interp_tile import run_program
        return run_program([g.tile], inputs, dims, [p.name for p in g.outputs])
    vals: dict = {}
    for op in g.ops:
        a = [vals[i] for i in op.args]
        dt = op.type.dtype
        shape = tuple(d.eval(dims) for d in op.type.shape)
        k = op.kind
        if k == "input":
            v = np.asarray(inputs[op.attr("name")])
        elif k == "const":
            v = np.asarray(op.attr("value"))
        elif k == "dim":
            v = np.asarray(op.attr("dim").eval(dims))
        elif k == "index":
            ax = op.attr("axis")
            r = np.arange(shape[ax]).reshape([-1 if i == ax else 1 for i in range(len(shape))])
            v = np.broadcast_to(r, shape)
        elif k in ("cast", "copy"):
            v = a[0]
        elif k == "unary":
            v = _unary(op.attr("fn"), a[0].astype(np.float64) if is_float(dt) else a[0])
        elif k == "binary":
            if op.attr("fn") == "pow":
                with np.errstate(all="ignore"):
                    v = a[0] ** op.attr("exponent")
            else:
                v = _binary(op.attr("fn"), a[0], a[1], dt)
        elif k == "compare":
            v = _compare(op.attr("fn"), a[0], a[1])
        elif k == "where":
            v = np.where(a[0], a[1], a[2])
        elif k == "transpose":
            v = np.swapaxes(a[0], -1, -2)
        elif k == "matmul":
            v = np.matmul(a[0].astype(np.float64 if is_float(dt) else np.int64),
                          a[1].astype(np.float64 if is_float(dt) else np.int64))
        elif k == "reduce":
            f = {"sum": np.sum, "max": np.max, "min": np.min}[op.attr("fn")]
            v = f(a[0], axis=op.attr("axes"), keepdims=op.attr("keepdims"))
        elif k == "mean":
            v = np.mean(a[0], axis=op.attr("axes"), keepdims=op.attr("keepdims"))
        elif k == "logsumexp":
            x, ax = a[0], op.attr("axes")
            m = np.max(x, axis=ax, keepdims=True)
            m = np.where(np.isfinite(m), m, 0)
            with np.errstate(divide="ignore"):
                v = np.log(np.sum(np.exp(x - m), axis=ax, keepdims=True)) + m
            if not op.attr("keepdims"):
                v = np.squeeze(v, axis=ax)
        elif k == "softmax":
            x, ax = a[0], op.attr("axes")
            with np.errstate(invalid="ignore"):
                e = np.exp(x - np.max(x, axis=ax, keepdims=True))
                v = e / np.sum(e, axis=ax, keepdims=True)
        elif k == "dequant":
            q, s = a[0], a[1]
            zero = a[2] if len(a) > 2 else op.attr("zero")
            G = op.attr("group")
            rows = np.arange(q.shape[0]) // G
            z = zero[rows] if isinstance(zero, np.ndarray) else zero
            v = (q.astype(np.float64) - z) * s[rows]
        else:
            raise NotImplementedError(f"interpreter: op kind {k}")
        # integer arithmetic wraps; conversions (casts, literals, inputs) saturate
        fit = wrap if k in ("unary", "binary", "matmul", "reduce") else quantize
        v = fit(np.broadcast_to(v, shape) if np.shape(v) != shape else v, dt)
        vals[op.id] = v
    return {p.name: vals[r] for p, r in zip(g.outputs, g.results)}


# ---- inputs and storage ----------------------------------------------------------------
def random_inputs(g: Graph, dims: dict, seed: int, full_ints: bool = False) -> dict:
    """Fresh random, never-zero-filled inputs: floats in [-1, 1], scalars in [0.1, 1], integers in
    [-8, 8] (their whole range with `full_ints`, where arithmetic wraps)."""
    rng = np.random.default_rng(seed)
    out = {}
    for p in g.params:
        shape = tuple(d.eval(dims) for d in p.type.shape)
        dt = p.type.dtype
        if is_float(dt):
            lo, hi = (0.1, 1.0) if not shape else (-1.0, 1.0)
            v = rng.uniform(lo, hi, size=shape)
        elif dt == "bool":
            v = rng.integers(0, 2, size=shape)
        else:
            lo, hi = _INT_RANGE[dt]
            if not full_ints and dt not in ("u4", "i4"):
                lo, hi = max(lo, -8), min(hi, 8)
            v = rng.integers(lo, hi, size=shape, endpoint=True)
        out[p.name] = quantize(v, dt)
    return out


_NP = {"f16": np.float16, "f32": np.float32, "f64": np.float64, "i8": np.int8, "u8": np.uint8,
       "i16": np.int16, "i32": np.int32, "i64": np.int64, "bf16": np.uint16, "bool": np.uint8}


def to_storage(v: np.ndarray, dtype: str) -> np.ndarray:
    """Values -> the C ABI's memory layout (bf16 as bits; 4-bit packed two per byte, low first)."""
    v = np.asarray(v)
    if dtype == "bf16":
        return (v.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    if dtype in FP8:
        return fp8_bits(v, dtype)
    if dtype in ("u4", "i4"):
        q = (v.astype(np.int64) & 0xF).astype(np.uint8)
        if q.shape[-1] % 2:
            q = np.concatenate([q, np.zeros(q.shape[:-1] + (1,), np.uint8)], axis=-1)
        return np.ascontiguousarray(q[..., 0::2] | (q[..., 1::2] << 4))
    return np.ascontiguousarray(v.astype(_NP[dtype]))


def from_storage(a: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bf16":
        return (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    if dtype in FP8:
        return fp8_values(a, dtype)
    if is_float(dtype):
        return a.astype(np.float64)
    return a.astype(np.int64)


def storage_shape(shape: tuple, dtype: str) -> tuple:
    if dtype in ("u4", "i4"):
        return shape[:-1] + ((shape[-1] + 1) // 2,)
    return shape


def np_storage_dtype(dtype: str):
    return np.uint8 if dtype in ("u4", "i4") or dtype in FP8 else _NP[dtype]


# Tolerance on max|out - ref| / max(|ref|): what each output dtype can promise after
# reassociation of reductions/products and f32 evaluation of 16-bit intermediates.
# (fp8: a value the target computes in f32 may round to the neighbouring code: 1/8 and 1/4 of a
# binade's top)
TOLERANCE = {"f64": 1e-9, "f32": 2e-5, "f16": 1e-2, "bf16": 3e-2, "fp8e4m3": 0.13, "fp8e5m2": 0.26}


def tolerance(dtype: str, reduction_length: int = 1, reduced: bool = False) -> float:
    """The tolerance for an output of `dtype` whose values accumulate up to `reduction_length`
    terms: the table's up to 256 terms; for f32 and f64, whose sums are limited by their own
    rounding, growing with the square root of the length beyond (about how fast the rounding
    errors of a long sum grow), so a correct K=8192 product is not a mismatch. 16-bit outputs
    are limited by their final rounding, which the table covers. `reduced`: the kernel's f32
    products may round their operands to tf32 (`precision tf32`), whose 10 mantissa bits are
    f16's, or accumulate fp8 products in the tensor cores' precision (runner.reduced_precision):
    f32 outputs get f16's tolerance."""
    if reduced and dtype == "f32":
        return TOLERANCE["f16"]
    grow = dtype in ("f32", "f64") and reduction_length > 256
    return TOLERANCE.get(dtype, 0.0) * (math.sqrt(reduction_length / 256) if grow else 1.0)


def rel_error(out: np.ndarray, ref: np.ndarray, slack: float = 0.0) -> float:
    """The largest difference between `out` and `ref`, relative to ref's largest magnitude
    (inf where only one is not finite, or they differ in shape); differences of up to `slack`
    count as none (an integer computed from floats may round the other way at .5)."""
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if out.shape != ref.shape:
        return math.inf
    if ref.size == 0:
        return 0.0
    same_nonfinite = (~np.isfinite(ref)) & ((out == ref) | (np.isnan(out) & np.isnan(ref)))
    if np.any(~np.isfinite(ref) & ~same_nonfinite) or np.any(~np.isfinite(out) & np.isfinite(ref)):
        return math.inf
    fin = np.isfinite(ref)
    if not fin.any():
        return 0.0
    scale = max(float(np.max(np.abs(ref[fin]))), 1e-30)
    return float(np.max(np.maximum(np.abs(out[fin] - ref[fin]) - slack, 0.0))) / scale

