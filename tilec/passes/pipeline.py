"""Software pipelining: rewrites each `pipelined(n, stages=S)` loop into a loop that overlaps the
tile copies of later iterations with the compute of this one.

On a target with asynchronous global -> shared copies (GPU cp.async), every shared buffer that
the loop body fills with a top-level `copy` gets S stages (a leading axis); a prologue issues the
copies of the first S iterations and waits for the first; iteration k computes on stage k % S,
waits for the tiles of iteration k+1, and once every thread is past its reads of stage k % S (the
barrier), issues the copies of iteration k+S into it. The wait that ends an iteration (rather than
starting the next) lets a GEMM that ends the body run its last k-step across it (overlap_gemm);
the refill right after the barrier gives each copy S - 1 whole iterations to land:

    for s in range(S):                           # prologue
        if s < n: copy_async(src(s), buf[s])
        commit()
    wait(S - 1)                                  # the group of iteration 0 has landed
    barrier()                                    # ... for every thread
    for k in range(n):
        <body, reading buf[k % S]>
        wait(S - 2)                              # the group of iteration k + 1 has landed
        barrier()                                # ... for every thread; stage k % S is free
        if k + S < n: copy_async(src(k + S), buf[k % S])
        commit()                                 # (one group per iteration, empty or not)

A tile the body computes with a parallel loop (a dequantized weight tile, a prologue) reads its
inputs with ordinary loads that would stall every iteration; first, each global tensor such a loop
reads as a window (unit stride along both loop axes, or one row for all i, as a group scale
`s[(k * 128 + i) // 128, j]`) is staged: a tile copy of the window into a new shared buffer,
which the loop reads instead. Those copies are then issued ahead like the others.

Elsewhere (the CPU: out-of-order cores and hardware prefetch stand in for staged copies), and
when S < 2, a pipelined loop becomes a plain `range` loop.

In a warp-specialized kernel (Hopper, TileKernel.warp_specialize) the pipelined K loop of tile
copies and a gemm becomes a `warp_specialized` loop, with no prologue and no waits: the producer
warp's first thread walks it issuing the copies of iteration k into stage k % S by TMA once the
stage is free (its `empty` mbarrier), and the consumer warpgroups walk it waiting for each stage
to fill (its `full` mbarrier), multiplying it with wgmma and freeing it:

    for k in warp_specialized(n, stages=S):
        copy_async(src(k), A_s[k % S])           # producer: after empty[k % S]; on full[k % S]
        copy_async(src(k), B_s[k % S])
        gemm(A_s[k % S], B_s[k % S], acc)        # consumers: after full[k % S]; then empty
"""

from __future__ import annotations

from dataclasses import replace

from ..ir import tile as T
from .rewrite import loads_in, map_exprs, multiple_of, subst, uses_var


def _staged_copies(loop: T.For, allocs: dict) -> list:
    """Top-level copies of the body that can be issued ahead: global -> shared, no conversion,
    and the destination is not read earlier in the body than the copy fills it."""
    out = []
    for s in loop.body:
        if isinstance(s, T.Copy) and s.dst.buf in allocs and allocs[s.dst.buf].scope == "shared" \
           and s.src.buf not in allocs and s.src.offsets is not None:
            out.append(s)
    return out


def _monotone(e, var: str) -> bool:
    """Whether `e` never decreases as `var` grows (sums, products by non-negative constants and
    quotients by positive ones of `var` and terms free of it)."""
    if not uses_var(e, (var,)) or isinstance(e, T.Var):
        return True
    if isinstance(e, T.Binary):
        if e.fn == "add":
            return _monotone(e.a, var) and _monotone(e.b, var)
        if e.fn in ("mul", "idiv"):
            for x, y in ((e.a, e.b), (e.b, e.a)) if e.fn == "mul" else ((e.a, e.b),):
                if isinstance(y, T.Const) and y.value >= (0 if e.fn == "mul" else 1):
                    return _monotone(x, var)
    return False


