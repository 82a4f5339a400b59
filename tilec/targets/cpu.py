"""The CPU target: C++17 + OpenMP. Blocks of the grid are distributed over OpenMP threads; each
thread owns one copy of the block's tile buffers (every scope lives in the thread's scratch).
16-bit floats are stored as bits and computed in float, rounded wherever the program's dtype says
f16/bf16. The GEMM tile kernel and the elementwise functions live in `tilec_cpu.h`.
"""

from __future__ import annotations

import platform

from ..diagnostics import error
from ..ir import tile as T
from ..ir.types import DTYPES, PACKED, is_float
from ..passes import (
    forward_copies,
    hoist_guards,
    hoist_loads,
    lower_reductions,
    pipeline,
    row_reciprocal,
    store_into_output,
    version_masks,
)
from ..passes.rewrite import column_base, loads_in, unit_stride, used_names, uses_var
from .abi import launcher_context, render_libraries
from .base import Resources, Target, Toolchain
from .cstyle import (
    ABI_TYPE,
    NARROW_FLOATS,
    CStyleRenderer,
    bytes_expr,
    cname,
    linear_block_vars,
    pdim,
)

ALL_DTYPES = ("f16", "bf16", "f32", "f64", "i8", "u8", "i16", "i32", "i64", "i4", "u4", "fp8e4m3",
              "fp8e5m2")


def _gemm_operands_read_in_place(k: T.TileKernel, globals_: dict, allocs: dict) -> set:
    """Tile buffers a GEMM can read straight from the tensor: filled by one copy without a
    conversion (same dtype, f32 or f64) in the statement list of the GEMM, with the GEMM's other
    operand also copied there (so the GEMM computes only the windows' valid part), and named by
    no other statement."""
    stmts = [s for s in T.walk_stmts(k.body) if not isinstance(s, T.Alloc)]
    out = set()
    for body in _statement_lists(k.body):
        copies = {st.dst.buf: st for st in body if isinstance(st, T.Copy)}
        for g in body:
            if not (isinstance(g, T.Gemm) and g.a in copies and g.b in copies and
                    g.a_stage is None and g.b_stage is None):
                continue
            for b in (g.a, g.b):
                c = copies[b]
                if globals_[c.src.buf].dtype == allocs[b].dtype in ("f32", "f64") and \
                   [s for s in stmts if _names(s, b)] == [c, g]:
                    out.add(b)
    return out


_EXPRS = (T.Load, T.Binary, T.Unary, T.Cast, T.Select, T.Compare, T.Fma)


def _names(st, buf: str) -> bool:
    """Does statement `st` itself (its fields and expressions, not its nested statements) name
    buffer `buf`?"""
    for f in st.__dataclass_fields__:
        if f in ("body", "orelse"):
            continue
        v = getattr(st, f)
        for x in (v if isinstance(v, tuple) else (v,)):
            if x == buf or getattr(x, "buf", None) == buf:
                return True
            if isinstance(x, _EXPRS) and any(isinstance(ld, T.Load) and ld.buf == buf
                                             for ld in T.walk_exprs(x)):
                return True
    return False


def _statement_lists(body):
    yield body
    for st in body:
        if isinstance(st, T.For):
            yield from _statement_lists(st.body)
        elif isinstance(st, T.If):
            yield from _statement_lists(st.body)
            yield from _statement_lists(st.orelse)


SUM_BLOCK = 4096  # elements a float sum adds in vector lanes before adding the block in double
PREFETCH_CHUNK = 256  # elements of a reduction loop between two prefetches of its input rows


