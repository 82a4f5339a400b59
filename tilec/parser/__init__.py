"""Front end: Lark grammar -> syntax tree -> Graph IR."""

from .grammar import parse  # noqa: F401
