#!/usr/bin/env python3
"""The table tilec_cpu.h's sin and cos reduce their argument with: (2^e * 2/pi) mod 4 for
e = -4 .. 104, each as three doubles of 28 significant bits (a 24-bit integer times one is exact),
together to 2^-82. 2/pi comes from Machin's formula in integer arithmetic (no dependencies).

    python3 tools/two_over_pi_table.py          # print the C++ table
tests/test_cpu_math.py checks that the header's table is what this prints."""

from __future__ import annotations

E_MIN, E_MAX = -4, 104
BITS = 400  # 2/pi to 2^-400: the table needs 2^-(E_MAX + 84)


def atan_inv(n: int, one: int) -> int:
    """atan(1/n) * one, by its series in integers."""
    total, term, k, sign = 0, one // n, 1, 1
    while term:
        total += sign * (term // k)
        term //= n * n
        k += 2
        sign = -sign
    return total


def two_over_pi(bits: int) -> int:
    """floor(2/pi * 2^bits)."""
    guard = 64
    one = 1 << (bits + guard)
    pi = 16 * atan_inv(5, one) - 4 * atan_inv(239, one)  # pi * 2^(bits + guard)
    return (2 * one * (1 << bits)) // pi


def rows() -> list:
    """[(e, (t0, t1, t2))]: each t an integer numerator over 2^26, 2^54, 2^82."""
    v = two_over_pi(BITS)  # 2/pi = v / 2^BITS
    out = []
    for e in range(E_MIN, E_MAX + 1):
        # (2^e 2/pi) mod 4 as a fraction over 2^(BITS - e), then to 82 bits after the point
        x = (v % (4 << (BITS - e))) >> (BITS - e - 82)  # floor(((2^e 2/pi) mod 4) * 2^82)
        t0 = x >> 56
        t1 = (x >> 28) & ((1 << 28) - 1)
        t2 = x & ((1 << 28) - 1)
        out.append((e, (t0, t1, t2)))
    return out


def c_table() -> str:
    lines = []
    for e, (t0, t1, t2) in rows():
        vals = [f"{float.hex(float(t0) / 2**26)}", f"{float.hex(float(t1) / 2**54)}",
                f"{float.hex(float(t2) / 2**82)}"]
        lines.append("    " + ", ".join(vals) + ",  // e = " + str(e))
    return "\n".join(lines)


if __name__ == "__main__":
    print(c_table())
