"""Software pipelining: rewrites each `pipelined(n, stages=S)` loop into a loop that overlaps the
tile copies of later iterations with the compute of this one.

On a target with asynchronous global -> shared copies (GPU cp.async), every shared buffer that
the loop body fills with a top-level `copy` gets S stages (a leading axis); a prologue issues the
copies of the first S-1 iterations, and iteration k waits for its own tiles, issues the copies
of iteration k+S-1 into the stage freed by iteration k-1, then computes on stage k % S:

    for s in range(S - 1):                       # prologue
        if s < n: copy_async(src(s), buf[s])
        commit()
    for k in range(n):
        wait(S - 2)                              # the group of iteration k has landed
        barrier()                                # ... for every thread; stage (k-1) % S is free
        if k + S - 1 < n: copy_async(src(k + S - 1), buf[(k + S - 1) % S])
        commit()
        <body, reading buf[k % S]>

Elsewhere (the CPU: out-of-order cores and hardware prefetch stand in for staged copies), and
when S < 2, a pipelined loop becomes a plain `range` loop.
"""

from __future__ import annotations

from dataclasses import replace

from ..ir import tile as T
from .rewrite import map_exprs, subst


def _staged_copies(loop: T.For, allocs: dict) -> list:
    """Top-level copies of the body that can be issued ahead: global -> shared, no conversion,
    and the destination is not read earlier in the body than the copy fills it."""
    out = []
    for s in loop.body:
        if isinstance(s, T.Copy) and s.dst.buf in allocs and allocs[s.dst.buf].scope == "shared" \
           and s.src.buf not in allocs and s.src.offsets is not None:
            out.append(s)
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
    prologue = [T.For((s,), (T.iconst(S - 1),), "range", (
        T.If(T.ilt(sv, n), issue(sv, sv)), T.Commit()))]
    ahead = T.iadd(kv, T.iconst(S - 1))
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
    head = (T.Wait(S - 2), T.Barrier(),
            T.If(T.ilt(ahead, n), issue(ahead, T.imod(ahead, T.iconst(S)))), T.Commit())
    return prologue, replace(loop, kind="range", body=head + tuple(body), stages=1), staged


def lower_body(stmts: tuple, target, params: dict) -> tuple:
    allocs = {a.name: a for a in T.walk_stmts(stmts) if isinstance(a, T.Alloc)}
    out, staged_all = [], {}
    for st in stmts:
        if isinstance(st, T.For) and st.kind == "pipelined":
            if target.resources.async_copy:
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
        ks.append(replace(k, body=lower_body(k.body, target, params)))
    return replace(prog, kernels=tuple(ks))
