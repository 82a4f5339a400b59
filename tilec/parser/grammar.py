"""Loads grammar/tile.lark (LALR, strict, positions) and turns Lark errors into TilecErrors."""

from __future__ import annotations

import functools
import itertools
import re
from importlib import resources
from pathlib import Path

from lark import Lark, Token
from lark.exceptions import (
    UnexpectedCharacters,
    UnexpectedEOF,
    UnexpectedInput,
    UnexpectedToken,
    VisitError,
)
from lark.indenter import Indenter

from ..diagnostics import Loc, TilecError, error
from . import ast
from .transform import LINE_OFFSET, ToAst


class TileIndenter(Indenter):
    """Python-style INDENT/DEDENT; newlines inside brackets are ignored."""

    NL_type = "_NL"
    OPEN_PAREN_types = ["LPAR", "LSQB"]
    CLOSE_PAREN_types = ["RPAR", "RSQB"]
    INDENT_type = "_INDENT"
    DEDENT_type = "_DEDENT"
    tab_len = 8

    def handle_NL(self, token):
        """Lark's rule, but a bad dedent is reported at the line that has it."""
        if self.paren_level > 0:
            return
        yield token
        indent_str = token.rsplit("\n", 1)[1]
        indent = indent_str.count(" ") + indent_str.count("\t") * self.tab_len
        if indent > self.indent_level[-1]:
            self.indent_level.append(indent)
            yield Token.new_borrow_pos(self.INDENT_type, indent_str, token)
            return
        while indent < self.indent_level[-1]:
            self.indent_level.pop()
            yield Token.new_borrow_pos(self.DEDENT_type, indent_str, token)
        if indent != self.indent_level[-1]:
            raise error("unindent does not match any outer indentation level",
                        Loc(token.end_line, max(token.end_column, 1)))


def grammar_text() -> str:
    """The grammar as shipped in the wheel (package tilec.grammar), or from the source tree."""
    try:
        return resources.files("tilec.grammar").joinpath("tile.lark").read_text()
    except (ModuleNotFoundError, FileNotFoundError):
        return (Path(__file__).resolve().parents[2] / "grammar" / "tile.lark").read_text()


@functools.lru_cache(maxsize=1)
def _parser() -> Lark:
    return Lark(
        grammar_text(),
        parser="lalr",
        strict=True,
        propagate_positions=True,
        postlex=TileIndenter(),
        maybe_placeholders=True,
        cache=True,  # the LALR tables (and strict checks) are built once per grammar version
    )


# Readable names for terminals in "expected ..." messages.
_TERMINAL_NAMES = {
    "NAME": "a name",
    "NUMBER": "a number",
    "STRING": "a string",
    "_NL": "end of line",
    "_INDENT": "an indented block",
    "_DEDENT": "end of block",
    "$END": "end of file",
    "COMP_OP": "a comparison",
    "ADD_OP": "'+' or '-'",
    "MUL_OP": "an operator",
}


def _describe_terminal(name: str) -> str:
    if name in _TERMINAL_NAMES:
        return _TERMINAL_NAMES[name]
    for t in _parser().terminals:
        if t.name == name and t.pattern.type == "str":
            return f"'{t.pattern.value}'"
    return name.lower()


def _describe_token(tok: Token) -> str:
    if tok.type in ("_NL", "$END", "_INDENT", "_DEDENT"):
        return {"_NL": "end of line", "$END": "end of file", "_INDENT": "indentation",
                "_DEDENT": "end of block"}[tok.type]
    return f"'{tok.value}'"


# Operators that may continue a complete expression: listed only when nothing else is expected.
_CONTINUATIONS = {"ADD_OP", "MUL_OP", "COMP_OP", "POW", "VBAR", "AMPERSAND", "DOT", "LPAR"}


def _expected(names) -> str:
    names = set(names)
    structural = names - _CONTINUATIONS
    # after a complete operand (an operator could follow), '(' is a call, not structure
    if structural and names & (_CONTINUATIONS - {"LPAR"}):
        names = structural
    descs = sorted({_describe_terminal(n) for n in names})
    if len(descs) == 1:
        return descs[0]
    if len(descs) == 2:
        return f"{descs[0]} or {descs[1]}"
    return "one of " + ", ".join(descs)


_CLOSE = {"(": ")", "[": "]"}


def _unclosed_bracket(source: str, upto: int) -> Loc | None:
    """Position of the innermost bracket still open at offset `upto` (strings, comments skipped)."""
    stack, i, line, col = [], 0, 1, 1
    while i < min(upto, len(source)):
        ch = source[i]
        if ch == "#":
            while i < len(source) and source[i] != "\n":
                i += 1
            continue
        if ch in "\"'":
            quote = source[i:i + 3] if source[i:i + 3] in ('"""', "'''") else ch
            j = source.find(quote, i + len(quote))
            j = len(source) if j < 0 else j + len(quote)
            for c in source[i:j]:
                line, col = (line + 1, 1) if c == "\n" else (line, col + 1)
            i = j
            continue
        if ch in _CLOSE:
            stack.append((ch, Loc(line, col)))
        elif ch in ")]" and stack:
            stack.pop()
        line, col = (line + 1, 1) if ch == "\n" else (line, col + 1)
        i += 1
    return stack[-1] if stack else None