class CpuRenderer(CStyleRenderer):
    """C++ for one kernel's body: a grid block's statements, run by one OpenMP thread."""

    def __init__(self, kernel: T.TileKernel):
        super().__init__(kernel)
        self.valid: dict = {}  # tile buffer -> (statement list, valid rows, valid cols) of its copy
        self.body_id = None  # the statement list being rendered
        self.in_place = _gemm_operands_read_in_place(kernel, self.globals, self.allocs)
        self.direct: dict = {}  # tile buffer read in place -> (pointer, row stride)
        self.unpacked: dict = {}  # 4-bit load -> the int8 array its SIMD loop's values are in
        self.streams = False  # a loop writes with non-temporal stores (streaming_loop)

    def load_alloc(self, e: T.Load) -> str:
        a = self.allocs[e.buf]
        return f"{cname(e.buf)}[{self.linear([self.expr(s) for s in a.shape], e.idx)}]"

    def s_Store(self, s: T.Store, depth):
        if s.buf in self.allocs:
            a = self.allocs[s.buf]
            ref = f"{cname(s.buf)}[{self.linear([self.expr(x) for x in a.shape], s.idx)}]"
        else:
            p = self.globals[s.buf]
            ref = f"{cname(s.buf)}[{self.global_offset(p, s.idx)}]"
        self.emit(f"{ref} = {self.store_expr(s.buf, s.value)};", depth)

    def s_Fill(self, s: T.Fill, depth):
        a = self.allocs[s.buf]
        n = " * ".join(f"({self.expr(x)})" for x in a.shape)
        st = self.storage(a.dtype)
        v = self.cast(self.expr(s.value), s.value.dtype, st)
        self.emit(f"std::fill_n({cname(s.buf)}, {n}, ({self.ctype(st)}){v});", depth)

    def s_Allreduce(self, s: T.Allreduce, depth):
        pass  # one thread holds each row: its partial is the row's value

    def s_Copy(self, s: T.Copy, depth):
        dst = self.allocs[s.dst.buf]
        src = self.globals[s.src.buf]
        rows, cols = (self.expr(x) for x in dst.shape)
        dims = [pdim(d) for d in src.shape]
        offs = [self.operand(o, 12, True) for o in s.src.offsets]
        start = None  # row-major offset of the window's first element
        for d, o in zip(dims, offs):
            start = o if start is None else f"({start}) * {d} + {o}"
        conv = self.copy_conversion(src.dtype, dst.dtype)
        self.emit(f"// copy {T.fmt(T.Load(s.src.buf, s.src.offsets, src.dtype))} -> {s.dst.buf}",
                  depth)

        def left(dim, off):  # how much of the tensor remains from `off` on
            return dim if off == "0" else f"{dim} - {off}"
        # the part of the tile that holds tensor values (the rest is zero padding): a GEMM of
        # this tile in the same statement list computes only that part
        self.valid[s.dst.buf] = (self.body_id, f"tilec::imin({rows}, {left(dims[-2], offs[-2])})",
                                 f"tilec::imin({cols}, {left(dims[-1], offs[-1])})")
        if s.dst.buf in self.in_place:
            # only a GEMM of the tile's valid part reads it: it reads the tensor in place
            self.direct[s.dst.buf] = (f"{cname(src.name)} + {start}", dims[-1])
            self.emit(f"// (read in place by the GEMM: {s.dst.buf} is not filled)", depth)
            return
        if src.dtype in PACKED:  # (unpacked into the tile: one value per element)
            row0 = None  # the window's first row, counting the leading axes' rows
            for d, o in zip(dims[:-1], offs[:-1]):
                row0 = o if row0 is None else f"({row0}) * {d} + {o}"
            self.emit(f"tilec::copy_tile4<{str(src.dtype == 'i4').lower()}>({cname(src.name)}, "
                      f"{dims[-1]}, {row0}, {offs[-1]}, {left(dims[-2], offs[-2])}, "
                      f"{left(dims[-1], offs[-1])}, {cname(s.dst.buf)}, {rows}, {cols});", depth)
            return
        self.emit(f"tilec::copy_tile({cname(src.name)} + {start}, {dims[-1]}, "
                  f"{left(dims[-2], offs[-2])}, {left(dims[-1], offs[-1])}, {cname(s.dst.buf)}, "
                  f"{rows}, {cols}, {conv});", depth)

    def copy_conversion(self, src: str, dst: str) -> str:
        """The functor copy_tile converts a tensor element of dtype `src` with into the value a
        tile of dtype `dst` holds: rounded (floats) or saturated (integers) to `dst`, as any
        conversion is; where every `src` value is a `dst` value, only unpacked."""
        if src == dst or (is_float(src) and dst in ("f32", "f64") and
                          DTYPES[src][1] <= DTYPES[dst][1]):
            return f"tilec::from_{src}()" if src in NARROW_FLOATS else \
                f"tilec::cast_to<{self.ctype(self.storage(dst))}>()"
        value = self.cast(self.from_storage("v", src), src, dst)
        return (f"[](const {ABI_TYPE[src]} v) {{ return ({self.ctype(self.storage(dst))})"
                f"({value}); }}")

    def stmts(self, ss, depth: int):
        outer, self.body_id = self.body_id, id(ss)
        super().stmts(ss, depth)
        self.body_id = outer

    def s_GemvMma(self, s: T.GemvMma, depth):
        if s.kmajor:  # (before the checks below, which are about the CPU's own routine)
            raise T.Unsupported("gemv_mma_kmajor() runs on CUDA only; on the CPU weights packed "
                                "along K take the scalar GEMV")
        a, q, sc = self.globals[s.a], self.globals[s.q], self.globals[s.s]
        dst = self.allocs[s.dst]
        if s.mr != 1:
            raise T.Unsupported(f"gemv_mma() on the CPU takes one row of A, not mr={s.mr}")
        if not (a.dtype == sc.dtype == dst.dtype == "f32") or dst.shape[0] != T.iconst(1):
            raise T.Unsupported(f"gemv_mma() on the CPU takes f32 activations and scales and one "
                                f"slice of f32 sums, not {a.dtype}, {sc.dtype}, {dst.dtype} "
                                f"{T.fmt(dst.shape[0])}")
        row, first, rows, col0, _ = (self.expr(x) for x in s.idx)
        self.emit(f"// {s.dst}: A's row {row} times the dequantized weights (tilec_cpu.h)", depth)
        self.emit(f"tilec::gemv_dequant4<{str(q.dtype == 'i4').lower()}, {self.expr(dst.shape[1])}>("
                  f"{cname(a.name)} + ({row}) * {pdim(a.shape[-1])}, {cname(q.name)}, "
                  f"{cname(sc.name)}, {pdim(q.shape[-1])}, {first}, {rows}, {col0}, {s.group}, "
                  f"{float(s.zero)!r}f, {cname(s.dst)});", depth)

    def s_Gemm(self, s: T.Gemm, depth):
        a, b, c = self.allocs[s.a], self.allocs[s.b], self.allocs[s.c]
        m, n = (self.expr(x) for x in c.shape)
        k = self.expr(s.k_extent(a.shape))
        lda, ldb, ldc = self.expr(a.shape[1]), self.expr(b.shape[1]), n
        va, vb = self.valid.get(s.a), self.valid.get(s.b)
        if va and vb and va[0] == vb[0] == self.body_id and \
           s.a_stage is None and s.b_stage is None:
            # only the rows, columns and depth that hold tensor values (padding adds zeros)
            ra, ca = va[1:] if not s.transpose_a else va[2:0:-1]
            rb, cb = vb[1:] if not s.transpose_b else vb[2:0:-1]
            m, n, k = ra, cb, (ca if ca == rb else f"tilec::imin({ca}, {rb})")
        pa, pb = cname(s.a), cname(s.b)
        if s.a in self.direct:
            pa, lda = self.direct[s.a]
        if s.b in self.direct:
            pb, ldb = self.direct[s.b]
        ct = self.ctype(self.storage(c.dtype))
        if ct in ("float", "double") and \
           self.ctype(self.storage(a.dtype)) == ct == self.ctype(self.storage(b.dtype)):
            self.emit(f"tilec::gemm_tile<{str(s.transpose_a).lower()}, {str(s.transpose_b).lower()}, "
                      f"{ct}>({m}, {n}, {k}, {pa}, {lda}, {pb}, {ldb}, "
                      f"{cname(s.c)}, {ldc});", depth)
            return
        ia = (f"{cname(s.a)}[tilec_k * {lda} + tilec_i]" if s.transpose_a else
              f"{cname(s.a)}[tilec_i * {lda} + tilec_k]")
        ib = (f"{cname(s.b)}[tilec_j * {ldb} + tilec_k]" if s.transpose_b else
              f"{cname(s.b)}[tilec_k * {ldb} + tilec_j]")
        self.emit(f"for (int64_t tilec_i = 0; tilec_i < {m}; ++tilec_i)  // integer tile GEMM", depth)
        self.emit(f"for (int64_t tilec_k = 0; tilec_k < {k}; ++tilec_k)", depth + 1)
        self.emit(f"for (int64_t tilec_j = 0; tilec_j < {n}; ++tilec_j)", depth + 2)
        self.emit(f"{cname(s.c)}[tilec_i * {ldc} + tilec_j] += ({ct}){ia} * ({ct}){ib};", depth + 3)

    # ---- parallel loops: the innermost one is vectorized (`omp simd`), with a vector reduction
    # for each reduction store (a store of combine(buf[idx], v) whose idx does not use the
    # innermost variable)
    def parallel(self, s: T.For, depth):
        *outer, inner = list(zip(s.vars, s.extents))
        for n, (v, ext) in enumerate(outer):
            self.emit(f"for (int64_t {cname(v)} = 0; {cname(v)} < {self.expr(ext)}; ++{cname(v)}) {{",
                      depth + n)
        d = depth + len(outer)
        v, ext = inner
        reductions = _reduction_stores(s.body, v)
        if not all(isinstance(x, (T.Store, T.If, T.Let, T.For)) for x in s.body) or \
           any(isinstance(x, T.For) for x in s.body):
            # a nested loop or another statement kind: a plain (non-vectorized) inner loop
            self.emit(f"for (int64_t {cname(v)} = 0; {cname(v)} < {self.expr(ext)}; ++{cname(v)}) {{", d)
            self.stmts(s.body, d + 1)
            self.emit("}", d)
        elif reductions:
            self.reducing_loop(s.body, v, ext, reductions, d)
        else:
            self.unpack_rows(s.body, v, ext, d)
            out = self.streamed_store(s.body, v)
            if out is not None:
                self.streaming_loop(s.body, v, ext, out, d)
            else:
                self.simd_loop(s.body, v, ext, d)
            self.unpacked.clear()
        for n in reversed(range(len(outer))):
            self.emit("}", depth + n)

    def streamed_store(self, body, v: str):
        """The loop's one store when it writes an f32 output along `v` (unit stride), after only
        `let`s: the values can go to memory with non-temporal stores (streaming_loop)."""
        *lets, last = body
        if not (isinstance(last, T.Store) and last.buf in self.globals and
                all(isinstance(x, T.Let) for x in lets) and
                self.globals[last.buf].dtype == "f32" and unit_stride(last.idx, v)):
            return None
        # only the first write of the output's lines: a loop that rewrites values an earlier
        # statement stored (a softmax scaling its exponentials in place) finds them in cache.
        # Not in GEMM kernels either: their tile rows are short and the kernel is not bound by
        # memory (4096 x 4096 x 64 f32: 13.7 ms plain, 15.6-16.3 ms streamed)
        if any(ld.buf == last.buf for st in body for ld in loads_in(st)) or any(
                isinstance(x, T.Gemm) or (isinstance(x, T.Store) and x.buf == last.buf and
                                          x is not last)
                for x in T.walk_stmts(self.k.body)):
            return None
        return last

    def streaming_loop(self, body, v: str, ext, st: T.Store, d: int):
        """The loop of a row written to a large output (at least TILEC_STREAM_BYTES): values
        computed 256 at a time into a small buffer, then written with non-temporal stores
        (tilec::stream_row), which do not first read the output's cache lines from memory (a
        plain store does, for a third more traffic) and do not evict the inputs; smaller outputs,
        which a later kernel may find in cache, take the plain loop. A row that is a copy of an
        f32 input row streams from that row itself: staged through the buffer, g++ turned the
        copy into `rep movsq` whose 8-byte stores the 32-byte loads of the stream then waited on
        (a 4096 x 4096 copy at 16 GB/s against 32 for the AVX2 build on an Intel Xeon)."""
        n = self.expr(ext)
        self.emit(f"if ({bytes_expr('f32', self.globals[st.buf].shape, '(size_t)')} >= "
                  f"TILEC_STREAM_BYTES) {{", d)
        self.emit("float* const tilec_row = {} + {};".format(*self.row_of(st.buf, st.idx, v)),
                  d + 1)
        src = st.value
        if len(body) == 1 and isinstance(src, T.Load) and src.buf in self.globals and \
                self.globals[src.buf].dtype == "f32" and unit_stride(src.idx, v):
            name, offset = self.row_of(src.buf, src.idx, v)
            self.emit(f"tilec::stream_row(tilec_row, {name} + {offset}, {n});", d + 1)
        else:
            # chunks end on 64-byte boundaries of the row (the first one is shorter when the row
            # starts between two), so only the row's ends take plain stores
            self.emit(f"for (int64_t tilec_c = 0, tilec_m = 0; tilec_c < {n}; "
                      f"tilec_c += tilec_m) {{", d + 1)
            self.emit("alignas(64) float tilec_vals[256];", d + 2)
            self.emit(f"tilec_m = tilec::imin(256 - tilec::stream_skew(tilec_row + tilec_c), "
                      f"{n} - tilec_c);", d + 2)
            self.prefetch_rows(self.input_rows(body, v), "tilec_c", "tilec_m", d + 2)
            self.emit("#pragma omp simd", d + 2)
            self.emit("for (int64_t tilec_k = 0; tilec_k < tilec_m; ++tilec_k) {", d + 2)
            self.emit(f"const int64_t {cname(v)} = tilec_c + tilec_k;", d + 3)
            self.stmts(body[:-1], d + 3)
            self.emit(f"tilec_vals[tilec_k] = {self.store_expr(st.buf, st.value)};", d + 3)
            self.emit("}", d + 2)
            self.emit("tilec::stream_row(tilec_row + tilec_c, tilec_vals, tilec_m);", d + 2)
            self.emit("}", d + 1)
        self.emit("} else {", d)
        self.simd_loop(body, v, ext, d + 1)
        self.emit("}", d)
        self.streams = True

    def row_of(self, buf: str, idx: tuple, v: str) -> tuple:
        """The row a unit-stride access of a global walks: (tensor, offset of its element at
        v = 0)."""
        p = self.globals[buf]
        return cname(p.name), self.global_offset(p, idx[:-1] + (column_base(idx[-1], v),))

    def input_rows(self, body, v: str) -> list:
        """The input rows the loop body reads along `v` (unit stride), each once: (tensor, offset
        of the row's element at v = 0). Rows whose address depends on a value the body computes
        are left out, and 4-bit rows (unpacked before the loop)."""
        local = tuple(st.name for st in body if isinstance(st, T.Let))
        rows = []
        for ld in (x for st in body for x in loads_in(st)):
            p = self.globals.get(ld.buf)
            if p is None or p.dtype in PACKED or not unit_stride(ld.idx, v) or \
                    any(uses_var(x, local) for x in ld.idx):
                continue
            row = self.row_of(ld.buf, ld.idx, v)
            if row not in rows:
                rows.append(row)
        return rows

    def prefetch_rows(self, rows: list, start: str, count: str, d: int):
        """For a chunk of a loop (elements start .. start + count - 1 of each row): a prefetch of
        each input row some way ahead of the chunk (tilec::prefetch_ahead). Without them the
        core's prefetchers, which stop at 4 KiB pages, left compute-heavy loops and the first
        pass of row kernels waiting on memory (docs/PERFORMANCE.md)."""
        for name, offset in rows:
            self.emit(f"tilec::prefetch_ahead({name}, {offset} + {start}, {count});", d)

    def simd_loop(self, body, v: str, ext, d: int):
        self.emit("#pragma omp simd", d)
        self.emit(f"for (int64_t {cname(v)} = 0; {cname(v)} < {self.expr(ext)}; ++{cname(v)}) {{", d)
        self.stmts(body, d + 1)
        self.emit("}", d)

    def unpack_rows(self, body, v: str, ext, d: int):
        """4-bit loads along the SIMD loop's variable (`q[r, c0 + v]`): a byte holds two
        consecutive values, which no compiler vectorizes one element at a time, so the loop's
        values of each are unpacked first into an int8 array, two per byte (`tilec::unpack4`,
        vectorized), and the loop reads that. Needs a static bound on the loop's extent, and only
        loads every iteration makes (not under an `if`, a `where` arm or the right side of `&`
        / `|`: unpacking reads the row before the loop, so a guarded row past the tensor's end
        must stay guarded), whose row does not depend on a name the loop body defines."""
        cap = _const_bound(ext)
        if cap is None or cap > 16384:
            return
        local = {st.name for st in body if isinstance(st, T.Let)}
        for st in body:
            if not isinstance(st, (T.Store, T.Let)):
                continue
            exprs = [st.value] + list(getattr(st, "idx", ()))
            for ld in (x for e in exprs for x in _unconditional_loads(e)):
                p = self.globals.get(ld.buf)
                if p is None or p.dtype not in ("u4", "i4") or ld in self.unpacked or \
                        not unit_stride(ld.idx, v) or \
                        any(uses_var(x, tuple(local)) for x in ld.idx):
                    continue
                base = column_base(ld.idx[-1], v)
                name = f"tilec_q{len(self.unpacked)}"
                dims = [pdim(x) for x in p.shape]
                row = self.linear(dims[:-1], ld.idx[:-1]) if len(dims) > 1 else "0"
                self.emit(f"alignas(64) int8_t {name}[{cap}];", d)
                self.emit(f"tilec::unpack4<{str(p.dtype == 'i4').lower()}>({name}, {cname(p.name)}, "
                          f"{row}, {self.expr(base)}, {self.expr(ext)}, {dims[-1]});", d)
                self.unpacked[ld] = f"(int32_t){name}[{cname(v)}]"

    def load_global(self, e: T.Load) -> str:
        if e in self.unpacked:
            return self.unpacked[e]
        return super().load_global(e)

    def reducing_loop(self, body, v, ext, reductions: list, depth):
        """Each reduction store accumulates into a local (vectorized with an OpenMP reduction
        clause); the buffer is updated once after the loop. A float max/min also tracks NaN,
        which must win as in NumPy (OpenMP's vector max/min would drop it). A float sum adds
        blocks of SUM_BLOCK (or PREFETCH_CHUNK, below) in double; a loop over input rows runs in
        chunks of PREFETCH_CHUNK that prefetch them (prefetch_rows)."""
        accs, clauses, after, totals = {}, [], [], []
        for st in reductions:
            fn = {"add": "sum", "maximum": "max", "minimum": "min"}[st.value.fn]
            ct = self.ctype(self.storage(self.allocs[st.buf].dtype))
            acc = self.fresh("tilec_acc")
            flt = ct in ("float", "double")
            init = {"sum": "0",
                    "max": f"-std::numeric_limits<{ct}>::infinity()" if flt else
                           f"std::numeric_limits<{ct}>::lowest()",
                    "min": f"std::numeric_limits<{ct}>::infinity()" if flt else
                           f"std::numeric_limits<{ct}>::max()"}[fn]
            self.emit(f"{ct} {acc} = {init};", depth)
            clauses.append(f"reduction({ {'sum': '+', 'max': 'max', 'min': 'min'}[fn] }:{acc})")
            result = acc
            if flt and fn != "sum":
                nan = acc + "_nan"
                self.emit(f"int {nan} = 0;", depth)
                clauses.append(f"reduction(|:{nan})")
                result = f"({nan} ? std::numeric_limits<{ct}>::quiet_NaN() : {acc})"
            accs[st] = (fn, acc, flt)
            ref = self.load_alloc(T.Load(st.buf, st.idx, self.allocs[st.buf].dtype))
            if fn == "sum" and flt:
                # blocked summation: each block of SUM_BLOCK elements is summed in vector lanes,
                # the blocks' sums in double, so a long row's sum keeps its accuracy (a single
                # f32 running sum over millions of elements drifts by their count times an ulp)
                total = acc + "_total"
                self.emit(f"double {total} = 0;", depth)
                totals.append((acc, total))
                result = f"({ct}){total}"
            dt = self.allocs[st.buf].dtype
            if fn == "sum" and dt in PACKED:  # (held in 32 bits: the sum wraps in 4)
                after.append(f"{ref} = {self.rounded(f'{ref} + {result}', dt)};")
            else:
                after.append(f"{ref} += {result};" if fn == "sum" else
                             f"{ref} = tilec::{'maximum' if fn == 'max' else 'minimum'}({ref}, "
                             f"{result});")
        n = self.expr(ext)
        d = depth
        # a loop over input rows runs in chunks that each prefetch the rows ahead (the first pass
        # over a row kernel's rows is the one that reads them from memory); a float sum adds each
        # chunk, or each block of SUM_BLOCK, into its double total
        rows = self.input_rows(body, v)
        step = PREFETCH_CHUNK if rows else SUM_BLOCK if totals else None
        if step:
            blk = self.fresh("tilec_blk")
            self.emit(f"for (int64_t {blk} = 0; {blk} < {n}; {blk} += {step}) {{", d)
            d += 1
            self.emit(f"const int64_t {blk}_end = tilec::imin({n}, {blk} + {step});", d)
            self.prefetch_rows(rows, blk, f"{blk}_end - {blk}", d)
            lo, hi = blk, f"{blk}_end"
        else:
            lo, hi = "0", n
        self.emit(f"#pragma omp simd {' '.join(clauses)}", d)
        self.emit(f"for (int64_t {cname(v)} = {lo}; {cname(v)} < {hi}; ++{cname(v)}) {{", d)
        self.reducing_body(body, accs, d + 1)
        self.emit("}", d)
        if step:
            for acc, total in totals:
                self.emit(f"{total} += {acc};", d)
                self.emit(f"{acc} = 0;", d)
            self.emit("}", depth)
        for line in after:
            self.emit(line, depth)

    def reducing_body(self, body, accs: dict, depth):
        for st in body:
            if st in accs:
                fn, acc, flt = accs[st]
                x = self.fresh("tilec_v")
                self.emit(f"const auto {x} = {self.expr(st.value.b)};", depth)
                if fn == "sum":
                    self.emit(f"{acc} += {x};", depth)
                else:
                    op = ">" if fn == "max" else "<"
                    self.emit(f"{acc} = {x} {op} {acc} ? {x} : {acc};", depth)
                    if flt:
                        self.emit(f"{acc}_nan |= {x} != {x};", depth)
            elif isinstance(st, T.If):
                self.emit(f"if ({self.test(st.cond)}) {{", depth)
                self.reducing_body(st.body, accs, depth + 1)
                if st.orelse:
                    self.emit("} else {", depth)
                    self.reducing_body(st.orelse, accs, depth + 1)
                self.emit("}", depth)
            else:
                self.stmts([st], depth)


