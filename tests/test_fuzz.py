"""Fuzzing the front end and the compiler through `tilec check`, for the CPU, CUDA and HIP: mutated
samples and error-corpus files (spans deleted, duplicated or swapped, tokens inserted, text cut
short; or tokens "retyped": swapped for others of their class, which mostly parse and so reach
the passes and renderers) either compile or get a user error (`file[:line:col]: error: ...`,
exit 1) within the time limit; never an internal error or a traceback.

The examples are derandomized (the same on every run, so CI is reproducible); set
TILEC_FUZZ_EXAMPLES to run more of them locally.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tilec.cli import main

ROOT = Path(__file__).resolve().parent.parent
CORPUS = sorted((ROOT / "samples").glob("*.tile")) + sorted((ROOT / "samples" / "tile").glob("*.tile")) \
    + sorted((ROOT / "tests" / "errors").glob("*.tile"))
TEXTS = [p.read_bytes().decode("utf-8", "surrogateescape") for p in CORPUS]  # some are not UTF-8
# fragments a mutation inserts: keywords, punctuation, dtypes, numbers and names the language uses
TOKENS = ["kernel", "schedule", "target", "cuda", "cpu", "assume", "->", ":", "(", ")", "[", "]",
          ",", "=", "==", "+", "-", "*", "/", "//", "%", "@", ".T", "**", "<", ">", "&", "|", "~",
          "f16", "bf16", "f32", "f64", "i8", "u8", "i32", "i64", "u4", "i4", "bool", "0", "1", "-1",
          "1e30", "0.5", "inf", "nan", "M", "N", "K", "x", "softmax", "sum", "max", "mean",
          "where", "dequant", "relu", "exp", "exp_nonpos", "axis=-1", "keepdims=True", "\n", "    ",
          "\t", "#",
          '"""', "with grid(", "shared", "fragment", "copy", "gemm", "parallel(", "pipelined(",
          "range(", "reduce(", "fill(", "clear(", "swizzle(", "threads=", "stages=", "tile M=",
          "fuse off", "if", "else:", "for", "in", "as", "\u00e9", "\ufeff", "\x00"]
EXAMPLES = int(os.environ.get("TILEC_FUZZ_EXAMPLES", "1000"))
SECONDS = 20  # per input: a sample-sized program checks in well under a second
USER_ERROR = re.compile(r"^\S+?(:\d+:\d+)?: error: ", re.M)


@st.composite
def mutated(draw):
    text = TEXTS[draw(st.integers(0, len(TEXTS) - 1))]
    for _ in range(draw(st.integers(1, 3))):
        n = len(text)
        i = draw(st.integers(0, n))
        j = draw(st.integers(i, min(n, i + 40)))
        kind = draw(st.sampled_from(["delete", "insert", "duplicate", "swap", "truncate", "replace"]))
        if kind == "delete":
            text = text[:i] + text[j:]
        elif kind == "insert":
            text = text[:i] + draw(st.sampled_from(TOKENS)) + text[i:]
        elif kind == "duplicate":
            text = text[:j] + text[i:j] + text[j:]
        elif kind == "swap" and j < n:
            text = text[:i] + text[j] + text[i + 1:j] + text[i] + text[j + 1:] if j > i else text
        elif kind == "truncate":
            text = text[:i]
        elif kind == "replace":
            text = text[:i] + draw(st.sampled_from(TOKENS)) + text[j:]
    return text


# classes of tokens a "retyping" swaps within: the program mostly still parses, so the mutation
# reaches the checks, passes and renderers behind the parser (dtypes, functions, reductions,
# operators, dimensions, axes, numbers, targets, schedule keys)
CLASSES = [
    ["f16", "bf16", "f32", "f64", "i8", "u8", "i16", "i32", "i64", "u4", "i4", "bool", "fp8e4m3",
     "fp8e5m2"],
    ["relu", "exp", "sigmoid", "silu", "gelu", "tanh", "abs", "sqrt", "rsqrt", "log", "gelu_tanh",
     "softplus", "mish", "exp2", "log2", "erf"],
    ["sum", "max", "min", "mean", "softmax", "logsumexp"],
    ["+", "-", "*", "/", "@", "//", "%", "**"],
    ["M", "N", "K", "D", "L", "S", "H", "B", "R", "C"],
    ["axis=-1", "axis=0", "axis=1", "axis=-2", "axis=2"],
    ["0", "1", "2", "3", "7", "16", "17", "32", "64", "100", "128", "256", "1024", "-1", "0.5",
     "1e-5"],
    ["cuda", "cpu", "hip"],
    ["tile", "threads", "stages", "swizzle", "warp_specialize", "fuse"],
    ["range", "parallel", "pipelined"],
    ["shared", "fragment", "local"],
]
TOKEN = re.compile(r"axis=-?\d+|[A-Za-z_][A-Za-z0-9_]*|-?\d+(\.\d+)?(e-?\d+)?|//|\*\*|[-+*/@%]")


@st.composite
def retyped(draw):
    """A sample or error-corpus file with one to three tokens swapped for others of their class."""
    text = TEXTS[draw(st.integers(0, len(TEXTS) - 1))]
    for _ in range(draw(st.integers(1, 3))):
        spots = [(m, cls) for m in TOKEN.finditer(text) for cls in CLASSES if m.group(0) in cls]
        if not spots:
            break
        m, cls = spots[draw(st.integers(0, len(spots) - 1))]
        text = text[:m.start()] + draw(st.sampled_from(cls)) + text[m.end():]
    return text


def check(tmp: Path, text: str, target: str):
    path = tmp / "fuzz.tile"
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    return CliRunner().invoke(main, ["check", str(path), "--target", target], catch_exceptions=True)


@pytest.mark.parametrize("target", ["cpu", "cuda", "hip"])
@pytest.mark.parametrize("strategy", [mutated, retyped], ids=["mutated", "retyped"])
def test_mutated_programs_compile_or_get_a_located_user_error(tmp_path, target, strategy):
    failures = []

    @settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(strategy())
    def one(text):
        t0 = time.monotonic()
        r = check(tmp_path, text, target)
        if time.monotonic() - t0 > SECONDS:
            failures.append((text, f"took {time.monotonic() - t0:.1f} s (limit {SECONDS} s)"))
        out = r.output + (r.stderr if r.stderr_bytes is not None else "")
        if r.exception is not None and not isinstance(r.exception, SystemExit):
            failures.append((text, f"exception {type(r.exception).__name__}: {r.exception}"))
        elif r.exit_code == 0:
            assert "ok (" in out
        elif r.exit_code != 1 or not USER_ERROR.search(out) or "internal compiler error" in out:
            failures.append((text, f"exit {r.exit_code}: {out[-500:]}"))
    one()
    assert not failures, "\n\n".join(f"--- input:\n{t}\n--- {why}" for t, why in failures[:3])
