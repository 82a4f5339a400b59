"""Tile IR mutators shared by the lowering passes: expression substitution and statement maps.
Each returns the same object when nothing changed."""

from __future__ import annotations

from dataclasses import fields, replace

from ..ir import tile as T


def map_expr(e, fn):
    """Rewrite expression `e` bottom-up: `fn(node)` returns a replacement or None to keep it."""
    t = type(e)  # children in the order x, a, b, cond, idx
    if t is T.Binary:
        a, b = map_expr(e.a, fn), map_expr(e.b, fn)
        if a is not e.a or b is not e.b:
            e = T.Binary(e.fn, a, b, e.dtype, e.exponent)
    elif t is T.Compare:
        a, b = map_expr(e.a, fn), map_expr(e.b, fn)
        if a is not e.a or b is not e.b:
            e = T.Compare(e.fn, a, b, e.dtype)
    elif t is T.Unary:
        x = map_expr(e.x, fn)
        if x is not e.x:
            e = T.Unary(e.fn, x, e.dtype)
    elif t is T.Cast:
        x = map_expr(e.x, fn)
        if x is not e.x:
            e = T.Cast(x, e.dtype)
    elif t is T.Load:
        idx = tuple(map_expr(i, fn) for i in e.idx)
        if any(a is not b for a, b in zip(idx, e.idx)):
            e = T.Load(e.buf, idx, e.dtype)
    elif t is T.Select:
        a, b, c = map_expr(e.a, fn), map_expr(e.b, fn), map_expr(e.cond, fn)
        if a is not e.a or b is not e.b or c is not e.cond:
            e = T.Select(c, a, b, e.dtype)
    elif t is T.Fma:
        a, b, c = map_expr(e.a, fn), map_expr(e.b, fn), map_expr(e.c, fn)
        if a is not e.a or b is not e.b or c is not e.c:
            e = T.Fma(a, b, c, e.dtype)
    elif e is None or isinstance(e, (str, int, float)):
        return e
    out = fn(e)
    return e if out is None else out


def subst(e, mapping: dict):
    """`e` with the variables named in `mapping` replaced by expressions."""
    return map_expr(e, lambda x: mapping.get(x.name) if isinstance(x, T.Var) else None)


def map_exprs(st, fn):
    """Statement `st` (and everything nested in it) with every expression rewritten by `fn`."""
    changes = {}
    for f in fields(st):
        v = getattr(st, f.name)
        if f.name in ("body", "orelse", "sync", "refill"):
            new = tuple(map_exprs(x, fn) for x in v)
            if any(a is not b for a, b in zip(new, v)):
                changes[f.name] = new
        elif f.name in ("value", "cond", "a_stage", "b_stage", "next_stage", "inside", "start") and \
                v is not None \
                and not isinstance(v, (str, bool)):
            new = map_expr(v, fn)
            if new is not v:
                changes[f.name] = new
        elif f.name in ("idx", "extents", "shape"):
            new = tuple(map_expr(x, fn) for x in v)
            if any(a is not b for a, b in zip(new, v)):
                changes[f.name] = new
        elif isinstance(v, T.Region) and v.offsets is not None:
            offs = tuple(map_expr(x, fn) for x in v.offsets)
            if any(a is not b for a, b in zip(offs, v.offsets)):
                changes[f.name] = replace(v, offsets=offs)
    return replace(st, **changes) if changes else st


def map_stmts(stmts: tuple, fn) -> tuple:
    """Rewrite a statement list bottom-up: `fn(stmt)` returns a list of statements (possibly the
    statement itself) to put in its place, or None to keep it."""
    out = []
    for st in stmts:
        if isinstance(st, T.For):
            body = map_stmts(st.body, fn)
            st = st if body == st.body else replace(st, body=body)
        elif isinstance(st, T.If):
            body, orelse = map_stmts(st.body, fn), map_stmts(st.orelse, fn)
            if body != st.body or orelse != st.orelse:
                st = replace(st, body=body, orelse=orelse)
        new = fn(st)
        out.extend([st] if new is None else new)
    return tuple(out)


def uses_var(e, names) -> bool:
    """Does expression `e` read any of the variables `names`?"""
    if e is None:
        return False
    return any(isinstance(x, T.Var) and x.name in names for x in T.walk_exprs(e))


def loads_in(st) -> list:
    """Every Load in statement `st` (nested statements, indices and conditions included)."""
    out = []
    for s in T.walk_stmts([st]):
        out += own_loads(s)
    return out


def own_loads(s) -> list:
    """The Loads of statement `s`'s own value, condition and indices (not of nested statements)."""
    out = []
    for f in ("value", "cond"):
        e = getattr(s, f, None)
        if e is not None and not isinstance(e, str):
            out += [x for x in T.walk_exprs(e) if type(x) is T.Load]
    for i in getattr(s, "idx", ()) or ():
        out += [x for x in T.walk_exprs(i) if type(x) is T.Load]
    return out


def stores_in(st) -> list:
    return [s for s in T.walk_stmts([st]) if isinstance(s, T.Store)]


