"""Rewrites softmax / mean / logsumexp into max, exp, sum and div and x ** 0.5 into sqrt; drops
no-op casts; CSE + DCE.

After this pass the fusion pass sees only: input const dim index cast unary binary compare where
transpose dequant matmul reduce.
"""

from __future__ import annotations

from dataclasses import replace

from ..ir.graph import GraphEditor, Module, attrs
from ..ir.types import Dim, TensorType, numel


def _keepdims_shape(shape, axes):
    return tuple(Dim.const(1) if i in axes else d for i, d in enumerate(shape))


def widen(x: int, t: TensorType, E) -> tuple:
    """16-bit inputs of softmax / logsumexp / mean are computed in f32 and rounded once at the
    end, as NumPy computes them; returns (value id, its type)."""
    if t.dtype not in ("f16", "bf16"):
        return x, t
    wt = t.with_dtype("f32")
    return E("cast", [x], wt), wt


def narrow(x: int, t: TensorType, E) -> int:
    return x if t.dtype not in ("f16", "bf16") else E("cast", [x], t)


def canonicalize_graph(g):
    ed = GraphEditor(g)
    for op in g.ops:
        a = [ed.map[x] for x in op.args]
        t, loc, st = op.type, op.loc, op.stmt

        def E(kind, args, type_, loc=loc, st=st, **kw):
            return ed.emit(kind, args, type_, attrs(**kw), loc, st)

        if op.kind == "cast" and ed.ops[a[0]].type == t:
            ed.map[op.id] = a[0]
        elif op.kind == "binary" and op.attr("fn") == "pow" and op.attr("exponent") == 0.5:
            # numpy's x ** 0.5 is sqrt(x) (sqrt(-0) = -0, sqrt(-inf) = NaN, where C's pow gives
            # +0 and +inf): every target then computes what the reference does
            ed.map[op.id] = E("unary", [a[0]], t, fn="sqrt")
        elif op.kind == "softmax":
            axes = op.attr("axes")
            x, wt = widen(a[0], t, E)
            kt = TensorType(wt.dtype, _keepdims_shape(t.shape, axes))
            m = E("reduce", [x], kt, fn="max", axes=axes, keepdims=True)
            e = E("unary", [E("binary", [x, m], wt, fn="sub")], wt, fn="exp")
            s = E("reduce", [e], kt, fn="sum", axes=axes, keepdims=True)
            ed.map[op.id] = narrow(E("binary", [e, s], wt, fn="div"), t, E)
        elif op.kind == "mean":
            xt = ed.ops[a[0]].type
            axes, keep = op.attr("axes"), op.attr("keepdims")
            src, wx = widen(a[0], xt, E)
            wt = t.with_dtype(wx.dtype)
            s = E("reduce", [src], wt, fn="sum", axes=axes, keepdims=keep)
            n = numel([xt.shape[i] for i in axes])
            sc = TensorType(wx.dtype, ())
            if n.is_const:
                cnt = E("const", [], sc, value=float(n.value))
            else:
                cnt = E("cast", [E("dim", [], TensorType("i64", ()), dim=n)], sc)
            ed.map[op.id] = narrow(E("binary", [s, cnt], wt, fn="div"), t, E)
        elif op.kind == "logsumexp":
            axes, keep = op.attr("axes"), op.attr("keepdims")
            xt = ed.ops[a[0]].type
            x, wx = widen(a[0], xt, E)
            kt = TensorType(wx.dtype, _keepdims_shape(xt.shape, axes))
            m = E("reduce", [x], kt, fn="max", axes=axes, keepdims=True)
            e = E("unary", [E("binary", [x, m], wx, fn="sub")], wx, fn="exp")
            s = E("reduce", [e], kt, fn="sum", axes=axes, keepdims=True)
            r = E("binary", [E("unary", [s], kt, fn="log"), m], kt, fn="add")
            if not keep:  # a reduction over size-1 axes drops them
                r = E("reduce", [r], t.with_dtype(wx.dtype), fn="max", axes=axes, keepdims=False)
            ed.map[op.id] = narrow(r, t, E)
        else:
            ed.keep(op)
    return ed.finish()


def run(m: Module, opts=None) -> Module:
    return replace(m, graphs=tuple(canonicalize_graph(g) for g in m.graphs))
