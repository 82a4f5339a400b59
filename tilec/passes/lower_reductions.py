"""Every `reduce(fn, src, dst, axis=1)` becomes a loop of reduction stores plus an `allreduce`:

    fill(dst, identity)
    for i, j in parallel(rows, cols):
        dst[i] = combine(dst[i], src[i, j])      # combine: +, maximum, minimum
    allreduce(fn, dst)

When `src` is filled by the loop just before the reduce, the reduction joins that loop, and the
loop only stores `src` if something else reads it (softmax's exp values are stored, RMSNorm's
squares are not). A loop of reduction stores accumulates per thread (on the CPU one thread holds a
row: a vectorized reduction; on a GPU each thread holds part of the row); `allreduce` combines the
threads that share a row (nothing to do on the CPU).
"""

from __future__ import annotations

import math
from dataclasses import fields, replace

from ..ir import tile as T
from ..ir.types import DTYPES, is_float
from .rewrite import map_stmts, own_loads

COMBINE = {"sum": "add", "max": "maximum", "min": "minimum"}


def identity(fn: str, dtype: str) -> T.Const:
    if fn == "sum":
        return T.Const(0.0 if is_float(dtype) else 0, dtype)
    if is_float(dtype):
        return T.Const(-math.inf if fn == "max" else math.inf, dtype)
    kind, bits = DTYPES[dtype]
    signed = kind == "i"
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    return T.Const(lo if fn == "max" else hi, dtype)


def reduction_store(fn: str, dst: str, dtype: str, idx: tuple, value) -> T.Store:
    if getattr(value, "dtype", dtype) != dtype:
        value = T.Cast(value, dtype)
    return T.Store(dst, idx, T.Binary(COMBINE[fn], T.Load(dst, idx, dtype), value, dtype))


def _readers(stmts, exclude) -> set:
    """Buffers read by statements other than `exclude` (identity)."""
    out = set()
    for st in stmts:
        if st is not exclude:
            for s in T.walk_stmts([st]):
                out |= _own_reads(s)
    return out


def _own_reads(s) -> set:
    """Buffers statement `s` itself reads (not its nested statements)."""
    out = {ld.buf for ld in own_loads(s)}
    if isinstance(s, T.Gemm):
        out |= {s.a, s.b, s.c}
    elif isinstance(s, T.Reduce):
        out.add(s.src)
    elif isinstance(s, T.Copy):
        out.add(s.src.buf)
    return out


def _producer_store(loop, src: str):
    """The single `src[i, j] = e` store of a parallel loop over src's whole rows (optionally under
    a guard that does not involve the column), with its guard; else None."""
    if not (isinstance(loop, T.For) and loop.kind == "parallel" and len(loop.vars) == 2 and
            len(loop.body) == 1):
        return None
    st, guard = loop.body[0], None
    if isinstance(st, T.If) and not st.orelse and len(st.body) == 1:
        guard, st = st.cond, st.body[0]
        if any(isinstance(x, T.Var) and x.name == loop.vars[1] for x in T.walk_exprs(guard)):
            return None
    if isinstance(st, T.Store) and st.buf == src and st.idx == tuple(T.Var(v) for v in loop.vars):
        return st, guard
    return None