def _describe_char(ch: str) -> str:
    """A character as an error names it: invisible and non-ASCII ones by code point and name."""
    import unicodedata
    if ch.isascii() and ch.isprintable():
        return f"'{ch}'"
    name = unicodedata.name(ch, "")
    shown = f"'{ch}' " if ch.isprintable() and unicodedata.category(ch)[0] not in "CZ" else ""
    return f"{shown}U+{ord(ch):04X}{' ' + name if name else ''}"


def _eof_loc(source: str) -> Loc:
    lines = source.splitlines() or [""]
    return Loc(len(lines), len(lines[-1]) + 1)


def _syntax_error(e: UnexpectedInput, source: str) -> TilecError:
    if isinstance(e, UnexpectedCharacters):
        ch = source[e.pos_in_stream] if e.pos_in_stream < len(source) else "?"
        return error(f"unexpected character {_describe_char(ch)}", Loc(e.line, e.column))
    if isinstance(e, UnexpectedEOF):
        return error(f"unexpected end of file; expected {_expected(e.expected)}", _eof_loc(source))
    if isinstance(e, UnexpectedToken):
        tok = e.token
        if tok.type in ("$END", "_DEDENT", "_INDENT"):
            # newlines inside brackets are not tokens: an unclosed bracket surfaces at the end
            pos = len(source) if tok.type == "$END" or tok.start_pos is None else tok.start_pos
            open_ = _unclosed_bracket(source, pos)
            if open_ is not None:
                return error(f"'{open_[0]}' was never closed", open_[1])
        if tok.type == "$END" or tok.line is None:
            loc = _eof_loc(source)
        else:
            loc = Loc(tok.line, tok.column, tok.column + len(tok.value) if tok.type not in (
                "_NL", "_INDENT", "_DEDENT") else None)
        if tok.type == "_INDENT":
            return error("unexpected indent", Loc(tok.end_line, tok.end_column))
        if tok.type == "_NL" and tok.value and tok.end_line:
            # Point at the end of the line that is incomplete, not at the next line.
            line = tok.line
            loc = Loc(line, tok.column)
        return error(f"unexpected {_describe_token(tok)}; expected {_expected(e.accepts or e.expected)}",
                     loc)
    return error(str(e).splitlines()[0], Loc(getattr(e, "line", 1), getattr(e, "column", 1)))


# a line that starts a kernel or a schedule (a top-level item) at the start of a line
_ITEM = re.compile(r"^(?=(?:kernel|schedule)\b)", re.M)
_PART_BYTES = 64 * 1024  # a large file is parsed in parts of about this size


def parse(source: str) -> ast.Module:
    """Parse .tile source text into an ast.Module; raises TilecError with a location.

    A large file is parsed in parts of whole top-level items, each one's parse tree dropped
    once it is turned into syntax nodes: the memory of the parse is one part's tree, not the
    file's (562 MB for a 5 MB file). A part boundary that is not a real one (a line inside a
    string or brackets that starts like an item) makes that part fail to parse; then, as for any
    syntax error, the whole file is parsed at once, and its error is the one reported."""
    if not source.endswith("\n"):
        source += "\n"
    if len(source) > 2 * _PART_BYTES:
        try:
            return _parse_parts(source)
        except TilecError:
            pass
    return _parse_text(source)


def _parse_text(source: str, line_offset: int = 0) -> ast.Module:
    try:
        tree = _parser().parse(source)
    except UnexpectedInput as e:
        raise _syntax_error(e, source) from None
    token = LINE_OFFSET.set(line_offset)
    try:
        return ToAst().transform(tree)
    except VisitError as e:
        if isinstance(e.orig_exc, TilecError):
            raise e.orig_exc from None
        raise
    finally:
        LINE_OFFSET.reset(token)


def _parse_parts(source: str) -> ast.Module:
    cuts = [0]
    for m in _ITEM.finditer(source):
        if m.start() - cuts[-1] >= _PART_BYTES:
            cuts.append(m.start())
    cuts.append(len(source))
    kernels, schedules, line = [], [], 0
    for a, b in itertools.pairwise(cuts):
        part = _parse_text(source[a:b], line)
        kernels += part.kernels
        schedules += part.schedules
        line += source.count("\n", a, b)
    return ast.Module(Loc(1, 1), tuple(kernels), tuple(schedules))
