"""The CPU device library's f16 conversions: with F16C (g++ at x86-64-v3 and up) tilec_cpu.h uses
the hardware instructions, elsewhere portable bit manipulation. Both must give the same bits:
every f16 value to f32 (signaling NaNs aside: the hardware quiets them), and f32 to f16 for
values around every rounding boundary, subnormals, overflow, infinities and NaNs."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

TEMPLATES = Path(__file__).resolve().parent.parent / "tilec" / "templates"

PROGRAM = r"""
#include "tilec_cpu.h"
#include <cstdio>
int main() {
    unsigned long long h1 = 1469598103934665603ull;  // FNV-1a over every result
    auto mix = [&](unsigned long long v) { h1 = (h1 ^ v) * 1099511628211ull; };
    for (uint32_t h = 0; h < 65536; ++h) {
        const bool snan = (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) && !(h & 0x200u);
        if (!snan) mix(tilec::bits_f32(tilec::f16_to_f32((uint16_t)h)));
    }
    // f32 -> f16: every f16 value, its neighbours in f32 and the midpoints between f16 values
    for (uint32_t h = 0; h < 65536; ++h) {
        const uint32_t u = tilec::bits_f32(tilec::f16_to_f32((uint16_t)h));
        for (int d = -3; d <= 3; ++d) mix(tilec::f32_to_f16(tilec::f32_bits(u + d)));
        mix(tilec::f32_to_f16(tilec::f32_bits(u + 0x1000u)));  // halfway to the next f16
    }
    const float big[] = {65504.0f, 65519.99f, 65520.0f, 1e30f, -1e30f, 1e-30f, 5.96e-8f, 2.98e-8f};
    for (float x : big) mix(tilec::f32_to_f16(x));
#ifdef TILEC_F16_HARDWARE
    std::printf("hw %016llx\n", h1);
#else
    std::printf("sw %016llx\n", h1);
#endif
    return 0;
}
"""


def run(tmp: Path, march: str) -> str:
    src = tmp / "conv.cpp"
    src.write_text(PROGRAM)
    exe = tmp / f"conv_{march}"
    subprocess.run(["g++", "-std=c++17", "-O2", f"-march={march}", f"-I{TEMPLATES / 'cpu'}",
                    f"-I{TEMPLATES / 'common'}", str(src), "-o", str(exe)],
                   check=True, capture_output=True, text=True)
    return subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.strip()


def test_hardware_and_portable_f16_conversions_agree(tmp_path):
    if shutil.which("g++") is None:
        pytest.skip("g++ not found")
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    if " f16c" not in flags or " avx2" not in flags:
        pytest.skip("this machine has no F16C/AVX2: the x86-64-v3 build cannot run here")
    hw, sw = run(tmp_path, "x86-64-v3").split(), run(tmp_path, "x86-64-v2").split()
    assert hw[0] == "hw" and sw[0] == "sw"
    assert hw[1] == sw[1]
