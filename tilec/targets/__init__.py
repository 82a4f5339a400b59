"""The target registry. Each target module defines one `Target` (resources, lowering steps,
renderer, templates, toolchain); this is the only list of them."""

from __future__ import annotations

from .base import Target
from .cpu import CPU
from .cuda import CUDA
from .hip import HIP

TARGETS = {t.name: t for t in (CPU, CUDA, HIP)}


def get(name: str) -> Target:
    return TARGETS[name]


def names() -> list:
    return list(TARGETS)


def lowering_pass_names() -> list:
    """Names of every target's lowering steps (for `--print-after`), in first-seen order."""
    out = []
    for t in TARGETS.values():
        out += [n for n, _ in t.lowering if n not in out]
    return out
