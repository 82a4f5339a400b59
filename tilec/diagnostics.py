"""Source locations and compiler errors, printed as `file:line:col: error: msg` + line + caret."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Loc:
    """A 1-based line/column position in a source file."""

    line: int
    col: int
    end_col: int | None = None


_WIDTH = 120  # source lines longer than this are shown around the caret


class TilecError(Exception):
    """A user-facing compile error. `loc` is None for errors not tied to a source position."""

    def __init__(self, message: str, loc: Loc | None = None, note: str | None = None):
        super().__init__(message)
        self.message = message
        self.loc = loc
        self.note = note

    def format(self, filename: str, source: str | None) -> str:
        """Render in the `file:line:col: error: ...` form with the source line and a caret."""
        if self.loc is None:
            head = f"{filename}: error: {self.message}"
            return head + (f"\n  note: {self.note}" if self.note else "")
        lines = (source or "").splitlines()
        head = f"{filename}:{self.loc.line}:{self.loc.col}: error: {self.message}"
        out = [head]
        if 1 <= self.loc.line <= len(lines):
            raw = lines[self.loc.line - 1]
            text = raw.expandtabs(8).rstrip()
            start = len(raw[: self.loc.col - 1].expandtabs(8))  # caret column after tab expansion
            width = 1
            if self.loc.end_col is not None and self.loc.end_col > self.loc.col:
                width = len(raw[: self.loc.end_col - 1].expandtabs(8)) - start
            width = min(width, _WIDTH)
            if len(text) > _WIDTH:  # a long line: the part around the caret, marked with ...
                lo = max(0, min(start - _WIDTH // 3, len(text) - _WIDTH))
                shown = text[lo:lo + _WIDTH]
                text = ("..." if lo else "") + shown + ("..." if lo + _WIDTH < len(text) else "")
                start = start - lo + (3 if lo else 0)
                width = min(width, _WIDTH - (start - (3 if lo else 0)))
            caret = " " * start + "^" + "~" * (max(width, 1) - 1)
            out += [f"    {text}", f"    {caret}"]
        if self.note:
            out.append(f"  note: {self.note}")
        return "\n".join(out)


def error(message: str, loc: Loc | None = None, note: str | None = None) -> TilecError:
    """Build an error to `raise` (keeps call sites short)."""
    return TilecError(message, loc, note)