def _unconditional_loads(e) -> list:
    """The loads evaluating `e` always performs (C evaluates one arm of `?:` and the right side of
    `&&` / `||` only when needed)."""
    out, stack = [], [e]
    while stack:
        x = stack.pop()
        if isinstance(x, T.Load):
            out.append(x)
            stack += list(x.idx)
        elif isinstance(x, T.Select):
            stack.append(x.cond)
        elif isinstance(x, T.Binary) and x.fn in ("and", "or") and x.dtype == "bool":
            stack.append(x.a)
        else:
            stack += [getattr(x, f) for f in ("x", "a", "b", "c", "cond") if getattr(x, f, None) is not None]
    return out


def _const_bound(ext):
    """A compile-time upper bound of a loop extent (a constant, or min() with one), else None."""
    if isinstance(ext, T.Const):
        return int(ext.value)
    if isinstance(ext, T.Binary) and ext.fn == "min":
        bounds = [b for b in (_const_bound(ext.a), _const_bound(ext.b)) if b is not None]
        return min(bounds) if bounds else None
    return None


def _reduction_stores(body, var: str) -> list:
    """Stores `b[idx] = combine(b[idx], v)` in `body` (branches included) whose index does not
    use the loop variable `var`: reductions along the loop."""
    return [st for st in T.walk_stmts(body) if is_reduction_store(st)
            and not any(isinstance(x, T.Var) and x.name == var for i in st.idx for x in T.walk_exprs(i))]


