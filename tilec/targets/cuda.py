"""The CUDA target (NVIDIA GPUs, sm_80 and later): one thread block per grid block of the Tile IR.

Lowering (after `tile`): software pipelining with cp.async stages, reductions as loops plus
`allreduce`, compile-time capacities for on-chip extents (one kernel variant each), layouts for
every fragment and shared buffer, and barriers. The renderer prints what those passes decided:
parallel loops run per thread over the register groups of their layout, with 16-byte vector
loads and stores where the index runs along the columns; tile copies, GEMMs and reductions are
calls into `tilec_cuda.h`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, replace

from ..ir import tile as T
from ..ir.layout import MmaLayout, MmaRows, VecCols, VecLayout, VecRows, WgmmaLayout, placed_bytes
from ..ir.types import FP8, is_float
from ..passes import (
    barriers,
    hoist_invariants,
    host_scalars,
    layout,
    lower_reductions,
    overlap_gemm,
    pipeline,
    specialize,
    split_k,
    tma_store,
    version_masks,
)
from ..passes.hoist_guards import conjuncts, split_bound
from ..passes.rewrite import (
    column_base,
    defined_names,
    loads_in,
    map_exprs,
    map_stmts,
    mod_of_var,
    multiple_of,
    names_read,
    taken_names,
    unit_stride,
    used_names,
    uses_var,
    written_by,
)
from .abi import launcher_context, render_libraries
from .base import Resources, Target, Toolchain
from .cpu import ALL_DTYPES
from .cstyle import ABI_TYPE, BYTES, CStyleRenderer, cname, drop_unread, linear_block_vars, names_in, pdim

# element type of tile buffers in memory (shared) and in registers (fragments): 16- and 8-bit
# floats keep their bits, everything else its C type
STORE = {"f16": "uint16_t", "bf16": "uint16_t", "f32": "float", "f64": "double", "i8": "int8_t",
         "u8": "uint8_t", "i16": "int16_t", "i32": "int32_t", "i64": "int64_t", "bool": "bool",
         "u4": "uint8_t", "i4": "uint8_t", "fp8e4m3": "uint8_t", "fp8e5m2": "uint8_t"}
# element type of fragments (registers) where it differs: a 4-bit value, one per element there
# (shared tiles hold them packed, as bytes), keeps its sign
REG = dict(STORE, i4="int8_t")
SIXTEEN = ("f16", "bf16")
# attention's P in two buffers (overlapped_loop; TILEC_WGMMA_ATTENTION's seventh field) when S,
# O and both P buffers take at most this many of a consumer thread's 240 registers: D = 128
# with 128-key tiles is 64 + 64 + 2 x 32; 176-key tiles (88 + 64 + 2 x 44) would spill
DOUBLE_P_REGISTERS = 192


def pair_words(a) -> int:
    """The 32-bit registers of a 16-bit register buffer `a` (two values per register)."""
    return (a.layout.slots() + 1) // 2


def kind(dtype: str) -> str:
    """The tilec_cuda.h storage kind (memory <-> register conversion) of a dtype."""
    return {"f16": "tilec::F16", "bf16": "tilec::BF16", "fp8e4m3": "tilec::FP8E4M3",
            "fp8e5m2": "tilec::FP8E5M2"}.get(dtype, f"tilec::Plain<{STORE[dtype]}>")


def wgmma_type(dtype: str) -> str:
    """The tilec_cuda.h WgmmaType of wgmma operands of a dtype (f32: a `precision tf32` gemm's,
    multiplied as tf32)."""
    return "tilec::sm90::WG_" + {"f16": "F16", "bf16": "BF16", "fp8e4m3": "E4M3",
                                 "fp8e5m2": "E5M2", "f32": "TF32"}[dtype]


def wgmmas(bk: int, dtype: str) -> int:
    """wgmmas of a K tile of `bk` values of `dtype`: one per 32 bytes of each row."""
    return bk * BYTES[dtype] // 32


def bits_kind(dtype: str) -> str:
    """The storage kind that moves a dtype's bits unchanged (the vector arrays of a group)."""
    return f"tilec::Plain<{STORE[dtype]}>"


# 16-bit float operations run on 16-bit registers (see tilec_cuda.h: for these, computing in f32
# and rounding once gives the same bits)
NATIVE16 = {"add": "__hadd_rn", "sub": "__hsub_rn", "mul": "__hmul_rn", "maximum": "__hmax_nan",
            "minimum": "__hmin_nan"}
NATIVE16_UNARY = {"neg": "__hneg", "abs": "__habs"}


def dequant_bias(dt: str, zero, qdtype: str):
    """The 16-bit bits of MAGIC + zero (+ 8 for signed nibbles, whose sign bit dequant4x8 and
    gemv_dequant4_mma flip) that those subtract from (MAGIC | q) in dtype dt, two values per
    instruction; None where that or a q - zero is not an exact 16-bit value (then the values
    go one by one)."""
    magic = 1024 if dt == "f16" else 128
    bias = magic + zero + (8 if qdtype == "i4" else 0)
    lo, hi = (-8, 7) if qdtype == "i4" else (0, 15)
    exact = 2048 if dt == "f16" else 256  # integers a 16-bit float holds exactly
    bits = to_bits16(float(bias), dt)
    if from_bits16(bits, dt) != bias or max(abs(lo - zero), abs(hi - zero)) > exact:
        return None
    return bits


def to_bits16(value: float, dtype: str) -> int:
    """The bits of `value` rounded to nearest even in a 16-bit float dtype."""
    if dtype == "f16":
        return struct.unpack("<H", struct.pack("<e", value))[0]
    f = struct.unpack("<I", struct.pack("<f", value))[0]
    if (f & 0x7f800000) == 0x7f800000 and f & 0x7fffff:
        return 0x7fc0 | (f >> 16 & 0x8000)  # NaN
    return (f + 0x7fff + (f >> 16 & 1)) >> 16


def from_bits16(bits: int, dtype: str) -> float:
    if dtype == "f16":
        return struct.unpack("<e", struct.pack("<H", bits))[0]
    return struct.unpack("<f", struct.pack("<I", bits << 16))[0]


def bits16(value: float, dtype: str) -> str:
    """A 16-bit float constant as a C literal of its bits."""
    return f"(uint16_t)0x{to_bits16(value, dtype):04x}"


class LoopContext:
    """Where the statements of a split parallel loop are being rendered: the loop's layout and
    variables, and the vector loads/stores hoisted around its element loop."""

    def __init__(self, layout, full: tuple, ivar, jvar, streaming: bool):
        self.layout, self.full, self.ivar, self.jvar = layout, full, ivar, jvar
        self.streaming = streaming
        self.rows_of = layout.rows_layout() if isinstance(layout, (MmaLayout, VecLayout)) else None
        self.vec_loads: dict = {}  # Load -> register array name
        self.vec_stores: dict = {}  # id(Store) -> register array name
        self.values: dict = {}  # expression -> register array holding it (storage form)
        self.recips: dict = {}  # row divisor -> the name of its reciprocal
        self.rows_loop = isinstance(layout, (MmaRows, VecRows))
        # the loop's whole version: its vector accesses known aligned (Load, or id(Store));
        # None: the guarded version (counts and alignment tested per group)
        self.aligned: set | None = None
        # id(Store) -> (staging buffer, its panel columns): stores of the epilogue's whole tile
        # written to shared memory, for TMA stores (CudaRenderer.staged_stores)
        self.staged: dict = {}
        self.packed = False  # ... packed in registers instead (CudaRenderer.deferred_epilogue)


@dataclass
class DeferredEpilogue:
    """A persistent GEMM's epilogue whose whole tiles are stored under the next tile's first
    wgmmas (CudaRenderer.deferred_epilogue)."""
    loop: T.For  # the epilogue's loop over the accumulators
    staged: dict  # its stores: id(Store) -> (staging buffer, panel columns)
    panels: int  # panels per warpgroup's rows


def eager_subexprs(e):
    """The subexpressions of `e` that its evaluation always computes, each occurrence once (so
    a repeat counts twice): not those inside a select's branches or under && and ||, which C
    evaluates only when taken (hoisting them could read what the condition guards), nor a
    load's indices."""
    yield e
    t = type(e)
    if t is T.Select:
        children = (e.cond,)
    elif t is T.Binary and e.fn in ("and", "or") and e.dtype == "bool":
        children = ()
    elif t is T.Binary or t is T.Compare:
        children = (e.a, e.b)  # (b: None for pow, whose exponent is a number)
    elif t is T.Unary or t is T.Cast:
        children = (e.x,)
    elif t is T.Fma:
        children = (e.a, e.b, e.c)
    else:
        children = ()
    for c in children:
        if c is not None:
            yield from eager_subexprs(c)


