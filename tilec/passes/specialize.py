"""On-chip buffers get compile-time sizes: a kernel whose shared or fragment buffers have a
run-time extent (attention's head dim D, a row kernel's row length C) becomes one variant per
capacity the target offers for it (`when D <= 64`, `when D <= 128`, ...); the launcher runs the
first variant whose condition holds.

Past the largest capacity, a row kernel still runs: its streaming variant drops the row buffers
and recomputes their values from memory where they are used (`rematerialize`), so a row of any
length is read in passes over memory instead of being held on chip. Kernels where that is not
possible (a buffer filled by a GEMM) return TILEC_ERR_UNSUPPORTED past the largest capacity.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

from ..ir import tile as T
from ..ir.types import Dim
from .rewrite import loads_in, map_exprs, map_stmts, subst


def _dynamic_extents(k: T.TileKernel) -> list:
    """Run-time extents (expressions of dimensions) of on-chip buffers, in first-use order."""
    out = []
    for a in T.walk_stmts(k.body):
        if isinstance(a, T.Alloc) and a.scope in ("shared", "fragment"):
            out += [d for d in a.shape if not isinstance(d, T.Const) and d not in out]
    return out


def to_dim(e) -> Dim:
    """An index expression over dimension symbols as a `Dim` (for the launcher's conditions)."""
    if isinstance(e, T.Var):
        return Dim.sym(e.name)
    if isinstance(e, T.Const):
        return Dim.const(int(e.value))
    ops = {"add": "add", "sub": "sub", "mul": "mul", "idiv": "floordiv", "imod": "mod"}
    if isinstance(e, T.Binary) and e.fn in ops:
        return Dim.bin(ops[e.fn], to_dim(e.a), to_dim(e.b))
    if isinstance(e, T.Binary) and e.fn == "cdiv":
        return to_dim(e.a).cdiv(to_dim(e.b))
    raise AssertionError(f"extent {T.fmt(e)} is not an expression of dimensions")


def _feeds_gemm(k: T.TileKernel, ext) -> bool:
    bufs = {s.name for s in T.walk_stmts(k.body) if isinstance(s, T.Alloc) and ext in s.shape}
    return any(isinstance(s, T.Gemm) and bufs & {s.a, s.b, s.c} for s in T.walk_stmts(k.body))


def _threads(k: T.TileKernel, caps: dict, target) -> int:
    """Threads of a capacity variant, unless a schedule fixed them: a row kernel's by its
    longest row buffer; a kernel whose buffers feed a GEMM at least the target's count for the
    largest capacity (registers held by the run-time bounds and strides of that extent)."""
    r = target.resources
    gemm = any(_feeds_gemm(k, e) for e in caps)
    table = r.matrix_threads_by_capacity if gemm else r.row_threads_by_capacity
    if not k.auto_threads or not table:
        return k.threads
    cap = max(caps.values())
    t = next((t for top, t in table if cap <= top), k.threads)
    return max(t, k.threads) if gemm else t


def _with_capacity(k: T.TileKernel, caps: dict, target) -> T.TileKernel:
    def fix(st):
        if isinstance(st, T.Alloc) and any(d in caps for d in st.shape):
            return [replace(st, shape=tuple(T.iconst(caps[d]) if d in caps else d for d in st.shape))]
        return None
    when = None
    for ext, cap in caps.items():
        c = Dim.bin("le", to_dim(ext), cap)
        when = c if when is None else Dim.bin("and", when, c)
    suffix = "_".join(_name(e) + str(c) for e, c in caps.items())
    return replace(k, name=f"{k.name}_{suffix}", body=map_stmts(k.body, fix),
                   when=_both(k.when, when), threads=_threads(k, caps, target))


def _both(a, b):
    """Conditions a and b (a variant's own, e.g. TMA's strides, and its capacity's)."""
    return b if a is None else a if b is None else Dim.bin("and", a, b)


def _name(e) -> str:
    return "".join(ch for ch in T.fmt(e) if ch.isalnum()) or "n"


# ---- streaming: recompute row buffers instead of holding them ------------------------------
def _definition(body, buf: str):
    """The single `buf[i, j] = e` of a parallel loop over (i, j), as (loop, store); else None."""
    stores = [(loop, st) for loop in T.walk_stmts(body) if isinstance(loop, T.For)
              for st in T.walk_stmts(loop.body) if isinstance(st, T.Store) and st.buf == buf]
    if len(stores) != 1:
        return None
    loop, st = stores[0]
    if loop.kind != "parallel" or st.idx != tuple(T.Var(v) for v in loop.vars):
        return None
    return loop, st


def _row_buffers(k: T.TileKernel, extents: list) -> list:
    return [a for a in T.walk_stmts(k.body) if isinstance(a, T.Alloc) and a.scope == "fragment" and
            any(d in extents for d in a.shape)]


def _derived(k: T.TileKernel, extents: list) -> list:
    """Row buffers filled from other on-chip values only (softmax's exp values): recomputing
    them where they are read costs arithmetic, not memory traffic, and frees their registers."""
    allocs, out = _allocs(k), []
    for a in _row_buffers(k, extents):
        hit = _definition(k.body, a.name)
        if hit and all(ld.buf in allocs for ld in T.walk_exprs(hit[1].value)
                       if isinstance(ld, T.Load)):
            out.append(a.name)
    return out


def _allocs(k: T.TileKernel) -> set:
    return {a.name for a in T.walk_stmts(k.body) if isinstance(a, T.Alloc)}


def rematerialize(k: T.TileKernel, doomed: list, name: str = "_stream"):
    """`k` without the fragments `doomed`: each use reads the expression that filled it.
    None when a buffer is not filled by exactly one elementwise store."""
    body = k.body
    if any(isinstance(s, (T.Gemm, T.Copy)) for s in T.walk_stmts(body)):
        return None
    for a in doomed:
        hit = _definition(body, a.name)
        if hit is None:
            return None
        loop, store = hit

        def inline(e, a=a, loop=loop, store=store):
            if isinstance(e, T.Load) and e.buf == a.name:
                return subst(store.value, dict(zip(loop.vars, e.idx)))
            return None

        def drop(st, a=a):
            if isinstance(st, T.Store) and st.buf == a.name:
                return []
            if isinstance(st, T.Alloc) and st.name == a.name:
                return []
            if isinstance(st, (T.For, T.If)) and not st.body and not getattr(st, "orelse", ()):
                return []
            return None
        body = map_stmts(tuple(map_exprs(s, inline) for s in body), drop)
    names = {a.name for a in doomed}
    if any(ld.buf in names for s in body for ld in loads_in(s)):
        return None
    return replace(k, name=f"{k.name}{name}", body=body)


def _fix_dim(d: Dim, name: str, value: int) -> Dim:
    if d.op == "sym":
        return Dim.const(value) if d.args[0] == name else d
    if d.op == "const":
        return d
    args = [_fix_dim(a, name, value) for a in d.args]
    return Dim.bin(d.op, *args) if len(args) == 2 else Dim(d.op, tuple(args))


def exact(v: T.TileKernel, name: str, value: int) -> T.TileKernel:
    """Variant `v` for dimension `name` equal to `value` (the capacity it is built for): the
    dimension is a constant everywhere in the kernel, so strides and bounds of it become
    immediates and the tests of a row cut short disappear. A head dimension is nearly always
    exactly 64 or 128; the attention kernel at D = 128 held ~10 registers of 64-bit stride and
    bound arithmetic that spilled (sm_90)."""
    fix = {name: T.iconst(value)}
    body = tuple(map_exprs(st, lambda e: fix.get(e.name) if isinstance(e, T.Var) else None)
                 for st in v.body)
    params = tuple(replace(p, shape=tuple(_fix_dim(d, name, value) for d in p.shape))
                   for p in v.params)
    return replace(v, name=f"{v.name}exact", body=body, params=params,
                   grid=tuple(subst(g, fix) for g in v.grid),
                   when=_both(v.when, Dim.bin("eq", Dim.sym(name), value)))


def specialize(k: T.TileKernel, target) -> list:
    exts = _dynamic_extents(k)
    if not exts:
        return [k]
    r = target.resources
    choices = [r.matrix_capacities if _feeds_gemm(k, e) else r.row_capacities for e in exts]
    out, derived = [], _derived(k, exts)
    for caps in itertools.product(*choices):
        if k.warp_specialize and any(c % 64 for c in caps):
            continue  # (TMA fills a warp-specialized kernel's tiles in panels of 64 columns)
        v = _with_capacity(k, dict(zip(exts, caps)), target)
        if len(exts) == 1 and isinstance(exts[0], T.Var) and _feeds_gemm(k, exts[0]):
            # first: the launcher tries it first; the kernel's own threads (the table's choice
            # is for a run-time extent)
            # (its condition: the kernel's own and `name == capacity`)
            out.append(exact(replace(v, threads=k.threads, when=k.when), exts[0].name, caps[0]))
        doomed = [a for a in T.walk_stmts(v.body) if isinstance(a, T.Alloc) and a.name in derived]
        out.append((rematerialize(v, doomed, "") if doomed else None) or v)
    stream = rematerialize(k, _row_buffers(k, exts))
    if stream is not None:
        out.append(replace(stream, when=None))
    return out


def run(prog: T.TileProgram, target, options) -> T.TileProgram:
    ks = []
    for k in prog.kernels:
        ks += specialize(k, target)
    return replace(prog, kernels=tuple(ks))