def is_reduction_store(st) -> bool:
    """`b[idx] = combine(b[idx], v)` with combine in add, maximum, minimum."""
    return (isinstance(st, T.Store) and isinstance(st.value, T.Binary) and
            st.value.fn in ("add", "maximum", "minimum") and isinstance(st.value.a, T.Load) and
            st.value.a.buf == st.buf and st.value.a.idx == st.idx)


# ---- whole-program rendering ---------------------------------------------------------------
def render_kernel(k: T.TileKernel, symbols, threads_expr: str) -> dict:
    em = CpuRenderer(k)
    em.stmts(k.body, 0)
    buffers, off = [], "0"
    for a in em.allocs.values():
        if a.name in em.in_place:  # a GEMM reads the tensor itself: no tile buffer
            continue
        ct = em.ctype(em.storage(a.dtype))
        count = " * ".join(f"({em.expr(x)})" for x in a.shape)
        buffers.append(dict(name=a.name, cname=cname(a.name), ctype=ct, scope=a.scope, count=count,
                            offset=off))
        off = f"tilec_off_{a.name} + tilec::align64((size_t)({count}) * sizeof({ct}))"
    params = []
    for p in k.params:
        if p.kind == "scalar":
            params.append(f"{em.ctype(p.dtype)} {cname(p.name)}")
        else:
            const = "const " if p.kind == "input" else ""
            params.append(f"{const}{ABI_TYPE[p.dtype]}* __restrict {cname(p.name)}")
    used = used_names(k)  # a dimension the kernel does not read is an unnamed parameter
    params += [f"int64_t {cname(s)}" if s in used else f"int64_t /*{s}*/" for s in symbols]
    grid = [em.expr(g) for g in k.grid] + ["1"] * (3 - len(k.grid))
    bvars = [dict(name=name, expr=e) for name, e in linear_block_vars(k)]
    # blocks whose loops run a block-dependent number of steps (a causal key loop) are dealt out
    # one at a time, so that the threads finish together; equal blocks go in contiguous ranges
    uneven = any(isinstance(s, T.For) and s.kind != "parallel" and
                 any(uses_var(e, tuple(k.block_vars)) for e in s.extents)
                 for s in T.walk_stmts(k.body))
    return dict(name=k.name, comment=k.comment, params=params, grid=grid,
                schedule="dynamic, 1" if uneven else "static",
                buffers=buffers, per_thread=off if buffers else "0", threads=threads_expr,
                block_vars=bvars, body=em.lines, tile_ir=T.print_kernel(k).splitlines(),
                after_blocks=["tilec::stream_fence();  // this thread's non-temporal stores, "
                              "before the team joins"] if em.streams else [])


