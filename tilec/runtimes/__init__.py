"""What `tilec run` needs to call a built library on a target's memory: allocate, copy in and
out, pass the target's trailing arguments, and time a call. One module per target runtime."""

from __future__ import annotations

import importlib


def get(name: str):
    return importlib.import_module(f"{__name__}.{name}").Runtime()
