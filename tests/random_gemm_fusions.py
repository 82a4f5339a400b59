"""Random GEMM fusions, KernelBench style: an optional elementwise prologue on A, `A @ W` (A
transposed or batched, W as [K, N] or nn.Linear's [N, K], shared or batched), a chain of
epilogue operations (bias vectors, per-row scales, scalars, activations, clamps) and, sometimes,
a reduction over the output's rows (softmax, log-softmax, a row sum, a row max's scaling).
Values stay well conditioned (exp's argument is clamped), so every mismatch is a bug.

    python tests/random_gemm_fusions.py 5      # print some programs
"""

from __future__ import annotations

import random
import sys

ACTIVATIONS = ("relu", "sigmoid", "tanh", "gelu", "gelu_tanh", "silu", "abs", "softplus", "mish")


def activation(r: random.Random, x: str) -> str:
    if r.random() < 0.1:
        return f"exp(clamp({x}, -5.0, 5.0))"
    return f"{r.choice(ACTIVATIONS)}({x})"


def program(r: random.Random, name: str = "g") -> str:
    """One kernel's text, drawn with `r`."""
    dt = r.choice(["f32", "f16", "bf16"])
    batched = r.random() < 0.3
    a_t, w_t = r.random() < 0.3, r.random() < 0.5
    lead = "B, " if batched else ""
    params = [f"A: {dt}[{lead}{'K, M' if a_t else 'M, K'}]",
              f"W: {dt}[{lead if batched and r.random() < 0.5 else ''}{'N, K' if w_t else 'K, N'}]"]
    a = "A.T" if a_t else "A"
    if r.random() < 0.3:  # a prologue, back in the operands' dtype
        a = f"{dt}({activation(r, f'f32({a})')})"
    y = f"({a} @ {'W.T' if w_t else 'W'})"
    for i in range(r.randint(1, 4)):
        c = r.random()
        if c < 0.25:
            params.append(f"b{i}: {dt}[N]")
            y = f"({y} + f32(b{i}))"
        elif c < 0.4:
            params.append(f"r{i}: f32[M, 1]")
            y = f"({y} * r{i})"
        elif c < 0.55:
            params.append(f"s{i}: f32")
            y = f"({y} * s{i} - 0.25)"
        elif c < 0.85:
            y = activation(r, y)
        else:
            y = f"clamp({y}, -2.0, 3.0)"
    shape = f"{lead}M, N"
    c = r.random()
    if c < 0.15:
        y = f"softmax({y}, axis=-1)"
    elif c < 0.25:
        y = f"{y} - logsumexp({y}, axis=-1, keepdims=True)"
    elif c < 0.35:
        y, shape = f"sum({y}, axis=-1, keepdims=True)", f"{lead}M, 1"
    elif c < 0.45:
        y = f"{y} / (max(abs({y}), axis=-1, keepdims=True) + 1.0)"
    out = r.choice([dt, "f32"])
    return (f"kernel {name}({', '.join(params)}) -> Y: {out}[{shape}]:\n"
            f"    Z = {y}\n    Y = {out}(Z)\n")


if __name__ == "__main__":
    rng = random.Random()
    for n in range(int(sys.argv[1]) if len(sys.argv) > 1 else 3):
        print(program(rng, f"g{n}"))