def lower_body(stmts: tuple, allocs: dict, taken: set) -> tuple:
    out = []
    stmts = list(stmts)
    for n, st in enumerate(stmts):
        if isinstance(st, T.For):
            st = replace(st, body=lower_body(st.body, allocs, taken))
        elif isinstance(st, T.If):
            st = replace(st, body=lower_body(st.body, allocs, taken),
                         orelse=lower_body(st.orelse, allocs, taken))
        if not isinstance(st, T.Reduce):
            out.append(st)
            continue
        assert st.axis == 1, "reductions along axis 0 are not lowered yet"
        src, dst = allocs[st.src], allocs[st.dst]
        # the statement before the reduce, allocations aside
        at = next((n for n in range(len(out) - 1, -1, -1) if not isinstance(out[n], T.Alloc)), None)
        prev = out[at] if at is not None else None
        hit = _producer_store(prev, st.src)
        if hit is not None and prev.extents[1] == src.shape[1]:
            store, guard = hit
            i, j = (T.Var(v) for v in prev.vars)
            keep = st.src in _readers(out[:at] + out[at + 1:] + stmts[n + 1:], None)
            val = T.Load(st.src, (i, j), src.dtype) if keep else store.value
            body = ((store,) if keep else ()) + (reduction_store(st.fn, st.dst, dst.dtype, (i,), val),)
            body = body if guard is None else (T.If(guard, body),)
            # the allocations between the loop and the reduce move above the joined loop
            out[at:] = out[at + 1:] + [T.Fill(st.dst, identity(st.fn, dst.dtype)),
                                       replace(prev, body=body)]
        else:
            i, j = T.Var("r"), T.Var("c")
            while i.name in taken or j.name in taken:
                i, j = T.Var(i.name + "_"), T.Var(j.name + "_")
            out += [T.Fill(st.dst, identity(st.fn, dst.dtype)),
                    T.For((i.name, j.name), src.shape, "parallel", (reduction_store(
                        st.fn, st.dst, dst.dtype, (i,), T.Load(st.src, (i, j), src.dtype)),))]
        out.append(T.Allreduce(st.fn, st.dst))
    return tuple(out)


def drop_dead_allocs(body: tuple) -> tuple:
    """Remove allocations that no statement reads or writes any more."""
    used = set()
    for s in T.walk_stmts(body):
        if isinstance(s, T.Alloc):
            continue
        used |= _own_reads(s)  # (walk_stmts visits the nested statements too)
        if isinstance(s, (T.Store, T.Fill)):
            used.add(s.buf)
        elif isinstance(s, T.Copy):
            used.add(s.dst.buf)
        elif isinstance(s, T.Allreduce):
            used.add(s.buf)
    return tuple(s for s in body if not (isinstance(s, T.Alloc) and s.name not in used))


def drop_dead_fragments(body: tuple) -> tuple:
    """Stores into fragments that nothing reads (a row cached for a use the tiling then reads
    from memory, e.g. a transposed read), the loops and branches left empty, and then the
    fragments themselves (drop_dead_allocs). A statement other than a store or fill that names a
    fragment (a gemm, a copy, an allreduce) counts as reading it."""
    while True:
        frags = {a.name for a in T.walk_stmts(body) if isinstance(a, T.Alloc) and
                 a.scope == "fragment"}
        read = set()
        for s in T.walk_stmts(body):
            if isinstance(s, T.Alloc):
                continue
            read |= _own_reads(s)
            if not isinstance(s, (T.Store, T.Fill, T.For, T.If, T.Let)):
                read |= {getattr(s, f.name) for f in fields(s)
                         if isinstance(getattr(s, f.name), str)} & frags
        dead = frags - read
        if not dead:
            return body

        def drop(st, dead=dead):
            if isinstance(st, (T.Store, T.Fill)) and st.buf in dead:
                return []
            if isinstance(st, T.For) and not st.body:
                return []
            if isinstance(st, T.If) and not st.body and not st.orelse:
                return []
            return None
        body = drop_dead_allocs(map_stmts(body, drop))


def run(prog: T.TileProgram, target, options) -> T.TileProgram:
    ks = []
    for k in prog.kernels:
        allocs = {a.name: a for a in T.walk_stmts(k.body) if isinstance(a, T.Alloc)}
        taken = set(k.block_vars) | {p.name for p in k.params} | set(allocs)
        body = drop_dead_allocs(lower_body(k.body, allocs, taken))
        ks.append(replace(k, body=drop_dead_fragments(body)))
    return replace(prog, kernels=tuple(ks))
