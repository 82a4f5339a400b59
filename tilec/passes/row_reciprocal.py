"""A loop's f32 divisions by a value the loop does not change (softmax's sum, a norm) multiply
by that value's reciprocal, computed once before the loop:

    for j in parallel(C):                      row_sum_i_rcp = 1.0 / row_sum_i
        Y[r, j] = t[i, j] / row_sum_i    ->    for j in parallel(C):
                                                   Y[r, j] = t[i, j] * row_sum_i_rcp

The reciprocal rounds once and the product once: within 1.5 ulp of the quotient (what the CUDA
target does too; docs/LANGUAGE_NOTES.md). A division costs several multiplies' time in a SIMD
loop. Divisors are `Let` values defined outside the loop (hoist_loads makes a row's value one);
divisions by constants and by values that change along the loop stay exact.
"""

from __future__ import annotations

from dataclasses import replace

from ..ir import tile as T
from .rewrite import defined_names, map_exprs


def _divisors(loop: T.For) -> list:
    """Names of f32 `Let` values outside `loop` that its statements divide by, in first-use order."""
    inside = defined_names((loop,))
    out = []
    for st in T.walk_stmts(loop.body):
        for f in ("value", "cond"):
            e = getattr(st, f, None)
            if e is None or isinstance(e, (str, bool)):
                continue
            for x in T.walk_exprs(e):
                if isinstance(x, T.Binary) and x.fn == "div" and x.dtype == "f32" and \
                   isinstance(x.b, T.Var) and x.b.name not in inside and x.b.name not in out:
                    out.append(x.b.name)
    return out


def run(prog: T.TileProgram, target, options) -> T.TileProgram:
    return replace(prog, kernels=tuple(reciprocals(k) for k in prog.kernels))


def reciprocals(k: T.TileKernel) -> T.TileKernel:
    taken = defined_names(k.body) | {p.name for p in k.params} | set(k.block_vars) | \
        {st.name for st in T.walk_stmts(k.body) if isinstance(st, T.Alloc)}
    f32_lets = {st.name for st in T.walk_stmts(k.body)
                if isinstance(st, T.Let) and getattr(st.value, "dtype", None) == "f32"}

    def fresh(base: str) -> str:
        name, n = f"{base}_rcp", 1
        while name in taken:
            n += 1
            name = f"{base}_rcp{n}"
        taken.add(name)
        return name

    def rewrite(stmts) -> tuple:
        out = []
        for st in stmts:
            if isinstance(st, T.If):
                st = replace(st, body=rewrite(st.body), orelse=rewrite(st.orelse))
            elif isinstance(st, T.For):
                names = [d for d in _divisors(st) if d in f32_lets] \
                    if st.kind == "parallel" else []
                if names:
                    rcp = {d: fresh(d) for d in names}
                    out += [T.Let(r, T.Binary("div", T.Const(1.0, "f32"), T.Var(d, "f32"), "f32"))
                            for d, r in rcp.items()]

                    def mul(x, rcp=rcp):
                        if isinstance(x, T.Binary) and x.fn == "div" and x.dtype == "f32" and \
                           isinstance(x.b, T.Var) and x.b.name in rcp:
                            return T.Binary("mul", x.a, T.Var(rcp[x.b.name], "f32"), "f32")
                        return None
                    st = replace(st, body=tuple(map_exprs(s, mul) for s in st.body))
                else:
                    st = replace(st, body=rewrite(st.body))
            out.append(st)
        return tuple(out)
    body = rewrite(k.body)
    return k if body == k.body else replace(k, body=body)