def _inside(copies, allocs: dict, params: dict, k: str, n):
    """A condition under which every copy reads a window wholly inside its tensor in each of the
    n iterations (k = 0 .. n - 1); None when the windows' offsets do not grow with k."""
    conds = []
    last = T.isub(n, T.iconst(1))
    for c in copies:
        dims = params[c.src.buf].shape
        for off, ext, dim in zip(c.src.offsets[-2:], allocs[c.dst.buf].shape[-2:], dims[-2:]):
            if not _monotone(off, k):
                return None
            end = T.iadd(subst(off, {k: last}), ext)
            bound = T.dim_to_expr(dim)
            if end == bound or (isinstance(end, T.Const) and isinstance(bound, T.Const) and
                                end.value <= bound.value):
                continue  # (a window as wide as the tensor from 0: always inside)
            cond = T.Compare("le", end, bound)
            if cond not in conds:
                conds.append(cond)
    out = T.Const(True, "bool") if not conds else None
    for c in conds:
        out = T.land(out, c)
    return out


def _pipelined(loop: T.For, allocs: dict, params: dict):
    """(prologue, loop, staged buffer names) for one pipelined loop on an async-copy target."""
    S = loop.stages
    copies = [c for c in _staged_copies(loop, allocs)
              if allocs[c.dst.buf].dtype == params[c.src.buf].dtype]
    if S < 2 or not copies:
        return [], replace(loop, kind="range"), set()
    staged = {c.dst.buf for c in copies}
    (k,) = loop.vars
    n = loop.extents[0]
    kv = T.Var(k)

    def issue(at, stage):
        out = []
        for c in copies:
            src = replace(c.src, offsets=tuple(subst(o, {k: at}) for o in c.src.offsets))
            out.append(T.Copy(src, T.Region(c.dst.buf, (stage,)), async_=True))
        return tuple(out)

    s = "s"
    while s in loop.vars or s in allocs or s in params:
        s += "_"
    sv = T.Var(s)
    prologue = [T.For((s,), (T.iconst(S),), "range", (
        T.If(T.ilt(sv, n), issue(sv, sv)), T.Commit()))]
    stage_k = T.imod(kv, T.iconst(S))

    def staged_read(e):
        if isinstance(e, T.Load) and e.buf in staged:
            return replace(e, idx=(stage_k,) + e.idx)
        return None

    body = []
    for st in loop.body:
        if st in copies:
            continue
        if isinstance(st, T.Gemm):
            st = replace(st, a_stage=stage_k if st.a in staged else st.a_stage,
                         b_stage=stage_k if st.b in staged else st.b_stage)
        body.append(map_exprs(st, staged_read))
    ahead = T.iadd(kv, T.iconst(S))
    sync = (T.Wait(S - 2), T.Barrier())
    refill = (T.If(T.ilt(ahead, n), issue(ahead, stage_k)), T.Commit())
    prologue += [T.Wait(S - 1), T.Barrier()]
    return prologue, replace(loop, kind="range", body=tuple(body) + sync + refill, stages=1,
                             inside=_inside(copies, allocs, params, k, n)), staged


def _warp_specialized(loop: T.For) -> tuple:
    """(loop, staged buffer names) for the pipelined loop of a warp-specialized kernel: its
    top-level tile copies fill stage k % S (the producer's), the rest (the consumers') reads
    them there."""
    (k,) = loop.vars
    stage_k = T.imod(T.Var(k), T.iconst(loop.stages))
    staged = {st.dst.buf for st in loop.body if isinstance(st, T.Copy)}
    body = []
    for st in loop.body:
        if isinstance(st, T.Copy):
            body.append(replace(st, dst=T.Region(st.dst.buf, (stage_k,)), async_=True))
        elif isinstance(st, T.Gemm):
            body.append(replace(st, a_stage=stage_k if st.a in staged else None,
                                b_stage=stage_k if st.b in staged else None))
        else:
            if any(isinstance(x, (T.Copy, T.Gemm)) for x in T.walk_stmts([st])):
                raise AssertionError("a warp-specialized loop holds a nested copy or gemm")
            body.append(st)
    return replace(loop, kind="warp_specialized", body=tuple(body)), staged


def _unit(e, var: str):
    """`base + var` or `var` with base free of loop variables -> base; else None."""
    if isinstance(e, T.Var) and e.name == var:
        return T.iconst(0)
    if isinstance(e, T.Binary) and e.fn == "add" and isinstance(e.b, T.Var) and e.b.name == var:
        return e.a
    return None