class CudaRenderer(CStyleRenderer):
    UNARY = {
        # (exp_nonpos: an argument at most 44, which the GPU's exp takes as fast as any)
        "exp": "tilec::exp({x})", "exp_nonpos": "tilec::exp({x})", "exp2": "tilec::exp2({x})",
        "log": "tilec::log({x})", "log2": "tilec::log2({x})", "sqrt": "tilec::sqrt({x})",
        "rsqrt": "({one} / tilec::sqrt({x}))",
        "sin": "tilec::sin({x})", "cos": "tilec::cos({x})", "tanh": "tilec::tanh({x})",
        "erf": "tilec::erf({x})", "sigmoid": "tilec::sigmoid({x})", "relu": "tilec::relu({x})",
        "gelu": "tilec::gelu({x})", "gelu_tanh": "tilec::gelu_tanh({x})",
        "silu": "tilec::silu({x})", "softplus": "tilec::softplus({x})", "mish": "tilec::mish({x})",
        "abs": "tilec::abs({x})", "neg": "(-{x})",
    }
    UNARY_F64 = {}

    def __init__(self, kernel: T.TileKernel, target):
        super().__init__(kernel)
        self.target = target
        self.ctx: LoopContext | None = None
        # values an element's statements share, computed once (stmts): expression -> its local
        self.shared_values: dict = {}
        self.share_values = split_k.shared_values(True)
        # copy_g2s's narrow copies: in the kernels of one gemm bounded for one block per SM alone
        # (copy_call)
        self.narrow_copies = kernel.blocks_per_sm == 1 and \
            sum(isinstance(x, T.Gemm) for x in T.walk_stmts(kernel.body)) == 1
        self.whole: dict | None = None  # in a whole version (version_whole): loop id -> aligned
        self.copy_plans: dict = {}  # name -> declaration (CopyPlan), at the kernel's start
        # in the version of a pipelined loop whose copies lie inside the tensors (For.inside):
        # the plans those copies use (their `chunks` joins the version's test)
        self.copies_inside = False
        self.inside_plans: set = set()
        self.rotating: dict = {}  # (loop variable, S) -> the counter holding its value % S
        self.elementwise: bool | None = None  # (reads_once, computed once)
        self.edge_version = False  # in the other version: no overlapped gemm (its registers
        #                            and the copies' tests would not fit together: spills)
        # names the launcher knows (dimensions, host-computed Lets), and those of them that
        # bound a 32-bit loop counter (the launcher checks they fit)
        self.launcher_values: set = set()
        self.int32_bounds: set = set()
        # warp-specialized kernels: the byte offset of the mbarriers in shared memory, the
        # tensor maps the TMA copies and stores use ({tensor: (box rows, rank)}), and whether the
        # statements being printed run on the consumer warpgroups alone (block barriers
        # become a named barrier of theirs)
        self.ws_barriers = 0
        self.ws_maps: dict = {}
        self.ws_gemm = None
        self.once_ring = False  # (warp_specialized: the tiles copied once are a ring per tile)
        self.kv_split = False  # (warp_specialized: attention's K and V on rings of their own)
        # (warp_specialized: attention's P in two buffers, conversions' split of the statements
        # after the softmax; None: one buffer)
        self.p_split = None
        self.consumer_only = False
        self.defer: DeferredEpilogue | None = None  # (warp_specialized: deferred_epilogue)

    def binary(self, e: T.Binary) -> str:
        if e.fn == "imod" and self.rotating:
            for (k, m), name in self.rotating.items():
                form = mod_of_var(e, k)
                if form is not None and form[1] == m:
                    c = form[0] % m
                    return name if c == 0 else f"tilec::wrap_add<{m}>({name}, {c})"
        if e.fn == "pow" and is_float(e.dtype) and not (float(e.exponent).is_integer() and
                                                        abs(e.exponent) <= 4):
            return f"tilec::pow({self.expr(e.a)}, {_lit(e.exponent, e.dtype)})"
        if e.fn == "div" and self.ctx is not None and e.b in self.ctx.recips:
            # a row's elements divided by one value of the row (softmax's sum, a norm): times
            # the reciprocal the group computed once, within 1.5 ulp of the division
            return f"{self.operand(e.a, 8, False)} * {self.ctx.recips[e.b]}"
        return super().binary(e)

    def row_divisors(self, body, jvar: str) -> list:
        """f32 divisors in `body` that hold one value per row: no column variable, and read from
        registers only (so that they can be evaluated once, before the element loop)."""
        out = []
        for st in body:
            if isinstance(st, (T.If, T.For)):
                continue
            for x in T.walk_exprs(st.value) if isinstance(st, T.Store) else ():
                if isinstance(x, T.Binary) and x.fn == "div" and x.dtype == "f32" and \
                   x.b not in out and not uses_var(x.b, (jvar, "tilec_v")) and \
                   all(ld.buf in self.allocs and self.allocs[ld.buf].scope == "fragment"
                       for ld in T.walk_exprs(x.b) if isinstance(ld, T.Load)):
                    out.append(x.b)
        return out

    # ---- buffers
    def is_sixteen(self, buf: str) -> bool:
        return self.allocs[buf].dtype in SIXTEEN

    def shared_layout_type(self, a: T.Alloc) -> str:
        return a.layout.cpp_type(STORE[a.dtype])

    def smem_ref(self, a: T.Alloc, idx) -> str:
        """`buf[offset]` of element idx of a shared tile (a leading index picks the stage)."""
        *stage, r, c = idx
        off = f"{self.shared_layout_type(a)}::offset({self.expr(r)}, {self.expr(c)})"
        if stage:
            off = f"({self.expr(stage[0])}) * {a.layout.size()} + {off}"
        return f"{cname(a.name)}[{off}]"

    def reg_index(self, a: T.Alloc, idx) -> str:
        ctx = self.ctx
        if ctx is None:
            raise AssertionError(f"fragment {a.name} is accessed outside a loop split by its layout")
        if a.layout == ctx.layout and idx == ctx.full and not ctx.streaming:
            return "tilec_q" if ctx.layout.vec == 1 else f"tilec_q * {ctx.layout.vec} + tilec_v"
        if ctx.rows_of is not None and a.layout == ctx.rows_of and idx == (T.Var(ctx.ivar),):
            return "0" if ctx.streaming else ctx.layout.row_slot("tilec_q")
        if isinstance(a.layout, VecCols) and isinstance(ctx.layout, VecLayout) \
                and ctx.layout.cols_layout() == a.layout and ctx.jvar is not None \
                and idx == (T.Var(ctx.jvar),):
            return "tilec_v" if a.layout.vec > 1 else "0"  # (every group: the same columns)
        raise AssertionError(f"fragment {a.name} (layout {a.layout}) is accessed at "
                             f"[{', '.join(map(T.fmt, idx))}] in a loop split by {ctx.layout}")

    def stage_base(self, a: T.Alloc, idx) -> str:
        """Pointer to the stage of shared buffer `a` that index `idx` selects (its first index,
        when the buffer has a stage axis)."""
        if len(idx) == 3:
            return f"({cname(a.name)} + ({self.expr(idx[0])}) * {a.layout.size()})"
        return cname(a.name)

    def load_alloc(self, e: T.Load) -> str:
        a = self.allocs[e.buf]
        if a.scope == "shared" and a.layout.packed:
            r, c = e.idx[-2:]
            return (f"tilec::load_{a.dtype}({self.stage_base(a, e.idx)}, {self.expr(r)}, "
                    f"{self.expr(c)}, {_const(a.shape[-1])})")
        if a.scope == "shared":
            return self.from_storage(self.smem_ref(a, e.idx), a.dtype)
        return self.from_storage(self.reg_read(a, self.reg_index(a, e.idx)), a.dtype)

    @staticmethod
    def reg_read(a: T.Alloc, slot: str) -> str:
        """Register `slot` of fragment `a`; 16-bit fragments pack two slots per 32-bit register."""
        if a.dtype in SIXTEEN:
            return f"tilec::get16({cname(a.name)}, {slot})"
        return f"{cname(a.name)}[{slot}]"

    @staticmethod
    def reg_write(a: T.Alloc, slot: str, value: str) -> str:
        if a.dtype in SIXTEEN:
            return f"tilec::set16({cname(a.name)}, {slot}, {value});"
        return f"{cname(a.name)}[{slot}] = {value};"

    def load(self, e: T.Load) -> str:
        if self.ctx is not None and e in self.ctx.vec_loads:  # arrays hold the storage form
            return self.from_storage(f"{self.ctx.vec_loads[e]}[tilec_v]", e.dtype)
        return super().load(e)

    # ---- 16-bit floats in 16-bit registers
    def native16(self, e) -> bool:
        """Is `e` a 16-bit float operation computed in 16-bit registers?"""
        if getattr(e, "dtype", None) not in SIXTEEN:
            return False
        if isinstance(e, T.Binary):
            return e.fn in NATIVE16 and e.a.dtype == e.b.dtype == e.dtype
        if isinstance(e, T.Unary):
            return e.fn in NATIVE16_UNARY and e.x.dtype == e.dtype
        return False

    def expr(self, e) -> str:
        if e in self.shared_values:  # (16-bit ones hold the value rounded, as __half etc.)
            name = self.shared_values[e]
            return f"tilec::to_f32({name})" if e.dtype in SIXTEEN else name
        if self.ctx is not None and e in self.ctx.values:  # computed for the whole group
            return self.from_storage(f"{self.ctx.values[e]}[tilec_v]", e.dtype)
        if self.native16(e):
            return f"tilec::to_f32({self.hexpr(e)})"
        return super().expr(e)

    def hexpr(self, e) -> str:
        """A 16-bit float expression as a `__half` / `__nv_bfloat16` value: native operations on
        its operands' bits, loads as their bits, anything else computed in f32 and rounded once."""
        dt = e.dtype
        if e in self.shared_values:
            return self.shared_values[e]
        if self.ctx is not None and e in self.ctx.values:
            return f"tilec::as_{dt}({self.ctx.values[e]}[tilec_v])"
        if self.native16(e):
            if isinstance(e, T.Binary):
                return f"{NATIVE16[e.fn]}({self.hexpr(e.a)}, {self.hexpr(e.b)})"
            return f"{NATIVE16_UNARY[e.fn]}({self.hexpr(e.x)})"
        if isinstance(e, T.Const):
            return f"tilec::as_{dt}({bits16(float(e.value), dt)})"
        if isinstance(e, T.Load):
            raw = self.storage_ref(e)
            if raw is not None:
                return f"tilec::as_{dt}({raw})"
        if isinstance(e, T.Cast) and hasattr(e.x, "dtype"):
            return f"tilec::to_{dt}({self.cast(self.expr(e.x), e.x.dtype, 'f32')})"
        return f"tilec::to_{dt}({self.expr_unrounded(e)})"

    def storage_ref(self, e: T.Load):
        """The register or memory reference that holds a loaded value's bits (None for 4-bit
        values, which are unpacked)."""
        if self.ctx is not None and e in self.ctx.vec_loads:
            return f"{self.ctx.vec_loads[e]}[tilec_v]"
        if e.buf in self.allocs:
            a = self.allocs[e.buf]
            if a.scope == "shared":
                return None if a.layout.packed else self.smem_ref(a, e.idx)
            return self.reg_read(a, self.reg_index(a, e.idx))
        p = self.globals[e.buf]
        return None if p.dtype in ("u4", "i4") else f"{cname(p.name)}[{self.global_offset(p, e.idx)}]"

    def stored16(self, value, dtype: str) -> str:
        """The bits of `value` stored into a 16-bit buffer of `dtype`: a value of that dtype as
        its 16-bit result, any other converted once."""
        if isinstance(value, T.Cast) and value.dtype == dtype and hasattr(value.x, "dtype"):
            value = value.x  # the conversion to 16 bits is the store's own
        vd = getattr(value, "dtype", "i64")
        if vd == dtype:
            return f"tilec::bits({self.hexpr(value)})"
        return self.to_storage(self.cast(self.expr(value), vd, "f32"), dtype)

    def stmts(self, ss, depth: int):
        """Statements; in a parallel loop's element body, each value its statements compute more
        than once (a fused intermediate read by several outputs or operations: the expression
        trees repeat it) is computed once, into a local declared before the first statement
        that reads it. nvcc does not merge repeats through 16-bit conversions (its cvt and f16
        arithmetic are asm), so without this an f16 chain computed each repeat again."""
        if self.ctx is None or not self.share_values:
            super().stmts(ss, depth)
            return
        counts: dict = {}
        for st in ss:
            if isinstance(st, (T.Store, T.Let)):
                for x in eager_subexprs(st.value):
                    counts[x] = counts.get(x, 0) + 1
        added = []
        for st in ss:
            if isinstance(st, (T.Store, T.Let)):
                # children before their parents: each local reads the ones inside it
                for x in sorted(dict.fromkeys(eager_subexprs(st.value)),
                                key=lambda x: sum(1 for _ in T.walk_exprs(x))):
                    if counts[x] > 1 and x not in self.shared_values and \
                            not isinstance(x, (T.Var, T.Const, T.Load)):
                        name = self.fresh("tilec_c")
                        value = self.hexpr(x) if x.dtype in SIXTEEN else self.expr(x)
                        self.emit(f"const auto {name} = {value};", depth)
                        self.shared_values[x] = name
                        added.append(x)
            getattr(self, "s_" + type(st).__name__)(st, depth)
        for x in added:
            del self.shared_values[x]

    def alloc_value(self, buf: str, value: str, vdtype: str) -> str:
        dt = self.allocs[buf].dtype
        if dt in SIXTEEN + FP8:  # (tile buffers of narrow floats hold their bits)
            return self.to_storage(self.cast(value, vdtype, "f32"), dt)
        return self.cast(value, vdtype, dt)

    def store_expr(self, buf: str, value) -> str:
        dtype = self.allocs[buf].dtype if buf in self.allocs else self.globals[buf].dtype
        if dtype in SIXTEEN:
            return self.stored16(value, dtype)
        if dtype in FP8 and isinstance(value, T.Load) and value.dtype == dtype:
            raw = self.storage_ref(value)
            if raw is not None:  # fp8 bits moved as they are
                return raw
        return super().store_expr(buf, value)

    # ---- statements
    def s_Store(self, s: T.Store, depth):
        ctx = self.ctx
        if ctx is not None and id(s) in ctx.vec_stores:  # one element of a vector store
            self.emit(f"{ctx.vec_stores[id(s)]}[tilec_v] = {self.store_expr(s.buf, s.value)};",
                      depth)
            return
        if s.buf in self.allocs:
            a = self.allocs[s.buf]
            if a.scope == "shared":
                self.emit(f"{self.smem_ref(a, s.idx)} = {self.store_expr(s.buf, s.value)};", depth)
            else:
                self.emit(self.reg_write(a, self.reg_index(a, s.idx), self.store_expr(s.buf, s.value)),
                          depth)
            return
        p = self.globals[s.buf]
        line = f"{cname(s.buf)}[{self.global_offset(p, s.idx)}] = {self.store_expr(s.buf, s.value)};"
        if ctx is not None and ctx.rows_loop:  # every thread holding the row has the value
            line = f"if ({ctx.layout.leader()}) {line}"
        self.emit(line, depth)

    def s_Fill(self, s: T.Fill, depth):
        a = self.allocs[s.buf]
        v = self.alloc_value(s.buf, self.expr(s.value), s.value.dtype)
        if a.scope == "shared":
            n = a.layout.size() * (_const(a.shape[0]) if len(a.shape) == 3 else 1)
            self.emit(f"for (int tilec_e = tilec_tid; tilec_e < {n}; tilec_e += {self.k.threads}) "
                      f"{cname(s.buf)}[tilec_e] = {v};", depth)
            return
        self.emit("#pragma unroll", depth)
        self.emit(f"for (int tilec_e = 0; tilec_e < {a.layout.slots()}; ++tilec_e) "
                  f"{self.reg_write(a, 'tilec_e', v)}", depth)

    def s_Copy(self, s: T.Copy, depth):
        dst = self.allocs[s.dst.buf]
        src = self.globals[s.src.buf]
        rows, cols = (_const(x) for x in dst.shape[-2:])
        dims = [pdim(d) for d in src.shape]
        offs = [self.operand(o, 12, True) for o in s.src.offsets]
        # chunks of 16 bytes lie wholly inside or outside the tensor when the window's column
        # offset is a multiple of a chunk (and, checked at run time, so is the row stride)
        chunk = 16 // (BYTES[dst.dtype] if not dst.layout.packed else 1)
        whole = multiple_of(s.src.offsets[-1], chunk * (2 if dst.layout.packed else 1))
        if dst.layout.packed:  # 4-bit values: copy the bytes (the window starts on a byte)
            cols = dst.layout.cols
            dims[-1] = f"(({dims[-1]} + 1) / 2)"
            offs[-1] = f"({offs[-1]}) / 2"
        start = None  # row-major offset of the window's first element
        for d, o in zip(dims, offs):
            start = o if start is None else f"({start}) * {d} + {o}"

        def left(dim, off):  # how much of the tensor remains from `off` on
            return dim if off == "0" else f"{dim} - {off}"
        ptr = cname(dst.name)
        if s.dst.offsets:
            ptr = f"{ptr} + ({self.expr(s.dst.offsets[0])}) * {dst.layout.size()}"
        self.emit(f"// {'issue ' if s.async_ else ''}copy "
                  f"{T.fmt(T.Load(s.src.buf, s.src.offsets, src.dtype))} -> {s.dst.buf}", depth)
        tparams = f"{rows}, {cols}, {self.k.threads}, {self.shared_layout_type(dst)}"
        if whole and self.copies_inside:
            plan = f"tilec_plan_{cname(src.name)}_{cname(dst.name)}"
            self.copy_plans[plan] = (f"const auto {plan} = tilec::copy_plan<{tparams}>("
                                     f"{cname(src.name)}, {dims[-1]});")
            self.inside_plans.add(plan)
            self.emit(f"tilec::copy_g2s_inside<{str(s.async_).lower()}>({plan}, {ptr}, "
                      f"{cname(src.name)} + {start}, {dims[-1]});", depth)
            return
        # (elsewhere no plan: its registers live through the kernel, and in loops that are not
        # versioned it saves only a few instructions per copy; attention spilled more with it)
        self.copy_call(s, tparams, whole, [ptr, f"{cname(src.name)} + {start}", dims[-1],
                                           left(dims[-2], offs[-2]), left(dims[-1], offs[-1])],
                       depth)

    def copy_call(self, s: T.Copy, tparams: str, whole: bool, args: list, depth):
        """The call of a tile copy (dst, src, row stride, rows and columns left in the tensor).
        Narrow copies (copy_g2s) in the kernels of one gemm bounded for one block per SM alone:
        under a tighter bound they slowed the f32 X @ W.T whose rows they never copied (13% at
        4096^3, an H100), and the loops of attention's two gemms are left as they were
        measured. (Copies that are not asynchronous take none: the flag is left out.)"""
        narrow = "" if not s.async_ or self.narrow_copies else ", false"
        self.emit(f"tilec::copy_g2s<{tparams}, {str(s.async_).lower()}, {str(whole).lower()}"
                  f"{narrow}>({', '.join(args)});", depth)

    def s_Commit(self, s, depth):
        self.emit("tilec::cp_async_commit();", depth)

    def s_Wait(self, s: T.Wait, depth):
        self.emit(f"tilec::cp_async_wait<{s.pending}>();", depth)

    def s_Barrier(self, s, depth):
        if self.consumer_only and self.k.pingpong:  # (one warpgroup: its own named barrier)
            self.emit("tilec::sm90::consumer_sync<128>(1 + tilec_wg);", depth)
            return
        if self.consumer_only:
            self.emit(f"tilec::sm90::consumer_sync<{self.k.warp_specialize * 128}>(1);", depth)
            return
        self.emit("__syncthreads();", depth)

    def s_Allreduce(self, s: T.Allreduce, depth):
        a = self.allocs[s.buf]
        op = {"sum": "tilec::OpSum", "max": "tilec::OpMax", "min": "tilec::OpMin"}[s.fn]
        if isinstance(a.layout, MmaRows):
            assert a.layout.warps_n == 1, "row values of an accumulator split across warps"
            self.emit(f"tilec::quad_allreduce<{op}>({cname(s.buf)});", depth)
        elif isinstance(a.layout, (VecRows, VecCols)):
            if self.consumer_only:  # (its __syncthreads would wait for the producer forever)
                raise AssertionError(f"a block-wide allreduce of {s.buf} in the consumer "
                                     "warpgroups of a warp-specialized kernel")
            if isinstance(a.layout, VecCols):
                self.emit(f"tilec::block_col_allreduce<{op}, {self.k.threads}, "
                          f"{a.layout.per_row}>({cname(s.buf)});", depth)
            else:
                self.emit(f"{cname(s.buf)}[0] = tilec::block_allreduce<{op}, {self.k.threads}>"
                          f"({cname(s.buf)}[0]);", depth)
        else:
            raise AssertionError(f"allreduce of {s.buf} with layout {a.layout}")
        if s.fn == "sum" and a.dtype in ("u4", "i4"):  # (summed in 8 bits: it wraps in 4)
            self.emit(f"for (int tilec_e = 0; tilec_e < {a.layout.slots()}; ++tilec_e) "
                      f"{cname(s.buf)}[tilec_e] = "
                      f"{self.rounded(f'{cname(s.buf)}[tilec_e]', a.dtype)};", depth)

    def gemm_args(self, L) -> str:
        """Template arguments a target's tile GEMMs take after tilec_cuda.h's (accumulator
        layout L): none here (HIP: its MFMA tile)."""
        return ""

    def check_gemm(self, s: T.Gemm, a: T.Alloc, L):
        """A target's own conditions on a gemm it renders (HIP: its MFMA layouts)."""

    def s_Gemm(self, s: T.Gemm, depth):
        a, b, c = self.allocs[s.a], self.allocs[s.b], self.allocs[s.c]
        L = c.layout
        self.check_gemm(s, a, L)
        bk = _const(s.k_extent(a.shape))
        warps = f"{L.rows}, {L.cols}, {bk}, {L.warps_m}, {L.warps_n}"
        more = self.gemm_args(L)

        ptr = self.operand_ptr
        lb = self.shared_layout_type(b)
        mma = layout.on_matrix_units(s, self.allocs, self.target.resources)
        tb = str(s.transpose_b).lower()
        if a.scope != "shared":
            assert isinstance(a.layout, MmaLayout) and a.layout.warps_n == 1 and \
                not s.transpose_a, f"gemm with {s.a} in registers needs whole rows per warp"
            if mma:
                self.emit(f"tilec::gemm_rs<{warps}, {tb}, {lb}, {kind(b.dtype)}{more}>("
                          f"{cname(s.a)}, {ptr(s.b, s.b_stage)}, {cname(s.c)});", depth)
                return
            assert a.dtype not in SIXTEEN, f"{a.dtype} fragment {s.a} times {b.dtype} {s.b}"
            self.emit(f"tilec::gemm_simt_rs<{warps}, {tb}, {lb}, {kind(b.dtype)}, {STORE[a.dtype]}, "
                      f"{STORE[c.dtype]}{more}>({cname(s.a)}, {ptr(s.b, s.b_stage)}, "
                      f"{cname(s.c)});", depth)
            return
        la = self.shared_layout_type(a)
        ta = str(s.transpose_a).lower()
        if self.target.resources.tf32 and layout.on_tf32_units(s, self.allocs):
            self.emit(f"tilec::gemm_ss_tf32<{warps}, {ta}, {tb}, {la}, {lb}>({ptr(s.a, s.a_stage)}, "
                      f"{ptr(s.b, s.b_stage)}, {cname(s.c)});", depth)
        elif mma and s.next_stage is not None and not self.edge_version:
            # overlapped: the k-steps' fragments (the first loaded before) and, before the last
            # k-step, the sync statements, the loads of the next stage's first fragments and the
            # copies of a later tile into the stage this iteration read
            self.emit(f"tilec::gemm_ss_overlapped({self.fragments(s)}, {ptr(s.a, s.a_stage)}, "
                      f"{ptr(s.b, s.b_stage)}, {ptr(s.a, s.next_stage)}, {ptr(s.b, s.next_stage)}, "
                      f"{cname(s.c)},", depth)
            for part, last, what in ((s.sync, False, "before the last k-step"),
                                     (s.refill, True, "after it: the stage this iteration read")):
                self.emit(f"[&] {{  // {what}", depth + 2)
                self.stmts(part, depth + 3)
                self.emit("});" if last else "},", depth + 2)
        elif mma:  # (an overlapped gemm in the edge version: its statements after a plain one)
            self.emit(f"tilec::gemm_ss<{self.ss_params(s)}{more}>({ptr(s.a, s.a_stage)}, "
                      f"{ptr(s.b, s.b_stage)}, {cname(s.c)});", depth)
            self.stmts(s.sync, depth)
            self.stmts(s.refill, depth)
        else:
            acc = STORE[c.dtype]
            self.emit(f"tilec::gemm_simt<{warps}, {ta}, {tb}, {la}, {lb}, {kind(a.dtype)}, "
                      f"{kind(b.dtype)}, {acc}{more}>({ptr(s.a, s.a_stage)}, "
                      f"{ptr(s.b, s.b_stage)}, {cname(s.c)});", depth)

    def s_For(self, s: T.For, depth):
        # (only loops whose gemm overlaps their end: elsewhere the second version's
        # registers spill, e.g. W4A16's dequantizing K loop, for little gain)
        if s.inside is None or self.copies_inside or not any(
                isinstance(x, T.Gemm) and x.next_stage is not None for x in s.body):
            self.sequential(s, depth)
            return
        # a pipelined loop, twice: where every copy of it reads whole 16-byte chunks inside
        # its tensor (tested once per block), copies without tests and the gemm overlapped
        # with the loop's end; the loop of the blocks at the tensors' edges keeps the tests
        mark = len(self.lines)
        self.copies_inside = True
        self.sequential(s, depth + 1)
        self.copies_inside = False
        inside, plans = self.lines[mark:], sorted(self.inside_plans)
        del self.lines[mark:]
        self.inside_plans.clear()
        cond = " && ".join([self.expr(s.inside)] + [f"{p}.chunks" for p in plans])
        self.emit(f"if ({cond}) {{", depth)
        self.emit("// the copies of every iteration read whole chunks inside the tensors", depth + 1)
        self.lines += inside
        self.emit("} else {", depth)
        self.edge_version = True
        self.sequential(s, depth + 1)
        self.edge_version = False
        self.emit("}", depth)

    # ---- Hopper: the warp-specialized kernel (TileKernel.warp_specialize) -------------------
    def warp_specialized(self, body, depth: int):
        """The body of a warp-specialized kernel: mbarriers set up, then the producer warpgroup
        (its first thread issues every TMA copy: those before the `warp_specialized` loop once,
        on their own barrier, those of the loop into its stages) and the consumer warpgroups
        (the statements before the loop, the loop's other statements with its gemms on wgmma,
        then the statements after it: the epilogue). A persistent kernel does that tile after
        tile, in both roles; one counter of loop iterations per role runs the stage ring across
        tiles. Its tiles copied once per tile (attention's Q) are a ring of one stage: the
        consumers free it once their loop's last product that reads it is complete, so the
        producer loads the next tile's while they finish this one."""
        k = self.k
        (loop,) = [st for st in body if isinstance(st, T.For) and st.kind == "warp_specialized"]
        at = body.index(loop)
        pre_copies = [st for st in body[:at] if isinstance(st, T.Copy)]
        pre = [st for st in body[:at] if not isinstance(st, (T.Alloc, T.Copy))]
        post = body[at + 1:]
        S, consumers = loop.stages, k.warp_specialize
        copies = [st for st in loop.body if isinstance(st, T.Copy)]
        gemms = [st for st in loop.body if isinstance(st, T.Gemm)]
        # the GEMM's K loop (copies and one gemm): wgmma k-tiles kept in flight across
        # iterations; else each gemm completes before the statements after it
        self.ws_gemm = gemms[0] if len(gemms) == 1 and len(loop.body) == len(copies) + 1 else None
        if pre_copies and k.persistent and (k.cluster > 1 or k.pingpong):
            raise AssertionError("tiles copied before the loop of a persistent kernel of "
                                 "clusters or ping-pong")
        self.once_ring = bool(pre_copies) and k.persistent
        if self.once_ring and (self.ws_gemm is not None or any(
                ld.buf == c.dst.buf for st in post for ld in loads_in(st) for c in pre_copies)):
            # (consumer_loop frees them after its loop; an epilogue must not read them)
            raise AssertionError("tiles copied once per tile of a GEMM's K loop, or read by "
                                 "the epilogue")
        # attention's K and V tiles on rings of their own (resources.wgmma_attention's split):
        # with the products overlapped and without turns, the consumers free a stage's K once
        # its Q K^T is complete, before its P V; the producer issues a key tile's K, then the
        # previous one's V, the order the consumers take them
        cfg = self.target.resources.wgmma_attention or (0,) * 8
        parts = self.two_products(loop) if self.ws_gemm is None else None
        v_copies = [c for c in copies if parts is not None and c.dst.buf == parts[4].b]
        self.kv_split = bool(cfg[6] and cfg[3] and parts is not None and k.cluster == 1 and
                             not (cfg[4] and k.warp_specialize == 2) and len(v_copies) == 1 and
                             len(copies) > 1)
        # attention's P in two buffers (resources.wgmma_attention's last field: overlapped_loop)
        self.p_split = self.conversions(loop, parts) if (
            cfg[7] == 2 and cfg[3] and parts is not None and
            not (cfg[4] and k.warp_specialize == 2) and
            self.launcher_bound(loop.extents[0]) is not None) else None
        # the producer's Lets: those its copies' offsets and the loop's trip count read
        read = {x.name for c in pre_copies + copies for o in c.src.offsets for x in T.walk_exprs(o)
                if isinstance(x, T.Var)} | {x.name for x in T.walk_exprs(loop.extents[0])
                                            if isinstance(x, T.Var)}
        lets = []
        for st in reversed([st for st in pre if isinstance(st, T.Let)]):
            if st.name in read:
                lets.insert(0, st)
                read |= {x.name for x in T.walk_exprs(st.value) if isinstance(x, T.Var)}
        self.emit(f"// warp roles: warpgroups 0-{consumers - 1} multiply (wgmma) and run the epilogue; "
                  f"warpgroup {consumers} loads (TMA)", depth)
        self.emit(f"uint64_t* tilec_full = reinterpret_cast<uint64_t*>(tilec_smem + "
                  f"{self.ws_barriers});  // full[s]: stage s has landed", depth)
        self.emit(f"uint64_t* tilec_empty = tilec_full + {S};  // empty[s]: the consumers are done "
                  "with stage s", depth)
        last = "tilec_empty"  # (the barriers after the rings start after this ring)
        if self.kv_split:
            self.emit("// K and V on rings of their own: full[s] and empty[s] are stage s's K tile, "
                      "full_v[s] and empty_v[s] its V tile", depth)
            self.emit(f"uint64_t* tilec_full_v = tilec_empty + {S};", depth)
            self.emit(f"uint64_t* tilec_empty_v = tilec_full_v + {S};", depth)
            last = "tilec_empty_v"
        if k.pingpong:
            # the warpgroups' turns: each waits for the other's K loop to end before its own (a
            # wait on the ring's barriers by parity must be at most one pass ahead, and the
            # turns keep one warpgroup's products beside the other's epilogue)
            self.emit(f"uint64_t* tilec_order = {last} + {S};  // order[g]: warpgroup g's turn",
                      depth)
        if pre_copies:
            self.emit(f"uint64_t* tilec_once = {last} + {S};  // the tiles copied once have "
                      "landed", depth)
        if self.once_ring:
            self.emit("uint64_t* tilec_once_free = tilec_once + 1;  // the consumers are done "
                      "with them", depth)
        self.emit("if (tilec_tid == 0) {", depth)
        self.emit(f"for (int tilec_s = 0; tilec_s < {S}; ++tilec_s) {{", depth + 1)
        self.emit("tilec::sm90::mbar_init(&tilec_full[tilec_s], 1);", depth + 2)
        # (ping-pong: one warpgroup reads each stage)
        # one arrival per consumer warp (its first lane, once the warpgroup's wgmmas that read
        # the stage are complete); clusters: the consumer warps of every block of the cluster
        # free a stage, since each block writes part of the B tile into all of them
        self.emit(f"tilec::sm90::mbar_init(&tilec_empty[tilec_s], "
                  f"{4 if k.pingpong else consumers * 4 * k.cluster});", depth + 2)
        if self.kv_split:
            self.emit("tilec::sm90::mbar_init(&tilec_full_v[tilec_s], 1);", depth + 2)
            self.emit(f"tilec::sm90::mbar_init(&tilec_empty_v[tilec_s], {consumers * 4});", depth + 2)
        self.emit("}", depth + 1)
        if k.pingpong:  # order[g]: warpgroup g may start its next tile's products
            self.emit("tilec::sm90::mbar_init(&tilec_order[0], 128);", depth + 1)
            self.emit("tilec::sm90::mbar_init(&tilec_order[1], 128);", depth + 1)
        if pre_copies:
            self.emit("tilec::sm90::mbar_init(tilec_once, 1);", depth + 1)
        if self.once_ring:  # (one arrival per consumer warp, as for a stage)
            self.emit(f"tilec::sm90::mbar_init(tilec_once_free, {consumers * 4});", depth + 1)
        self.emit("tilec::sm90::mbar_init_fence();", depth + 1)
        self.emit("}", depth)
        if k.cluster > 1:
            # (the other block's copies and arrivals reach these barriers: they must exist)
            self.emit("tilec::sm90::cluster_sync();", depth)
            self.emit("const uint32_t tilec_rank = tilec::sm90::cluster_rank();  // in the cluster",
                      depth)
            self.emit(f"// the cluster's tiles: {k.cluster} neighbouring M tiles, rank r on the "
                      "r-th", depth)
            self.emit(f"const int64_t tilec_cgrid[3] = {{ tilec_grid[0], (tilec_grid[1] + "
                      f"{k.cluster - 1}) / {k.cluster}, tilec_grid[2] }};", depth)
            self.emit("const int64_t tilec_tiles = tilec_cgrid[0] * tilec_cgrid[1] * tilec_cgrid[2];",
                      depth)
        else:
            self.emit("__syncthreads();", depth)
            if k.persistent:
                self.emit("const int64_t tilec_tiles = tilec_grid[0] * tilec_grid[1] * "
                          "tilec_grid[2];", depth)
        # producer
        self.emit(f"if (tilec_warp >= {consumers * 4}) {{  // the producer warpgroup", depth)
        producer_regs = PRODUCER_REGS if self.p_split is None else PRODUCER_REGS_DOUBLE_P
        self.emit(f"tilec::sm90::setmaxnreg_dec<{producer_regs}>();", depth + 1)
        self.emit(f"if (tilec_tid == {consumers * 128}) {{  // its first thread issues every copy",
                  depth + 1)
        for c in dict.fromkeys(c.src.buf for c in pre_copies + copies):
            self.emit(f"tilec::sm90::prefetch_tensor_map(&tilec_map_{cname(c)});", depth + 2)
        self.emit("uint32_t tilec_it = 0;  // K tiles issued: stage tilec_it % "
                  f"{S}, pass tilec_it / {S}", depth + 2)
        if self.once_ring:
            self.emit("uint32_t tilec_t = 0;  // the block's tiles so far", depth + 2)
        d = depth + 2
        if k.persistent:
            self.tile_loop(d)
            d += 1
        for st in lets:
            self.stmts([st], d)

        def copy_once(d: int):
            nbytes = sum(self.tile_bytes(c) for c in pre_copies)
            if self.once_ring:
                self.emit("tilec::sm90::mbar_wait(tilec_once_free, (tilec_t & 1) ^ 1);  // (free "
                          "at once for the first tile)", d)
            self.emit(f"tilec::sm90::mbar_arrive_expect_tx(tilec_once, {nbytes});", d)
            for c in pre_copies:
                self.tma_copy(c, d, "tilec_once")
        if pre_copies and not self.once_ring:
            copy_once(d)
        ring = [c for c in copies if not self.kv_split or c not in v_copies]
        nbytes = sum(self.tile_bytes(c) for c in ring)
        j = loop.vars[0]

        def copy_v(at, it: str, d: int):
            """The V tile of key tile `at` (a Tile IR expression), the `it`-th of its ring."""
            (c,) = v_copies
            c = map_exprs(c, lambda x: at if isinstance(x, T.Var) and x.name == j else None)
            self.emit(f"const uint32_t tilec_sv = ({it}) % {S};", d)
            self.emit(f"tilec::sm90::mbar_wait(&tilec_empty_v[tilec_sv], ((({it}) / {S}) & 1) ^ 1);",
                      d)
            self.emit(f"tilec::sm90::mbar_arrive_expect_tx(&tilec_full_v[tilec_sv], "
                      f"{self.tile_bytes(c)});", d)
            self.tma_copy(c, d, "&tilec_full_v[tilec_sv]", "tilec_sv")
        self.loop_body = loop.body
        self.loop_head(j, loop.extents[0], d)
        self.emit(f"const uint32_t tilec_s = tilec_it % {S};", d + 1)
        self.emit(f"tilec::sm90::mbar_wait(&tilec_empty[tilec_s], ((tilec_it / {S}) & 1) ^ 1);  "
                  "// (free at once on the first pass)", d + 1)
        self.emit(f"tilec::sm90::mbar_arrive_expect_tx(&tilec_full[tilec_s], {nbytes});", d + 1)
        for c in ring:
            self.tma_copy(c, d + 1)
        if self.kv_split:
            self.emit(f"if ({cname(j)} > 0) {{  // the previous key tile's V, after this one's K",
                      d + 1)
            copy_v(T.Binary("sub", T.Var(j), T.Const(1, "i64"), "i64"), "tilec_it - 1", d + 2)
            self.emit("}", d + 1)
        self.emit("++tilec_it;", d + 1)
        if self.once_ring:
            # (the tile's first stage is issued as soon as it is free, before the wait for the
            # consumers to finish the previous tile's products)
            self.emit(f"if ({cname(loop.vars[0])} == 0) {{  // then this tile's copied-once tiles",
                      d + 1)
            copy_once(d + 2)
            self.emit("}", d + 1)
        self.emit("}", d)
        if self.kv_split:
            self.emit(f"if ({self.expr(loop.extents[0])} > 0) {{  // the last key tile's V", d)
            copy_v(T.Binary("sub", loop.extents[0], T.Const(1, "i64"), "i64"), "tilec_it - 1",
                   d + 1)
            self.emit("}", d)
        if self.once_ring:
            self.emit(f"if ({self.expr(loop.extents[0])} <= 0) {{  // (no key tiles: these alone)", d)
            copy_once(d + 1)
            self.emit("}", d)
            self.emit("++tilec_t;", d)
        if k.persistent:
            self.emit("}", d - 1)
        self.emit("}", depth + 1)
        # consumers
        self.emit("} else {  // the consumer warpgroups", depth)
        self.emit(f"tilec::sm90::setmaxnreg_inc<{consumer_regs(consumers, producer_regs)}>();",
                  depth + 1)
        self.consumer_only = True
        d = depth + 1
        if k.pingpong:
            # warpgroup g takes the block's tiles g, g + 2, ...: the K tiles of the block's j-th
            # tile are the ring's j * n .. j * n + n - 1 (n K tiles per tile)
            n = self.expr(loop.extents[0])
            self.emit("const int tilec_wg = tilec_warp / 4;  // this consumer warpgroup", d)
            self.emit(f"uint32_t tilec_it = tilec_wg * (uint32_t){n};  // the ring's K tile", d)
            self.emit("uint32_t tilec_turn = 0;  // this warpgroup's tiles so far", d)
            self.tile_loop(d, "tilec_wg", 2)
            d += 1
        else:
            self.emit("uint32_t tilec_it = 0;  // K tiles consumed", d)
            if self.once_ring:
                self.emit("uint32_t tilec_t = 0;  // the block's tiles so far", d)
            self.defer = self.deferred_epilogue(post)
            if self.defer is not None:
                self.flush_function(d)
            if k.persistent:
                self.tile_loop(d)
                d += 1
        self.stmts(tuple(pre), d)
        if pre_copies:
            self.emit(f"tilec::sm90::mbar_wait(tilec_once, {'tilec_t & 1' if self.once_ring else 0});"
                      "  // the tiles copied once", d)
        if self.ws_gemm is not None:
            self.gemm_k_loop(loop, d)
        else:
            self.consumer_loop(loop, d)
        self.stmts(tuple(post), d)
        if self.once_ring:
            self.emit("++tilec_t;", d)
        self.consumer_only = False
        if k.pingpong:
            self.emit(f"tilec_it += (uint32_t){n};  // (the other warpgroup's tile)", d)
            self.emit("++tilec_turn;", d)
        if d > depth + 1:
            self.emit("}", depth + 1)
        if self.defer is not None:
            self.emit("if (tilec_pend) tilec_flush(0, "
                      f"{self.defer.panels});  // the block's last tile", depth + 1)
            self.defer = None
        if k.tma_stores:  # (the block's shared memory outlives its last stores)
            self.emit("if (tilec_tid % 128 == 0) tilec::sm90::bulk_wait<0>();  // the TMA stores "
                      "are done", depth + 1)
        self.emit("}", depth)
        if k.cluster > 1:  # (no block leaves while the other may still reach its barriers)
            self.emit("tilec::sm90::cluster_sync();", depth)

    def tile_bytes(self, c: T.Copy) -> int:
        """Bytes a tile copy writes into one stage of its shared buffer."""
        a = self.allocs[c.dst.buf]
        return a.layout.size() * BYTES[a.dtype]

    def gemm_k_loop(self, loop: T.For, d: int):
        """The consumers' K loop of a warp-specialized GEMM: each K tile's wgmmas stay in
        flight while the next tile's are issued; a stage is freed once its wgmmas complete."""
        k, g, S = self.k, self.ws_gemm, loop.stages
        if k.pingpong:
            self.emit("if (tilec_wg == 1 || tilec_turn > 0)  // after the other's K loop", d)
            self.emit("tilec::sm90::mbar_wait(&tilec_order[tilec_wg], "
                      "(tilec_turn - (tilec_wg == 0 ? 1 : 0)) & 1);", d + 1)
        if g.promote:
            self.promoted_k_loop(loop, d)
            return
        self.loop_body = loop.body
        a, b, c = self.allocs[g.a], self.allocs[g.b], self.allocs[g.c]
        self.emit("uint32_t tilec_prev = 0;  // the stage of the previous K tile", d)
        self.loop_head(loop.vars[0], loop.extents[0], d)
        bk = _const(g.k_extent(a.shape))
        b_mn = not g.transpose_b
        self.emit(f"const uint32_t tilec_s = tilec_it % {S};", d + 1)
        self.emit(f"tilec::sm90::mbar_wait(&tilec_full[tilec_s], (tilec_it / {S}) & 1);", d + 1)
        self.emit("tilec::sm90::wgmma_fence();", d + 1)
        tparams = f"{c.layout.cols}, {bk}, {str(b_mn).lower()}, {wgmma_type(a.dtype)}"
        if g.transpose_a:  # A MN-major (the tile's rows are K, its columns M): A_MN, after
            tparams += ", 128, true"  # A_ROWS at its default (a K-major A's panel height)
        if k.pingpong:  # the warpgroup's own tile: one wgmma row of 64 per half
            halves = c.layout.rows // 64
            self.emit(f"// this warpgroup's tile: {g.a}{'.T' if g.transpose_a else ''} "
                      f"({halves} x 64 rows) times {g.b} "
                      f"({'rows of N' if b_mn else 'rows of K'}), {halves * wgmmas(bk, a.dtype)} wgmmas",
                      d + 1)
            for h in range(halves):
                self.emit(f"tilec::sm90::wgmma_tile<{tparams}>({cname(g.c)}" +
                          (f" + {h * c.layout.cols // 2}" if h else "") + ", "
                          f"{cname(g.a)} + tilec_s * {a.layout.size()}" +
                          (f" + {h * 64 * bk}" if h else "") +
                          f", {cname(g.b)} + tilec_s * {b.layout.size()});", d + 1)
        else:
            self.emit(f"// this warpgroup's 64 rows of {g.a}{'.T' if g.transpose_a else ''} "
                      f"times {g.b} ({'rows of N' if b_mn else 'rows of K'}), {wgmmas(bk, a.dtype)} wgmmas",
                      d + 1)
            self.emit(f"tilec::sm90::wgmma_tile<{tparams}>({cname(g.c)}, "
                      f"{self.ws_operands(g, 'tilec_s')});", d + 1)
        self.emit("tilec::sm90::wgmma_commit();", d + 1)
        kv = cname(loop.vars[0])
        if self.defer is not None:
            self.emit(f"if (tilec_pend && {kv} < {self.defer.panels}) tilec_flush((int){kv}, "
                      f"(int){kv} + 1);  // the previous tile's panel {kv}, beside these wgmmas",
                      d + 1)
        self.emit("tilec::sm90::wgmma_wait<1>();  // the previous K tile's wgmmas are done", d + 1)
        self.emit(f"if ({kv} > 0) {self.release('tilec_prev')}", d + 1)
        self.emit("tilec_prev = tilec_s;", d + 1)
        self.emit("++tilec_it;", d + 1)
        self.emit("}", d)
        if k.pingpong:
            self.emit("tilec::sm90::mbar_arrive(&tilec_order[1 - tilec_wg]);  // the other's turn",
                      d)
        self.emit("tilec::sm90::wgmma_wait<0>();", d)
        self.emit(f"tilec::sm90::fence_regs<{c.layout.slots()}>({cname(g.c)});", d)
        self.emit(f"if ({self.expr(loop.extents[0])} > 0) {self.release('tilec_prev')}", d)
        if self.defer is not None:
            P = self.defer.panels
            self.emit("if (tilec_pend) {  // the previous tile's panels no K tile took", d)
            self.emit(f"tilec_flush((int)tilec::imin({self.expr(loop.extents[0])}, (int64_t){P}), "
                      f"{P});", d + 1)
            self.emit("tilec_pend = false;", d + 1)
            self.emit("}", d)

    def ws_operands(self, g: T.Gemm, stage: str) -> str:
        """The A and B arguments of wgmma_tile for this consumer warpgroup's 64 rows of a
        cooperative warp-specialized GEMM's K tile at `stage`."""
        a, b = self.allocs[g.a], self.allocs[g.b]
        # (64 rows of K values; A transposed: a panel of 64 M columns of BK rows, as many)
        bk = _const(g.k_extent(a.shape))
        return (f"{cname(g.a)} + {stage} * {a.layout.size()} + (tilec_warp / 4) * "
                f"{64 * bk}, {cname(g.b)} + {stage} * {b.layout.size()}")

    def promoted_k_loop(self, loop: T.For, d: int):
        """gemm_k_loop with promoted products (Gemm.promote: fp8): the wgmmas of each group of
        promote / BK K tiles sum into a partial (the tensor cores' precision), which once they
        complete is added to the accumulators in f32 and the group's stages freed; meanwhile the
        other consumer warpgroup's wgmmas keep the tensor cores busy. With one K tile per
        partial and resources.fp8_pairs, the K tiles go in pairs instead (paired_k_loop)."""
        k, g, S = self.k, self.ws_gemm, loop.stages
        a, c = self.allocs[g.a], self.allocs[g.c]
        bk = _const(a.shape[-1])
        group = g.promote // bk  # K tiles per partial
        assert not k.pingpong and g.promote % bk == 0 and group <= S, \
            "promoted products: the cooperative kernel, whole K tiles per partial"
        kv, trip = cname(loop.vars[0]), self.expr(loop.extents[0])
        # (what the consumers read of the loop: the K tile's index, to group the K tiles)
        self.loop_body = (T.Store("tilec_k", (), T.Var(loop.vars[0])),) if group > 1 else ()
        n = c.layout.slots()
        self.emit(f"float tilec_part[{n}];  // {g.promote} values of K's products, in the tensor "
                  "cores' precision", d)
        if group == 1 and self.target.resources.fp8_pairs:
            self.paired_k_loop(loop, n, d)
            return
        self.loop_head(loop.vars[0], loop.extents[0], d)
        self.emit(f"const uint32_t tilec_s = tilec_it % {S};", d + 1)
        self.emit(f"tilec::sm90::mbar_wait(&tilec_full[tilec_s], (tilec_it / {S}) & 1);", d + 1)
        self.emit("tilec::sm90::wgmma_fence();", d + 1)
        first = f"{kv} % {group} == 0" if group > 1 else None
        self.emit(f"// this warpgroup's 64 rows of {g.a} times {g.b} (rows of "
                  f"{'K' if g.transpose_b else 'N'}), {wgmmas(bk, a.dtype)} wgmmas, into "
                  "the partial" + (" (a group's first K tile starts it)" if first else ""), d + 1)
        self.emit(f"tilec::sm90::wgmma_tile<{c.layout.cols}, {bk}, "
                  f"{str(not g.transpose_b).lower()}, {wgmma_type(a.dtype)}>(tilec_part, "
                  f"{self.ws_operands(g, 'tilec_s')}, {f'{first} ? 0 : 1' if first else '0'});",
                  d + 1)
        self.emit("tilec::sm90::wgmma_commit();", d + 1)
        body = d + 1
        if group > 1:  # the group's last K tile (or the loop's)
            self.emit(f"if ({kv} % {group} == {group - 1} || {kv} + 1 == {trip}) {{", d + 1)
            body = d + 2
        self.emit("tilec::sm90::wgmma_wait<0>();", body)
        self.emit(f"tilec::sm90::promote<{n}>({cname(g.c)}, tilec_part);  // added in f32", body)
        if group > 1:  # the group's stages: this one and the K tiles before it in the group
            self.emit(f"for (int tilec_j = 0; tilec_j <= (int)({kv} % {group}); ++tilec_j)", body)
            self.emit(self.release(f"(tilec_it - tilec_j) % {S}"), body + 1)
            self.emit("}", d + 1)
        else:
            self.emit(self.release("tilec_s"), body)
        self.emit("++tilec_it;", d + 1)
        self.emit("}", d)
        self.emit(f"tilec::sm90::fence_regs<{n}>({cname(g.c)});", d)

    def paired_k_loop(self, loop: T.For, n: int, d: int):
        """promoted_k_loop with one K tile per partial, taking the K tiles in pairs: the second
        tile's wgmmas (into a second partial) run while the first's partial is added, so the
        warpgroup's tensor-core work pauses once per pair instead of once per K tile. Both are
        complete before the loop repeats: ptxas serializes every wgmma of a loop whose
        accumulators are still being written across its back edge (C7514). An odd last K tile
        follows the loop alone."""
        g, S = self.ws_gemm, loop.stages
        a, c = self.allocs[g.a], self.allocs[g.c]
        bk = _const(a.shape[-1])
        tparams = (f"{c.layout.cols}, {bk}, {str(not g.transpose_b).lower()}, "
                   f"{wgmma_type(a.dtype)}")
        self.emit(f"float tilec_part2[{n}];  // the second K tile's of a pair", d)
        self.emit(f"const int64_t tilec_trip = {self.expr(loop.extents[0])};", d)

        def tile(part: str, stage: str, it: str, depth: int):
            self.emit(f"const uint32_t {stage} = ({it}) % {S};", depth)
            self.emit(f"tilec::sm90::mbar_wait(&tilec_full[{stage}], (({it}) / {S}) & 1);", depth)
            self.emit("tilec::sm90::wgmma_fence();", depth)
            self.emit(f"tilec::sm90::wgmma_tile<{tparams}>({part}, "
                      f"{self.ws_operands(g, stage)}, 0);", depth)
            self.emit("tilec::sm90::wgmma_commit();", depth)

        def promote(part: str, stage: str, depth: int):
            self.emit(f"tilec::sm90::promote<{n}>({cname(g.c)}, {part});  // added in f32", depth)
            self.emit(self.release(stage), depth)

        self.emit(f"// K tiles in pairs, each into a partial of its own ({bk // 32} wgmmas): the "
                  "second's wgmmas run while the first's partial is added", d)
        self.emit("for (int64_t tilec_p = 0; tilec_p + 1 < tilec_trip; tilec_p += 2) {", d)
        tile("tilec_part", "tilec_s", "tilec_it", d + 1)
        tile("tilec_part2", "tilec_s2", "tilec_it + 1", d + 1)
        self.emit("tilec::sm90::wgmma_wait<1>();  // the first K tile's", d + 1)
        promote("tilec_part", "tilec_s", d + 1)
        self.emit("tilec::sm90::wgmma_wait<0>();  // the second's", d + 1)
        promote("tilec_part2", "tilec_s2", d + 1)
        self.emit("tilec_it += 2;", d + 1)
        self.emit("}", d)
        self.emit("if (tilec_trip % 2 == 1) {  // the odd last K tile", d)
        tile("tilec_part", "tilec_s", "tilec_it", d + 1)
        self.emit("tilec::sm90::wgmma_wait<0>();", d + 1)
        promote("tilec_part", "tilec_s", d + 1)
        self.emit("++tilec_it;", d + 1)
        self.emit("}", d)
        self.emit(f"tilec::sm90::fence_regs<{n}>({cname(g.c)});", d)

    def consumer_loop(self, loop: T.For, d: int):
        """The consumers' walk of a general warp-specialized loop (attention's key loop): wait
        for the stage, run the body in order (its copies are the producer's; each gemm on wgmma,
        complete before the statements after it), free the stage. A body of two products, the
        second's A operand in registers (attention's S = Q K^T, then O += P V), runs
        overlapped instead (overlapped_loop)."""
        parts = self.two_products(loop)
        overlap, pingpong = (self.target.resources.wgmma_attention or (0,) * 6)[3:5]
        turns = parts is not None and pingpong and self.k.warp_specialize == 2
        if turns:
            self.emit("// the two warpgroups take turns issuing products (warpgroup 0 first): "
                      "one's softmax runs while the other's products do", d)
            self.emit("if (tilec_warp / 4 == 1) tilec::sm90::turn_pass(1);", d)
        if parts is not None and overlap:
            self.overlapped_loop(loop, parts, d, turns)
        else:
            S = loop.stages
            self.loop_body = loop.body
            self.loop_head(loop.vars[0], loop.extents[0], d)
            self.emit(f"const uint32_t tilec_s = tilec_it % {S};", d + 1)
            self.emit(f"tilec::sm90::mbar_wait(&tilec_full[tilec_s], (tilec_it / {S}) & 1);", d + 1)
            for st in loop.body:
                if isinstance(st, T.Copy):
                    continue
                if isinstance(st, T.Gemm):
                    self.wgmma_gemm(st, d + 1, turns)
                else:
                    self.stmts((st,), d + 1)
            self.emit(self.release("tilec_s"), d + 1)
            self.emit("++tilec_it;", d + 1)
            self.emit("}", d)
            self.free_once(d)
        if turns:  # (the other warpgroup's last turn passed)
            self.emit("if (tilec_warp / 4 == 0) tilec::sm90::turn_wait(0);", d)

    def two_products(self, loop: T.For):
        """(statements before the first gemm, the first gemm, the statements after it that do
        not touch the second gemm's operands in registers, the rest, the second gemm) of a
        loop body (copies aside) `fills of g1's accumulator, g1, ..., g2` with g2 last and its A
        operand a register fragment; else None."""
        body = [st for st in loop.body if not isinstance(st, T.Copy)]
        at = [n for n, st in enumerate(body) if isinstance(st, T.Gemm)]
        if len(at) != 2 or at[1] != len(body) - 1:
            return None
        g1, g2 = body[at[0]], body[-1]
        first, mid = body[:at[0]], body[at[0] + 1:-1]
        if self.allocs[g2.a].scope == "shared" or g2.c == g1.c or \
                not all(isinstance(st, T.Fill) and st.buf == g1.c for st in first):
            return None
        held = {g2.a, g2.c}  # (in use by the previous iteration's g2 until its wait)

        def touches(st):
            return any(isinstance(x, (T.Store, T.Fill)) and x.buf in held
                       for x in T.walk_stmts([st])) or any(ld.buf in held for ld in loads_in(st))
        cut = next((n for n, st in enumerate(mid) if touches(st)), len(mid))
        return first, g1, mid[:cut], mid[cut:], g2

    def overlapped_loop(self, loop: T.For, parts, d: int, turns: bool = False):
        """Two products per iteration, overlapped as FlashAttention-3 does within a warpgroup:
        iteration j issues its g1 (S = Q K_j^T) and the previous iteration's g2 (O += P V_{j-1},
        O already rescaled and P already written by that iteration), waits for g1 alone and runs
        the statements that only read S (the softmax) while g2 still runs, then waits for g2
        (the previous stage is then free) before the statements that touch O or P. Nothing is in
        flight across the loop's back edge: ptxas serializes every wgmma of a loop whose
        accumulators are still being written when the loop repeats (C7514/C7515; that form
        measured 0.61x cuDNN). The first iteration (no g2 yet) is peeled off, the last g2
        follows the loop. With `turns`, each issue of products is the warpgroup's turn
        (ping-pong).

        With `p_split` (resources.wgmma_attention's last field, where `conversions` allows),
        P has two buffers that the iterations take in turn (the loop in pairs of iterations,
        then an odd one): an iteration converts its P into the buffer its g2 does not read,
        before the wait for g2, so that nothing after the softmax but O's rescaling waits for
        g2.

        The wait for g2 goes in both arms of O's rescaling (its warp vote) where that comes
        first: ptxas's scheduler issued the wait before the softmax's exponentials while the
        two shared a basic block, so they never ran beside g2; a block of its own keeps it after
        them (test_hopper reads it in the SASS)."""
        first, g1, reads, rest, g2 = parts
        S, n = loop.stages, self.expr(loop.extents[0])
        c1, c2 = self.allocs[g1.c], self.allocs[g2.c]
        j = cname(loop.vars[0])
        split = self.p_split  # (never with turns: warp_specialized)

        def turn(what: str, depth: int):
            if turns:
                self.emit(f"tilec::sm90::turn_{what}(tilec_warp / 4);", depth)

        def issue(g: T.Gemm, stage: str, depth: int):
            self.emit("tilec::sm90::wgmma_fence();", depth)
            self.wgmma_issue(g, depth, stage)
            self.emit("tilec::sm90::wgmma_commit();", depth)

        v = "_v" if self.kv_split else ""  # (the ring that holds V)

        def wait_v(depth: int):  # (on its own ring: the previous key tile's V has landed)
            if self.kv_split:
                self.emit(f"tilec::sm90::mbar_wait(&tilec_full_v[tilec_prev], ((tilec_it - 1) / "
                          f"{S}) & 1);", depth)

        def issue_g1(depth: int):  # (the stage of this key tile, once it has landed)
            self.emit(f"const uint32_t tilec_s = tilec_it % {S};", depth)
            self.emit(f"tilec::sm90::mbar_wait(&tilec_full[tilec_s], (tilec_it / {S}) & 1);",
                      depth)
            self.stmts(tuple(first), depth)
            issue(g1, "tilec_s", depth)

        def last_g2(a: str, depth: int):  # (g2 of the last key tile, reading P from `a`)
            turn("wait", depth)
            wait_v(depth)
            issue(replace(g2, a=a), "tilec_prev", depth)
            turn("pass", depth)
            self.emit("tilec::sm90::wgmma_wait<0>();", depth)
            self.emit(f"tilec::sm90::fence_regs<{c2.layout.slots()}>({cname(g2.c)});", depth)
            self.emit(self.release("tilec_prev", v), depth)

        def iteration(b: int, p_in: str, p_out: str | None):
            """One iteration of the loop after the first: g2 reads P from `p_in`; the
            conversions write `p_out` before the wait for g2 (None: one buffer, written after)."""
            turn("wait", b)
            issue_g1(b)
            self.emit(f"// {g2.c} of the previous key tile, while this tile's {g1.c} runs", b)
            wait_v(b)
            issue(replace(g2, a=p_in), "tilec_prev", b)
            turn("pass", b)
            self.emit(f"tilec::sm90::wgmma_wait<1>();  // this tile's {g1.c}", b)
            self.emit(f"tilec::sm90::fence_regs<{c1.layout.slots()}>({cname(g1.c)});", b)
            if self.kv_split:
                self.emit(self.release("tilec_s") + "  // (its K)", b)
            self.stmts(tuple(reads), b)
            after = rest
            if p_out is not None:
                self.emit(f"// {g2.a} of this tile into {cname(p_out)}, which the product in flight "
                          "does not read", b)
                self.stmts(tuple(rename_stores(st, g2.a, p_out) for st in split[0]), b)
                after = split[1]
            wait = (f"tilec::sm90::wgmma_wait<0>();  // the previous tile's {g2.c}: its stage "
                    "is free",
                    f"tilec::sm90::fence_regs<{c2.layout.slots()}>({cname(g2.c)});",
                    f"tilec::sm90::fence_regs<{pair_words(self.allocs[g2.a])}>({cname(p_in)});",
                    self.release("tilec_prev", v))
            head = after[0] if after else None
            if isinstance(head, T.For) and head.kind == "parallel":
                # in both arms of O's rescaling vote (parallel): in a basic block of its own
                # after the softmax's, where ptxas's scheduler keeps it (within one block it
                # issued the wait before the softmax's exponentials, which then never overlapped
                # g2)
                self.parallel(head, b, first=wait)
                after = after[1:]
            else:
                for line in wait:
                    self.emit(line, b)
            self.stmts(tuple(after), b)
            self.emit("tilec_prev = tilec_s;", b)
            self.emit("++tilec_it;", b)

        def numbered(depth: int, index: str, p_in: str, p_out: str, head: str = ""):
            """`head` { the iteration of key tile `index`, its loop variable declared }"""
            self.emit(head + "{", depth)
            self.emit(f"const int64_t {j} = {index};", depth + 1)
            if loop.vars[0] not in names_read(self.loop_body):
                self.emit(f"(void){j};", depth + 1)
            iteration(depth + 1, p_in, p_out)
            self.emit("}", depth)

        self.emit(f"// the products overlapped: key tile k's softmax runs while {g2.c} of tile "
                  f"k - 1 does", d)
        self.emit("uint32_t tilec_prev = 0;  // the stage of the previous key tile", d)
        self.loop_body = loop.body
        self.emit(f"if ({n} > 0) {{  // key tile 0: {g1.c} and its softmax, no {g2.c} before it", d)
        b = d + 1
        self.emit(f"const int64_t {j} = 0;", b)
        self.emit(f"(void){j};", b)
        turn("wait", b)
        issue_g1(b)
        turn("pass", b)
        self.emit("tilec::sm90::wgmma_wait<0>();", b)
        self.emit(f"tilec::sm90::fence_regs<{c1.layout.slots()}>({cname(g1.c)});", b)
        if self.kv_split:
            self.emit(self.release("tilec_s") + "  // (its K)", b)
        self.stmts(tuple(reads) + tuple(rest), b)
        self.emit("tilec_prev = tilec_s;", b)
        self.emit("++tilec_it;", b)
        self.emit("}", d)
        if split is None:
            self.loop_head(loop.vars[0], loop.extents[0], d, start=T.Const(1, "i64"))
            iteration(d + 1, g2.a, None)
            self.emit("}", d)
            self.free_once(d)
            self.emit(f"if ({n} > 0) {{  // {g2.c} of the last key tile", d)
            last_g2(g2.a, d + 1)
            self.emit("}", d)
            return
        taken, p2, n2 = taken_names(self.k), f"{g2.a}2", 2
        while p2 in taken:  # (a name of the kernel's own: the second buffer takes another)
            n2 += 1
            p2 = f"{g2.a}{n2}"
        self.allocs[p2] = replace(self.allocs[g2.a], name=p2)
        c = f"tilec_{j}_i"
        count = self.loop_count(loop.extents[0])
        self.emit(f"// two buffers of {g2.a} taken in turn: {g2.a} (key tile 0, then every "
                  f"second tile) and {cname(p2)}", d)
        self.emit(f"int {c} = 1;", d)
        self.emit(f"for (; {c} + 1 < {count}; {c} += 2) {{", d)
        for half, (p_in, p_out) in enumerate(((g2.a, p2), (p2, g2.a))):
            numbered(d + 1, f"{c}{' + 1' if half else ''}", p_in, p_out)
        self.emit("}", d)
        self.emit(f"const bool tilec_odd = {c} < {count};  // (a key tile left: it writes "
                  f"{cname(p2)})", d)
        numbered(d, c, g2.a, p2, head="if (tilec_odd) ")
        self.free_once(d)
        self.emit(f"if ({n} > 0) {{  // {g2.c} of the last key tile", d)
        self.emit("if (tilec_odd) {", d + 1)
        last_g2(p2, d + 2)
        self.emit("} else {", d + 1)
        last_g2(g2.a, d + 2)
        self.emit("}", d + 1)
        self.emit("}", d)

    def conversions(self, loop: T.For, parts):
        """(the statements of overlapped_loop's `rest` that only write g2's A operand, reading
        none of g2's register operands, the others) when those may move ahead of the others and
        two buffers of the A operand fit beside g1's and g2's accumulators (DOUBLE_P_REGISTERS)
        in a loop without masks by query rows (row_masked); else None."""
        _, g1, _, rest, g2 = parts
        a, c1, c2 = g2.a, self.allocs[g1.c], self.allocs[g2.c]
        words = pair_words(self.allocs[a])
        if c1.layout.slots() + c2.layout.slots() + 2 * words > DOUBLE_P_REGISTERS or \
                any(row_masked(st) for st in loop.body):
            return None
        held = {a, g2.c}
        convert, others = [], []
        for st in rest:
            nested = list(T.walk_stmts([st]))
            only_stores = all(isinstance(x, (T.For, T.If, T.Store, T.Let)) for x in nested)
            stores = {x.buf for x in nested if isinstance(x, T.Store)}
            if only_stores and stores == {a} and not any(ld.buf in held for ld in loads_in(st)):
                # (it moves ahead of the statements before it: none of them may write what it
                # reads or read or write the buffer it writes)
                read = {ld.buf for ld in loads_in(st)}
                for o in others:
                    written = {b for x in T.walk_stmts([o]) for b in written_by(x)}
                    if written & (read | {a}) or any(ld.buf == a for ld in loads_in(o)):
                        return None
                convert.append(st)
            else:
                others.append(st)
        return (convert, others) if convert else None

    def wgmma_gemm(self, g: T.Gemm, d: int, turns: bool = False):
        """One gemm of a warp-specialized loop on wgmma, completed: this consumer warpgroup's
        64 rows. A from shared memory (K-major: rows of K in panels of 64 columns) or from
        registers (a 16-bit fragment in the accumulator's layout, e.g. attention's P); B from
        shared memory, rows of N (MN-major) or of K, panels of 64 columns. With `turns`, issued
        in the warpgroup's turn (ping-pong)."""
        if turns:
            self.emit("tilec::sm90::turn_wait(tilec_warp / 4);", d)
        self.emit("tilec::sm90::wgmma_fence();", d)
        self.wgmma_issue(g, d)
        self.emit("tilec::sm90::wgmma_commit();", d)
        if turns:
            self.emit("tilec::sm90::turn_pass(tilec_warp / 4);", d)
        self.emit("tilec::sm90::wgmma_wait<0>();", d)
        self.emit(f"tilec::sm90::fence_regs<{self.allocs[g.c].layout.slots()}>({cname(g.c)});", d)

    def wgmma_issue(self, g: T.Gemm, d: int, stage: str = "tilec_s"):
        """The wgmmas of gemm `g` (this warpgroup's rows), its staged operands at `stage`."""
        a, b, c = self.allocs[g.a], self.allocs[g.b], self.allocs[g.c]
        b_mn = not g.transpose_b
        bk = _const(b.shape[-2] if b_mn else b.shape[-1])
        bf = wgmma_type(b.dtype)
        b_ptr = cname(g.b) + (f" + {stage} * {b.layout.size()}" if g.b_stage is not None else "")
        if a.scope == "shared":
            a_ptr = cname(g.a) + (f" + {stage} * {a.layout.size()}" if g.a_stage is not None else "")
            rows = a.layout.rows
            self.emit(f"// this warpgroup's 64 rows of {g.a} times {g.b}, {wgmmas(bk, b.dtype)} "
                      "wgmmas", d)
            self.emit(f"tilec::sm90::wgmma_tile<{c.layout.cols}, {bk}, {str(b_mn).lower()}, {bf}, "
                      f"{rows}>({cname(g.c)}, {a_ptr} + (tilec_warp / 4) * {64 * 64}, {b_ptr});", d)
        else:
            self.emit(f"// this warpgroup's 64 rows of {g.a} (registers) times {g.b}, "
                      f"{bk // 16} wgmmas", d)
            self.emit(f"tilec::sm90::wgmma_tile_rs<{c.layout.cols}, {bk}, {str(b_mn).lower()}, "
                      f"{bf}>({cname(g.c)}, {cname(g.a)}, {b_ptr});", d)

    def free_once(self, d: int):
        """A persistent kernel's consumers are done with the tiles copied once per tile (the
        loop's products that read them are complete): each consumer warp's arrival frees them
        for the next tile's copy."""
        if self.once_ring:
            self.emit("// this tile's products are complete: the next tile's copies may land",
                      d)
            self.emit("{ __syncwarp(); if (tilec_lane == 0) "
                      "tilec::sm90::mbar_arrive(tilec_once_free); }", d)

    def release(self, stage: str, ring: str = "") -> str:
        """A consumer warp's arrival on the `empty` barrier of `stage` (in every block of a
        cluster), by its first lane: 256 arrivals per stage, twice over in a cluster, slowed
        the cluster kernel to 0.69x cuBLAS (docs/PERFORMANCE.md). `ring` "_v": attention's V
        ring (kv_split)."""
        out = f"tilec::sm90::mbar_arrive(&tilec_empty{ring}[{stage}]);"
        if self.k.cluster == 2:
            out += f" tilec::sm90::mbar_arrive_remote(&tilec_empty[{stage}], tilec_rank ^ 1);"
        return f"{{ __syncwarp(); if (tilec_lane == 0) {{ {out} }} }}"

    def tile_loop(self, depth: int, first: str | None = None, every: int = 1):
        """The persistent loop over the grid's tiles, with the block variables of each: the
        block's tiles from its `first` (0 if None) on, every `every`-th. Where block x's work
        grows with x (`longest_first`: a causal bound), the blocks walk pairs of tiles instead,
        x = last - j, then x = j: each pair's work adds up alike, so a static share of pairs
        is an even one."""
        start = "blockIdx.x" if first is None else f"blockIdx.x + (int64_t){first} * gridDim.x"
        step = "gridDim.x" if every == 1 else f"{every} * (int64_t)gridDim.x"
        c = self.k.cluster
        if c > 1:  # the cluster's tiles: tilec_b counts clusters, block rank r takes M tile r
            start, step = f"blockIdx.x / {c}", f"gridDim.x / {c}"
        k = self.k
        if k.longest_first:
            assert c == 1 and every == 1, "pairs of tiles in clusters or ping-pong"
            self.emit("// pairs of tiles, x = last - j then x = j (their key tiles add up alike), "
                      "where there are", depth)
            self.emit("// at least as many pairs as blocks; else one tile a step, the longest "
                      "first", depth)
            self.emit("const int64_t tilec_half = (tilec_grid[0] + 1) / 2;  // pairs per row of x",
                      depth)
            self.emit("const int64_t tilec_pairs = tilec_half * (tilec_tiles / tilec_grid[0]);",
                      depth)
            self.emit("const int tilec_per = tilec_pairs >= (int64_t)gridDim.x ? 2 : 1;", depth)
            self.emit("const int64_t tilec_row = tilec_per == 2 ? tilec_half : tilec_grid[0];  "
                      "// steps per row of x", depth)
            self.emit(f"for (int64_t tilec_p = {start}; tilec_p < tilec_row * (tilec_tiles / "
                      f"tilec_grid[0]); tilec_p += {step})", depth)
            self.emit("for (int tilec_m = 0; tilec_m < tilec_per; ++tilec_m) {", depth)
            self.emit("const int64_t tilec_j = tilec_p % tilec_row;", depth + 1)
            self.emit("if (tilec_m == 1 && 2 * tilec_j + 1 == tilec_grid[0]) continue;  // (the "
                      "middle x: alone)", depth + 1)
            self.emit("const int64_t tilec_b = tilec_p / tilec_row * tilec_grid[0] + "
                      "(tilec_m == 0 ? tilec_grid[0] - 1 - tilec_j : tilec_j);", depth + 1)
            k = replace(k, longest_first=False)  # (x from tilec_b as it is)
        else:
            self.emit(f"for (int64_t tilec_b = {start}; tilec_b < tilec_tiles; tilec_b += {step}) {{",
                      depth)
        m_var = cname(self.k.block_vars[1]) if c > 1 else None  # (a GEMM's M tile)
        for name, e in block_vars(k):
            if c > 1:
                e = e.replace("tilec_grid[", "tilec_cgrid[")
                if name == m_var:
                    e = f"{c} * ({e}) + tilec_rank"
            self.emit(f"const int64_t {name} = {e};", depth + 1)
            if name in map(cname, self.k.block_vars):  # (a role may not read each)
                self.emit(f"(void){name};", depth + 1)

    def tma_copy(self, c: T.Copy, depth: int, bar: str = "&tilec_full[tilec_s]",
                 at: str = "tilec_s"):
        """A tile copy by TMA, completing on mbarrier `bar`: boxes of one 128-byte swizzle row
        (64 16-bit or 128 fp8 columns) by the window's rows, one per panel of the tile, into
        the stage `at` of a staged buffer; coordinates innermost first."""
        dst = self.allocs[c.dst.buf]
        rows, cols = (_const(x) for x in dst.shape[-2:])
        pw = 128 // BYTES[dst.dtype]  # (columns of a panel)
        coords_of, rank = self.tma_coords(c.src.buf, c.src.offsets)
        staged = c.dst.offsets is not None
        stage = f"{cname(dst.name)}" + (f" + {at} * {dst.layout.size()}" if staged else "")
        self.emit(f"// copy {T.fmt(T.Load(c.src.buf, c.src.offsets, dst.dtype))} -> "
                  f"{c.dst.buf}" + ("[stage]" if staged else "") +
                  (f": {cols // pw} panels of {pw} columns" if cols > pw else ""), depth)
        # boxes: (element offset in the stage, column offset, row offset); in a cluster the
        # B tile's boxes are shared out over the blocks (halves of a one-panel tile's rows),
        # each written to every block
        shared = self.k.cluster > 1 and self.ws_gemm is not None and c.dst.buf == self.ws_gemm.b
        box_rows = rows // 2 if shared and cols == pw else rows
        boxes = [(p * rows * pw, pw * p, 0) for p in range(cols // pw)]
        if box_rows < rows:
            boxes = [(h * box_rows * pw, 0, h * box_rows) for h in range(2)]
        self.ws_maps[c.src.buf] = (box_rows, rank)
        for n, (at, dx, dy) in enumerate(boxes):
            coords = coords_of(dx, dy)
            dst_at = stage + (f" + {at}" if at else "")
            if shared:
                self.emit(f"if (tilec_rank == {n % self.k.cluster}) "
                          f"tilec::sm90::tma_load_{rank}d_multicast({dst_at}, "
                          f"&tilec_map_{cname(c.src.buf)}, {bar}, {coords}, "
                          f"{(1 << self.k.cluster) - 1});", depth)
                continue
            self.emit(f"tilec::sm90::tma_load_{rank}d({dst_at}, &tilec_map_{cname(c.src.buf)}, "
                      f"{bar}, {coords});", depth)

    def tma_coords(self, tensor: str, offsets) -> tuple:
        """(fn(column offset, row offset) -> the C coordinates of a box, innermost first; the
        rank of the tensor map): a tensor of more than 3 dims is addressed as 3, its leading
        dims merged into one (the tensors are contiguous, row-major: tensor_maps)."""
        p = self.globals[tensor]
        offs = [self.expr(o) for o in offsets]
        lead = offs[:-2]
        if len(lead) > 1:  # the merged coordinate: sum of lead[i] * (the extents after it)
            flat = lead[0]
            for o, d in zip(lead[1:], p.shape[1:-2]):
                flat = f"({flat}) * {pdim(d)} + {o}"
            lead = [flat]
        x0, y0 = offs[-1], offs[-2]

        def coords(dx, dy):
            x = f"(int32_t)({x0})" + (f" + {dx}" if dx else "")
            y = f"(int32_t)({y0})" + (f" + {dy}" if dy else "")
            return ", ".join([x, y] + [f"(int32_t)({o})" for o in lead])
        return coords, 2 + len(lead)

    def s_GemvMma(self, s: T.GemvMma, depth):
        a, q, sc = self.globals[s.a], self.globals[s.q], self.globals[s.s]
        dst = self.allocs[s.dst]
        L = dst.layout
        if sc.dtype not in SIXTEEN:
            raise T.Unsupported(f"gemv_mma() on CUDA takes f16 or bf16 activations and scales, "
                                f"not {sc.dtype}")
        row, first, rows, col0, m = (self.expr(x) for x in s.idx)
        bits = dequant_bias(sc.dtype, s.zero, q.dtype)
        if bits is None:
            raise T.Unsupported(f"gemv_mma(): zero={s.zero} is not exact in {sc.dtype} pairs")
        which = f"A's row {row}" if s.mr == 1 else f"{m} rows of A from row {row}"
        self.emit(f"// {dst.name}: the warps' partial sums of {which} times the dequantized "
                  "weights, on the matrix units", depth)
        # weights packed along K (q [N, K], scales [N, K / group]) take their own routine, which
        # also needs K and the scales' row length
        dims = (f"{pdim(q.shape[-2])}, {pdim(q.shape[-1])}, {pdim(sc.shape[-1])}" if s.kmajor
                else pdim(q.shape[-1]))
        self.emit(f"tilec::gemv_dequant4_mma{'_kmajor' if s.kmajor else ''}<{kind(sc.dtype)}, "
                  f"{str(q.dtype == 'i4').lower()}, {L.cols}, {L.rows // s.mr}, {L.cols + L.pad}, "
                  f"{s.mr}>({cname(a.name)} + ({row}) * {pdim(a.shape[-1])}, "
                  f"{pdim(a.shape[-1])}, {m}, {cname(q.name)}, {cname(sc.name)}, {dims}, "
                  f"{first}, {rows}, {col0}, {s.group}, 0x{bits:04x}{bits:04x}u, "
                  f"{cname(dst.name)});", depth)

    def s_GemmLoad(self, s: T.GemmLoad, depth):
        g = s.gemm
        name = self.fragments(g)
        self.emit(f"// the first k-step's fragments of the overlapped gemm into {g.c}", depth)
        self.emit(f"tilec::SsFragments<{self.ss_params(g)}> {name};", depth)
        self.emit(f"{name}.load({self.operand_ptr(g.a, g.a_stage)}, "
                  f"{self.operand_ptr(g.b, g.b_stage)});", depth)

    def ss_params(self, g: T.Gemm) -> str:
        """The template arguments of gemm_ss and SsFragments for gemm `g` (both operands in
        shared tiles): block tile, K tile, warp grid, transposes, tile layouts, operand kind."""
        a, b, L = self.allocs[g.a], self.allocs[g.b], self.allocs[g.c].layout
        bk = _const(g.k_extent(a.shape))
        return (f"{L.rows}, {L.cols}, {bk}, {L.warps_m}, {L.warps_n}, "
                f"{str(g.transpose_a).lower()}, {str(g.transpose_b).lower()}, "
                f"{self.shared_layout_type(a)}, {self.shared_layout_type(b)}, {kind(a.dtype)}")

    def operand_ptr(self, buf: str, stage) -> str:
        """A gemm operand: shared buffer `buf`, at stage `stage` if it has a stage axis."""
        if stage is None:
            return cname(buf)
        return f"{cname(buf)} + ({self.expr(stage)}) * {self.allocs[buf].layout.size()}"

    @staticmethod
    def fragments(g: T.Gemm) -> str:
        return f"tilec_frags_{cname(g.c)}"

    def sequential(self, s: T.For, depth):
        """A loop (parallel loops: self.parallel). In a range loop whose body indexes stages by
        `k % S` (pipelined loops), that stage is a 32-bit counter wrapped at S each iteration:
        the remainder of the 64-bit loop variable took ~10 instructions per use, and measurably
        slowed a GEMM's K loop (docs/PERFORMANCE.md)."""
        moduli = sorted(self.stage_moduli(s)) if s.kind == "range" and len(s.vars) == 1 else []
        if not moduli:
            if s.kind == "range" and _const(s.extents[0]) is None and self.accumulates(s.body):
                # only sums of loads (a split GEMM's partial products): 4 iterations' loads in
                # flight together instead of one load's latency per iteration
                self.emit("#pragma unroll 4", depth)
            super().s_For(s, depth)
            return
        (k,) = s.vars
        names = {m: f"tilec_{cname(k)}_mod{m}" for m in moduli}
        start = None if s.start is None else self.expr(s.start)
        for m, name in names.items():
            first = "0" if start is None else f"(int)(({start}) % {m})"
            self.emit(f"int {name} = {first};  // {cname(k)} % {m}", depth)
        self.loop_body = s.body
        self.loop_head(k, s.extents[0], depth, s.start)
        saved = dict(self.rotating)
        self.rotating.update({(k, m): name for m, name in names.items()})
        self.stmts(s.body, depth + 1)
        self.rotating = saved
        for m, name in names.items():
            self.emit(f"{name} = {name} + 1 == {m} ? 0 : {name} + 1;", depth + 1)
        self.emit("}", depth)

    def loop_head(self, var: str, extent, depth, start=None):
        """A sequential loop whose trip count the launcher bounds (a dimension or a value it
        computes, checked to fit in 32 bits; a constant) counts in a 32-bit register; the loop
        variable is its 64-bit value, so arithmetic on it stays 64-bit. A 64-bit counter holds
        two registers through the loop, and in an attention kernel at 255 registers those two
        decided whether ptxas spilled. (A start is at most the bound where the loop runs: it is
        a non-negative value below the extent, e.g. a split point clamped to it.)"""
        n = self.loop_count(extent)
        if n is None:
            super().loop_head(var, extent, depth, start)
            return
        c = f"tilec_{cname(var)}_i"
        first = "0" if start is None else str(start.value) if isinstance(start, T.Const) else \
            f"(int){self.expr(start)}"
        self.emit(f"for (int {c} = {first}; {c} < {n}; ++{c}) {{", depth)
        self.emit(f"const int64_t {cname(var)} = {c};", depth + 1)
        if var not in names_read(self.loop_body):  # (e.g. a K loop of one row: nvcc would warn)
            self.emit(f"(void){cname(var)};", depth + 1)

    def loop_count(self, extent) -> str | None:
        """The trip count `extent` as a 32-bit int expression when the launcher bounds it (see
        loop_head; the bound's check is then part of the launcher), else None."""
        bound = self.launcher_bound(extent)
        if bound is None:
            return None
        if bound:
            self.int32_bounds.add(bound)
        if isinstance(extent, T.Const):
            return str(extent.value)
        if isinstance(extent, T.Var):
            return f"(int){self.expr(extent)}"
        return f"(int)tilec::imax((int64_t)0, {self.expr(extent)})"  # (negative: no iteration)

    def launcher_bound(self, e) -> str | None:
        """The launcher value (a dimension or a host-computed Let) that bounds the integer
        expression `e` from above, "" when `e` is a constant below 2^31, None if neither."""
        if isinstance(e, T.Const) and isinstance(e.value, int) and 0 <= e.value < 2 ** 31:
            return ""
        if isinstance(e, T.Var) and e.name in self.launcher_values:
            return e.name
        if isinstance(e, T.Binary) and e.fn == "min":
            a = self.launcher_bound(e.a)
            return a if a is not None else self.launcher_bound(e.b)
        if isinstance(e, T.Binary) and e.fn == "max":  # (a split loop's bound clamped at 0)
            a, b = self.launcher_bound(e.a), self.launcher_bound(e.b)
            return b if a == "" else a if b == "" else None
        return None

    def accumulates(self, body) -> bool:
        """Does `body` only add loaded values into fragment elements (acc[i] = acc[i] + X[..],
        in parallel loops and branches, no other statements)?"""
        for st in T.walk_stmts(body):
            if (isinstance(st, T.For) and st.kind == "parallel") or isinstance(st, T.If):
                continue
            if not isinstance(st, T.Store) or st.buf not in self.allocs or \
                    self.allocs[st.buf].scope != "fragment":
                return False
            v = st.value
            if not (isinstance(v, T.Binary) and v.fn == "add" and isinstance(v.a, T.Load) and
                    v.a.buf == st.buf and v.a.idx == st.idx and
                    isinstance(v.b.x if isinstance(v.b, T.Cast) else v.b, T.Load)):
                return False
        return True

    @staticmethod
    def stage_moduli(s: T.For) -> set:
        """The S of every `k % S` or `(k + c) % S` (c a constant) in loop s's body."""
        (k,) = s.vars
        out = set()

        def note(e):
            form = mod_of_var(e, k)
            if form is not None:
                out.add(form[1])
            return None
        for st in T.walk_stmts(s.body):
            map_exprs(st, note)
        return out

    # ---- parallel loops, split over threads by their layout
    def parallel(self, s: T.For, depth, first: tuple[str, ...] = ()):
        """Loop s over its layout; `first`: lines that run before it, in both arms of the unit
        scale vote where it has one (overlapped_loop's wait for the product in flight)."""
        vote = self.unit_scale_vote(s)
        if vote is not None:
            self.emit(f"if ({vote}) {{  // (a warp whose rows all scale by 1 skips the loop)", depth)
            for line in first:
                self.emit(line, depth + 1)
            self.parallel_loop(s, depth + 1)
            if first:
                self.emit("} else {", depth)
                for line in first:
                    self.emit(line, depth + 1)
            self.emit("}", depth)
            return
        for line in first:
            self.emit(line, depth)
        self.parallel_loop(s, depth)

    def unit_scale_vote(self, s: T.For) -> str | None:
        """The warp vote under which a loop that scales each row of a matrix fragment by a row
        value, `X[i, j] = X[i, j] * a[i]`, runs: whether any of the warp's threads holds a row
        whose factor is not 1 (attention's rescaling of O, whose factor stays exactly 1 while
        a row's max does: passes/tile.py). Multiplying by 1 changes nothing, so a warp that
        skips it computes what it would have; None for other loops."""
        if len(s.vars) != 2 or not isinstance(s.by, MmaLayout) or len(s.body) != 1 or \
                not isinstance(s.body[0], T.Store):
            return None
        st, (i, j) = s.body[0], s.vars
        x = self.allocs.get(st.buf)
        v = st.value
        if x is None or x.scope != "fragment" or st.idx != (T.Var(i), T.Var(j)) or \
                not isinstance(v, T.Binary) or v.fn != "mul":
            return None
        own = T.Load(st.buf, st.idx, x.dtype)
        factor = v.b if v.a == own else v.a if v.b == own else None
        if not (isinstance(factor, T.Load) and factor.idx == (T.Var(i),)):
            return None
        a = self.allocs.get(factor.buf)
        if a is None or a.scope != "fragment" or a.dtype != x.dtype or x.dtype not in ("f32", "f64"):
            return None
        one = "1.0f" if a.dtype == "f32" else "1.0"
        held = " || ".join(f"{cname(a.name)}[{n}] != {one}" for n in range(a.layout.slots()))
        return f"tilec::warp_any({held})"

    def parallel_loop(self, s: T.For, depth):
        loop = self.loop_parts(s)
        # in the kernel's whole version (version_whole) a loop listed there runs unguarded
        aligned = self.whole.get(id(s)) if self.whole is not None else None
        tile = self.whole_tile(loop) if self.whole is None else None
        if tile is None:
            self.groups(loop, aligned, depth)
            return
        # an accumulator's loop (a GEMM epilogue), twice: the blocks whose whole tile lies
        # inside the tensors run it without per-row tests, per-group counts or alignment
        # tests (the test is the block's, so its threads take one version)
        conds, aligned, rows_inside = tile
        self.emit(f"if ({' && '.join(conds)}) {{", depth)
        self.emit("// the block's whole tile lies inside the tensors; its vector accesses are "
                  "aligned", depth + 1)
        self.groups(loop, aligned, depth + 1, rows_inside, self.staged_stores(loop))
        self.emit("} else {", depth)
        self.groups(loop, None, depth + 1)
        self.emit("}", depth)

    def whole_tile(self, loop):
        """For a loop over an mma accumulator's groups with row or column bounds: (the
        block-uniform condition under which all of the layout's rows and columns lie inside the
        bounds and its vector accesses are aligned, those accesses, the row conditions it
        covers), else None."""
        s, L, ivar, _, body, orelse, row_conds, col_bounds, _ = loop
        if not isinstance(L, MmaLayout) or orelse or \
                any(isinstance(st, _COLLECTIVE) for st in T.walk_stmts(body)):
            return None
        # only after gemms of two shared tiles: attention's (P in registers) holds too much in
        # registers already (a second version spilled 20 bytes at D <= 96)
        accs = {ld.buf for st in body for ld in loads_in(st)
                if isinstance(getattr(self.allocs.get(ld.buf), "layout", None), MmaLayout)}
        gemms = [g for g in T.walk_stmts(self.k.body) if isinstance(g, T.Gemm) and g.c in accs]
        if not gemms or any(self.allocs[g.a].scope != "shared" for g in gemms):
            return None
        rows = []
        for c in row_conds:
            hit = split_bound(c, (ivar,)) if ivar is not None else None
            if hit is not None:
                rows.append((c, hit[1], hit[2]))
        hit = self.whole_groups(*loop, uniform=True) if col_bounds else ([], set(), [])
        if hit is None or not (rows or col_bounds):
            return None
        conds, aligned, bounds = hit
        # the test is the block's, before the loop: bounds that move with the loop's own
        # variables (a column bound in i) are not one test
        if any(uses_var(e, s.vars) for e in bounds + [e for _, b, c in rows for e in (b, c)]):
            return None
        conds = [f"{self.expr(T.isub(bound, base))} >= {L.rows}" for _, base, bound in rows] + conds
        return conds, aligned, tuple(c for c, _, _ in rows)

    def loop_parts(self, s: T.For) -> tuple:
        """(loop, layout, row var, column var, body, else branch, row conditions, column bounds
        as (base, bound), other column conditions) of a parallel loop."""
        L = s.by
        assert L is not None, f"parallel loop over ({', '.join(s.vars)}) has no layout"
        streaming = L.groups() is None
        rows_loop = isinstance(L, (MmaRows, VecRows))
        if len(s.vars) == 2:
            ivar, jvar = s.vars
        elif rows_loop:
            ivar, jvar = s.vars[0], None
        else:
            ivar, jvar = None, s.vars[0]
        if ivar is None and L.rows != 1:
            raise AssertionError(f"1-D loop over columns split by a {L.rows}-row layout")
        body, guard, orelse = s.body, [], ()
        if len(body) == 1 and isinstance(body[0], T.If):
            guard, body, orelse = conjuncts(body[0].cond), body[0].body, body[0].orelse
        row_conds, col_bounds, other = [], [], []
        for cnd in guard:
            if jvar is None or not uses_var(cnd, (jvar,)):
                row_conds.append(cnd)
                continue
            hit = split_bound(cnd, (jvar,))
            if hit is None:
                other.append(cnd)
            else:
                col_bounds.append(hit[1:])
        if jvar is not None and (streaming or _const(s.extents[-1]) != L.cols) and \
                not self.elementwise_in_registers(s.body, s.vars):
            # the layout's columns past the loop's extent are capacity padding: a body that maps
            # register elements to register elements at the same position may run there too
            # (padding is never read as data), which saves a branch per element; a body that
            # touches memory or reduces into row values may not
            col_bounds.append((T.iconst(0), s.extents[-1]))
        return (s, L, ivar, jvar, body, orelse, row_conds, col_bounds, other)

    def version_whole(self, body, depth) -> bool:
        """Render the kernel body `body` twice when its loops over vector groups (statements of
        it, or of its sequential loops) have column bounds: a version where every group of this
        thread lies inside the bounds and every vector access is aligned (tested once, up
        front), whose loops run without per-group counts or alignment tests, and the guarded
        version for the threads at a row's ragged end. False (nothing rendered) when no loop
        qualifies."""
        whole, conds = {}, []
        defined = defined_names(body)
        # threads that exchange values (shuffles, barriers, shared memory) must all take the same
        # version: a warp split between two versions would meet its shuffles and barriers at two
        # places and hang; then the test is the block's (its whole tile inside the bounds)
        uniform = any(isinstance(st, _COLLECTIVE) for st in T.walk_stmts(body))
        for st, outer in _parallel_loops(body):
            if isinstance(st.by, MmaLayout):
                continue  # (an accumulator's loop is versioned on its own: whole_tile)
            if outer and not self.reads_packed(st):
                # inside sequential loops only where whole words of 4-bit values replace a test
                # and a value-by-value path per word (a decode GEMV); elsewhere the unguarded
                # loop body gets unrolled further and spilled (f32 split GEMV: 76 bytes at the
                # 64 registers of 4 blocks per SM)
                continue
            hit = self.whole_groups(*self.loop_parts(st), uniform=uniform)
            # the test goes before the body: its bounds may not read what the body defines,
            # nor the variables of the sequential loops around the parallel one
            if hit is None or any(isinstance(x, T.Var) and (x.name in defined or x.name in outer)
                                  for e in hit[2] for x in T.walk_exprs(e)):
                continue
            whole[id(st)] = hit[1]
            conds += [c for c in hit[0] if c not in conds]
        if not whole:
            return False
        self.emit(f"if ({' && '.join(conds)}) {{", depth)
        self.emit("// every vector group of this thread lies inside its row and is aligned", depth + 1)
        self.whole = whole
        self.stmts(body, depth + 1)
        self.whole = None
        self.emit("} else {", depth)
        self.stmts(body, depth + 1)
        self.emit("}", depth)
        return True

    def reads_packed(self, loop: T.For) -> bool:
        """Does the loop read a global tensor of 4-bit values?"""
        return any(x.buf in self.globals and self.globals[x.buf].dtype in ("u4", "i4")
                   for st in loop.body for x in loads_in(st))

    def whole_groups(self, s, L, ivar, jvar, body, orelse, row_conds, col_bounds, other,
                     uniform=False):
        """For a loop over a VecLayout's groups with column bounds: (the condition under which
        every group of the thread is whole and every vector access of a global tensor along
        the columns aligned, those accesses), else None. `uniform`: a condition the same for
        every thread of the block (all the layout's columns inside the bounds)."""
        if not isinstance(L, (VecLayout, MmaLayout)) or L.groups() is None or jvar is None or \
                not col_bounds or L.vec == 1 or orelse or (isinstance(L, MmaLayout) and not uniform):
            return None
        conds = []
        if uniform:
            conds += [f"{self.expr(T.isub(bound, base))} >= {L.cols}" for base, bound in col_bounds]
        # per thread: a one-row layout's groups run left to right, so its last group is whole
        # only if all are
        if uniform:
            qs = []
        elif L.rows == 1 and L.valid("0") is None:
            qs = [L.groups() - 1]
        else:
            qs = range(L.groups())
        for q in qs:
            col0 = L.col0(str(q))
            tests = [f"{self.expr(T.isub(bound, base))} - {col0} >= {L.vec}"
                     for base, bound in col_bounds]
            valid = L.valid(str(q))
            conds.append(" && ".join(tests) if valid is None else
                         f"(!({valid}) || ({' && '.join(tests)}))")
        aligned = set()
        accesses = _column_loads(body, jvar, self.globals) + (
            [] if other else
            [st for st in body if isinstance(st, T.Store) and st.buf in self.globals and
             unit_stride(st.idx, jvar)])
        for x in accesses:
            p = self.globals[x.buf]
            if p.dtype in ("u4", "i4"):
                # 4-bit values dequantized eight per word (vector_group): whole aligned words
                # when every row and the group's first column start on a word
                if isinstance(x, T.Load) and L.vec == 8 and len(p.shape) > 1 and \
                        multiple_of(column_base(x.idx[-1], jvar), 8):
                    test = f"tilec::words_aligned({cname(p.name)}, {pdim(p.shape[-1])})"
                    conds += [test] if test not in conds else []
                    aligned.add(x)
                continue
            if not multiple_of(column_base(x.idx[-1], jvar), L.vec):
                continue  # a column offset that may cut vectors: tested per group
            tests = [f"tilec::vec_aligned<{L.vec}, {bits_kind(p.dtype)}>({cname(p.name)})"]
            if len(p.shape) > 1:  # every row starts aligned too
                tests.append(f"{pdim(p.shape[-1])} % {L.vec} == 0")
            conds += [t for t in tests if t not in conds]
            aligned.add(x if isinstance(x, T.Load) else id(x))  # as vec_loads / vec_stores key them
        return conds, aligned, [e for b in col_bounds for e in b]

    def groups(self, loop, aligned, depth, rows_inside=(), staged=None):
        """The loop over the thread's groups; `aligned`: the loop's whole version (every group
        whole, these vector accesses aligned), else None; `rows_inside`: row conditions known
        to hold (not tested); `staged`: stores written to shared memory for TMA stores
        (staged_stores), panel by panel."""
        s, L, ivar, jvar, body, orelse, row_conds, col_bounds, other = loop
        streaming = L.groups() is None
        d = depth
        packed = bool(staged) and self.defer is not None and self.defer.loop is s
        if packed:  # (deferred_epilogue)
            self.emit("// the tile's values, packed in registers: the next tile's K loop stores "
                      "them (tilec_flush)", d)
            self.emit("#pragma unroll", d)
            self.emit(f"for (int tilec_q = 0; tilec_q < {L.groups()}; ++tilec_q) {{", d)
            row, col0, valid = L.row("tilec_q"), L.col0("tilec_q"), L.valid("tilec_q")
        elif staged:
            panels = self.staging_panels(loop, staged, d)
            d += 1
            self.emit("#pragma unroll", d)
            self.emit(f"for (int tilec_q = tilec_p * {panels}; tilec_q < (tilec_p + 1) * {panels}; "
                      "++tilec_q) {", d)
            row, col0, valid = L.row("tilec_q"), L.col0("tilec_q"), L.valid("tilec_q")
        elif streaming:
            ext = self.expr(s.extents[-1])
            self.emit(f"for (int64_t tilec_g = tilec_tid; tilec_g * {L.vec} < {ext}; "
                      f"tilec_g += {self.k.threads}) {{", d)
            row, col0, valid = "0", f"tilec_g * {L.vec}", None
        else:
            # a loop over registers unrolls completely (register arrays need constant indices);
            # one that only moves memory beside a GEMM's accumulators stays a loop (registers)
            gemm = any(isinstance(x, T.Gemm) for x in T.walk_stmts(self.k.body))
            rolled = gemm and not self.touches_fragments(s.body)
            self.emit("#pragma unroll 1" if rolled else "#pragma unroll", d)
            self.emit(f"for (int tilec_q = 0; tilec_q < {L.groups()}; ++tilec_q) {{", d)
            row, col0, valid = L.row("tilec_q"), L.col0("tilec_q"), L.valid("tilec_q")
        d += 1
        conds = [valid] if valid else []
        if ivar is not None:
            self.emit(f"const int {cname(ivar)} = {row};", d)
            self.emit(f"(void){cname(ivar)};", d)
            if _const(s.extents[0]) != L.rows:
                conds.append(f"{cname(ivar)} < {self.expr(s.extents[0])}")
        conds += [self.expr(c) for c in row_conds if c not in rows_inside]
        ok = None
        if conds and not orelse:  # the whole group is skipped where a row condition fails
            self.emit(f"if ({' && '.join(conds)}) {{", d)
            d += 1
        elif conds:  # ... or takes the else branch
            ok = "tilec_ok"
            self.emit(f"const bool tilec_ok = {' && '.join(conds)};", d)
        outer = self.ctx
        self.ctx = LoopContext(L, tuple(T.Var(v) for v in s.vars), ivar, jvar, streaming)
        self.ctx.staged = staged or {}
        self.ctx.packed = packed
        if jvar is None:
            self.emit("const int tilec_v = 0;", d)
            self.emit("(void)tilec_v;", d)
            self.branch([ok] if ok else [], body, orelse, d)
        else:
            self.ctx.aligned = aligned
            self.vector_group(body, orelse, ok, jvar, col0, [] if aligned is not None else col_bounds,
                              other, L.vec, d)
        self.ctx = outer
        if conds and not orelse:
            self.emit("}", d - 1)
        if packed:
            self.emit("}", depth)
            self.emit("// where its TMA stores go", depth)
            for st in body:
                if id(st) in staged:
                    at = self.staged_coords(st, ivar, jvar)
                    self.emit(" ".join(f"{self.pending(st.buf)}_at[{n}] = (int32_t)({x});"
                                       for n, x in enumerate(at)), depth)
            self.emit("tilec_pend = true;", depth)
            return
        if staged:
            self.emit("}", depth + 1)
            self.staging_stores([st for st in body if id(st) in staged], staged,
                                lambda st: self.staged_coords(st, ivar, jvar), depth + 1)
        self.emit("}", depth)

    # ---- Hopper: the epilogue's whole tiles through shared memory by TMA stores -----------
    # (each consumer warpgroup's stores form bulk groups of its first thread; named barrier
    # STAGING_BAR + g is warpgroup g's)
    STAGING_BAR = 4

    def staged_stores(self, loop) -> dict:
        """The stores of an epilogue loop whose whole tiles leave by TMA (TileKernel.
        tma_stores): id(Store) -> (staging buffer, panel columns); {} for other loops."""
        staging = dict(self.k.tma_stores)
        _, L, ivar, jvar, body, orelse, _, _, other = loop
        if not staging or not isinstance(L, WgmmaLayout) or other or orelse:
            return {}
        outs = {p.name: p for p in self.k.params}
        return {id(st): (staging[st.buf], self.allocs[staging[st.buf]].layout.cols)
                for st in body if isinstance(st, T.Store) and st.buf in staging and
                tma_store.tile_store(st, ivar, jvar, outs)}

    def staging_panels(self, loop, staged: dict, d: int) -> int:
        """Open the loop over a tile's panels (tilec_p) with each panel's staging buffers free;
        returns the thread's groups per panel."""
        cols, panels, per_panel = self.panel_split(loop[1], staged)
        outs = sorted({buf for buf, _ in staged.values()})
        self.emit(f"// the tile leaves through shared memory ({', '.join(outs)}) by TMA stores: "
                  f"{panels} panel(s) of {cols} columns per consumer warpgroup, each written to a "
                  "buffer once its last store has read it", d)
        self.open_panel(panels, d)
        return per_panel

    @staticmethod
    def panel_split(L, staged: dict) -> tuple:
        """(columns per panel, panels per warpgroup's rows, the thread's groups per panel) of
        an epilogue over layout L whose stores `staged` leave by TMA."""
        (cols,) = {c for _, c in staged.values()}
        panels = L.cols // cols
        return cols, panels, L.groups() // panels

    def open_panel(self, panels: int, d: int, skip: str | None = None):
        """Open the loop over a tile's panels (tilec_p), each begun once its staging buffer is
        free; `skip`: a condition under which a panel is passed over."""
        self.emit("#pragma unroll", d)
        self.emit(f"for (int tilec_p = 0; tilec_p < {panels}; ++tilec_p) {{", d)
        if skip:
            self.emit(f"if ({skip}) continue;", d + 1)
        self.emit(f"tilec::sm90::staging_free<{min(panels, 2) - 1}>({self.STAGING_BAR} + "
                  "tilec_warp / 4);", d + 1)

    def staging_stores(self, stores: list, staged: dict, coords, d: int):
        """Close a panel: the warpgroup's writes made visible to the TMA unit, then its first
        thread stores each staged store's panel tilec_p (its 64 rows, the panel's columns; the
        first panel's coordinates `coords(st)`, innermost first) and commits them as one bulk
        group."""
        self.emit(f"tilec::sm90::staging_ready({self.STAGING_BAR} + tilec_warp / 4);", d)
        self.emit("if (tilec_tid % 128 == 0) {", d)
        for st in stores:
            buf, cols = staged[id(st)]
            x, *rest = coords(st)
            self.tma_store(st, buf, [f"{x} + tilec_p * {cols}"] + rest, d + 1)
        self.emit("tilec::sm90::bulk_commit();", d + 1)
        self.emit("}", d)

    def staged_coords(self, st: T.Store, ivar: str, jvar: str) -> list:
        """The TMA coordinates of this warpgroup's first panel of a staged store's tile
        (innermost first)."""
        *lead, r, c = st.idx
        return [self.expr(column_base(c, jvar)),
                f"{self.expr(column_base(r, ivar))} + (tilec_warp / 4) * 64"] + \
            [self.expr(e) for e in lead[::-1]]

    def tma_store(self, st: T.Store, buf: str, coords: list, d: int):
        """The TMA store of this warpgroup's panel tilec_p of a staged store at `coords`."""
        self.ws_maps[st.buf] = (64, len(st.idx))
        at = ", ".join(f"(int32_t)({e})" for e in coords)
        self.emit(f"tilec::sm90::tma_store_{len(st.idx)}d(&tilec_map_{cname(st.buf)}, "
                  f"{self.staging_buffer(buf)}, {at});", d)

    # ---- Hopper: a persistent GEMM's epilogue stored under the next tile's wgmmas ----------
    def deferred_epilogue(self, post) -> DeferredEpilogue | None:
        """The epilogue after a persistent GEMM's K loop (`post`) whose whole tiles wait for
        the next tile's K loop (TileKernel.deferred_stores, passes/tma_store.py): computed as
        the K loop ends, as before, and kept packed in registers; the next tile's K loop writes
        a panel of them to the staging buffers and stores it after issuing each of its first
        K tiles' wgmmas (tilec_flush), so the tensor cores no longer idle while the warpgroups
        write the tile. None where the kernel does not defer them."""
        if not self.k.deferred_stores:
            return None
        (loop,) = [st for st in post if isinstance(st, T.For)]
        parts = self.loop_parts(loop)
        L = parts[1]
        staged = self.staged_stores(parts)
        assert L.vec == 2 and L.valid("tilec_q") is None and staged, \
            "a deferred epilogue: pairs of columns, every group valid, staged stores"
        return DeferredEpilogue(loop, staged, self.panel_split(L, staged)[1])

    def pending(self, out: str) -> str:
        """The registers of a deferred epilogue's pending tile of output `out`."""
        return f"tilec_pend_{cname(out)}"

    def flush_function(self, d: int):
        """A deferred epilogue's pending tile and tilec_flush(first, last), which writes its
        panels [first, last) to the staging buffers and stores them by TMA (in this
        warpgroup's bulk groups, as staging_stores does)."""
        df = self.defer
        _, L, _, _, body, *_ = self.loop_parts(df.loop)
        stores = [st for st in body if id(st) in df.staged]
        cols, panels, per_panel = self.panel_split(L, df.staged)
        self.emit("// a deferred epilogue: a whole tile's values wait in registers, packed, "
                  "while the next tile's first", d)
        self.emit(f"// K tiles' wgmmas run; each of those K tiles' iterations writes a panel "
                  f"of {cols} columns to the", d)
        self.emit("// staging buffers and stores it by TMA", d)
        for st in stores:
            self.emit(f"uint32_t {self.pending(st.buf)}[{L.groups()}];  // the pending tile of "
                      f"{st.buf}, pairs of {self.globals[st.buf].dtype} values", d)
            self.emit(f"int32_t {self.pending(st.buf)}_at[{len(st.idx)}] = {{}};  // where its TMA "
                      "stores go (this warpgroup's first panel)", d)
        self.emit("bool tilec_pend = false;  // a tile is pending", d)
        self.emit("auto tilec_flush = [&](int tilec_first, int tilec_last) {  // its panels "
                  "[first, last)", d)
        self.open_panel(panels, d + 1, "tilec_p < tilec_first || tilec_p >= tilec_last")
        self.emit("#pragma unroll", d + 2)
        self.emit(f"for (int tilec_q = tilec_p * {per_panel}; tilec_q < (tilec_p + 1) * "
                  f"{per_panel}; ++tilec_q) {{", d + 2)
        self.emit(f"const int tilec_i = tilec::sm90::opaque({L.row('tilec_q')});  // (opaque: "
                  "computed here, not held through the K loop)", d + 3)
        self.emit(f"const int tilec_j0 = {L.col0('tilec_q')};", d + 3)
        for st in stores:
            buf, cols = df.staged[id(st)]
            self.emit(f"tilec::sm90::store32({self.staging_buffer(buf)} + tilec::sm90::sw128<2>("
                      f"tilec_i % 64, tilec_j0 % {cols}), {self.pending(st.buf)}[tilec_q]);", d + 3)
        self.emit("}", d + 2)
        self.staging_stores(stores, df.staged, lambda st: [
            f"{self.pending(st.buf)}_at[{n}]" for n in range(len(st.idx))], d + 2)
        self.emit("}", d + 1)
        self.emit("};", d)

    def staging_buffer(self, buf: str) -> str:
        """The staging buffer of this warpgroup's panel tilec_p (two per warpgroup, alternating;
        one where a tile has one panel)."""
        a = self.allocs[buf]
        per = _const(a.shape[0]) // self.k.warp_specialize
        at = f"((tilec_warp / 4) * {per} + tilec_p % {per})" if per > 1 else "(tilec_warp / 4)"
        return f"{cname(buf)} + {at} * {a.layout.size()}"

    def touches_fragments(self, body) -> bool:
        frags = {n for n, a in self.allocs.items() if a.scope != "shared"}
        return any(isinstance(st, T.Store) and st.buf in frags for st in T.walk_stmts(body)) or \
            any(ld.buf in frags for st in body for ld in loads_in(st))

    @staticmethod
    def vector_tile(a: T.Alloc, vec: int) -> bool:
        """Do `vec` columns of shared tile `a` starting at a multiple of vec lie contiguous (and
        vector-aligned)? Swizzling moves whole 16-byte chunks; padding keeps rows aligned."""
        L = a.layout
        if a.dtype not in STORE or L.packed or a.dtype == "bool":
            return False
        elem = BYTES[a.dtype]
        if L.swizzle:
            return 16 % (vec * elem) == 0
        return (L.cols + L.pad) % vec == 0

    def expr_unrounded(self, e) -> str:
        """`e` without its final rounding to 16 bits (the store that takes it rounds)."""
        if isinstance(e, (T.Unary, T.Binary)) and e.dtype in SIXTEEN and e not in self.shared_values:
            return self.expr(type(e)(**{**{f: getattr(e, f) for f in e.__dataclass_fields__},
                                        "dtype": "f32"}))
        return self.expr(e)

    def elementwise_in_registers(self, body, loop_vars) -> bool:
        """Does `body` only write fragment elements at the loop's own position, and read no
        memory?"""
        full = tuple(T.Var(v) for v in loop_vars)
        for st in T.walk_stmts(body):
            if isinstance(st, T.Store) and (st.buf not in self.allocs or st.idx != full or
                                            self.allocs[st.buf].scope == "shared"):
                return False
        return not any(ld.buf not in self.allocs or self.allocs[ld.buf].scope == "shared"
                       for st in body for ld in loads_in(st))

    def branch(self, conds: list, body, orelse, d):
        if not conds:
            self.stmts(body, d)
            return
        self.emit(f"if ({' && '.join(conds)}) {{", d)
        self.stmts(body, d + 1)
        if orelse:
            self.emit("} else {", d)
            self.stmts(orelse, d + 1)
        self.emit("}", d)

    def packed_source(self, ld: T.Load, jvar: str, rowwise: dict):
        """(base pointer, row, first column, columns) of a 4-bit column load, else None."""
        at = ld.idx[:-1] + (_at_j0(ld.idx[-1], jvar),)
        if ld.buf in rowwise:
            a = rowwise[ld.buf]
            if not a.layout.packed:
                return None
            r, c = (self.expr(x) for x in at[-2:])
            return self.stage_base(a, at), r, c, str(_const(a.shape[-1]))
        p = self.globals[ld.buf]
        if p.dtype not in ("u4", "i4"):
            return None
        dims = [pdim(x) for x in p.shape]
        row = self.linear(dims[:-1], at[:-1]) if len(dims) > 1 else "0"
        return cname(p.name), row, self.expr(at[-1]), dims[-1]

    def emit_column_load(self, ld: T.Load, jvar: str, rowwise: dict, packed, vec: int, nload: str,
                         d: int):
        """The vector load of one group's columns into its register array (storage form)."""
        name = self.ctx.vec_loads[ld]
        at = ld.idx[:-1] + (_at_j0(ld.idx[-1], jvar),)
        if packed is not None:  # 4-bit values, unpacked to int32
            base, row, col, cols = packed
            self.emit(f"int32_t {name}[{vec}];", d)
            self.emit(f"tilec::load_vec4<{vec}, {str(ld.dtype == 'i4').lower()}>({name}, {base}, "
                      f"{row}, {col}, {cols}, {nload});", d)
            return
        if ld.buf in rowwise:  # a row-major shared tile: the group's columns are contiguous
            a = rowwise[ld.buf]
            r, c = (self.expr(x) for x in at[-2:])
            ptr = f"{self.stage_base(a, at)} + {self.shared_layout_type(a)}::offset({r}, {c})"
            dtype = a.dtype
        else:
            p = self.globals[ld.buf]
            ptr, dtype = f"{cname(p.name)} + {self.global_offset(p, at)}", p.dtype
        self.emit(f"{STORE[dtype]} {name}[{vec}];", d)
        if self.ctx.aligned and ld in self.ctx.aligned:
            # (a shared tile: a generic address; a global input: read once, or another one,
            # whose L2 policy tilec_cuda.h chooses)
            hint = "" if ld.buf in rowwise else \
                ", tilec::LOAD_ONCE" if self.reads_once(ld.buf) else ", tilec::LOAD_GLOBAL"
            self.emit(f"tilec::load_vec_whole<{vec}, {bits_kind(dtype)}{hint}>({name}, {ptr});", d)
        else:
            self.emit(f"tilec::load_vec<{vec}, {bits_kind(dtype)}>({name}, {ptr}, {nload});", d)

    def reads_once(self, buf: str) -> bool:
        """Whether this kernel reads each element of input `buf` once: an elementwise kernel (no
        reductions, products, copies or barriers) over the shape of one of its outputs."""
        if self.elementwise is None:
            self.elementwise = not any(isinstance(st, _COLLECTIVE) or
                                       (isinstance(st, T.Alloc) and st.scope == "shared")
                                       for st in T.walk_stmts(self.k.body))
        p = self.globals[buf]
        return self.elementwise and p.kind == "input" and any(
            q.kind == "output" and q.shape == p.shape for q in self.k.params)

    def paired_dequant(self, value, dt: str, sources: dict):
        """(q, s, bias bits) when `value` is dt((f32(q) - zero) * f32(s)) of a 4-bit column load q
        and a column load s of the 16-bit dtype dt (what `dequant` lowers to) that dequant4x8
        computes exactly, two values per instruction; else None."""
        hit = _dequant_form(value, dt) if dt in SIXTEEN else None
        if hit is None or hit[0] not in self.ctx.vec_loads or sources.get(hit[0]) is None or \
           hit[2] not in self.ctx.vec_loads or hit[2].dtype != dt:
            return None
        q, zero, sc = hit
        bits = dequant_bias(dt, zero, q.dtype)
        return None if bits is None else (q, sc, f"{bits:04x}")

    def dequant_values(self, body, sources: dict) -> list:
        """The 16-bit dequantized values the group's statements compute inside larger
        expressions (a GEMV's `acc + a * dequant(...)`): (expression, q, s, bias bits) for each
        distinct one, when every statement is a store and there is at least one."""
        out, seen = [], set()
        for st in body:
            if not isinstance(st, T.Store):
                return []
            for e in T.walk_exprs(st.value):
                if isinstance(e, T.Cast) and e.dtype in SIXTEEN and e not in seen:
                    hit = self.paired_dequant(e, e.dtype, sources)
                    if hit is not None:
                        seen.add(e)
                        out.append((e,) + hit)
        return out

    def dequant_stores(self, body, orelse, sources: dict) -> list:
        """When every store of the group stores a paired dequantization (`paired_dequant`) of
        the stored 16-bit dtype, and the else branch stores zeros: (store, q, s, bias bits) for
        each, else []."""
        out = []
        for st in body:
            if not isinstance(st, T.Store):
                return []
            dt = (self.allocs[st.buf] if st.buf in self.allocs else self.globals[st.buf]).dtype
            hit = self.paired_dequant(st.value, dt, sources)
            if hit is None:
                return []
            out.append((st,) + hit)
        for st in orelse:
            if not (isinstance(st, T.Store) and isinstance(st.value, T.Const) and
                    st.value.value == 0 and any(st.buf == x.buf and st.idx == x.idx
                                                for x, *_ in out)):
                return []
        return out

    def vector_group(self, body, orelse, ok, jvar, col0, col_bounds, other, vec, d):
        """One group of `vec` consecutive columns: its global loads along the columns as vector
        loads, the body per column, its global stores along the columns as vector stores; only
        the first tilec_n columns (those inside every column bound) are valid, and with an else
        branch only where `ok` holds."""
        # inside a layout of static columns the group's first column and its count are small:
        # 32-bit registers (a streamed row's column runs to the tensor's length: 64 bits)
        small = not self.ctx.streaming
        self.emit(f"const {'int' if small else 'int64_t'} tilec_j0 = {col0};", d)
        n = str(vec)
        for base, bound in col_bounds:
            lim = self.expr(T.isub(bound, base)) if not (isinstance(base, T.Const) and base.value == 0) \
                else self.expr(bound)
            n = f"tilec::imin({n}, {lim} - tilec_j0)"
        if small and col_bounds:  # between 0 and vec whatever the bounds
            n = f"(int)tilec::imax(0, {n})"
        self.emit(f"const {'int' if small else 'int64_t'} tilec_n = {n};", d)
        self.emit("(void)tilec_n;", d)
        nload = f"({ok} ? tilec_n : 0)" if ok else "tilec_n"
        ctx = self.ctx
        rowwise = {n: a for n, a in self.allocs.items() if a.scope == "shared" and not a.layout.swizzle}
        loads = _column_loads(body, jvar, {**self.globals, **rowwise})
        for ld in loads:
            ctx.vec_loads[ld] = self.fresh("tilec_ld")
        sources = {ld: self.packed_source(ld, jvar, rowwise) for ld in loads}
        dequant = [] if other or vec != 8 else self.dequant_stores(body, orelse, sources)
        values = [] if dequant or other or orelse or vec != 8 else \
            self.dequant_values(body, sources)
        # loaded as words on the fast path (in program order: the source is deterministic)
        deferred = list(dict.fromkeys(q for _, q, _, _ in dequant + values))
        for ld in loads:
            if ld not in deferred:
                self.emit_column_load(ld, jvar, rowwise, sources[ld], vec, nload, d)
        for b in self.row_divisors(body, jvar):
            name = self.fresh("tilec_rcp")
            self.emit(f"const float {name} = tilec::recip({self.expr(b)});", d)
            ctx.recips[b] = name
        stores = [] if other or orelse else [
            st for st in body if isinstance(st, T.Store) and st.buf in self.globals and
            unit_stride(st.idx, jvar)]
        for st in stores:
            name = self.fresh("tilec_st")
            self.emit(f"{STORE[self.globals[st.buf].dtype]} {name}[{vec}];", d)
            ctx.vec_stores[id(st)] = name
        # stores into a shared tile whose `vec` columns are contiguous: one vector store, when
        # every element stores (both branches write the same element) or the tail is predicated
        shared_stores = []
        if not other:
            for st in body:
                if not (isinstance(st, T.Store) and st.buf in self.allocs and
                        self.allocs[st.buf].scope == "shared" and unit_stride(st.idx, jvar) and
                        self.vector_tile(self.allocs[st.buf], vec)):
                    continue
                twin = next((e for e in orelse if isinstance(e, T.Store) and e.buf == st.buf and
                             e.idx == st.idx), None)
                if orelse and twin is None:
                    continue
                name = self.fresh("tilec_st")
                a = self.allocs[st.buf]
                self.emit(f"{STORE[a.dtype]} {name}[{vec}];", d)
                ctx.vec_stores[id(st)] = name
                if twin is not None:
                    ctx.vec_stores[id(twin)] = name
                shared_stores.append((st, name, twin is not None))
        conds = ([ok] if ok else []) + [self.expr(c) for c in other]

        def element_loop(guarded: bool, depth: int):
            self.emit("#pragma unroll", depth)
            self.emit(f"for (int tilec_v = 0; tilec_v < {vec}; ++tilec_v) {{", depth)
            self.emit(f"const int64_t {cname(jvar)} = tilec_j0 + tilec_v;", depth + 1)
            self.emit(f"(void){cname(jvar)};", depth + 1)
            self.branch(conds + (["tilec_v < tilec_n"] if guarded else []), body, orelse, depth + 1)
            self.emit("}", depth)
        if dequant or values:
            # whole groups of packed 4-bit values: two values per instruction (dequant4x8) into
            # the vector store, or into registers the element loop reads; the rest (a row's last
            # group, a masked group, an unaligned word) value by value
            words, calls, arrays = [], [], []
            for x, q, sc, bias in dequant + values:
                w = self.fresh("tilec_w")
                base, row, col, cols = sources[q]
                if ctx.aligned and q in ctx.aligned:  # a whole version: known whole words
                    self.emit(f"const uint32_t {w} = tilec::word4_whole({base}, {row}, {col}, "
                              f"{cols});", d)
                else:
                    self.emit(f"uint32_t {w} = 0;", d)
                    words.append(f"tilec::word4({w}, {base}, {row}, {col}, {cols})")
                if isinstance(x, T.Store):
                    dst = ctx.vec_stores[id(x)]
                else:
                    dst = self.fresh("tilec_dq")
                    arrays.append(f"uint16_t {dst}[{vec}];")
                    ctx.values[x] = dst
                calls.append(f"tilec::dequant4x8<{kind(sc.dtype)}, {str(q.dtype == 'i4').lower()}>"
                             f"({dst}, {w}, 0x{bias}{bias}u, {ctx.vec_loads[sc]});")
            fast = ([] if not col_bounds else [f"tilec_n >= {vec}"]) + ([ok] if ok else []) + words
            if fast:
                self.emit(f"if ({' && '.join(fast)}) {{", d)
            for c in arrays + calls:
                self.emit(c, d + bool(fast))
            if values:
                element_loop(False, d + bool(fast))
            ctx.values.clear()
            if fast:
                self.emit("} else {", d)
                for q in deferred:
                    self.emit_column_load(q, jvar, rowwise, sources[q], vec, nload, d + 1)
                element_loop(bool(col_bounds), d + 1)
                self.emit("}", d)
        elif col_bounds and vec > 1:
            # whole groups (all but the last of a row) run without a test per element
            self.emit(f"if (tilec_n >= {vec}) {{", d)
            element_loop(False, d + 1)
            self.emit("} else {", d)
            element_loop(True, d + 1)
            self.emit("}", d)
        else:
            element_loop(bool(col_bounds), d)
        for st in stores:
            p = self.globals[st.buf]
            if id(st) in ctx.staged and ctx.packed:  # kept for the next tile's K loop
                self.emit(f"{self.pending(st.buf)}[tilec_q] = tilec::sm90::pack16x2("
                          f"{ctx.vec_stores[id(st)]});", d)
                continue
            if id(st) in ctx.staged:  # into this panel's staging buffer, in TMA's swizzle
                buf, cols = ctx.staged[id(st)]
                self.emit(f"tilec::store_vec_whole<{vec}, {bits_kind(p.dtype)}>("
                          f"{self.staging_buffer(buf)} + tilec::sm90::sw128<{BYTES[p.dtype]}>("
                          f"{cname(ctx.ivar)} % 64, tilec_j0 % {cols}), {ctx.vec_stores[id(st)]});",
                          d)
                continue
            at = st.idx[:-1] + (_at_j0(st.idx[-1], jvar),)
            ptr = f"{cname(p.name)} + {self.global_offset(p, at)}"
            if ctx.aligned and id(st) in ctx.aligned:
                self.emit(f"tilec::store_vec_whole<{vec}, {bits_kind(p.dtype)}>({ptr}, "
                          f"{ctx.vec_stores[id(st)]});", d)
            else:
                self.emit(f"tilec::store_vec<{vec}, {bits_kind(p.dtype)}>({ptr}, "
                          f"{ctx.vec_stores[id(st)]}, tilec_n);", d)
        for st, name, whole in shared_stores:
            a = self.allocs[st.buf]
            at = st.idx[:-1] + (_at_j0(st.idx[-1], jvar),)
            r, c = (self.expr(x) for x in at[-2:])
            n = str(vec) if whole else nload
            self.emit(f"tilec::store_vec<{vec}, {bits_kind(a.dtype)}>({self.stage_base(a, at)} + "
                      f"{self.shared_layout_type(a)}::offset({r}, {c}), {name}, {n});", d)


def _const(e):
    return e.value if isinstance(e, T.Const) else None


def _lit(v, dtype):
    from .cstyle import float_lit
    return float_lit(float(v), dtype)


def _at_j0(last, jvar: str):
    """The last index with the column variable replaced by the group's first column."""
    return T.iadd(column_base(last, jvar), T.Var("tilec_j0"))


def _dequant_form(value, dtype: str):
    """(q, zero, s) when `value` is dtype((f32(q) - zero) * f32(s)) (or without `- zero`) with q a
    4-bit load, zero an integer constant and s a load of `dtype`; else None."""
    if isinstance(value, T.Cast) and value.dtype == dtype:
        value = value.x
    if not (isinstance(value, T.Binary) and value.fn == "mul" and value.dtype == "f32"):
        return None
    for x, s in ((value.a, value.b), (value.b, value.a)):
        if not (isinstance(s, T.Cast) and isinstance(s.x, T.Load) and s.x.dtype == dtype):
            continue
        zero = 0
        if isinstance(x, T.Binary) and x.fn == "sub" and isinstance(x.b, T.Const) and \
           float(x.b.value).is_integer():
            x, zero = x.a, int(x.b.value)
        if isinstance(x, T.Cast) and isinstance(x.x, T.Load) and x.x.dtype in ("u4", "i4"):
            return x.x, zero, s.x
    return None


def _column_loads(body, jvar: str, globals_: dict) -> list:
    """Loads of the buffers `globals_` in `body` (outside nested branches) that walk the columns
    with unit stride: loaded once per group as vectors. Every element of the group that runs
    `body` reads them."""
    out = []
    for st in body:
        if isinstance(st, (T.If, T.For)):
            continue
        exprs = [getattr(st, "value", None)] + list(getattr(st, "idx", ()) or ())
        for e in exprs:
            if e is None or isinstance(e, str):
                continue
            for x in T.walk_exprs(e):
                if isinstance(x, T.Load) and x.buf in globals_ and x not in out and \
                   globals_[x.buf].dtype != "bool" and unit_stride(x.idx, jvar):
                    out.append(x)
    return out


def _parallel_loops(body, outer=()):
    """(loop, variables of the sequential loops around it) for each parallel loop of `body` that
    is a statement of it or of its sequential loops (a GEMV's rows, a split's K steps)."""
    for st in body:
        if isinstance(st, T.For) and st.kind == "parallel":
            yield st, outer
        elif isinstance(st, T.For):
            yield from _parallel_loops(st.body, outer + tuple(st.vars))


def row_masked(st) -> bool:
    """Does a parallel loop in `st` compute with its first (row) variable other than as an
    index, e.g. a causal mask comparing key and query positions? (Such kernels keep the rows'
    positions in registers: with two buffers of P, causal attention at D = 128 spilled.)"""
    def bare(e, var) -> bool:  # (var in e outside the indices of loads)
        if isinstance(e, T.Var):
            return e.name == var
        parts = () if isinstance(e, T.Load) else \
            (getattr(e, f, None) for f in ("a", "b", "c", "x", "cond"))
        return any(bare(p, var) for p in parts if p is not None and not isinstance(p, str))
    return any(isinstance(x, T.For) and x.kind == "parallel" and len(x.vars) == 2 and
               any(isinstance(y, T.Store) and bare(y.value, x.vars[0])
                   for y in T.walk_stmts(list(x.body)))
               for x in T.walk_stmts([st]))


def rename_stores(st, buf: str, to: str):
    """Statement `st` with its stores into `buf` storing into `to` instead."""
    def fn(x):
        return [replace(x, buf=to)] if isinstance(x, T.Store) and x.buf == buf else None
    return map_stmts((st,), fn)[0]


# statements through which the threads of a block exchange values
_COLLECTIVE = (T.Reduce, T.Allreduce, T.Barrier, T.Gemm, T.GemmLoad, T.GemvMma, T.Copy, T.Commit,
               T.Wait)


# ---- whole-program rendering ----------------------------------------------------------------
def render_kernel(k: T.TileKernel, symbols, target, renderer=None, after: bool = False,
                  before: bool = False) -> dict:
    # the Lets of dimensions alone (host_scalars pass) and the grid: computed by the launcher
    host = host_scalars.host_lets(k)
    body = tuple(st for st in k.body if not any(st is h for h in host))
    em = (renderer or CudaRenderer)(k, target)  # (the HIP target's subclass renders its own)
    em.launcher_values = T.shape_dims(k) | {h.name for h in host}
    # shared buffers: 128-byte aligned; TMA's 128-byte swizzle needs 1024 (and the mbarriers
    # of a warp-specialized kernel follow them)
    shared, frags, off = [], [], 0
    align = 1024 if k.warp_specialize else 128
    for a in em.allocs.values():
        if a.scope == "shared":
            shared.append(dict(name=cname(a.name), ctype=STORE[a.dtype], offset=off,
                               what=f"{a.dtype}[{', '.join(T.fmt(x) for x in a.shape)}], {a.layout}"))
            off += placed_bytes([a], align)
    maps = []
    if k.warp_specialize:
        em.ws_barriers = off
        stages = next(st.stages for st in T.walk_stmts(body)
                      if isinstance(st, T.For) and st.kind == "warp_specialized")
        once = any(isinstance(st, T.Copy) for st in body)  # (tiles copied before the loop)
        # full[S], empty[S] (, full_v[S], empty_v[S]: decided by warp_specialized, which reads
        # the ring's place only) (, order[2]) (, once (, once_free: persistent))
        em.warp_specialized(body, 1)
        off += 16 * stages * (2 if em.kv_split else 1) + (16 if k.pingpong else 0) + \
            (8 if once else 0) + (8 if once and k.persistent else 0)
        maps = tensor_maps(k, em.ws_maps)
    elif not em.version_whole(body, 1):
        em.stmts(body, 1)
    for a in em.allocs.values():
        if a.scope == "shared":
            continue
        elif a.dtype in SIXTEEN:  # two 16-bit values per register
            frags.append(dict(name=cname(a.name), ctype="uint32_t", slots=pair_words(a),
                              what=f"{a.dtype}[{', '.join(T.fmt(x) for x in a.shape)}], {a.layout}, "
                                   "16-bit pairs"))
        else:
            frags.append(dict(name=cname(a.name), ctype=REG[a.dtype], slots=a.layout.slots(),
                              what=f"{a.dtype}[{', '.join(T.fmt(x) for x in a.shape)}], {a.layout}"))
    params = []
    for p in k.params:
        if p.kind == "scalar":
            params.append(f"{em.ctype(p.dtype)} {cname(p.name)}")
        else:
            const = "const " if p.kind == "input" else ""
            params.append(f"{const}{ABI_TYPE[p.dtype]}* __restrict__ {cname(p.name)}")
    # a dimension or host value the kernel does not read is an unnamed parameter
    used = used_names(replace(k, body=body, grid=()))
    host_names = [cname(h.name) for h in host if h.name in used]  # (the kernel's; others feed them)
    kparams = params + [f"int64_t {cname(s)}" if s in used else f"int64_t /*{s}*/"
                        for s in symbols]
    kparams += [f"int64_t {n}" for n in host_names] + [f"int64_t tilec_g{n}" for n in range(3)]
    kparams = [f"const __grid_constant__ CUtensorMap tilec_map_{cname(t)}" for t in em.ws_maps] + \
        kparams
    params += [f"int64_t {cname(s)}" for s in symbols]  # the host launcher passes them all
    grid = [em.expr(g) for g in k.grid] + ["1"] * (3 - len(k.grid))
    # matrix kernels and column reductions: registers matter more than a second block per SM
    # (no spills; given only the threads, ptxas held column reductions of 512 threads to 64
    # registers or fewer and spilled: 12 bytes for sm_80 at 64, 36 for sm_90a at 40)
    regs_first = any(isinstance(s, T.Gemm) or (isinstance(s, T.Alloc) and isinstance(s.layout, VecCols))
                     for s in T.walk_stmts(k.body))
    bounds = f"{k.threads}, {k.blocks_per_sm}" if regs_first or k.blocks_per_sm > 1 else f"{k.threads}"
    args = [f"tilec_map_{cname(t)}" for t in em.ws_maps] + \
        [cname(p.name) for p in k.params] + [cname(s) for s in symbols] + host_names + \
        ["tilec_g0", "tilec_g1", "tilec_g2"]
    # the block's tile from its index (a persistent kernel walks its tiles in the body instead)
    block = [] if k.persistent else [
        "const int64_t tilec_b = (int64_t)blockIdx.x + (int64_t)blockIdx.y * gridDim.x;",
        "if (tilec_b >= tilec_grid[0] * tilec_grid[1] * tilec_grid[2]) return;"] + \
        [f"const int64_t {name} = {e};" for name, e in block_vars(k)]
    # sm_90a code (wgmma, setmaxnreg): a stub in the other architectures' code
    guard = (["#if defined(TILEC_SM90A)"],
             ["#else", "    __trap();  // (sm_90a code: the launcher runs it on H100/H200 devices alone)",
              "#endif"]) if k.warp_specialize else ([], [])
    lines = drop_unread(em.lines)
    plans = list(em.copy_plans.values())
    # the thread's index, lane and warp, declared where the kernel reads them
    reads = names_in(lines + block + plans)
    warp = target.resources.warp
    ids = []
    if "tilec_lane" in reads:
        ids.append(f"const int tilec_lane = tilec_tid & {warp - 1};")
    # only where the wgmma operands are 16-bit (or tf32), whose descriptors move by constant
    # offsets: fp8 operands' descriptors are rebuilt per k-step, and in uniform registers the fp8
    # GEMM measured 0.78-0.85x torch._scaled_mm at 8192^3 against 0.96x without the broadcast
    # (H100, two A/B calls: docs/PERFORMANCE.md)
    uniform = all(em.allocs[g.b].dtype in SIXTEEN + ("f32",) for g in T.walk_stmts(k.body)
                  if isinstance(g, T.Gemm) and g.b in em.allocs)
    if "tilec_warp" in reads and k.warp_specialize and uniform:
        ids += ["// (broadcast from lane 0: the compiler then knows every lane holds the same "
                "warp index, and",
                "// keeps what derives from it, such as a warpgroup's 16-bit wgmma descriptors, "
                "in uniform registers)",
                f"const int tilec_warp = __shfl_sync(0xffffffffu, tilec_tid >> "
                f"{warp.bit_length() - 1}, 0);"]
    elif "tilec_warp" in reads:
        ids.append(f"const int tilec_warp = tilec_tid >> {warp.bit_length() - 1};")
    if ids or "tilec_tid" in reads:
        ids.insert(0, "const int tilec_tid = (int)threadIdx.x;")
    # where the call launches another kernel before this one, or after it: dependent launches
    # (tilec_cuda.h, launch_after), each kernel's first statements
    order = (["    tilec::wait_for_prior();  // (until the call's previous kernel has finished: "
              "its results are visible)"] if after else []) + \
        (["    tilec::allow_dependents();  // (the call's next kernel may launch: it waits for "
          "this one to finish)"] if before else [])
    return dict(name=k.name, comment=k.comment, params=params, kparams=kparams, bounds=bounds,
                grid=grid, maps=maps, launch=launch_lines(k, off, args, after), order=order,
                smem_decl=smem_lines(k, off),
                block=block, guard=guard, ids=ids,
                host=[(cname(h.name), em.expr(h.value)) for h in host],
                int32_bounds=[cname(n) for n in sorted(em.int32_bounds)],
                shared=shared, frags=frags, plans=plans, body=lines,
                tile_ir=T.print_kernel(k).splitlines(), smem=off, args=args)


def variant_guards(k: T.TileKernel) -> list:
    """The run-time conditions of a warp-specialized variant beyond its dims: the tensors TMA
    reads 16-byte aligned, and a device that runs sm_90a code (an H100/H200)."""
    if not k.warp_specialize:
        return []
    return [f"tilec::aligned16({cname(n)})" for n in k.aligned] + ["tilec::sm90a_device()"]


def launch_order(prog: T.TileProgram) -> dict:
    """Each kernel's place among a call's launches: name -> (after, before), whether the call
    launches another kernel before it, and after it (the parts of a variant in order, then the
    next launch slot's)."""
    slots = prog.slots()
    return {k.name: (si > 0 or pi > 0, si < len(slots) - 1 or pi < len(v) - 1)
            for si, variants in enumerate(slots) for v in variants for pi, k in enumerate(v)}


def launch_lines(k: T.TileKernel, smem: int, args: list, after: bool = False) -> list:
    """The launcher's lines from the grid sizes (tilec_g0..2) on: the grid (one block per tile,
    or a persistent one: as many blocks or clusters of blocks as the device holds at once), the
    shared-memory limit, the launch and its status."""
    call = f"{k.name}, {smem}, tilec_smem_ready"
    allow = ["static std::atomic<unsigned> tilec_smem_ready{0};",
             f"if (tilec::allow_smem({call}) != cudaSuccess) return TILEC_ERR_LAUNCH;"]
    done = "return cudaGetLastError() == cudaSuccess ? TILEC_OK : TILEC_ERR_LAUNCH;"
    # (after another kernel of the call: whether its launch may be a dependent one, per device)
    known = ["static std::atomic<int> tilec_after[64];  // (a dependent launch where it may be)"] \
        if after else []
    c = k.cluster
    if c > 1:
        return [f"// a persistent grid of clusters of {c} blocks (as many as fit at once) walks "
                f"the tiles, {c} at a time"] + allow + [
                "static std::atomic<int> tilec_resident[64];"] + known + [
                f"const int64_t tilec_clusters = tilec_g0 * ((tilec_g1 + {c - 1}) / {c}) * tilec_g2;",
                f"if (tilec::launch_pairs({k.name}, tilec_clusters, {k.threads}, {smem}, tilec_stream, "
                f"tilec_resident, {'tilec_after' if after else 'nullptr'}, {', '.join(args)}) != "
                "cudaSuccess) return TILEC_ERR_LAUNCH;", done]
    if k.persistent:
        out = [f"// a persistent grid: {k.blocks_per_sm} block(s) per SM walk the tiles",
               "const int64_t tilec_tiles = tilec_g0 * tilec_g1 * tilec_g2;",
               f"const int64_t tilec_resident = (int64_t)tilec::sm_count() * {k.blocks_per_sm};",
               "const int64_t tilec_blocks = tilec_resident > 0 && tilec_resident < tilec_tiles ? "
               "tilec_resident : tilec_tiles;"]
    else:
        out = ["const int64_t tilec_blocks = tilec_g0 * tilec_g1 * tilec_g2;"]
    out += ["const int64_t tilec_x = tilec_blocks < 2147483647 ? tilec_blocks : 2147483647;",
            "const int64_t tilec_y = (tilec_blocks + tilec_x - 1) / tilec_x;",
            "if (tilec_y > 65535) return TILEC_ERR_UNSUPPORTED;"]
    if smem > 48 * 1024:
        out += allow
    if after:  # (the call launched another kernel before this one)
        return out + known + [
            f"if (tilec::launch_after({k.name}, dim3((unsigned)tilec_x, (unsigned)tilec_y), "
            f"{k.threads}, {smem}, tilec_stream, tilec_after, {', '.join(args)}) != "
            "cudaSuccess) return TILEC_ERR_LAUNCH;", "return TILEC_OK;"]
    return out + [f"{k.name}<<<dim3((unsigned)tilec_x, (unsigned)tilec_y), {k.threads}, {smem}, "
                  f"tilec_stream>>>({', '.join(args)});", done]


def smem_lines(k: T.TileKernel, smem: int) -> list:
    """The kernel's dynamic shared memory (none: no lines): 128-byte aligned, or 1024 for the
    128-byte swizzle of TMA, under a name of its own (every kernel of a file shares one extern
    array per name, and its alignment)."""
    if not smem:
        return []
    if not k.warp_specialize:
        return ["extern __shared__ __align__(128) unsigned char tilec_smem[];"]
    return ["// (its own name: every kernel of a file shares one extern array, and this one is "
            "aligned more)",
            "extern __shared__ __align__(1024) unsigned char tilec_smem_1024[];",
            "unsigned char* const tilec_smem = tilec_smem_1024;"]


# setmaxnreg: the producer warpgroup keeps 40 registers a thread (24 with attention's two P
# buffers, FlashAttention-3's split); the consumer warpgroups share the rest of the registers the
# block was launched with (a multiple of 8, at most 240)
PRODUCER_REGS = 40
PRODUCER_REGS_DOUBLE_P = 24


def consumer_regs(consumers: int, producer: int = PRODUCER_REGS) -> int:
    """Registers a consumer thread asks for. setmaxnreg moves registers within the block's own
    allocation: the launch gives every thread the kernel's count (65536 over the threads, a
    multiple of 8: 168 at 384 threads), and a consumer's setmaxnreg.inc waits until the producer
    has freed enough, forever if the counts add up to more (2 x 128 x 240 + 128 x 32 = 65536
    is over the 64512 of 384 threads: that kernel hung on an H100)."""
    threads = 128 * (consumers + 1)
    block = 65536 // threads // 8 * 8 * threads
    return min(240, (block - 128 * producer) // (128 * consumers) // 8 * 8)


def tensor_maps(k: T.TileKernel, used: dict) -> list:
    """The launcher's lines that build the tensor maps of a warp-specialized kernel's TMA copies
    and stores (cached by tilec::tensor_map): each tensor row-major, boxes of one 128-byte row
    (128 fp8, 64 16-bit or 32 f32 columns) by the window's rows; a map the driver refuses is
    TILEC_ERR_UNSUPPORTED."""
    params = {p.name: p for p in k.params}
    out = []
    for name, (rows, rank) in used.items():
        p = params[name]
        # innermost first; the leading dims of a tensor of more than 3 merged into one
        # (tilec's tensors are contiguous: their product is one more row-major dim)
        shape = [pdim(d) for d in p.shape]
        if len(shape) > 3:
            shape = [" * ".join(f"(uint64_t)({d})" for d in shape[:-2])] + shape[-2:]
        dims = [f"(uint64_t)({d})" for d in reversed(shape)]
        strides, acc = [], f"(uint64_t)({shape[-1]}) * {BYTES[p.dtype]}"
        for d in list(reversed(shape))[1:-1]:
            strides.append(acc)
            acc = f"{acc} * (uint64_t)({d})"
        strides.append(acc)
        strides = strides[:rank - 1]
        cols = 128 // BYTES[p.dtype]
        box = [str(cols), str(rows)] + ["1"] * (rank - 2)
        dt = {"f16": "CU_TENSOR_MAP_DATA_TYPE_FLOAT16", "bf16": "CU_TENSOR_MAP_DATA_TYPE_BFLOAT16",
              "f32": "CU_TENSOR_MAP_DATA_TYPE_FLOAT32", "fp8e4m3": "CU_TENSOR_MAP_DATA_TYPE_UINT8",
              "fp8e5m2": "CU_TENSOR_MAP_DATA_TYPE_UINT8"}[p.dtype]
        m = f"tilec_map_{cname(name)}"
        out += [f"CUtensorMap {m};  // {name}: boxes of {cols} columns x {rows} rows, 128-byte "
                "swizzle",
                "{",
                f"    const uint64_t tilec_dims[{rank}] = {{{', '.join(dims)}}};",
                f"    const uint64_t tilec_strides[{rank - 1}] = {{{', '.join(strides)}}};",
                f"    const uint32_t tilec_box[{rank}] = {{{', '.join(box)}}};",
                f"    if (!tilec::tensor_map(&{m}, {cname(name)}, {dt}, {rank}, tilec_dims, "
                "tilec_strides, tilec_box))",
                "        return TILEC_ERR_UNSUPPORTED;",
                "}"]
    return out


def block_vars(k: T.TileKernel) -> list:
    """The Tile IR's block variables from the linear block index `tilec_b`: x fastest; with a
    rasterization panel (`swizzle`), blocks walk panels of `swizzle` block rows column by column,
    so consecutive blocks share operand tiles in L2."""
    names = [cname(v) for v in k.block_vars]
    out = []
    if k.swizzle and len(names) >= 2:
        sw = k.swizzle
        per = "tilec_grid[0] * tilec_grid[1]"
        out.append(("tilec_lin", f"tilec_b % ({per})"))
        out.append(("tilec_panel", f"tilec_lin / ({sw} * tilec_grid[0])"))
        out.append(("tilec_rows", f"tilec::imin(tilec_grid[1] - tilec_panel * {sw}, {sw})"))
        out.append(("tilec_in", f"tilec_lin % ({sw} * tilec_grid[0])"))
        out.append((names[1], f"tilec_panel * {sw} + tilec_in % tilec_rows"))
        out.append((names[0], "tilec_in / tilec_rows"))
        if len(names) == 3:
            out.append((names[2], f"tilec_b / ({per})"))
        return out
    return linear_block_vars(k)


def _gencode(arch: str) -> str:
    num = arch[3:]
    return f"-gencode arch=compute_{num},code=sm_{num}"


def device_context(target, gpu: str, stream_type: str) -> dict:
    """What kernel.cu.j2 says of the device (CUDA's or HIP's): the kernels' kind, the device
    library and the stream type."""
    return dict(gpu=gpu, device_library=target.device_library, stream_type=stream_type)


def render(target, src, m, env, banner, options) -> dict:
    archs = options.get("arch") or target.default_arch

    def kernel_context(g, prog):
        ctx = launcher_context(g, prog, ["cudaStream_t tilec_stream"], ["tilec_stream"],
                               machine={T.SMS: "(int64_t)std::max(tilec::sm_count(), 1)"},
                               guards=variant_guards,
                               refusable=lambda k: bool(k.warp_specialize))
        order = launch_order(prog) if split_k.dependent_launches(True) else {}
        ctx["kernels"] = []
        for k in prog.kernels:
            after, before = order.get(k.name, (False, False))
            ctx["kernels"].append(render_kernel(k, g.symbols, target, after=after, before=before))
        ctx.update(device_context(target, "CUDA", "cudaStream_t"))
        return ctx
    files, libs = render_libraries(
        target, src, m, env, banner, options, kernel_context, ["cuda_runtime_api.h"],
        ["tilec_stream: the CUDA stream the kernels run on (0: default)",
         "Tensor pointers are device memory."])
    files["tilec_cuda.h"] = env.loader.get_source(env, "cuda/tilec_cuda.h")[0]
    files.update(gpu_common_files(env))
    # PTX of the last architecture for newer GPUs, without the `a` (arch-specific code such as
    # wgmma runs only on the GPUs it names; the warp-specialized kernels are launched on those
    # alone, so the portable PTX holds a stub of them)
    last = archs[-1][3:].rstrip("a")
    files["Makefile"] = env.get_template("cuda/Makefile.j2").render(
        banner=banner("#"), libs=libs,
        gencode=" ".join(_gencode(a) for a in archs) +
        f" -gencode arch=compute_{last},code=compute_{last}", archs=", ".join(archs))
    return files


def gpu_common_files(env) -> dict:
    """The device code the GPU libraries share (tilec_cuda.h and tilec_hip.h include it)."""
    return {"tilec_gpu.h": env.loader.get_source(env, "common/tilec_gpu.h")[0]}


def _for_arch(target, options: dict):
    """Hopper's resources when sm_90a is among the architectures built: GEMMs get the
    warp-specialized TMA + wgmma kernel, compiled for sm_90a (a stub elsewhere: wgmma and
    setmaxnreg exist only there) and launched on H100/H200 devices alone (the launcher asks)."""
    archs = options.get("arch") or target.default_arch
    if "sm_90a" in archs:
        # 128 x 256 tiles, K tiles of 64 (one 128-byte swizzle row), 4 stages (192 KiB of
        # shared memory), two consumer warpgroups of 64 x 256 accumulators each (128 registers
        # of a thread's 232) and a producer warpgroup
        default = (128, 256, 64, 4, 2, False, 1)
        wgmma = split_k.wgmma_tile(default)
        # attention: 128 query rows (64 per consumer warpgroup), 128 keys per stage, 3 stages of
        # K and V tiles (224 KiB with the Q tile at D = 128; 2 stages measured 0.65x cuDNN
        # against 0.92x); FlashAttention-3's order, each warpgroup's softmax beside its previous
        # P V (0.84x cuDNN at D = 128 against 0.76-0.78x with each product completed before the
        # softmax). The two warpgroups issue independently: taking turns (named barriers) helped
        # while the softmax was longer, and since the base-2 softmax measures 0.91-0.92x against
        # 0.95x without at D = 128, 0.90x against 0.94x at D = 64 (docs/PERFORMANCE.md). A
        # persistent grid walks the query tiles, loading a tile's Q during the tile before it
        # (D128 0.95-0.97x cuDNN against 0.93x one block per tile, causal 0.97-0.99x against
        # 0.93x; D64-D96 0.94-0.95x against 0.89-0.90x). K and V share a ring (rings of their
        # own measured alike with the persistent grid, 0.91-0.92x without it). P in two
        # buffers where the registers allow (D <= 128, no mask reading the query rows:
        # overlapped_loop): D128 1.696-1.711 ms against 1.740-1.754 ms with one, interleaved on
        # an H100 (1.03x cuDNN against 1.00-1.01x); D64 alike
        attention = split_k.wgmma_attention((128, 128, 3, True, False, True, False, 2) if wgmma
                                            else ())
        # fp8: the tensor cores accumulate fp8 products in less than f32 precision, so each
        # 128 values of K are summed into a partial that is then added to the accumulators in
        # f32 (Gemm.promote); 128 x 128 tiles, K tiles of 128 values, 6 stages of 32 KiB. Measured at 8192^3
        # (docs/PERFORMANCE.md): partials of 128 / 256 / 512 values 0.88x / 0.85x / 0.78x
        # torch._scaled_mm (a group holds its stages longer), never promoted 0.99x with 3x the
        # error. The K tiles go in pairs, into two partials beside the accumulators (192 of a
        # consumer thread's 232 registers, no spills): the second's wgmmas run while the first's
        # partial is added, 0.88x -> 0.95x at 8192^3
        wgmma_fp8 = (128, 128, 128, 6, 2, False, 1) if wgmma else ()
        promote = split_k.fp8_promote(128)
        pairs = split_k.fp8_pairs(True)
        # the epilogue's stores under the next tile's first wgmmas (CudaRenderer.
        # deferred_epilogue): f16 GEMM on the H200, interleaved with cuBLAS (docs/PERFORMANCE.md,
        # 2026-12-06 03:00): 4096^3 182.4 -> 180.0 us, 8192^3 1455.9 -> 1432.2 us; the whole
        # flush after the first K tile's wgmmas instead of a panel per K tile: 181.4, 1446.4 us
        deferred = split_k.deferred_epilogue(True)
        # B's rows off 128-byte lines (4096 x 4088 x 4096 f16, an H100, docs/PERFORMANCE.md
        # 2026-12-06 07:50): the copy engine splits each misaligned box row into more L2
        # requests, 0.249 ms against cuBLAS's 0.195-0.208; in clusters of 2 sharing B tiles
        # (half the requests) 0.198 ms. Only there: 4096^3 takes 0.185 ms in clusters, 0.180
        # without
        clusters = split_k.wgmma_pairs(True)
        # f32 `X @ W.T` under `precision tf32` on tf32 wgmma (K tiles of 32 values, the 16-bit
        # tile's bytes): 4096^3 0.349 ms against cuBLAS tf32's 0.346 on an H200, where tf32
        # mma.sync takes 0.97 (docs/PERFORMANCE.md, 2026-12-06 23:00); `A @ B` stays on tf32
        # mma.sync (tf32 wgmma takes K-major operands only)
        tf32 = split_k.wgmma_tf32(True)
        # 192 x 128 tiles, 4 stages, three consumer warpgroups (64 x 128 accumulators each),
        # where they waste less of the last wave of tiles than 128 x 256 (passes/tile.
        # fuller_waves; linear layers on an H100, docs/PERFORMANCE.md 2026-12-06 10:27). Not
        # beside another tile of the TILEC_WGMMA knob (what it measures is that tile alone)
        waves = split_k.wgmma_waves((192, 128, 64, 4, 3, False, 1) if wgmma == default else ())
        return replace(target, resources=replace(target.resources, wgmma=wgmma,
                                                 wgmma_pairs=clusters and wgmma[6:] == (1,),
                                                 wgmma_tf32=tf32,
                                                 wgmma_waves=waves,
                                                 wgmma_fp8=wgmma_fp8, fp8_promote=promote,
                                                 fp8_pairs=pairs, deferred_epilogue=deferred,
                                                 wgmma_attention=attention))
    return target


CUDA = Target(
    name="cuda",
    resources=Resources(
        warp=32, max_threads=1024, tile_memory=227 * 1024, mma=(16, 8, 16),
        gemm_tile=(128, 128, 64), gemm_stages=3, gemm_threads=128, row_block=1, row_threads=256,
        ew_tile=(1, 4096), ew_threads=256, attn_stages=2,
        # attention: 128 queries x 32 keys per step on 4 warps of 32 rows: each warp reads every
        # K and V fragment for two 16-row tiles (half the shared-memory reads per mma of 8 warps
        # of 16 rows: 0.87x SDPA flash against 0.72x, docs/PERFORMANCE.md); head dims 64, 96
        # and 128 (exact variants, and run-time ones up to each); at D = 128 that takes all 255
        # registers, so a head dim between 96 and 128 (run-time bounds and strides) runs its
        # D <= 128 variant on 8 warps of 16 rows instead; a causal mask splits the key loop
        # where the diagonal tiles start (per-tile versions of the masking statement spilled 8
        # bytes; the split loops none: 0.86x SDPA flash against 0.80x with the mask on every
        # tile), a key bound alone keeps per-tile versions (its split loop spilled 12 bytes)
        attn_tile=(128, 32), attn_threads=128, matrix_threads_by_capacity=((96, 128), (128, 256)),
        diagonal_masks="split",
        dtypes=ALL_DTYPES, async_copy=True, padded_operands=True,
        mma_dtypes=SIXTEEN, tf32=True,
        matrix_capacities=(64, 96, 128), row_capacities=(256, 1024, 4096, 8192, 16384),
        row_threads_by_capacity=((256, 128),),
        gemm_swizzle=8, scalar_gemm_tile=(64, 128, 32), row_tile=False,
        # column reductions: blocks of 512 threads over 128 bytes of each row, 256 rows a step (4
        # 16-byte vectors a thread; on an H100, f16 softmax over axis 0 of 8192 x 8192, 128
        # blocks: 0.532 / 0.313 / 0.237 ms on 256 / 512 / 1024 threads, 8 vectors a thread no
        # faster than 4; an f32 sum over the middle axis of 8 x 2048 x 4096, 1024 blocks: 0.105 /
        # 0.104 / 0.127 ms; docs/PERFORMANCE.md)
        col_reduce=(512, 256, 128, 264, 4),
        # f32 X @ W.T on the scalar units: 2 stages, registers capped for 3 blocks per SM (168
        # a thread, no spills): 3.30 ms against 3.67 at 4096^3 on an H100; A @ B measured
        # slower so (3.62 against 3.41) and keeps 3 stages, one block's bound
        # (docs/PERFORMANCE.md); so do f64 and an operand computed on its way (they spilled)
        scalar_gemm_kmajor=(2, 3),
        # M <= 16 (decode): 16-row tiles, 8 warps splitting N, deep K tiles (16 x 128 x 128 was
        # the fastest of six W4A16 tiles measured with split-K, docs/PERFORMANCE.md), at most
        # 8 KiB of weights per K tile: 16-bit weights take 16 x 32 x 128 on 4 warps (Llama-7B
        # decode shapes of 1, 8 and 16 rows on an H100: 0.020-0.041 ms against 0.021-0.053
        # for 128 columns and 0.022-0.046 for 64, docs/PERFORMANCE.md 2026-12-06 13:45)
        gemm_variants=((16, (16, 128, 128), 256, 4),),
        decode_weight_bytes=8192,
        # split decode GEMMs over K when their grid has fewer than 512 tiles (about 4 blocks for
        # each of the 132 SMs of an H100/H200, 2 resident at once: 128 registers, no spills),
        # at least 4 K tiles per split
        split_k=(512, 4, 2),
        # M = 1: 32 threads x 8 columns, 8 warps each taking 4 consecutive rows per step (8 of
        # 16-bit weights; their loads in flight together); splits of at least 128 rows, 2 blocks
        # per SM (<= 128 registers; 4 blocks per SM spill; measured against 1-2 rows per step,
        # 2-4 blocks per SM and a version staging B through shared memory: docs/PERFORMANCE.md)
        gemv=(256, 256, 512, 128, 2, 4),
        # M = 1 of 4-bit weights on the matrix units: 64 columns on 32 warps, about 128 blocks
        # (one per SM; N=K=8192 is not split), 64 registers: 0.022 ms at N=K=8192 against
        # 0.025 for 16 warps, 2 blocks per SM, 256 blocks, and 0.027-0.047 for ten others,
        # deeper load pipelines among them (docs/PERFORMANCE.md)
        gemv_mma=(64, 1024, 128, 128, 1),
        # the same for weights packed along K (tilec_cuda.h gemv_dequant4_mma_kmajor, 16-byte
        # loads of whole 64-byte column pieces): 32 columns on 8 warps, 3 blocks per SM (at 4
        # the split variant spills), split over K below 256 blocks. Measured at N=K=8192
        # (unsplit): 0.020 ms for 32 columns at 4 blocks per SM, against 0.025-0.030 for
        # 64-column blocks split to 512 or 1024 blocks (docs/PERFORMANCE.md, 2026-12-04)
        gemv_mma_kmajor=(32, 256, 256, 128, 3),
        # M <= 8 and M <= 16 (decode batches) on the same routines, each weight read and
        # dequantized once for all rows. Measured on an H100 at N = K = 8192 (docs/
        # PERFORMANCE.md, 2026-12-07 17:43): 8 rows on 24 warps 0.022-0.023 ms at M = 4 and 8
        # (32 warps: 0.021 ms at M = 8, but its split variant spills 48 bytes for sm_80),
        # 16 rows (a second n8 tile: twice the accumulators) on 16 warps 0.029 ms at M = 16
        # (8 warps, 2 blocks per SM: 0.049); packed along K, 8 warps, 2 blocks per SM (3 spill
        # in the split variants): 0.023-0.024 and 0.030 ms. The 16-row tile took 0.078-0.080
        # ms at M = 4-16, 0.121-0.124 packed along K
        gemv_mma_rows=((8, 768, 1), (16, 512, 1)),
        gemv_mma_rows_kmajor=((8, 256, 2), (16, 256, 2))),
    toolchain=Toolchain("NVCC", "nvcc", "CUDA compiler"),
    lowering=(
        # cp.async stages for pipelined K loops: needs the tile copies of the `tile` pass
        ("pipeline", pipeline.run),
        # key tiles no mask touches skip the masking statement's selects (uniform test per tile)
        ("version_masks", version_masks.run),
        # reduce -> per-thread partials + allreduce, joined to the loop that fills the row
        ("lower_reductions", lower_reductions.run),
        # run-time on-chip extents -> one variant per capacity (+ a streaming row variant)
        ("specialize", specialize.run),
        # per-block arithmetic (a scale from a dimension) out of the unrolled element loops
        ("hoist_invariants", hoist_invariants.run),
        # thread layouts of fragments, swizzles of shared tiles; needs static shapes
        ("layout", layout.run),
        # Hopper: a GEMM epilogue's whole output tiles leave through shared memory by TMA stores
        ("tma_store", tma_store.run),
        # barriers between shared-memory writers and readers; needs the final statement order
        ("barriers", barriers.run),
        # a K loop's last gemm runs its last k-step across the wait and barrier ending the loop
        ("overlap_gemm", overlap_gemm.run),
        # 64-bit divisions of dimensions alone: named once, computed by the launcher
        ("host_scalars", host_scalars.run),
    ),
    render_files=render,
    templates="cuda",
    source_ext=".cu",
    device_library="tilec_cuda.h",
    arch_choices=("sm_80", "sm_86", "sm_89", "sm_90", "sm_90a"),
    # one library for every GPU from the A100 on: the Hopper kernels (sm_90a code) launched on
    # H100/H200 devices, sm_80 code elsewhere, sm_90 PTX for newer GPUs
    default_arch=("sm_80", "sm_90a"),
    runtime="cuda",
    link_flags="-lcudart",
    specialize=_for_arch,
)
