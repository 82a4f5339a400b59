"""Rewrites softmax / mean / logsumexp into max, exp, sum and div; drops no-op casts; CSE + DCE.

After this pass the fusion pass sees only: input const dim index cast unary binary compare where
transpose dequant matmul reduce.
"""

from __future__ import annotations

from dataclasses import replace

from ..ir.graph import GraphEditor, Module, attrs
from ..ir.types import Dim, TensorType, numel


def _keepdims_shape(shape, axes):
    return tuple(Dim.const(1) if i in axes else d for i, d in enumerate(shape))


def canonicalize_graph(g):
    ed = GraphEditor(g)
    for op in g.ops:
        a = [ed.map[x] for x in op.args]
        t, loc, st = op.type, op.loc, op.stmt

        def E(kind, args, type_, loc=loc, st=st, **kw):
            return ed.emit(kind, args, type_, attrs(**kw), loc, st)

        if op.kind == "cast" and ed.ops[a[0]].type == t:
            ed.map[op.id] = a[0]
        elif op.kind == "softmax":
            axes = op.attr("axes")
            kt = TensorType(t.dtype, _keepdims_shape(t.shape, axes))
            m = E("reduce", [a[0]], kt, fn="max", axes=axes, keepdims=True)
            e = E("unary", [E("binary", [a[0], m], t, fn="sub")], t, fn="exp")
            s = E("reduce", [e], kt, fn="sum", axes=axes, keepdims=True)
            ed.map[op.id] = E("binary", [e, s], t, fn="div")
        elif op.kind == "mean":
            x = ed.ops[a[0]]
            axes, keep = op.attr("axes"), op.attr("keepdims")
            # 16-bit means accumulate and divide in f32, then round once (as NumPy does)
            wide = "f32" if t.dtype in ("f16", "bf16") else t.dtype
            src = a[0] if wide == x.type.dtype else E("cast", [a[0]], x.type.with_dtype(wide))
            wt = t.with_dtype(wide)
            s = E("reduce", [src], wt, fn="sum", axes=axes, keepdims=keep)
            n = numel([x.type.shape[i] for i in axes])
            sc = TensorType(wide, ())
            if n.is_const:
                cnt = E("const", [], sc, value=float(n.value))
            else:
                cnt = E("cast", [E("dim", [], TensorType("i64", ()), dim=n)], sc)
            m = E("binary", [s, cnt], wt, fn="div")
            ed.map[op.id] = m if wide == t.dtype else E("cast", [m], t)
        elif op.kind == "logsumexp":
            x = ed.ops[a[0]]
            axes, keep = op.attr("axes"), op.attr("keepdims")
            kt = TensorType(t.dtype, _keepdims_shape(x.type.shape, axes))
            m = E("reduce", [a[0]], kt, fn="max", axes=axes, keepdims=True)
            e = E("unary", [E("binary", [a[0], m], x.type, fn="sub")], x.type, fn="exp")
            s = E("reduce", [e], kt, fn="sum", axes=axes, keepdims=True)
            r = E("binary", [E("unary", [s], kt, fn="log"), m], kt, fn="add")
            if not keep:  # a reduction over size-1 axes drops them
                r = E("reduce", [r], t, fn="max", axes=axes, keepdims=False)
            ed.map[op.id] = r
        else:
            ed.keep(op)
    return ed.finish()


def run(m: Module, opts=None) -> Module:
    return replace(m, graphs=tuple(canonicalize_graph(g) for g in m.graphs))