def render(target, src, m, env, banner, options) -> dict:
    def kernel_context(g, prog):
        sched = m.schedule_for(g.name, target.name)
        threads = str(sched.threads) if sched.threads else "omp_get_max_threads()"
        ctx = launcher_context(g, prog, [], [], machine={T.THREADS: threads})
        ctx["kernels"] = [render_kernel(k, g.symbols, threads) for k in prog.kernels]
        ctx["release_scratch"] = "tilec_scratch_cache.release();"
        return ctx
    files, libs = render_libraries(
        target, src, m, env, banner, options, kernel_context, [], [],
        "A call runs on an OpenMP team of up to omp_get_max_threads() threads (no more "
        "than it has blocks of work); call omp_set_num_threads(n) on the calling thread to "
        "cap its calls at n threads.")
    files["tilec_cpu.h"] = env.loader.get_source(env, "cpu/tilec_cpu.h")[0]
    archs = options.get("arch") or target.default_arch
    if len(archs) > 1:
        raise error(f"the cpu target builds for one -march, not {', '.join(archs)}")
    # x86: 512-bit vectors for the compiler's own vectorized loops where the instruction set
    # has them (AVX-512; without it the hint changes nothing)
    x86 = bool(archs) and (archs[0] != "native" or platform.machine() in ("x86_64", "AMD64"))
    files["Makefile"] = env.get_template("cpu/Makefile.j2").render(
        banner=banner("#"), libs=libs, march=f"-march={archs[0]}" if archs else "",
        tune="-mprefer-vector-width=512" if x86 else "")
    return files