def _window(ld: T.Load, i: str, j: str, rows: int, cols: int):
    """(window offsets, staged shape, index into the staged tile) when `ld` reads a window of its
    tensor along the loop (i, j) of extents (rows, cols); else None."""
    if len(ld.idx) < 2:
        return None
    *lead, ri, ci = ld.idx
    if any(uses_var(x, (i, j)) for x in lead):
        return None
    c0 = _unit(ci, j)
    if c0 is None or uses_var(c0, (i, j)):
        return None
    r0 = _unit(ri, i)
    if r0 is not None and not uses_var(r0, (i, j)):
        return tuple(lead) + (r0, c0), (rows, cols), (T.Var(i), T.Var(j))
    # a row index (base + i) // G that is the same for all i < rows: base a multiple of rows,
    # rows dividing G (a quantization group spans whole tiles)
    if isinstance(ri, T.Binary) and ri.fn == "idiv" and isinstance(ri.b, T.Const) and \
       ri.b.value % rows == 0:
        base = _unit(ri.a, i)
        if base is not None and not uses_var(base, (i, j)) and multiple_of(base, rows):
            return (tuple(lead) + (T.idiv(base, ri.b), c0), (1, cols),
                    (T.iconst(0), T.Var(j)))
    return None


def stage_loads(loop: T.For, params: dict, taken: set) -> tuple:
    """(allocations, loop) with the window loads of the loop's tile-computing parallel loops
    staged through shared buffers filled by tile copies."""
    allocs, body = [], []
    for st in loop.body:
        if not (isinstance(st, T.For) and st.kind == "parallel" and len(st.vars) == 2 and
                all(isinstance(x, T.Const) for x in st.extents)):
            body.append(st)
            continue
        i, j = st.vars
        rows, cols = (x.value for x in st.extents)
        staged: dict = {}  # Load -> replacement
        copies = []
        for ld in loads_in(st):
            p = params.get(ld.buf)
            if p is None or ld in staged or p.dtype == "bool":
                continue
            win = _window(ld, i, j, rows, cols)
            if win is None or (p.dtype in ("u4", "i4") and not (cols % 2 == 0 and
                                                                multiple_of(win[0][-1], 2))):
                continue
            offsets, shape, at = win
            name = f"{ld.buf}_s"
            while name in taken:
                name += "_"
            taken.add(name)
            allocs.append(T.Alloc(name, "shared", p.dtype, tuple(T.iconst(x) for x in shape)))
            copies.append(T.Copy(T.Region(ld.buf, offsets), T.Region(name)))
            staged[ld] = T.Load(name, at, ld.dtype)
        body += copies + [map_exprs(st, lambda e, staged=staged: staged.get(e))]
    return allocs, replace(loop, body=tuple(body))


def lower_body(stmts: tuple, target, params: dict, warp_specialize: bool = False) -> tuple:
    if target.resources.async_copy and not warp_specialize:
        taken = set(params) | {s.name for s in T.walk_stmts(stmts) if isinstance(s, T.Alloc)} | \
            {v for s in T.walk_stmts(stmts) if isinstance(s, T.For) for v in s.vars}
        new = []
        for st in stmts:
            if isinstance(st, T.For) and st.kind == "pipelined" and st.stages >= 2:
                extra, st = stage_loads(st, params, taken)
                new += extra
            new.append(st)
        stmts = tuple(new)
    allocs = {a.name: a for a in T.walk_stmts(stmts) if isinstance(a, T.Alloc)}
    out, staged_all = [], {}
    for st in stmts:
        if warp_specialize and isinstance(st, T.Copy):
            # a tile copied once before the loop (attention's Q): the producer's too, by TMA
            out.append(replace(st, async_=True))
            continue
        if isinstance(st, T.For) and st.kind == "pipelined":
            if warp_specialize:
                loop, staged = _warp_specialized(st)
                staged_all.update((b, st.stages) for b in staged)
                out.append(loop)
            elif target.resources.async_copy:
                prologue, loop, staged = _pipelined(st, allocs, params)
                for b in staged:
                    staged_all[b] = st.stages
                out += prologue + [loop]
            else:
                out.append(replace(st, kind="range", stages=1))
        else:
            out.append(st)
    # staged buffers get their leading stage axis
    return tuple(replace(a, shape=(T.iconst(staged_all[a.name]),) + a.shape)
                 if isinstance(a, T.Alloc) and a.name in staged_all else a for a in out)


def run(prog: T.TileProgram, target, options) -> T.TileProgram:
    ks = []
    for k in prog.kernels:
        params = {p.name: p for p in k.params}
        ks.append(replace(k, body=lower_body(k.body, target, params, bool(k.warp_specialize))))
    return replace(prog, kernels=tuple(ks))
