"""The CPU device library's f16 conversions (tilec_cpu.h: integer and float arithmetic with
selects, so loops that convert vectorize) against the hardware's (F16C's vcvtph2ps and
vcvtps2ph, round to nearest even): every f16 value to f32 (signaling NaNs aside: the hardware
quiets them), and f32 to f16 for values around every rounding boundary, subnormals, overflow,
infinities and NaNs; each one alone and in loops the compiler vectorizes, and the same bits
built for x86-64-v2 (no F16C) and x86-64-v3."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

TEMPLATES = Path(__file__).resolve().parent.parent / "tilec" / "templates"

PROGRAM = r"""
#include "tilec_cpu.h"
#include <cstdio>
#include <vector>
#ifdef __F16C__
#include <immintrin.h>
#endif
// (no inlining: the loops below see only the conversions, which they vectorize)
__attribute__((noinline)) void to_f32(const uint16_t* h, float* f, int n) {
    for (int i = 0; i < n; ++i) f[i] = tilec::f16_to_f32(h[i]);
}
__attribute__((noinline)) void to_f16(const float* f, uint16_t* h, int n) {
    for (int i = 0; i < n; ++i) h[i] = tilec::f32_to_f16(f[i]);
}
int main() {
    unsigned long long h1 = 1469598103934665603ull;  // FNV-1a over every result
    auto mix = [&](unsigned long long v) { h1 = (h1 ^ v) * 1099511628211ull; };
    long mismatches = 0;
    std::vector<uint16_t> hs(65536), back;
    std::vector<float> fs(65536), xs;
    for (uint32_t h = 0; h < 65536; ++h) hs[h] = (uint16_t)h;
    to_f32(hs.data(), fs.data(), 65536);
    for (uint32_t h = 0; h < 65536; ++h) {
        const bool snan = (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) && !(h & 0x200u);
        const uint32_t one = tilec::bits_f32(tilec::f16_to_f32((uint16_t)h));
        mismatches += one != tilec::bits_f32(fs[h]);
#ifdef __F16C__
        mismatches += !snan && one != tilec::bits_f32(_cvtsh_ss((uint16_t)h));
#endif
        if (!snan) mix(one);
    }
    // f32 -> f16: every f16 value, its neighbours in f32 and the midpoints between f16 values
    for (uint32_t h = 0; h < 65536; ++h) {
        const uint32_t u = tilec::bits_f32(fs[h]);
        for (int d = -3; d <= 3; ++d) xs.push_back(tilec::f32_bits(u + d));
        xs.push_back(tilec::f32_bits(u + 0x1000u));  // halfway to the next f16
    }
    for (float x : {65504.0f, 65519.99f, 65520.0f, 1e30f, -1e30f, 1e-30f, 5.96e-8f, 2.98e-8f})
        xs.push_back(x);
    back.resize(xs.size());
    to_f16(xs.data(), back.data(), (int)xs.size());
    for (size_t i = 0; i < xs.size(); ++i) {
        const uint16_t one = tilec::f32_to_f16(xs[i]);
        mismatches += one != back[i];
#ifdef __F16C__
        mismatches += one != (uint16_t)_cvtss_sh(xs[i], _MM_FROUND_TO_NEAREST_INT);
#endif
        mix(one);
    }
#ifdef __F16C__
    std::printf("hw %016llx %ld\n", h1, mismatches);
#else
    std::printf("sw %016llx %ld\n", h1, mismatches);
#endif
    return 0;
}
"""


def run(tmp: Path, march: str) -> list:
    src = tmp / "conv.cpp"
    src.write_text(PROGRAM)
    exe = tmp / f"conv_{march}"
    subprocess.run(["g++", "-std=c++17", "-O3", f"-march={march}", "-ffp-contract=off",
                    f"-I{TEMPLATES / 'cpu'}", f"-I{TEMPLATES / 'common'}", str(src), "-o", str(exe)],
                   check=True, capture_output=True, text=True)
    return subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split()


def test_f16_conversions_match_the_hardware(tmp_path):
    if shutil.which("g++") is None:
        pytest.skip("g++ not found")
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    if " f16c" not in flags or " avx2" not in flags:
        pytest.skip("this machine has no F16C/AVX2: the x86-64-v3 build cannot run here")
    hw, sw = run(tmp_path, "x86-64-v3"), run(tmp_path, "x86-64-v2")
    assert hw[0] == "hw" and sw[0] == "sw"
    assert hw[2] == "0" and sw[2] == "0"  # (against F16C; element by element and in loops)
    assert hw[1] == sw[1]


def test_an_f16_conversion_loop_vectorizes(tmp_path):
    """g++ turns a loop of f16_to_f32 and one of f32_to_f16 into vector code (a branch or a
    scalar hardware conversion in either keeps it scalar: f16 programs on the CPU ran up to 18x
    slower than f32 ones)."""
    if shutil.which("g++") is None or shutil.which("objdump") is None:
        pytest.skip("g++ or objdump not found")
    src = tmp_path / "conv.cpp"
    src.write_text(PROGRAM)
    obj = tmp_path / "conv.o"
    subprocess.run(["g++", "-std=c++17", "-O3", "-march=x86-64-v3", "-ffp-contract=off", "-c",
                    f"-I{TEMPLATES / 'cpu'}", f"-I{TEMPLATES / 'common'}", str(src), "-o", str(obj)],
                   check=True, capture_output=True, text=True)
    asm = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(obj)], check=True,
                         capture_output=True, text=True).stdout
    for fn in ("to_f32", "to_f16"):
        body = asm.split(f"<_Z{len(fn)}{fn}", 1)[1].split("\n\n", 1)[0]
        assert "%ymm" in body, (fn, body[:2000])
