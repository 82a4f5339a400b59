"""Lark Transformer: parse tree -> tilec.parser.ast (one method per grammar rule/alias)."""

from __future__ import annotations

import ast as pyast
from contextvars import ContextVar

from lark import Token, Transformer, v_args

from ..diagnostics import Loc, error
from . import ast

# lines before the text being transformed (a part of a file parsed on its own: grammar.parse)
LINE_OFFSET: ContextVar[int] = ContextVar("LINE_OFFSET", default=0)


def loc_of(meta_or_tok) -> Loc:
    skip = LINE_OFFSET.get()
    if isinstance(meta_or_tok, Token):
        return Loc(meta_or_tok.line + skip, meta_or_tok.column,
                   meta_or_tok.column + len(meta_or_tok.value))
    end = meta_or_tok.end_column if meta_or_tok.end_line == meta_or_tok.line else None
    return Loc(meta_or_tok.line + skip, meta_or_tok.column, end)


def _span(a: Loc, b: Loc) -> Loc:
    end = b.end_col if (b.line == a.line and b.end_col) else None
    return Loc(a.line, a.col, end)


@v_args(meta=True)
class ToAst(Transformer):
    """Builds the syntax tree; no semantic checks except literal well-formedness."""

    # ---- expressions
    def name(self, meta, c):
        return ast.Name(loc_of(c[0]), str(c[0]))

    def number(self, meta, c):
        text = str(c[0])
        is_float = any(ch in text for ch in ".eE")
        digits = text.lstrip("0") or "0"
        if not is_float and len(digits) > 19:  # more than any 64-bit integer holds
            raise error(f"integer literal {text[:12]}... ({len(text)} digits) does not fit in "
                        "64 bits", loc_of(c[0]))
        return ast.Number(loc_of(c[0]), float(text) if is_float else int(text), is_float)

    def compare(self, meta, c):
        left, op, right = c
        return ast.Compare(_span(left.loc, right.loc), str(op), left, right)

    def binop(self, meta, c):
        left, op, right = c
        return ast.BinOp(_span(left.loc, right.loc), str(op), left, right)

    def or_(self, meta, c):
        return ast.BinOp(_span(c[0].loc, c[1].loc), "|", c[0], c[1])

    def and_(self, meta, c):
        return ast.BinOp(_span(c[0].loc, c[1].loc), "&", c[0], c[1])

    def pow(self, meta, c):
        return ast.BinOp(_span(c[0].loc, c[2].loc), "**", c[0], c[2])

    def neg(self, meta, c):
        return ast.Unary(loc_of(meta), "-", c[0])

    def invert(self, meta, c):
        return ast.Unary(loc_of(meta), "~", c[0])

    def attr(self, meta, c):
        return ast.Attr(loc_of(meta), c[0], str(c[1]))

    def tuple(self, meta, c):
        return ast.Tuple(loc_of(meta), tuple(x for x in c if x is not None))

    def list(self, meta, c):
        return ast.List(loc_of(meta), tuple(x for x in c if x is not None))

    def call(self, meta, c):
        fn, argl = c[0], c[1] or []
        args, kwargs, seen = [], [], set()
        for a in argl:
            if isinstance(a, tuple):
                if a[0] in seen:
                    raise error(f"keyword argument '{a[0]}' given twice", a[2])
                seen.add(a[0])
                kwargs.append(a)
            elif kwargs:
                raise error("positional argument follows keyword argument", a.loc)
            else:
                args.append(a)
        return ast.Call(loc_of(fn), str(fn), tuple(args), tuple(kwargs))

    def args(self, meta, c):
        return [x for x in c if x is not None]

    def subscript(self, meta, c):
        return ast.Subscript(loc_of(meta), str(c[0]),
                             tuple(self._positional(c[1] or (), "an index")))

    @staticmethod
    def _positional(argl, what):
        for a in argl:
            if isinstance(a, tuple):
                raise error(f"{what} takes no keyword arguments", a[2])
        return argl

    # ---- tile-level statements
    def names(self, meta, c):
        return tuple((str(t), loc_of(t)) for t in c if t is not None)

    def grid(self, meta, c):
        fn, argl, names, *body = c
        return ast.Grid(loc_of(fn), self.call(meta, [fn, argl]), names, tuple(body))

    def t_assign(self, meta, c):
        return ast.TAssign(loc_of(c[0]), str(c[0]), c[1])

    def t_store(self, meta, c):
        return ast.TStore(loc_of(c[0]), str(c[0]), tuple(self._positional(c[1] or (), "an index")),
                          c[2])

    def t_call(self, meta, c):
        return ast.TCall(loc_of(c[0]), self.call(meta, [c[0], c[1]]))

    def t_for(self, meta, c):
        names, fn, argl, *body = c
        return ast.TFor(loc_of(meta), names, self.call(meta, [fn, argl]), tuple(body))

    def t_else(self, meta, c):
        return tuple(c)

    def t_if(self, meta, c):
        cond, *rest = c
        orelse = ()
        if rest and (isinstance(rest[-1], tuple) or rest[-1] is None):
            orelse = rest.pop() or ()
        return ast.TIf(loc_of(meta), cond, tuple(rest), orelse)

    def kwarg(self, meta, c):
        return (str(c[0]), c[1], loc_of(c[0]))

    # ---- kernels
    def type(self, meta, c):
        return (str(c[0]), loc_of(c[0]), None if c[1] is None else tuple(c[1]))

    def rank0_type(self, meta, c):  # `f32[]`: a rank-0 tensor in memory
        return (str(c[0]), loc_of(c[0]), ())

    def dims(self, meta, c):
        return [x for x in c if x is not None]

    def param(self, meta, c):
        dtype, dloc, dims = c[1]
        return ast.Param(loc_of(c[0]), str(c[0]), dtype, dloc, dims)

    def params(self, meta, c):
        return [x for x in c if x is not None]

    def outputs(self, meta, c):
        return tuple(x for x in c if x is not None)

    def docstring(self, meta, c):
        return ("doc", str(c[0]), loc_of(c[0]))

    def assume(self, meta, c):
        return ast.Assume(loc_of(meta), c[0])

    def assign(self, meta, c):
        return ast.Assign(loc_of(c[0]), str(c[0]), c[1])

    def kernel(self, meta, c):
        name, params, outputs, *stmts = c
        doc, body = None, []
        for i, s in enumerate(stmts):
            if isinstance(s, tuple) and s[0] == "doc":
                if i != 0:
                    raise error("a docstring must be the first statement of a kernel", s[2])
                doc = _string_value(s[1], s[2])
            else:
                body.append(s)
        return ast.Kernel(loc_of(name), str(name), tuple(params or ()), outputs, doc, tuple(body))

    # ---- schedules
    def sched_kv(self, meta, c):
        return (str(c[0]), _int(c[1]), loc_of(c[0]))

    def sched_value(self, meta, c):
        tok = c[0]
        val = _int(tok) if tok.type == "NUMBER" else str(tok)
        return (None, val, loc_of(tok))

    def sched_item(self, meta, c):
        return ast.SchedItem(loc_of(c[0]), str(c[0]), tuple(c[1:]))

    def target_block(self, meta, c):
        return ast.TargetSchedule(loc_of(c[0]), str(c[0]), tuple(c[1:]))

    def schedule(self, meta, c):
        return ast.Schedule(loc_of(c[0]), str(c[0]), tuple(c[1:]))

    def start(self, meta, c):
        ks = tuple(x for x in c if isinstance(x, ast.Kernel))
        ss = tuple(x for x in c if isinstance(x, ast.Schedule))
        return ast.Module(Loc(1, 1), ks, ss)


def _int(tok: Token) -> int:
    text = str(tok)
    if not text.isdigit():
        raise error(f"expected an integer, got '{text}'", loc_of(tok))
    return int(text)


def _string_value(text: str, loc: Loc) -> str:
    try:
        value = pyast.literal_eval(text)
    except (ValueError, SyntaxError):
        raise error("malformed string literal", loc) from None
    # Docstrings are indented like code; drop the common indentation (as Python's inspect.cleandoc).
    import inspect

    return inspect.cleandoc(value)
