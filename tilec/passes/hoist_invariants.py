"""Arithmetic that depends only on dimensions, scalar parameters and block indices is computed
once per block, before the kernel body:

    S[i, j] = S[i, j] * rsqrt(f32(D))     ->     inv0 = rsqrt(f32(D))
                                                  ...
                                                  S[i, j] = S[i, j] * inv0

GPU code unrolls its element loops; a compiler does not always hoist such a value out of the
per-element branches it lands in (attention's scale cost a division and a square root per
score before this pass).
"""

from __future__ import annotations

from dataclasses import replace

from ..ir import tile as T
from .rewrite import taken_names


def _varying(e, fixed: set) -> bool:
    """Does `e` read memory or a variable other than the per-block ones?"""
    for x in T.walk_exprs(e):
        if isinstance(x, T.Load):
            return True
        if isinstance(x, T.Var) and x.name not in fixed:
            return True
    return False


def _worth(e) -> bool:
    """Floating-point work (index arithmetic on integers is cheap and folds)."""
    return any(isinstance(x, (T.Unary, T.Binary, T.Cast)) and
               getattr(x, "dtype", "i64") not in ("i64", "i32", "bool") for x in T.walk_exprs(e))


def hoist(k: T.TileKernel) -> T.TileKernel:
    # dimension symbols are the free variables of the parameters' shapes
    fixed = {p.name for p in k.params if p.kind == "scalar"} | set(k.block_vars) | T.shape_dims(k)
    lets, names = [], {}
    taken = taken_names(k)

    def top_down(e):
        """The largest invariant subexpressions of `e` replaced by hoisted names."""
        if e is None or isinstance(e, (T.Var, T.Const, str, int, float)):
            return e
        if not isinstance(e, T.Load) and not _varying(e, fixed) and _worth(e):
            if e not in names:
                n = len(names)
                name = f"inv{n}"
                while name in taken:
                    n += 1
                    name = f"inv{n}"
                taken.add(name)
                names[e] = T.Var(name, e.dtype)
                lets.append(T.Let(name, e))
            return names[e]
        changes = {f: top_down(getattr(e, f)) for f in ("x", "a", "b", "cond")
                   if getattr(e, f, None) is not None}
        changes = {f: v for f, v in changes.items() if v is not getattr(e, f)}
        return replace(e, **changes) if changes else e

    body = tuple(_rewrite_roots(st, top_down) for st in k.body)
    return replace(k, body=tuple(lets) + body) if lets else k


def _rewrite_roots(st, fn):
    """Statement `st` with fn applied to each whole expression it holds (values, conditions,
    indices, extents), nested statements included."""
    changes = {}
    for f in ("value", "cond"):
        v = getattr(st, f, None)
        if v is not None and not isinstance(v, str):
            new = fn(v)
            if new is not v:
                changes[f] = new
    for f in ("idx", "extents"):
        v = getattr(st, f, None)
        if v:
            new = tuple(fn(x) for x in v)
            if any(a is not b for a, b in zip(new, v)):
                changes[f] = new
    for f in ("body", "orelse"):
        v = getattr(st, f, None)
        if v:
            new = tuple(_rewrite_roots(x, fn) for x in v)
            if any(a is not b for a, b in zip(new, v)):
                changes[f] = new
    return replace(st, **changes) if changes else st


def run(prog: T.TileProgram, target, options) -> T.TileProgram:
    return replace(prog, kernels=tuple(hoist(k) for k in prog.kernels))
