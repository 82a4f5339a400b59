"""Rows of a batched GEMM with one weight, merged: `X @ W` with X: [B, S, K] and W: [K, N] is
one GEMM of B * S rows, not B GEMMs of S rows each. Tensors are dense and row-major, so X and
the output [B, S, N] are the same memory as [B * S, K] and [B * S, N]: `view(g)` returns the
graph with such leading dims merged into one wherever the whole graph allows it (its public
signature stays the caller's: only the kernels see the view). Then the block tiles cover B * S
rows (no tile per batch left partly empty at the end of each S), a weight tile is read once per
row tile of all batches together, and decode sizes (B * S <= 16) take the small-M variants.

The view is taken only where every op keeps to the merged rows: elementwise ops whose
operands are either such tensors of the same rank or broadcast over trailing dims only,
matmuls of such an A by a 2-D B, reductions and `index` over trailing axes, transposes of
trailing axes, and tensors of other shapes used only by ops that do not mix them with the rows
(weights, dequantized weights, scalars).

A kernel of the view declares its tensors as [B * S, K]; printed as a tile-level kernel
(`dump-ir --stage tiled`) it declares B and S as dimensions (`B: dim`, ir/tile.py free_dims),
so the dump still builds. `TILEC_MERGE_ROWS=0` turns the view off (for measuring)."""

from __future__ import annotations

from dataclasses import replace

from ..ir.graph import Graph, ParamDecl, attrs
from ..ir.types import TensorType, numel
from . import split_k

# ops that compute each element from the same element of their operands (broadcast allowed)
_ELEMENTWISE = {"cast", "copy", "unary", "binary", "compare", "where"}
# ops that reduce over `axes` (keepdims or not)
_REDUCTIONS = {"reduce", "mean", "logsumexp", "softmax"}


def _rows(g: Graph) -> tuple | None:
    """The leading dims of the first matmul of a batched A by a 2-D B (batch dims and M)."""
    ops = g.op_map()
    for op in g.ops:
        if op.kind == "matmul":
            a, b = (ops[x] for x in op.args)
            if a.type.rank >= 3 and b.type.rank == 2:
                return tuple(a.type.shape[:-1])
    return None


def view(g: Graph) -> Graph | None:
    """`g` with its batched-GEMM rows merged (module docstring), or None where nothing merges
    or some op would mix the rows with other positions."""
    if g.tile is not None or not split_k.merge_rows(True):
        return None
    rows = _rows(g)
    if rows is None:
        return None
    n = len(rows)

    def rowed(t: TensorType) -> bool:
        return t.rank >= n and tuple(t.shape[:n]) == rows

    def merged(t: TensorType) -> TensorType:
        return TensorType(t.dtype, (numel(rows),) + tuple(t.shape[n:])) if rowed(t) else t

    def trailing_axis(a: int, rank: int) -> int | None:
        """Axis `a` of a rowed tensor of `rank` in the merged view; None where it is a row axis."""
        a %= rank
        return a - n + 1 if a >= n else None

    ops = g.op_map()
    out = []
    for op in g.ops:
        t, args = op.type, [ops[x].type for x in op.args]
        at = dict(op.attrs)
        if op.kind in ("input", "const", "dim"):
            pass
        elif not rowed(t):
            if any(rowed(a) for a in args):
                return None  # (a row axis reduced away or moved: not row-wise)
        elif op.kind in _ELEMENTWISE:
            # rowed operands of the output's rank; others broadcast over its trailing dims only
            if any(not (rowed(a) and a.rank == t.rank) and a.rank > t.rank - n for a in args):
                return None
        elif op.kind == "matmul":
            a, b = args
            if not (rowed(a) and a.rank == t.rank and not rowed(b) and b.rank == 2):
                return None
        elif op.kind == "transpose":
            if not (rowed(args[0]) and t.rank >= n + 2):
                return None
        elif op.kind in _REDUCTIONS:
            if not rowed(args[0]):
                return None
            axes = [trailing_axis(a, args[0].rank) for a in at["axes"]]
            if None in axes:
                return None
            at["axes"] = tuple(axes)
        elif op.kind == "index":
            axis = trailing_axis(at["axis"], t.rank)
            if axis is None:
                return None
            at["axis"] = axis
        else:
            return None
        out.append(replace(op, type=merged(t), attrs=attrs(**at)))

    def param(p: ParamDecl) -> ParamDecl:
        return replace(p, type=merged(p.type))
    return replace(g, params=tuple(param(p) for p in g.params),
                   outputs=tuple(param(p) for p in g.outputs), ops=tuple(out))