CPU = Target(
    name="cpu",
    resources=Resources(
        warp=1, max_threads=1024, tile_memory=4 << 20, mma=(1, 1, 1), gemm_tile=(128, 256, 256),
        gemm_stages=1, gemm_threads=1, row_block=1, row_threads=1, ew_tile=(2, 16384),
        # column reductions: blocks of 512 bytes of each row, 4 rows a step (measured on the
        # 2-core dev machine against 128-1024 bytes and 1-256 rows, docs/PERFORMANCE.md)
        col_reduce=(1, 4, 512, 8, 64),
        ew_threads=1, attn_tile=(64, 64), attn_threads=1, attn_stages=1, dtypes=ALL_DTYPES,
        # M = 1: a GEMV streaming B's rows (8192 columns per block: long contiguous runs for the
        # prefetchers; 4 rows per SIMD loop: the sums are read and written once per 4 rows),
        # split over K into >= 16 blocks (>= 256 rows each) so every core streams; measured
        # against 512-4096 columns and 1 row per step in docs/PERFORMANCE.md
        gemv=(8192, 1, 16, 256, 1, 4),
        # GEMVs of 4-bit weights with f32 activations and scales: tilec_cpu.h gemv_dequant4
        # (the same blocks and splits), up to M = 16 rows of A (the CPU has no small-M tile: a
        # 128-row tile computed 8x the rows at M = 16, 40.6 ms at N = K = 4096 against 8.3 for 16
        # passes of the GEMV over the 8 MB of weights, docs/PERFORMANCE.md)
        gemv_mma=(8192, 1, 16, 256, 1), gemv_mma_dtypes=("f32",), gemv_mma_max_m=16,
        # 256 x 256 tiles when every thread gets 4 of them: each staged 256 x 256 tile of B
        # serves 256 rows instead of 128 (f32 on 2 cores of Zen 4: 1024^3 6.35-6.54 -> 6.12-6.21
        # ms, 2048^3 57.5-58.4 -> 50.8 ms; docs/PERFORMANCE.md); fewer blocks keep the 128-row
        # tile, so a machine with many cores still gets a block per core
        gemm_large_tile=((256, 256, 256), 4)),
    toolchain=Toolchain("CXX", "g++", "C++17 compiler"),
    lowering=(
        # no async copies on the CPU: pipelined K loops run as plain loops
        ("pipeline", pipeline.run),
        # key tiles no mask touches skip the masking statement's selects (uniform test per tile)
        ("version_masks", version_masks.run),
        # `if base + i < n` guards -> clamped trip counts, so inner loops vectorize unmasked
        ("hoist_guards", hoist_guards.run),
        # reduce -> reduction stores joined to the loop that fills the row (needs guards hoisted)
        ("lower_reductions", lower_reductions.run),
        # a row buffer that only copies an input tensor: read the tensor (in cache) instead
        ("forward_copies", forward_copies.run),
        # a row buffer only an output's store reads: written into the output, finished in place
        ("store_into_output", store_into_output.run),
        # values invariant along the inner loop read once per row (after reductions are loops)
        ("hoist_loads", hoist_loads.run),
        # a division by such a row value: one reciprocal per row, a multiply per element
        ("row_reciprocal", row_reciprocal.run),
    ),
    render_files=render,
    templates="cpu",
    source_ext=".cpp",
    device_library="tilec_cpu.h",
    runtime="cpu",
    link_flags="-fopenmp",
    # -march for g++: a portable default (x86-64-v3: AVX2 and FMA, every x86 server and desktop
    # since about 2015) on x86-64 hosts, the compiler's own default elsewhere; `native` for the
    # build machine (what `tilec run` uses, since it runs where it builds)
    arch_choices=("native", "x86-64", "x86-64-v2", "x86-64-v3", "x86-64-v4"),
    default_arch=("x86-64-v3",) if platform.machine() in ("x86_64", "AMD64") else (),
)
