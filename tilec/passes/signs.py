"""Signs of Graph IR values that follow from how they are computed, for lowering choices that
need them (today: `exp` of a non-positive argument, as softmax's `exp(x - max(x))`, takes the
cheaper `exp_nonpos` in the Tile IR).

A fact is about every element: `nonpositive` means each element is <= 0 or NaN, `nonnegative`
each >= 0 or NaN (-0.0 counts as both). Facts hold for float values only: integer arithmetic
wraps, so `a - max(a)` of i8 values can come out positive. Rounding never flips a sign (0 is
representable in every float dtype and rounding is monotonic), so a fact about an exact result
holds for the rounded one. A zero's sign does matter to a division (1 / -0.0 is -inf), so a
quotient's sign is known only for divisors that are never -0.0 (rsqrt, 1 / sqrt, is no fact).
"""

from __future__ import annotations

from ..ir.types import at_least_plus_zero, is_float

_NONNEG_UNARY = ("abs", "exp", "exp2", "sqrt", "relu", "sigmoid", "softplus")
_DEPTH = 24  # facts come from nearby ops; deeper chains are not worth the walk


def nonpositive(ops: dict, oid: int, depth: int = 0) -> bool:
    """Is every element of op `oid`'s value <= 0 or NaN?"""
    return _sign(ops, oid, -1, depth)


def nonnegative(ops: dict, oid: int, depth: int = 0) -> bool:
    """Is every element of op `oid`'s value >= 0 or NaN?"""
    return _sign(ops, oid, +1, depth)


def _sign(ops: dict, oid: int, s: int, depth: int) -> bool:
    op = ops[oid]
    if depth > _DEPTH:
        return False
    if op.kind == "dim":  # dimensions are at least 1
        return s > 0
    if not is_float(op.type.dtype):
        return False
    a, d = op.args, depth + 1

    def same(x):
        return _sign(ops, x, s, d)

    def opposite(x):
        return _sign(ops, x, -s, d)

    k, fn = op.kind, op.attr("fn")
    if k == "const":
        v = op.attr("value")
        return isinstance(v, (int, float)) and (v != v or v * s >= 0)
    if k == "copy":
        return same(a[0])
    if k == "cast":  # from a float, or a dimension or index (at least 0)
        src = ops[a[0]]
        if src.kind in ("dim", "index"):
            return s > 0
        return is_float(src.type.dtype) and same(a[0])
    if k == "where":
        return same(a[1]) and same(a[2])
    if k == "reduce" and fn in ("max", "min", "sum"):
        return same(a[0])
    if k == "unary":
        if fn == "neg":
            return opposite(a[0])
        return s > 0 and fn in _NONNEG_UNARY
    if k != "binary":
        return False
    x, y = a[0], a[1] if len(a) > 1 else None
    if fn == "add":
        return same(x) and same(y)
    if fn == "sub":  # x - y: x below y (or above it), or x and -y of the sign
        return (at_most(ops, y, x) if s > 0 else at_most(ops, x, y)) or \
            (same(x) and opposite(y))
    if fn == "mul" and x == y:  # a square
        return s > 0
    if fn == "mul":
        return any((_sign(ops, u, s, d) and nonnegative(ops, v, d)) or
                   (_sign(ops, u, -s, d) and nonpositive(ops, v, d)) for u, v in ((x, y), (y, x)))
    if fn == "div":
        return same(x) and _positive_divisor(ops, y)
    if fn == "maximum":  # at least the larger operand, at most both bounds
        return (same(x) or same(y)) if s > 0 else (same(x) and same(y))
    if fn == "minimum":
        return (same(x) or same(y)) if s < 0 else (same(x) and same(y))
    return False


def _positive_divisor(ops: dict, oid: int) -> bool:
    """A divisor > 0 or +0.0 (never -0.0, which would flip the quotient's sign): a constant, or
    a dimension or index made a float."""
    op = ops[oid]
    if op.kind == "const":
        return at_least_plus_zero(op.attr("value"))
    return op.kind == "cast" and ops[op.args[0]].kind in ("dim", "index")


def at_most(ops: dict, x: int, y: int) -> bool:
    """Is each element of `x` <= the element of `y` it meets in `x - y` (or NaN)? True when `y`
    is `x` itself, an elementwise `maximum` with `x`, or a max-reduction of `x` broadcast back
    over the axes it reduced (kept as size-1 axes, or leading axes dropped)."""
    if x == y:
        return True
    oy = ops[y]
    if oy.kind == "binary" and oy.attr("fn") == "maximum" and x in oy.args:
        return True  # (x broadcasts alike into the maximum and into x - y)
    if not (oy.kind == "reduce" and oy.attr("fn") == "max" and oy.args[0] == x):
        return False
    axes = tuple(sorted(oy.attr("axes")))
    if oy.attr("keepdims"):
        return True  # size-1 axes broadcast exactly back over the reduced ones
    # dropped axes: the trailing ones left broadcast back only when the dropped ones led
    return axes == tuple(range(len(axes)))