def multiple_of(e, n: int) -> bool:
    """Is integer expression `e` provably a multiple of n (products with a constant multiple of
    n, sums of such, 0)?"""
    if isinstance(e, T.Const):
        return isinstance(e.value, int) and e.value % n == 0
    if isinstance(e, T.Binary) and e.fn == "mul":
        return multiple_of(e.a, n) or multiple_of(e.b, n)
    if isinstance(e, T.Binary) and e.fn in ("add", "sub"):
        return multiple_of(e.a, n) and multiple_of(e.b, n)
    return False


def names_read(stmts, exprs=()) -> set:
    """Every variable name the statements `stmts` (all nested fields) and the expressions
    `exprs` read."""
    out = set()

    def note(e):
        if isinstance(e, T.Var):
            out.add(e.name)
        return None
    for e in exprs:
        map_expr(e, note)
    for st in stmts:
        map_exprs(st, note)
    return out


def used_names(k: T.TileKernel) -> set:
    """Every variable name kernel `k` reads: in its grid, its statements (all nested fields) and
    the dimensions of its tensors' shapes."""
    return names_read(k.body, k.grid) | T.shape_dims(k)


def taken_names(k: T.TileKernel) -> set:
    """The names a new kernel-level `Let` of kernel `k` must not take: its parameters, their
    shapes' dimensions, its block variables, buffers, Lets and loop variables."""
    return {p.name for p in k.params} | T.shape_dims(k) | set(k.block_vars) | \
        {s.name for s in T.walk_stmts(k.body) if isinstance(s, (T.Alloc, T.Let))} | \
        {v for s in T.walk_stmts(k.body) if isinstance(s, T.For) for v in s.vars}


def unit_stride(idx, var: str) -> bool:
    """The index walks its last axis one element per step of `var`: (..., base + var) or
    (..., var), with nothing else depending on var."""
    if not idx:
        return False
    *lead, last = idx
    if any(uses_var(i, (var,)) for i in lead):
        return False
    if isinstance(last, T.Var):
        return last.name == var
    return (isinstance(last, T.Binary) and last.fn == "add" and isinstance(last.b, T.Var) and
            last.b.name == var and not uses_var(last.a, (var,)))


def column_base(last, var: str):
    """The `base` of a `unit_stride` index's last entry (`base + var`; 0 for `var` alone)."""
    return T.iconst(0) if isinstance(last, T.Var) else last.a


def written_by(st) -> list:
    """The buffers statement `st` itself writes (not its nested statements): a store's or
    fill's, a copy's destination, a matrix product's accumulator, a reduction's result (or a
    matrix-unit GEMV's partial sums), an all-reduce's buffer."""
    if isinstance(st, (T.Store, T.Fill, T.Allreduce)):
        return [st.buf]
    if isinstance(st, T.Copy):
        return [st.dst.buf]
    if isinstance(st, T.Gemm):
        return [st.c]
    if isinstance(st, (T.Reduce, T.GemvMma)):
        return [st.dst]
    return []


def writes_per_buffer(k: T.TileKernel) -> dict:
    """{buffer: number of statements that write it} (written_by)."""
    out: dict = {}
    for st in T.walk_stmts(k.body):
        for b in written_by(st):
            out[b] = out.get(b, 0) + 1
    return out


def mod_of_var(e, var: str):
    """(c, S) when `e` is `(var + c) % S` (or `var % S`: c = 0) for constants c >= 0, S > 0 (a
    pipelined loop's stage indices); else None."""
    if not (isinstance(e, T.Binary) and e.fn == "imod" and isinstance(e.b, T.Const) and
            e.b.value > 0):
        return None
    a = e.a
    if isinstance(a, T.Var) and a.name == var:
        return 0, e.b.value
    if isinstance(a, T.Binary) and a.fn == "add" and isinstance(a.a, T.Var) and a.a.name == var \
       and isinstance(a.b, T.Const) and a.b.value >= 0:
        return a.b.value, e.b.value
    return None


def whole_buffer_uses(k: T.TileKernel) -> set:
    """Buffers used other than by element loads and stores (whole-buffer statements)."""
    out = set()
    for st in T.walk_stmts(k.body):
        if isinstance(st, (T.Fill, T.Allreduce)):
            out.add(st.buf)
        elif isinstance(st, T.Copy):
            out |= {st.src.buf, st.dst.buf}
        elif isinstance(st, T.Gemm):
            out |= {st.a, st.b, st.c}
        elif isinstance(st, T.Reduce):
            out |= {st.src, st.dst}
    return out


def loads_of(stmts, buf: str) -> list:
    """The loads of `buf` the statements hold (nested ones, loop extents and conditions
    included)."""
    out = []
    for st in T.walk_stmts(stmts):
        for e in getattr(st, "extents", ()) or ():
            out += [x for x in T.walk_exprs(e) if type(x) is T.Load and x.buf == buf]
        out += [x for x in own_loads(st) if x.buf == buf]
    return out



def defined_names(stmts) -> set:
    """Names the statements define (lets and loop variables), nested ones included."""
    out = set()
    for st in T.walk_stmts(stmts):
        if isinstance(st, T.Let):
            out.add(st.name)
        elif isinstance(st, T.For):
            out |= set(st.vars)
    return out
