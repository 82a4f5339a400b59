// tilec_cpu.h -- the tilec CPU device library.
//
// Every C++ file that tilec emits for the CPU target includes this header
// (it is copied verbatim next to the generated sources).  It provides:
//   * f16 / bf16 storage types and exact, round-to-nearest-even conversions,
//   * packed 4-bit integer loads,
//   * a saturating float->int cast (Python-semantics floordiv / floormod, ceil division and
//     integer powers are in tilec_arith.h, which it includes),
//   * vectorizable exp_f32 and exp2_f32,
//   * gemm_tile: the register-blocked GEMM tile kernel behind the Tile IR's gemm(),
//   * the elementwise functions of fused expressions and the launchers' host helpers.
//
// Constraints: C++17, standard library only (GCC/Clang vector extensions, g++'s
// F16C conversion builtin where F16C is on, and on x86-64 <immintrin.h> for
// non-temporal stores only, are used when available, with a plain fallback),
// header-only and safe to include from several translation units, and built
// WITHOUT -ffast-math, so inf/nan must behave.
#ifndef TILEC_CPU_H
#define TILEC_CPU_H

#include "tilec_checked.h"

// how tilec_arith.h (the helpers shared with the GPU libraries) declares its functions
#define TILEC_HD static inline
#include "tilec_arith.h"

#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#if defined(__x86_64__)
#include <immintrin.h>  // non-temporal stores (stream_row)
#endif

#define TILEC_PRAGMA_(x) _Pragma(#x)
#if defined(__GNUC__) && !defined(__clang__)
#define TILEC_UNROLL(n) TILEC_PRAGMA_(GCC unroll n)
#elif defined(__clang__)
#define TILEC_UNROLL(n) TILEC_PRAGMA_(unroll n)
#else
#define TILEC_UNROLL(n)
#endif

namespace tilec {

typedef uint16_t f16_t;   // IEEE binary16 bits
typedef uint16_t bf16_t;  // bfloat16 bits

// ---------------------------------------------------------------------------
// Bit casts.  memcpy of a scalar is folded to a register move by every
// optimizing compiler and (unlike union punning) is well defined; it also
// keeps loops that use these helpers vectorizable.
static inline uint32_t bits_f32(float x) { uint32_t u; std::memcpy(&u, &x, 4); return u; }
static inline float f32_bits(uint32_t u) { float x; std::memcpy(&x, &u, 4); return x; }

// c ? a : b as masks on the bits. Written as a select (`?:`), g++ may see that one side is not
// needed on some path and move the arithmetic feeding that side into a branch, which it then
// will not run for every lane (-ftrapping-math): the loop stays scalar. With masks, both sides
// are computed for every lane and blended.
static inline uint32_t select_u32(bool c, uint32_t a, uint32_t b) {
    const uint32_t m = 0u - (uint32_t)c;
    return (a & m) | (b & ~m);
}
static inline float select_f32(bool c, float a, float b) { return f32_bits(select_u32(c, bits_f32(a), bits_f32(b))); }

// ---------------------------------------------------------------------------
// binary16 <-> binary32, in integer and float arithmetic whose cases are picked by
// select_u32, so that a loop converting element by element vectorizes (a branch, or a scalar
// hardware conversion, vcvtph2ps on one value, keeps such a loop scalar).
// To f16: round to nearest even, a NaN quiet with its top payload bits; to f32: exact, a NaN's
// payload kept. (On f16 bits in 32-bit integers: round_f16 then needs no narrowing and
// widening, which vectorized loops would do with shuffles.)
static inline float f16_bits_to_f32(uint32_t h) {
    const uint32_t sign = (h & 0x8000u) << 16;
    const uint32_t em = (h & 0x7fffu) << 13;  // exponent and mantissa, in f32's places
    const uint32_t e = em & 0x0f800000u;      // (f16's exponent field, moved)
    // zero / subnormal: m * 2^-24, exact in f32
    const uint32_t sub = bits_f32((float)(int32_t)(h & 0x3ffu) * 5.9604644775390625e-8f);
    const uint32_t r = select_u32(e == 0x0f800000u, em | 0x7f800000u,  // inf / nan: the payload
                                  select_u32(e == 0, sub, em + (112u << 23)));  // rebias 15 -> 127
    return f32_bits(sign | r);
}

static inline uint32_t f32_to_f16_bits(float x) {
    const uint32_t bits = bits_f32(x);
    const uint32_t sign = (bits >> 16) & 0x8000u;
    const uint32_t u = bits & 0x7fffffffu;
    // a normal f16 (|x| >= 2^-14): rebias the exponent and round the 13 dropped bits to
    // nearest even; a mantissa carry correctly bumps the exponent
    const uint32_t normal = (u - 0x38000000u + 0xfffu + ((u >> 13) & 1u)) >> 13;
    // subnormal or zero: adding 0.5f (whose ulp is 2^-24, the f16 subnormal step) lets the FPU
    // round to nearest even; the low bits of the sum are then the f16 encoding (0x400, the
    // smallest normal, where it rounds up). (Computed for every x, used below 2^-14.)
    const uint32_t sub = bits_f32(f32_bits(u & 0x3fffffffu) + 0.5f) - 0x3f000000u;
    const uint32_t r = select_u32(u > 0x7f800000u, 0x7e00u | ((u >> 13) & 0x3ffu),  // nan: quiet
                                  select_u32(u >= 0x477ff000u, 0x7c00u,  // >= 65520: inf
                                             select_u32(u >= 0x38800000u, normal, sub)));
    return sign | r;
}

static inline float f16_to_f32(uint16_t h) { return f16_bits_to_f32(h); }
static inline uint16_t f32_to_f16(float x) { return (uint16_t)f32_to_f16_bits(x); }

// bfloat16 is the top half of a binary32.
static inline float bf16_to_f32(uint16_t h) { return f32_bits((uint32_t)h << 16); }

static inline uint16_t f32_to_bf16(float x) {
    const uint32_t u = bits_f32(x);
    if ((u & 0x7fffffffu) > 0x7f800000u)  // nan: truncating could give inf, so force quiet
        return (uint16_t)((u >> 16) | 0x40u);
    // Round to nearest even; overflow carries into the exponent and gives inf.
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static inline float round_f16(float x) { return f16_bits_to_f32(f32_to_f16_bits(x)); }
static inline float round_bf16(float x) { return bf16_to_f32(f32_to_bf16(x)); }

// 8-bit floats (OCP FP8) with E exponent and M mantissa bits: E4M3 (no infinities; its NaN is
// S.1111.111; largest 448) and E5M2 (IEEE-like; largest 57344). To fp8: nearest even,
// saturating (finite values and infinities past the range give the largest of their sign, as
// NVIDIA's cvt .satfinite), NaN stays NaN.
template <int E, int M>
static inline uint8_t f32_to_fp8(float x) {
    constexpr int BIAS = (1 << (E - 1)) - 1;
    constexpr uint32_t TOP = E == 4 ? 0x7eu : 0x7bu;  // the largest finite code
    const uint32_t u = bits_f32(x);
    const uint32_t sign = (u >> 24) & 0x80u;
    const uint32_t au = u & 0x7fffffffu;
    if (au > 0x7f800000u) return (uint8_t)(sign | 0x7fu);  // NaN
    const int e = (int)(au >> 23) - 127;  // (f32 subnormals: far below fp8's range)
    if (e > BIAS + 1) return (uint8_t)(sign | TOP);  // (infinities too)
    // the value in units of the fp8 spacing at its binade (the subnormal spacing below the
    // smallest normal), rounded to nearest even by the FPU
    const int q = (e < 1 - BIAS ? 1 - BIAS : e) - M;
    const uint32_t n = (uint32_t)std::nearbyint(f32_bits(au) * f32_bits((uint32_t)(127 - q) << 23));
    // normal: n in [2^M, 2^(M+1)] (2^(M+1): the next binade); subnormal: n <= 2^M, the code
    const uint32_t code = e < 1 - BIAS ? n : ((uint32_t)(e + BIAS) << M) + n - (1u << M);
    return (uint8_t)(sign | (code > TOP ? TOP : code));
}

// The value of code c (exact in f32), at compile time: decoding is a lookup in a table of the
// 256 values, which vectorizes (a gather) where bit manipulation with branches would not.
template <int E, int M>
constexpr float fp8_value(int c) {
    const int bias = (1 << (E - 1)) - 1;
    const int e = (c >> M) & ((1 << E) - 1), m = c & ((1 << M) - 1);
    float v = 0.0f;
    if (E == 4 ? (c & 0x7f) == 0x7f : e == (1 << E) - 1) {
        v = (E == 4 || m) ? std::numeric_limits<float>::quiet_NaN()
                          : std::numeric_limits<float>::infinity();
    } else {  // (1 + m / 2^M) 2^(e - bias), or m / 2^M 2^(1 - bias) for a subnormal
        float scale = 1.0f;
        for (int p = (e == 0 ? 1 : e) - bias; p != 0; p += p > 0 ? -1 : 1)
            scale = p > 0 ? scale * 2.0f : scale * 0.5f;
        v = ((e == 0 ? 0.0f : 1.0f) + (float)m / (float)(1 << M)) * scale;
    }
    return (c & 0x80) ? -v : v;
}

template <int E, int M>
struct Fp8Table {
    float v[256];
    constexpr Fp8Table() : v() {
        for (int c = 0; c < 256; ++c) v[c] = fp8_value<E, M>(c);
    }
};
template <int E, int M>
inline constexpr Fp8Table<E, M> fp8_table{};

template <int E, int M>
static inline float fp8_to_f32(uint8_t c) { return fp8_table<E, M>.v[c]; }

static inline uint8_t f32_to_fp8e4m3(float x) { return f32_to_fp8<4, 3>(x); }
static inline uint8_t f32_to_fp8e5m2(float x) { return f32_to_fp8<5, 2>(x); }
static inline float fp8e4m3_to_f32(uint8_t c) { return fp8_to_f32<4, 3>(c); }
static inline float fp8e5m2_to_f32(uint8_t c) { return fp8_to_f32<5, 2>(c); }
static inline float round_fp8e4m3(float x) { return fp8e4m3_to_f32(f32_to_fp8e4m3(x)); }
static inline float round_fp8e5m2(float x) { return fp8e5m2_to_f32(f32_to_fp8e5m2(x)); }

// ---------------------------------------------------------------------------
// 4-bit packed integers: two per byte along the last axis, low nibble first;
// each row of `cols` elements starts on a byte boundary ((cols+1)/2 bytes).
static inline int32_t load_u4(const uint8_t* base, int64_t row, int64_t col, int64_t cols) {
    const uint8_t b = base[row * ((cols + 1) >> 1) + (col >> 1)];
    return (int32_t)((col & 1) ? (b >> 4) : (b & 0x0f));
}
static inline int32_t load_i4(const uint8_t* base, int64_t row, int64_t col, int64_t cols) {
    return (load_u4(base, row, col, cols) ^ 8) - 8;  // sign-extend bit 3
}
// the value of byte b's low / high nibble (signed: bit 3 extended)
template <bool SIGNED> static inline int32_t nibble_lo(int32_t b) {
    return SIGNED ? ((b & 15) ^ 8) - 8 : b & 15;
}
template <bool SIGNED> static inline int32_t nibble_hi(int32_t b) {
    return SIGNED ? ((b >> 4) ^ 8) - 8 : b >> 4;
}
// n values of a packed row from column col0 on, one per int8 (what a SIMD loop over the columns
// reads instead of load_u4 per element): from an even column, a byte at a time, two values each,
// a loop compilers vectorize; from an odd one, value by value.
template <bool SIGNED>
static inline void unpack4(int8_t* __restrict out, const uint8_t* __restrict base, int64_t row,
                           int64_t col0, int64_t n, int64_t cols) {
    if (n <= 0) return;
    if (col0 & 1) {
        for (int64_t t = 0; t < n; ++t)
            out[t] = (int8_t)(SIGNED ? load_i4(base, row, col0 + t, cols) : load_u4(base, row, col0 + t, cols));
        return;
    }
    const uint8_t* __restrict p = base + row * ((cols + 1) >> 1) + (col0 >> 1);
    const int64_t pairs = n >> 1;
#pragma omp simd
    for (int64_t t = 0; t < pairs; ++t) {
        const int lo = p[t] & 0x0f, hi = p[t] >> 4;
        out[2 * t] = (int8_t)(SIGNED ? (lo ^ 8) - 8 : lo);
        out[2 * t + 1] = (int8_t)(SIGNED ? (hi ^ 8) - 8 : hi);
    }
    if (n & 1) {
        const int lo = p[pairs] & 0x0f;
        out[n - 1] = (int8_t)(SIGNED ? (lo ^ 8) - 8 : lo);
    }
}

// ---------------------------------------------------------------------------
// Saturating float -> integer, round half to even, NaN -> 0.  The bounds are
// compared as doubles against 2^bits values, which are exact even for 64-bit
// types (INT64_MAX itself is not representable as a double).
template <typename I>
static inline I sat_cast(double x) {
    static_assert(std::is_integral<I>::value, "sat_cast target must be an integer type");
    if constexpr (std::is_same<I, bool>::value) {
        return x != 0.0;  // Python bool(): nan is truthy
    } else {
        if (x != x) return (I)0;
        const double r = std::nearbyint(x);  // current rounding mode: nearest even
        const double lo = (double)std::numeric_limits<I>::min();           // 0 or -2^(b-1)
        const double hi = std::is_signed<I>::value ? -lo                      // 2^(b-1)
                                                   : 2.0 * ((double)(std::numeric_limits<I>::max() / 2 + 1));  // 2^b
        if (r < lo) return std::numeric_limits<I>::min();
        if (r >= hi) return std::numeric_limits<I>::max();
        return (I)r;
    }
}

// ---------------------------------------------------------------------------
// exp_f32: branch-free so that it vectorizes inside `#pragma omp simd` loops.
//   exp(x) = 2^n * exp(r),  n = rint(x / ln2),  r = x - n*ln2 in [-ln2/2, ln2/2]
// * n is obtained with the 1.5*2^23 "magic add" (round to nearest even, no
//   float->int conversion, so nan/inf inputs never hit UB).
// * ln2 is split hi+lo (Cody-Waite); n*ln2_hi is exact for |n| < 2^9.
// * exp(r) is the degree-7 Taylor polynomial: truncation error < 1e-8 rel.
// * 2^n is applied as two exact power-of-two multiplies 2^(n/2) * 2^(n-n/2),
//   so results near the overflow threshold and in the subnormal range are
//   produced (and rounded) by the final multiply rather than by bit tricks.
// * Clamping |x| to 104 sends -inf/huge negatives to 0 and +inf/huge
//   positives to inf (n stays in [-150, 150], both halves normal); a nan
//   passes the clamp and propagates through the polynomial.
// Measured max relative error vs exp() in double: 7.7e-8 (0.65 FLT_EPSILON)
// with the fused multiply-adds below (instruction sets with FMA), 1.0e-7
// without; subnormal results are within one subnormal step.
// fma where the instruction set has one (x86-64-v3 and up, ARMv8): half the polynomial's operations
// and its dependent latency; plain multiply-add elsewhere (a libm fmaf call would be slower)
#if defined(__FMA__) || defined(__ARM_FEATURE_FMA)
#define TILEC_FMA_F32(a, b, c) __builtin_fmaf(a, b, c)
#else
#define TILEC_FMA_F32(a, b, c) ((a) * (b) + (c))
#endif

// multiply-add of a matrix product (Tile IR `fma`: products may fuse; elementwise code may not)
static inline float fma_acc(float a, float b, float c) { return TILEC_FMA_F32(a, b, c); }
#if defined(__FMA__) || defined(__ARM_FEATURE_FMA)
static inline double fma_acc(double a, double b, double c) { return __builtin_fma(a, b, c); }
#else
static inline double fma_acc(double a, double b, double c) { return a * b + c; }
#endif

// ---------------------------------------------------------------------------
// GEMV of 4-bit weights with f32 activations and scales (Tile IR `gemv_mma` on the CPU, one
// slice): dst[j] = sum over rows r in first .. first + rows - 1 of
// a[r] * (q[r, col0 + j] - zero) * s[r / group, col0 + j], for j < BN and col0 + j < N (0 past N;
// rows of q are whole bytes, value 2k in the low nibble of byte k). From an even col0 a byte
// holds two columns: the sums run over bytes, the low nibbles' columns and the high nibbles'
// in two arrays (no interleaving in the loop), each row's products a[r] * (v - zero) summed per
// quantization group and then scaled once: with AVX-512 the products come from a 16-entry table
// of the row (vpermps by the nibble, which also ignores the bits above it), else the nibbles
// are converted and multiplied. An odd col0 goes value by value.
template <bool SIGNED, int BN>
static inline void gemv_dequant4(const float* __restrict a, const uint8_t* __restrict q,
                                 const float* __restrict s, int64_t N, int64_t first, int64_t rows,
                                 int64_t col0, int64_t group, float zero, float* __restrict dst) {
    const int64_t n = col0 < N ? (N - col0 < BN ? N - col0 : BN) : 0;
    const int64_t bytes_per_row = (N + 1) >> 1, end = first + rows;
    for (int64_t j = 0; j < BN; ++j) dst[j] = 0.0f;
    if (n <= 0 || rows <= 0) return;
    if (col0 & 1) {
        for (int64_t r = first; r < end; ++r)
            for (int64_t j = 0; j < n; ++j) {
                const int32_t v = SIGNED ? load_i4(q, r, col0 + j, N) : load_u4(q, r, col0 + j, N);
                dst[j] += a[r] * (((float)v - zero) * s[(r / group) * N + col0 + j]);
            }
        return;
    }
    constexpr int64_t NB = (BN + 1) / 2;
    const int64_t nb = (n + 1) >> 1, pairs = n >> 1;  // bytes read; bytes with both columns
    alignas(64) float lo[NB], hi[NB], glo[NB], ghi[NB];  // sums of all rows; of this group's
    for (int64_t t = 0; t < nb; ++t) lo[t] = hi[t] = 0.0f;
    const uint8_t* qb = q + (col0 >> 1);
    for (int64_t g0 = first; g0 < end;) {
        const int64_t g1 = (g0 / group + 1) * group < end ? (g0 / group + 1) * group : end;
        for (int64_t t = 0; t < nb; ++t) glo[t] = ghi[t] = 0.0f;
#if defined(__AVX512F__)
        // a table per row: entry v = a[r] * (v - zero), v the raw nibble
        __m512 iz = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        if (SIGNED) iz = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, -8, -7, -6, -5, -4, -3, -2, -1);
        iz = _mm512_sub_ps(iz, _mm512_set1_ps(zero));
        const int64_t nv = nb & ~int64_t(15);
        int64_t r = g0;
        for (; r < g1; r += 4) {
            const int k = g1 - r < 4 ? (int)(g1 - r) : 4;
            __m512 L[4];
            const uint8_t* p[4];
            for (int u = 0; u < 4; ++u) {  // rows past the group: a zero table, row r again
                L[u] = u < k ? _mm512_mul_ps(_mm512_set1_ps(a[r + u]), iz) : _mm512_setzero_ps();
                p[u] = qb + (u < k ? r + u : r) * bytes_per_row;
            }
            for (int64_t t = 0; t < nv; t += 16) {
                __m512 e = _mm512_load_ps(glo + t), o = _mm512_load_ps(ghi + t);
                for (int u = 0; u < 4; ++u) {
                    const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(p[u] + t)));
                    e = _mm512_add_ps(e, _mm512_permutexvar_ps(b, L[u]));
                    o = _mm512_add_ps(o, _mm512_permutexvar_ps(_mm512_srli_epi32(b, 4), L[u]));
                }
                _mm512_store_ps(glo + t, e);
                _mm512_store_ps(ghi + t, o);
            }
            for (int u = 0; u < k; ++u)  // the bytes past the last whole vector
                for (int64_t t = nv; t < nb; ++t) {
                    const int32_t b = p[u][t];
                    const float vl = (float)nibble_lo<SIGNED>(b);
                    const float vh = (float)nibble_hi<SIGNED>(b);
                    glo[t] += a[r + u] * (vl - zero);
                    ghi[t] += a[r + u] * (vh - zero);
                }
        }
        const float za = 0.0f;  // (zero is in the tables)
#elif defined(__AVX2__) && defined(__FMA__)
        // the sums of a[r] * v, ROWS rows per pass over the columns (2 and 4 measured alike; 6, 8
        // and 16 4-12% slower), eight bytes (sixteen values) of a row a step, widened straight
        // from memory; zero * sum(a[r]) at the end. g++'s own vectorization of the generic loop
        // below shuffled 32-byte loads apart and spilled: 1.5x slower on Zen 5 with AVX2
        // (docs/PERFORMANCE.md)
        constexpr int ROWS = 4;
        const __m256i m15 = _mm256_set1_epi32(15), m8 = _mm256_set1_epi32(8);
        const int64_t nv = nb & ~int64_t(7);
        float asum = 0.0f;
        for (int64_t r = g0; r < g1; r += ROWS) {
            const int k = g1 - r < ROWS ? (int)(g1 - r) : ROWS;
            __m256 ar[ROWS];
            const uint8_t* p[ROWS];
            for (int u = 0; u < ROWS; ++u) {  // rows past the group: weight 0, row r again
                const float w = u < k ? a[r + u] : 0.0f;
                ar[u] = _mm256_set1_ps(w);
                p[u] = qb + (u < k ? r + u : r) * bytes_per_row;
                asum += w;
            }
            for (int64_t t = 0; t < nv; t += 8) {
                __m256 e = _mm256_load_ps(glo + t), o = _mm256_load_ps(ghi + t);
                TILEC_UNROLL(8) for (int u = 0; u < ROWS; ++u) {
                    const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(p[u] + t)));
                    __m256i vl = _mm256_and_si256(b, m15), vh = _mm256_srli_epi32(b, 4);
                    if (SIGNED) {  // (v ^ 8) - 8: bit 3 extended
                        vl = _mm256_sub_epi32(_mm256_xor_si256(vl, m8), m8);
                        vh = _mm256_sub_epi32(_mm256_xor_si256(vh, m8), m8);
                    }
                    e = _mm256_fmadd_ps(ar[u], _mm256_cvtepi32_ps(vl), e);
                    o = _mm256_fmadd_ps(ar[u], _mm256_cvtepi32_ps(vh), o);
                }
                _mm256_store_ps(glo + t, e);
                _mm256_store_ps(ghi + t, o);
            }
            for (int u = 0; u < k; ++u)  // the bytes past the last whole vector
                for (int64_t t = nv; t < nb; ++t) {
                    const int32_t b = p[u][t];
                    glo[t] = fma_acc(a[r + u], (float)nibble_lo<SIGNED>(b), glo[t]);
                    ghi[t] = fma_acc(a[r + u], (float)nibble_hi<SIGNED>(b), ghi[t]);
                }
        }
        const float za = zero * asum;
#else
        // the sums of a[r] * v, four rows per pass over the columns; zero * sum(a[r]) at the end
        float asum = 0.0f;
        for (int64_t r = g0; r < g1; r += 4) {
            const int k = g1 - r < 4 ? (int)(g1 - r) : 4;
            float ar[4];
            const uint8_t* __restrict p[4];
            for (int u = 0; u < 4; ++u) {  // rows past the group: weight 0, row r again
                ar[u] = u < k ? a[r + u] : 0.0f;
                p[u] = qb + (u < k ? r + u : r) * bytes_per_row;
                asum += ar[u];
            }
#pragma omp simd
            for (int64_t t = 0; t < nb; ++t) {
                float e = glo[t], o = ghi[t];
                for (int u = 0; u < 4; ++u) {
                    const int32_t b = p[u][t];
                    e = fma_acc(ar[u], (float)nibble_lo<SIGNED>(b), e);
                    o = fma_acc(ar[u], (float)nibble_hi<SIGNED>(b), o);
                }
                glo[t] = e;
                ghi[t] = o;
            }
        }
        const float za = zero * asum;
#endif
        const float* __restrict sr = s + (g0 / group) * N + col0;
#pragma omp simd
        for (int64_t t = 0; t < pairs; ++t) {
            lo[t] = fma_acc(glo[t] - za, sr[2 * t], lo[t]);
            hi[t] = fma_acc(ghi[t] - za, sr[2 * t + 1], hi[t]);
        }
        if (n & 1) lo[pairs] = fma_acc(glo[pairs] - za, sr[2 * pairs], lo[pairs]);
        g0 = g1;
    }
#pragma omp simd
    for (int64_t t = 0; t < pairs; ++t) {
        dst[2 * t] = lo[t];
        dst[2 * t + 1] = hi[t];
    }
    if (n & 1) dst[n - 1] = lo[pairs];
}

// e^r for |r| <= ln(2) / 2: the degree-7 Taylor polynomial
static inline float exp_poly(float r) {
    float p = 1.98412698e-4f;                // 1/7!
    p = TILEC_FMA_F32(p, r, 1.38888889e-3f);              // 1/6!
    p = TILEC_FMA_F32(p, r, 8.33333333e-3f);              // 1/5!
    p = TILEC_FMA_F32(p, r, 4.16666667e-2f);              // 1/4!
    p = TILEC_FMA_F32(p, r, 1.66666667e-1f);              // 1/3!
    p = TILEC_FMA_F32(p, r, 0.5f);
    p = TILEC_FMA_F32(p, r, 1.0f);
    return TILEC_FMA_F32(p, r, 1.0f);
}

// 2^n for n in [-126, 127] (a normal float), from its bits
static inline float pow2_f32(int32_t n) { return f32_bits((uint32_t)(n + 127) << 23); }

// times * 2^(n + r / ln 2) for |r| <= ln(2) / 2 and n in [-252, 254]: times e^r scaled in two
// steps (n1 = floor(n/2) and n - n1, both normal exponents), so that a subnormal result is
// rounded once, by the last multiply
static inline float exp_reduced(float r, int32_t n, float times = 1.0f) {
    const int32_t n1 = n >> 1;  // arithmetic shift: floor(n/2)
    return ((times * exp_poly(r)) * pow2_f32(n1)) * pow2_f32(n - n1);
}


// |x| above `lim` (the bits of a float) -> +-lim, on the bits: magnitudes order as integers, a
// NaN keeps its bits, and no branch gives the compiler a constant x to fold (a float clamp did:
// its vectorized loop blended precomputed results, 1.5x slower)
static inline float clamp_magnitude(float x, uint32_t lim) {
    const uint32_t bx = bits_f32(x), ax = bx & 0x7fffffffu;
    return f32_bits((bx & 0x80000000u) | select_u32(ax > lim && ax <= 0x7f800000u, lim, ax));
}

// x = n ln 2 + r for |x| <= 104: n = rint(x / ln 2) by the magic add, r by Cody-Waite
struct ExpSplit {
    float r;
    int32_t n;  // in [-150, 150]
};
static inline ExpSplit exp_split(float x) {
    const float magic = 12582912.0f;  // 1.5 * 2^23
    const float t = x * 1.44269504088896341f + magic;
    const float nf = t - magic;
    float r = TILEC_FMA_F32(nf, -0.693145751953125f, x);   // ln2_hi (15 significant bits)
    r = TILEC_FMA_F32(nf, -1.428606820309417e-6f, r);      // ln2_lo
    return {r, (int32_t)(bits_f32(t) - bits_f32(magic))};
}

static inline float exp_f32(float x) {
    const ExpSplit e = exp_split(clamp_magnitude(x, 0x42d00000u));  // 104: exp over- or underflows beyond anyway
    return exp_reduced(e.r, e.n);
}

// exp_f32 of an x <= 44 (or NaN), bit for bit, in fewer instructions: the renderer takes it
// where it knows the argument is at most 0 (sigmoid's exp(-|x|), softmax's exp(x - max(x))) or
// a little above (attention's scores against a max it keeps while they exceed it by up to
// 8 ln 2). n in [-150, 63] lets one scale do: 2^(n + 64) is normal, so p * 2^(n + 64) is exact
// and the multiply by 2^-64 rounds a subnormal result once, as exp_reduced's second step does.
// (The clamp stays on the bits: a float select became a branch that only AVX-512 masks
// vectorize.)
static inline float exp_nonpos_f32(float x) {
    const ExpSplit e = exp_split(clamp_magnitude(x, 0x42d00000u));  // n in [-150, 63] for x <= 44
    return (exp_poly(e.r) * pow2_f32(e.n + 64)) * 5.42101086242752217e-20f;  // 2^-64
}

// 2^x: x = n + f with n = rint(x), f exact, e^(f ln 2) (one rounding in f ln 2)
static inline float exp2_f32(float x) {
    x = clamp_magnitude(x, 0x43160000u);  // 150
    const float magic = 12582912.0f;  // 1.5 * 2^23
    const float t = x + magic;
    const float nf = t - magic;
    const int32_t n = (int32_t)(bits_f32(t) - bits_f32(magic));  // n in [-150, 150]
    return exp_reduced((x - nf) * 0.693147180559945309f, n);
}

// ---------------------------------------------------------------------------
// log, tanh, erf and erfc of floats, branch-free so that they vectorize inside `#pragma omp simd`
// loops (libm's are calls: an elementwise loop with one ran scalar, 10-40x slower than exp).
// Special values come last, as selects on the bits. Each function's accuracy (in ulp of the
// float nearest the exact result) is what bench/cpu_math_ulp.cpp measured over every float,
// with and without FMA, rounded up; tests/test_cpu_math.py asserts it on a sweep.

// x = 2^k (1 + f) with 1 + f in [sqrt(2)/2, sqrt(2)); positive subnormals are scaled by 2^23
// first. Meaningless for x <= 0, inf and NaN, which the callers replace.
struct LogSplit {
    float f;  // in [sqrt(2)/2 - 1, sqrt(2) - 1], exact
    float k;
};
static inline LogSplit log_split(float x) {
    const bool tiny = bits_f32(x) < 0x00800000u;  // +0 and the positive subnormals
    const uint32_t u = bits_f32(select_f32(tiny, x * 8388608.0f, x));
    const int32_t k = (int32_t)(u - 0x3f3504f3u) >> 23;  // 0x3f3504f3: sqrt(2)/2
    const float m = f32_bits(u - ((uint32_t)k << 23));
    return {m - 1.0f, (float)(k - (int32_t)select_u32(tiny, 23, 0))};
}

// k ln 2 + log(1 + f) + c, for f from log_split and a small correction c. With s = f / (2 + f),
// log(1 + f) = 2 atanh(s) = f - f^2/2 + s (f^2/2 + R), R = 2s^2/3 + 2s^4/5 + 2s^6/7 + 2s^8/9
// (|s| <= 0.172: the series' next term is below 2^-28 of the result); ln 2 is split so that
// k ln2_hi is exact.
static inline float log_assemble(LogSplit l, float c) {
    const float s = l.f / (2.0f + l.f);
    const float z = s * s;
    float r = TILEC_FMA_F32(z, 0.222222222f, 0.285714286f);  // 2/9, 2/7
    r = TILEC_FMA_F32(r, z, 0.4f);                           // 2/5
    r = TILEC_FMA_F32(r, z, 0.666666667f) * z;               // 2/3
    const float hfsq = 0.5f * l.f * l.f;
    const float lo = TILEC_FMA_F32(l.k, -2.12194440e-4f, c);  // k ln2_lo + c
    return TILEC_FMA_F32(l.k, 0.693359375f, l.f - (hfsq - TILEC_FMA_F32(s, hfsq + r, lo)));
}

// log's special values, on the bits of the argument u and the finite-path result y: log(+-0) =
// -inf, log(x < 0) = NaN, log(+inf) = +inf, NaN stays NaN
static inline float log_special(uint32_t u, float y) {
    uint32_t r = select_u32((u & 0x7fffffffu) == 0, 0xff800000u, bits_f32(y));
    r = select_u32(u > 0x80000000u, 0x7fc00000u, r);
    return f32_bits(select_u32(u >= 0x7f800000u && u < 0x80000000u, u, r));
}

// natural logarithm: within 1 ulp
static inline float log_f32(float x) { return log_special(bits_f32(x), log_assemble(log_split(x), 0.0f)); }

// log2(x) = k + log(1 + f) / ln 2: within 2 ulp; exact at powers of two
static inline float log2_f32(float x) {
    const LogSplit l = log_split(x);
    const float y = TILEC_FMA_F32(log_assemble({l.f, 0.0f}, 0.0f), 1.44269504088896341f, l.k);
    return log_special(bits_f32(x), y);
}

// log(1 + y): log(u) for u = 1 + y rounded, plus the rounding error of that sum over u (exact to
// first order); within 1 ulp; log1p(-0) = -0
static inline float log1p_f32(float y) {
    const float u = 1.0f + y;
    const float c = (y - (u - 1.0f)) / u;
    const uint32_t uy = bits_f32(y);
    const float r = log_special(bits_f32(u), log_assemble(log_split(u), c));
    return f32_bits(select_u32((uy & 0x7fffffffu) == 0, uy, bits_f32(r)));
}

// e^r - 1 for |r| <= ln(2) / 2 (plus a rounding): degree 8 Taylor, relative error below 2^-28
static inline float expm1_poly(float r) {
    float p = 2.48015873e-5f;                   // 1/8!
    p = TILEC_FMA_F32(p, r, 1.98412698e-4f);    // 1/7!
    p = TILEC_FMA_F32(p, r, 1.38888889e-3f);    // 1/6!
    p = TILEC_FMA_F32(p, r, 8.33333333e-3f);    // 1/5!
    p = TILEC_FMA_F32(p, r, 4.16666667e-2f);    // 1/4!
    p = TILEC_FMA_F32(p, r, 1.66666667e-1f);    // 1/3!
    p = TILEC_FMA_F32(p, r, 0.5f);
    return TILEC_FMA_F32(p, r * r, r);
}

// tanh(x) = sign(x) e / (e + 2), e = e^(2|x|) - 1: no cancellation near 0. |x| is clamped to 9.5
// (tanh rounds to 1 from 9.01 on): e^(2|x|) = 2^n e^r with n in [0, 28], and
// e^(2|x|) - 1 = 2^n (expm1(r) + 1 - 2^-n). Within 2.5 ulp; tanh(-0) = -0.
static inline float tanh_f32(float x) {
    const uint32_t bx = bits_f32(x);
    const ExpSplit s = exp_split(2.0f * clamp_magnitude(f32_bits(bx & 0x7fffffffu), 0x41180000u));
    const float e = (expm1_poly(s.r) + (1.0f - pow2_f32(-s.n))) * pow2_f32(s.n);
    return f32_bits(bits_f32(e / (e + 2.0f)) | (bx & 0x80000000u));
}

// erf(a) / a for a^2 <= 0.875^2: a polynomial in a^2 (least-squares fit, relative error 9e-9)
static inline float erf_small(float a) {
    const float s = a * a;
    float p = -6.20188890e-4f;
    p = TILEC_FMA_F32(p, s, 5.03191724e-3f);
    p = TILEC_FMA_F32(p, s, -2.67912839e-2f);
    p = TILEC_FMA_F32(p, s, 1.12824507e-1f);
    p = TILEC_FMA_F32(p, s, -3.76125515e-1f);
    return a * TILEC_FMA_F32(p, s, 1.12837911f);
}

// erfc(a) for 0.47 <= a <= 10.19, given -a^2 as hi + lo with hi exact: e^(-a^2) times
// erfcx(a) = e^(a^2) erfc(a), a degree-9 polynomial in t = 1 / (1 + a/2) (least-squares fit,
// relative error 2e-9). e^(-a^2) takes lo into its reduced argument, so a^2's rounding (up to
// 2^-24 a^2, 6e-6 of the result at a = 10) is not in it. (erfc(10.19) < 2^-150 rounds to 0.)
static inline float erfc_large(float a, float hi, float lo) {
    const float t = 1.0f / TILEC_FMA_F32(a, 0.5f, 1.0f);
    float q = -7.49539882e-2f;
    q = TILEC_FMA_F32(q, t, 3.53436977e-1f);
    q = TILEC_FMA_F32(q, t, -6.14823103e-1f);
    q = TILEC_FMA_F32(q, t, 4.10239756e-1f);
    q = TILEC_FMA_F32(q, t, -1.10557161e-1f);
    q = TILEC_FMA_F32(q, t, 2.36428410e-1f);
    q = TILEC_FMA_F32(q, t, 2.34552324e-1f);
    q = TILEC_FMA_F32(q, t, 2.83687979e-1f);
    q = TILEC_FMA_F32(q, t, 2.81975985e-1f);
    q = TILEC_FMA_F32(q, t, 3.87112914e-6f);
    const ExpSplit e = exp_split(hi);  // hi >= -103.84: n >= -150
    return exp_reduced(e.r + lo, e.n) * q;
}

// -(a^2) as hi + lo with hi exact: a split into 12 + 12 significant bits, a^2 = ah^2 + (a - ah)(a + ah)
struct NegSquare {
    float hi, lo;
};
static inline NegSquare neg_square(float a) {
    const float ah = f32_bits(bits_f32(a) & 0xfffff000u);
    return {-(ah * ah), -((a - ah) * (a + ah))};
}

// erf(a) and erfc(a) of an a >= 0 clamped to 10.19 (or NaN), each from whichever of erf_small and
// erfc_large suits it (1 - erf cancels less than 1 - erfc below 0.47), with -a^2 = sq.hi + sq.lo
struct ErfPair {
    float erf, erfc;
};
static inline ErfPair erf_pair(float a, NegSquare sq) {
    const float small = erf_small(a);
    const float large = erfc_large(a, sq.hi, sq.lo);
    return {select_f32(a < 0.875f, small, 1.0f - large), select_f32(a < 0.47f, 1.0f - small, large)};
}

// |x| clamped to 10.19 (or NaN), as erf_pair takes it
static inline float erf_arg(float x) { return clamp_magnitude(f32_bits(bits_f32(x) & 0x7fffffffu), 0x41230a3du); }

// erf(x), with erf(-x) = -erf(x): within 3 ulp
static inline float erf_f32(float x) {
    const float a = erf_arg(x);
    return f32_bits(bits_f32(erf_pair(a, neg_square(a)).erf) | (bits_f32(x) & 0x80000000u));
}

// erfc(x), with erfc(-x) = 1 + erf(x) (no cancellation): within 7 ulp
static inline float erfc_f32(float x) {
    const float a = erf_arg(x);
    const ErfPair p = erf_pair(a, neg_square(a));
    return select_f32(bits_f32(x) >> 31, 1.0f + p.erf, p.erfc);
}

// sin and cos of floats, for every float, vectorizable: x = m 2^e (m a 24-bit integer) times 2/pi,
// modulo 4, from a table of (2^e 2/pi) mod 4 in three 28-bit parts (m times one is exact in
// double; tools/two_over_pi_table.py makes the table). Multiples of 4 drop out of m 2^e 2/pi
// because m is an integer, so x 2/pi = 4j + q + f with f in [-1/2, 1/2] is exact to 2^-60 for
// every float, and r = f pi/2 keeps its relative accuracy even for the floats nearest a multiple
// of pi/2. Exponents below -4 take the e = -4 row scaled by a power of two (no reduction there).
alignas(64) static const double two_over_pi_mod4[109 * 3] = {
    0x1.45f3000000000p-5, 0x1.b727220000000p-27, 0x1.529fc24000000p-56,  // e = -4
    0x1.45f3040000000p-4, 0x1.6e4e440000000p-27, 0x1.529fc26000000p-55,  // e = -3
    0x1.45f3060000000p-3, 0x1.b939104000000p-28, 0x1.4a7f09c000000p-56,  // e = -2
    0x1.45f3060000000p-2, 0x1.b939104000000p-27, 0x1.4a7f09c000000p-55,  // e = -1
    0x1.45f3068000000p-1, 0x1.727220a000000p-27, 0x1.29fc274000000p-56,  // e = 0
    0x1.45f306c000000p+0, 0x1.c9c8828000000p-28, 0x1.29fc274000000p-55,  // e = 1
    0x1.45f306c000000p+1, 0x1.c9c882a000000p-27, 0x1.4fe13a8000000p-57,  // e = 2
    0x1.17cc1b4000000p+0, 0x1.9391054000000p-27, 0x1.4fe13a8000000p-56,  // e = 3
    0x1.17cc1b6000000p+1, 0x1.27220a8000000p-27, 0x1.4fe13aa000000p-55,  // e = 4
    0x1.7cc1b70000000p-2, 0x1.3910548000000p-29, 0x1.3f84eac000000p-56,  // e = 5
    0x1.7cc1b70000000p-1, 0x1.3910548000000p-28, 0x1.3f84eae000000p-55,  // e = 6
    0x1.7cc1b70000000p+0, 0x1.391054a000000p-27, 0x1.fc27578000000p-57,  // e = 7
    0x1.7cc1b72000000p+1, 0x1.c882a50000000p-29, 0x1.fc2757c000000p-56,  // e = 8
    0x1.f306dc8000000p+0, 0x1.c882a50000000p-28, 0x1.fc2757c000000p-55,  // e = 9
    0x1.f306dc8000000p+1, 0x1.c882a52000000p-27, 0x1.f84eafa000000p-55,  // e = 10
    0x1.e60db92000000p+1, 0x1.91054a6000000p-27, 0x1.f09d5f4000000p-55,  // e = 11
    0x1.cc1b726000000p+1, 0x1.220a94e000000p-27, 0x1.e13abe8000000p-55,  // e = 12
    0x1.9836e4e000000p+1, 0x1.1054a78000000p-29, 0x1.c2757d0000000p-55,  // e = 13
    0x1.306dc9c000000p+1, 0x1.1054a7c000000p-28, 0x1.84eafa2000000p-55,  // e = 14
    0x1.836e4e0000000p-1, 0x1.1054a7e000000p-27, 0x1.09d5f46000000p-55,  // e = 15
    0x1.836e4e4000000p+0, 0x1.054a7f0000000p-30, 0x1.3abe8e0000000p-59,  // e = 16
    0x1.836e4e4000000p+1, 0x1.054a7f0000000p-29, 0x1.3abe8f0000000p-58,  // e = 17
    0x1.06dc9c8000000p+1, 0x1.054a7f0000000p-28, 0x1.3abe8f8000000p-57,  // e = 18
    0x1.b727200000000p-4, 0x1.054a7f0000000p-27, 0x1.3abe8f8000000p-56,  // e = 19
    0x1.b727220000000p-3, 0x1.529fc00000000p-32, 0x1.3abe8fa000000p-55,  // e = 20
    0x1.b727220000000p-2, 0x1.529fc20000000p-31, 0x1.d5f47d0000000p-57,  // e = 21
    0x1.b727220000000p-1, 0x1.529fc20000000p-30, 0x1.d5f47d4000000p-56,  // e = 22
    0x1.b727220000000p+0, 0x1.529fc20000000p-29, 0x1.d5f47d4000000p-55,  // e = 23
    0x1.b727220000000p+1, 0x1.529fc24000000p-28, 0x1.abe8fa8000000p-55,  // e = 24
    0x1.6e4e440000000p+1, 0x1.529fc26000000p-27, 0x1.57d1f52000000p-55,  // e = 25
    0x1.b939104000000p+0, 0x1.4a7f09c000000p-28, 0x1.5f47d4c000000p-56,  // e = 26
    0x1.b939104000000p+1, 0x1.4a7f09c000000p-27, 0x1.5f47d4c000000p-55,  // e = 27
    0x1.727220a000000p+1, 0x1.29fc274000000p-28, 0x1.7d1f534000000p-56,  // e = 28
    0x1.c9c8828000000p+0, 0x1.29fc274000000p-27, 0x1.7d1f534000000p-55,  // e = 29
    0x1.c9c882a000000p+1, 0x1.4fe13a8000000p-29, 0x1.f47d4d0000000p-56,  // e = 30
    0x1.9391054000000p+1, 0x1.4fe13a8000000p-28, 0x1.f47d4d2000000p-55,  // e = 31
    0x1.27220a8000000p+1, 0x1.4fe13aa000000p-27, 0x1.e8fa9a6000000p-55,  // e = 32
    0x1.3910548000000p-1, 0x1.3f84eac000000p-28, 0x1.d1f534c000000p-55,  // e = 33
    0x1.3910548000000p+0, 0x1.3f84eae000000p-27, 0x1.a3ea69a000000p-55,  // e = 34
    0x1.391054a000000p+1, 0x1.fc27578000000p-29, 0x1.47d4d36000000p-55,  // e = 35
    0x1.c882a50000000p-1, 0x1.fc2757c000000p-28, 0x1.1f534dc000000p-56,  // e = 36
    0x1.c882a50000000p+0, 0x1.fc2757c000000p-27, 0x1.1f534dc000000p-55,  // e = 37
    0x1.c882a52000000p+1, 0x1.f84eafa000000p-27, 0x1.f534dd0000000p-58,  // e = 38
    0x1.91054a6000000p+1, 0x1.f09d5f4000000p-27, 0x1.f534dd8000000p-57,  // e = 39
    0x1.220a94e000000p+1, 0x1.e13abe8000000p-27, 0x1.f534ddc000000p-56,  // e = 40
    0x1.1054a78000000p-1, 0x1.c2757d0000000p-27, 0x1.f534ddc000000p-55,  // e = 41
    0x1.1054a7c000000p+0, 0x1.84eafa2000000p-27, 0x1.ea69bb8000000p-55,  // e = 42
    0x1.1054a7e000000p+1, 0x1.09d5f46000000p-27, 0x1.d4d3770000000p-55,  // e = 43
    0x1.054a7f0000000p-2, 0x1.3abe8e0000000p-31, 0x1.a9a6ee0000000p-55,  // e = 44
    0x1.054a7f0000000p-1, 0x1.3abe8f0000000p-30, 0x1.534ddc0000000p-55,  // e = 45
    0x1.054a7f0000000p+0, 0x1.3abe8f8000000p-29, 0x1.4d37700000000p-56,  // e = 46
    0x1.054a7f0000000p+1, 0x1.3abe8f8000000p-28, 0x1.4d37702000000p-55,  // e = 47
    0x1.529fc00000000p-4, 0x1.3abe8fa000000p-27, 0x1.34ddc0c000000p-56,  // e = 48
    0x1.529fc20000000p-3, 0x1.d5f47d0000000p-29, 0x1.34ddc0c000000p-55,  // e = 49
    0x1.529fc20000000p-2, 0x1.d5f47d4000000p-28, 0x1.a6ee068000000p-57,  // e = 50
    0x1.529fc20000000p-1, 0x1.d5f47d4000000p-27, 0x1.a6ee06c000000p-56,  // e = 51
    0x1.529fc24000000p+0, 0x1.abe8fa8000000p-27, 0x1.a6ee06c000000p-55,  // e = 52
    0x1.529fc26000000p+1, 0x1.57d1f52000000p-27, 0x1.4ddc0da000000p-55,  // e = 53
    0x1.4a7f09c000000p+0, 0x1.5f47d4c000000p-28, 0x1.377036c000000p-56,  // e = 54
    0x1.4a7f09c000000p+1, 0x1.5f47d4c000000p-27, 0x1.377036c000000p-55,  // e = 55
    0x1.29fc274000000p+0, 0x1.7d1f534000000p-28, 0x1.bb81b68000000p-57,  // e = 56
    0x1.29fc274000000p+1, 0x1.7d1f534000000p-27, 0x1.bb81b6c000000p-56,  // e = 57
    0x1.4fe13a8000000p-1, 0x1.f47d4d0000000p-28, 0x1.bb81b6c000000p-55,  // e = 58
    0x1.4fe13a8000000p+0, 0x1.f47d4d2000000p-27, 0x1.77036d8000000p-55,  // e = 59
    0x1.4fe13aa000000p+1, 0x1.e8fa9a6000000p-27, 0x1.dc0db60000000p-56,  // e = 60
    0x1.3f84eac000000p+0, 0x1.d1f534c000000p-27, 0x1.dc0db62000000p-55,  // e = 61
    0x1.3f84eae000000p+1, 0x1.a3ea69a000000p-27, 0x1.b81b6c4000000p-55,  // e = 62
    0x1.fc27578000000p-1, 0x1.47d4d36000000p-27, 0x1.7036d8a000000p-55,  // e = 63
    0x1.fc2757c000000p+0, 0x1.1f534dc000000p-28, 0x1.c0db628000000p-56,  // e = 64
    0x1.fc2757c000000p+1, 0x1.1f534dc000000p-27, 0x1.c0db628000000p-55,  // e = 65
    0x1.f84eafa000000p+1, 0x1.f534dd0000000p-30, 0x1.81b6c52000000p-55,  // e = 66
    0x1.f09d5f4000000p+1, 0x1.f534dd8000000p-29, 0x1.036d8a4000000p-55,  // e = 67
    0x1.e13abe8000000p+1, 0x1.f534ddc000000p-28, 0x1.b6c5280000000p-61,  // e = 68
    0x1.c2757d0000000p+1, 0x1.f534ddc000000p-27, 0x1.b6c5280000000p-60,  // e = 69
    0x1.84eafa2000000p+1, 0x1.ea69bb8000000p-27, 0x1.b6c52a0000000p-59,  // e = 70
    0x1.09d5f46000000p+1, 0x1.d4d3770000000p-27, 0x1.b6c52b0000000p-58,  // e = 71
    0x1.3abe8e0000000p-3, 0x1.a9a6ee0000000p-27, 0x1.b6c52b0000000p-57,  // e = 72
    0x1.3abe8f0000000p-2, 0x1.534ddc0000000p-27, 0x1.b6c52b0000000p-56,  // e = 73
    0x1.3abe8f8000000p-1, 0x1.4d37700000000p-28, 0x1.b6c52b2000000p-55,  // e = 74
    0x1.3abe8f8000000p+0, 0x1.4d37702000000p-27, 0x1.6d8a566000000p-55,  // e = 75
    0x1.3abe8fa000000p+1, 0x1.34ddc0c000000p-28, 0x1.b629598000000p-56,  // e = 76
    0x1.d5f47d0000000p-1, 0x1.34ddc0c000000p-27, 0x1.b629598000000p-55,  // e = 77
    0x1.d5f47d4000000p+0, 0x1.a6ee068000000p-29, 0x1.6c52b32000000p-55,  // e = 78
    0x1.d5f47d4000000p+1, 0x1.a6ee06c000000p-28, 0x1.b14acc8000000p-56,  // e = 79
    0x1.abe8fa8000000p+1, 0x1.a6ee06c000000p-27, 0x1.b14acc8000000p-55,  // e = 80
    0x1.57d1f52000000p+1, 0x1.4ddc0da000000p-27, 0x1.6295992000000p-55,  // e = 81
    0x1.5f47d4c000000p+0, 0x1.377036c000000p-28, 0x1.8a5664c000000p-56,  // e = 82
    0x1.5f47d4c000000p+1, 0x1.377036c000000p-27, 0x1.8a5664e000000p-55,  // e = 83
    0x1.7d1f534000000p+0, 0x1.bb81b68000000p-29, 0x1.14acc9e000000p-55,  // e = 84
    0x1.7d1f534000000p+1, 0x1.bb81b6c000000p-28, 0x1.4acc9e0000000p-58,  // e = 85
    0x1.f47d4d0000000p+0, 0x1.bb81b6c000000p-27, 0x1.4acc9e0000000p-57,  // e = 86
    0x1.f47d4d2000000p+1, 0x1.77036d8000000p-27, 0x1.4acc9e0000000p-56,  // e = 87
    0x1.e8fa9a6000000p+1, 0x1.dc0db60000000p-28, 0x1.4acc9e2000000p-55,  // e = 88
    0x1.d1f534c000000p+1, 0x1.dc0db62000000p-27, 0x1.2b32788000000p-56,  // e = 89
    0x1.a3ea69a000000p+1, 0x1.b81b6c4000000p-27, 0x1.2b32788000000p-55,  // e = 90
    0x1.47d4d36000000p+1, 0x1.7036d8a000000p-27, 0x1.5993c40000000p-57,  // e = 91
    0x1.1f534dc000000p+0, 0x1.c0db628000000p-28, 0x1.5993c40000000p-56,  // e = 92
    0x1.1f534dc000000p+1, 0x1.c0db628000000p-27, 0x1.5993c42000000p-55,  // e = 93
    0x1.f534dd0000000p-2, 0x1.81b6c52000000p-27, 0x1.664f10c000000p-56,  // e = 94
    0x1.f534dd8000000p-1, 0x1.036d8a4000000p-27, 0x1.664f10e000000p-55,  // e = 95
    0x1.f534ddc000000p+0, 0x1.b6c5280000000p-33, 0x1.993c438000000p-56,  // e = 96
    0x1.f534ddc000000p+1, 0x1.b6c5280000000p-32, 0x1.993c438000000p-55,  // e = 97
    0x1.ea69bb8000000p+1, 0x1.b6c52a0000000p-31, 0x1.3278872000000p-55,  // e = 98
    0x1.d4d3770000000p+1, 0x1.b6c52b0000000p-30, 0x1.93c4390000000p-57,  // e = 99
    0x1.a9a6ee0000000p+1, 0x1.b6c52b0000000p-29, 0x1.93c4390000000p-56,  // e = 100
    0x1.534ddc0000000p+1, 0x1.b6c52b0000000p-28, 0x1.93c4390000000p-55,  // e = 101
    0x1.4d37700000000p+0, 0x1.b6c52b2000000p-27, 0x1.2788720000000p-55,  // e = 102
    0x1.4d37702000000p+1, 0x1.6d8a566000000p-27, 0x1.3c43900000000p-57,  // e = 103
    0x1.34ddc0c000000p+0, 0x1.b629598000000p-28, 0x1.3c43904000000p-56,  // e = 104
};

// (32-bit: tilec::imin's 64-bit lanes would halve the vectors of the loops around)
static inline int32_t imin32(int32_t a, int32_t b) { return a < b ? a : b; }
static inline int32_t imax32(int32_t a, int32_t b) { return a > b ? a : b; }
// 2^n for n in [-252, 254] as a double, the exact product of two normal floats' powers of two
static inline double pow2_f64(int32_t n) { return (double)pow2_f32(n >> 1) * (double)pow2_f32(n - (n >> 1)); }

// x = (4j + q) pi/2 + r, |r| <= pi/4 (plus a rounding), q in 0..3; meaningless for inf and NaN
struct TrigSplit {
    float r;
    uint32_t q;
};
static inline TrigSplit trig_split(float x) {
    const uint32_t ax = bits_f32(x) & 0x7fffffffu;
    const int32_t ex = (int32_t)(ax >> 23);  // 0: subnormal, 255: inf or NaN
    const int32_t m = (int32_t)((ax & 0x7fffffu) | select_u32(ex != 0, 0x800000u, 0u));
    const int32_t e = (ex + (int32_t)(ex == 0)) - 150;  // |x| = m 2^e, e in [-149, 105]
    const int32_t row = imin32(imax32(e, -4), 104) + 4;
    // m 2^(e + 4) for e < -4 (exact): the e = -4 row needs no reduction modulo 4
    const double ms = (double)m * pow2_f64(imin32(e + 4, 0));
    const int64_t at = 3 * (int64_t)row;  // (a 64-bit index: AVX2's gather of doubles takes it)
    const double p0 = ms * two_over_pi_mod4[at], p1 = ms * two_over_pi_mod4[at + 1], p2 = ms * two_over_pi_mod4[at + 2];
    // p0 modulo 4 (in [-2, 2], exact; floor would be a libm call under -ftrapping-math)
    const double y0 = p0 - 4.0 * std::nearbyint(p0 * 0.25);
    const double k = std::nearbyint(y0 + p1);
    const double f = ((y0 - k) + p1) + p2;
    return {(float)(f * 1.5707963267948966), (uint32_t)(int32_t)k & 3u};  // (two's complement: k mod 4)
}

// sin(r) and cos(r) for |r| <= pi/4: Taylor polynomials of degree 9 and 10 (truncation below
// 2^-28 of the result)
static inline float sin_poly(float r) {
    const float z = r * r;
    float p = 2.75573192e-6f;                  // 1/9!
    p = TILEC_FMA_F32(p, z, -1.98412698e-4f);  // -1/7!
    p = TILEC_FMA_F32(p, z, 8.33333333e-3f);   // 1/5!
    p = TILEC_FMA_F32(p, z, -1.66666667e-1f);  // -1/3!
    return TILEC_FMA_F32(p * z, r, r);
}
static inline float cos_poly(float r) {
    const float z = r * r;
    float p = -2.75573192e-7f;                 // -1/10!
    p = TILEC_FMA_F32(p, z, 2.48015873e-5f);   // 1/8!
    p = TILEC_FMA_F32(p, z, -1.38888889e-3f);  // -1/6!
    p = TILEC_FMA_F32(p, z, 4.16666667e-2f);   // 1/4!
    p = TILEC_FMA_F32(p, z, -0.5f);
    return TILEC_FMA_F32(p, z, 1.0f);
}

// v with its sign flipped where `sign` has the sign bit, or NaN where x is inf or NaN (sin and cos
// of those)
static inline float trig_result(float x, float v, uint32_t sign) {
    return f32_bits(select_u32((bits_f32(x) & 0x7f800000u) == 0x7f800000u, 0x7fc00000u, bits_f32(v) ^ sign));
}

// sin(x): sin(r), cos(r), -sin(r), -cos(r) by quadrant, odd in x. sin and cos are within 2 ulp
// (1.51 measured over every float without FMA, 1.50 with).
static inline float sin_f32(float x) {
    const TrigSplit t = trig_split(x);
    const float v = select_f32(t.q & 1u, cos_poly(t.r), sin_poly(t.r));
    return trig_result(x, v, ((t.q & 2u) << 30) ^ (bits_f32(x) & 0x80000000u));
}

// cos(x): cos(r), -sin(r), -cos(r), sin(r) by quadrant
static inline float cos_f32(float x) {
    const TrigSplit t = trig_split(x);
    return trig_result(x, select_f32(t.q & 1u, sin_poly(t.r), cos_poly(t.r)), ((t.q + 1u) & 2u) << 30);
}

// x^c for a constant c (the renderer multiplies out integers of magnitude <= 4 and writes x^0.5 as
// sqrt, as numpy does; c is the program's literal as a double, not rounded to float): |x|^c =
// 2^(c log2|x|) in double, each step to about 2^-37, so the one rounding to float at the end makes
// it within 1 ulp; C's special values (pow(-8, 1/3) is NaN, pow(-0, -3) is -inf, ...).
static inline float pow_f32(float x, double c) {
    // |x| = 2^k m, m in [sqrt(2)/2, sqrt(2)): log_split's decomposition, then log2 in double:
    // log(m) = 2 atanh(s), s = f / (2 + f), |s| <= 0.172 (degree 13 in s: error below 2^-42)
    const LogSplit l = log_split(f32_bits(bits_f32(x) & 0x7fffffffu));
    const double f = (double)l.f, sd = f / (2.0 + f), z = sd * sd;
    double a = 1.0 / 13;
    a = a * z + 1.0 / 11;
    a = a * z + 1.0 / 9;
    a = a * z + 1.0 / 7;
    a = a * z + 1.0 / 5;
    a = a * z + 1.0 / 3;
    const double log2x = (double)l.k + 2.0 * sd * (a * z + 1.0) * 1.4426950408889634;
    // 2^y = 2^n 2^r, n = rint(y), |r| <= 1/2: e^(r ln 2) by degree 9 Taylor (error below 2^-37,
    // 1/10000 of a float's ulp); y clamped to [-160, 140], where the float result is 0 or inf
    const double yc = c * log2x, y = yc < -160.0 ? -160.0 : yc > 140.0 ? 140.0 : yc;
    const double n = std::nearbyint(y), t = (y - n) * 0.6931471805599453;
    double e = 1.0 / 362880;  // 1/9!
    e = e * t + 1.0 / 40320;
    e = e * t + 1.0 / 5040;
    e = e * t + 1.0 / 720;
    e = e * t + 1.0 / 120;
    e = e * t + 1.0 / 24;
    e = e * t + 1.0 / 6;
    e = e * t + 0.5;
    e = (e * t + 1.0) * t + 1.0;
    const float r = (float)(e * pow2_f64((int32_t)n));
    // special values: c is a constant, so these tests fold
    const bool c_int = c == std::nearbyint(c), c_odd = c_int && std::fabs(std::fmod(c, 2.0)) == 1.0;
    const uint32_t bx = bits_f32(x), ax = bx & 0x7fffffffu;
    const uint32_t sign = c_odd ? bx & 0x80000000u : 0u;  // x^c of x < 0 for an odd integer c
    uint32_t out = bits_f32(r) | sign;
    out = select_u32(ax == 0, (c < 0 ? 0x7f800000u : 0u) | sign, out);            // +-0
    out = select_u32(ax == 0x7f800000u, (c < 0 ? 0u : 0x7f800000u) | sign, out);   // +-inf
    out = select_u32(bx > 0x80000000u && ax < 0x7f800000u && !c_int, 0x7fc00000u, out);  // x < 0
    out = select_u32(ax > 0x7f800000u, 0x7fc00000u, out);                          // NaN
    return f32_bits(select_u32(bx == 0x3f800000u, 0x3f800000u, out));             // 1^c = 1
}

// Double precision: accuracy matters more than vectorization here.
static inline double exp_f64(double x) { return std::exp(x); }

// ---------------------------------------------------------------------------
// GEMM tile kernel
//
//   C[i*ldc + j] += sum_k A(i,k) * B(k,j)      0 <= i < m, 0 <= j < n
//   A(i,k) = TA ? A[k*lda + i] : A[i*lda + k]
//   B(k,j) = TB ? B[j*ldb + k] : B[k*ldb + j]
//
// Structure (a small Goto/BLIS-style kernel):
//   for each KC-slice of k, for each NC-slice of n:
//     pack B(kc x nc) into NR-wide column panels (Bp, <= 256 KiB, in L2);
//       when !TB and ldb is small (the usual BK x BN staging tile) full
//       panels are instead read in place, their rows already being vectors
//     for each MR-row block of A:
//       pack A(MR x kc) into an MR-interleaved panel (Ap, 8 KiB, in L1)
//       for each NR panel of B: micro-kernel MR x NR over kc
// Packing handles transposes and zero-pads the m/n tails to full MR/NR, so
// the micro-kernel always runs the full register block; only its write-back
// to C is clipped.  Scratch is thread-local (each OpenMP thread owns its own
// copy; no allocation per call).  A, B must not overlap C.
//
// Measured on Zen 4 (AVX-512, 1 core, f32, 128x256x256 tile in cache): ~108
// GFLOP/s, ~94% of the FMA peak; TB=true ~100 (the transposing pack costs).
// Whole 1024^3 GEMM through the recommended driver (BM=128, BN=256, BK=256,
// 2 threads): ~190 GFLOP/s vs ~203 for OpenBLAS.
//
// Generated code is built with -ffp-contract=off, so that elementwise code computes exactly
// what the program says (a*b - c is not silently an FMA); a matrix product may reassociate
// and fuse, so only this section contracts multiply-adds into FMAs.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=fast")
#endif
namespace detail {

#if defined(__GNUC__) && !defined(TILEC_SCALAR_GEMM)
// Vector width follows the enabled ISA (predefined macros only, no
// intrinsics).  AVX-512 has 32 registers: an 8 x 2-vector accumulator block
// (16 zmm) plus 2 B vectors and a broadcast fits without spills and measured
// best (12x2, 14x2, 6x3, 8x3, 4x4, 6x4 were all slower or equal on Zen 4).
// AVX2 / SSE have 16 registers: 6 x 2 (12 accumulators) fits.
//
// TILEC_GEMM_PREFETCH: whether gemm_tile prefetches the next rows of A and B's next K slice (see
// there); not under AVX-512 unless asked for.
#if defined(__AVX512F__)
#define TILEC_GEMM_VBYTES 64
#define TILEC_GEMM_MR 8
#ifndef TILEC_GEMM_PREFETCH
#define TILEC_GEMM_PREFETCH 0
#endif
#elif defined(__AVX__)
#define TILEC_GEMM_VBYTES 32
#define TILEC_GEMM_MR 6
#else
#define TILEC_GEMM_VBYTES 16
#define TILEC_GEMM_MR 6
#endif
#ifndef TILEC_GEMM_PREFETCH
#define TILEC_GEMM_PREFETCH 1
#endif
typedef float vf32 __attribute__((vector_size(TILEC_GEMM_VBYTES)));
typedef double vf64 __attribute__((vector_size(TILEC_GEMM_VBYTES)));
template <typename T> struct simd;
template <> struct simd<float> { typedef vf32 V; enum { W = TILEC_GEMM_VBYTES / 4, MR = TILEC_GEMM_MR, NV = 2 }; };
template <> struct simd<double> { typedef vf64 V; enum { W = TILEC_GEMM_VBYTES / 8, MR = TILEC_GEMM_MR, NV = 2 }; };
#else
// Portable fallback: "vectors" of one lane (4 x 8 scalar accumulators); the
// compiler may still auto-vectorize the accumulator rows.
template <typename T> struct simd { typedef T V; enum { W = 1, MR = 4, NV = 8 }; };
#endif

// memcpy-based loads/stores: unaligned-safe for vectors, trivial for scalars.
template <typename V, typename T> static inline V vload(const T* p) { V v; std::memcpy(&v, p, sizeof(V)); return v; }
template <typename V, typename T> static inline void vstore(T* p, const V& v) { std::memcpy(p, &v, sizeof(V)); }

template <typename T> struct gemm_cfg {
    typedef typename simd<T>::V V;
    enum {
        W = simd<T>::W, MR = simd<T>::MR, NR = simd<T>::W * simd<T>::NV,
        KC = 256,                                                   // k-slice: Ap = MR*KC (8 KiB f32)
        NC = ((256 * 1024 / (int)sizeof(T)) / KC) / NR * NR          // Bp = KC*NC = 256 KiB
    };
};

// Bp[panel][p][jj] = B(k0+p, j0 + panel*NR + jj), zero beyond nc.
template <bool TB, typename T>
static inline void pack_b(int64_t kc, int64_t nc, const T* B, int64_t ldb, T* Bp) {
    constexpr int NR = gemm_cfg<T>::NR;
    for (int64_t j0 = 0; j0 < nc; j0 += NR, Bp += kc * NR) {
        const int64_t nr = nc - j0 < NR ? nc - j0 : NR;
        if (!TB) {  // row p of the panel is contiguous in B
            for (int64_t p = 0; p < kc; ++p) {
                const T* src = B + p * ldb + j0;
                T* dst = Bp + p * NR;
                if (nr == NR) {
                    for (int jj = 0; jj < NR; ++jj) dst[jj] = src[jj];
                } else {
                    for (int jj = 0; jj < NR; ++jj) dst[jj] = jj < nr ? src[jj] : T(0);
                }
            }
        } else if (nr == NR) {
            // Full transposed panel: walk k outermost so every store is a
            // contiguous NR-vector (the strided reads become gathers); this
            // measured ~5% faster overall than column-at-a-time.
            const T* src = B + j0 * ldb;
            for (int64_t p = 0; p < kc; ++p)
                for (int jj = 0; jj < NR; ++jj) Bp[p * NR + jj] = src[jj * ldb + p];
        } else {    // column jj of the panel is contiguous in B: read along k
            for (int64_t jj = 0; jj < NR; ++jj) {
                const T* src = B + (j0 + jj) * ldb;
                for (int64_t p = 0; p < kc; ++p) Bp[p * NR + jj] = jj < nr ? src[p] : T(0);
            }
        }
    }
}

// Ap[p][ii] = A(i0+ii, k0+p), zero beyond mr.
template <bool TA, typename T>
static inline void pack_a(int64_t mr, int64_t kc, const T* A, int64_t lda, T* Ap) {
    constexpr int MR = gemm_cfg<T>::MR;
    if (TA) {       // A(., p) is contiguous
        for (int64_t p = 0; p < kc; ++p)
            for (int ii = 0; ii < MR; ++ii) Ap[p * MR + ii] = ii < mr ? A[p * lda + ii] : T(0);
    } else if (mr == MR) {
        // Same trick as pack_b: contiguous MR-wide stores per k step; this
        // made the whole tile ~5% faster than row-at-a-time strided stores.
        for (int64_t p = 0; p < kc; ++p)
            for (int ii = 0; ii < MR; ++ii) Ap[p * MR + ii] = A[ii * lda + p];
    } else {        // A(ii, .) is contiguous
        for (int ii = 0; ii < MR; ++ii) {
            const T* src = A + ii * lda;
            if (ii < mr) for (int64_t p = 0; p < kc; ++p) Ap[p * MR + ii] = src[p];
            else         for (int64_t p = 0; p < kc; ++p) Ap[p * MR + ii] = T(0);
        }
    }
}

// C(mr x nr) += Ap(MR x kc) * Bp(kc x NR), row p of Bp at Bp + p*ldbp (NR when
// packed, ldb when B is read in place).  The MR x NV accumulator array is
// fully unrolled so that it lives in registers; each k step is NV vector
// loads of B, MR scalar broadcasts of A and MR*NV FMAs (contracted by the
// compiler from a*b+c; GCC/Clang contract by default in C++).
// ROWS (<= MR) rows of the register block: a tile with fewer rows than MR (GEMV, decode sizes,
// a ragged last row block) does not compute the missing rows; Ap keeps its MR-row layout.
template <typename T, int ROWS>
static inline void micro_kernel(int64_t kc, const T* __restrict Ap, const T* __restrict Bp, int64_t ldbp,
                                T* __restrict C, int64_t ldc, int64_t mr, int64_t nr) {
    typedef typename gemm_cfg<T>::V V;
    constexpr int W = gemm_cfg<T>::W, MR = gemm_cfg<T>::MR, NR = gemm_cfg<T>::NR, NV = NR / W;
    V acc[std::size_t(ROWS)][std::size_t(NV)];
    TILEC_UNROLL(16) for (int i = 0; i < ROWS; ++i)
        TILEC_UNROLL(16) for (int v = 0; v < NV; ++v) acc[i][v] = V{} ;
    TILEC_UNROLL(2) for (int64_t p = 0; p < kc; ++p) {
        V b[std::size_t(NV)];
        TILEC_UNROLL(16) for (int v = 0; v < NV; ++v) b[v] = vload<V>(Bp + p * ldbp + v * W);
        TILEC_UNROLL(16) for (int i = 0; i < ROWS; ++i) {
            const T a = Ap[p * MR + i];
            TILEC_UNROLL(16) for (int v = 0; v < NV; ++v) acc[i][v] += b[v] * a;
        }
    }
    if (mr == ROWS && nr == NR) {
        TILEC_UNROLL(16) for (int i = 0; i < ROWS; ++i)
            TILEC_UNROLL(16) for (int v = 0; v < NV; ++v) {
                T* c = C + i * ldc + v * W;
                vstore(c, vload<V>(c) + acc[i][v]);
            }
    } else {  // clipped write-back of an edge tile
        alignas(64) T tmp[std::size_t(ROWS * NR)];
        for (int i = 0; i < ROWS; ++i)
            for (int v = 0; v < NV; ++v) vstore(tmp + i * NR + v * W, acc[i][v]);
        for (int64_t i = 0; i < mr; ++i)
            for (int64_t j = 0; j < nr; ++j) C[i * ldc + j] += tmp[i * NR + j];
    }
}

// Software prefetch of a block of rows from memory (`lines` cache lines per row, rows `stride`
// bytes apart), spread over the micro-kernel calls that run before it is read: `step` issues the
// next few lines. The addresses are integers, not pointers: a prefetch may run past the tensor
// (the next K slice of the last one), which is harmless for a prefetch and must not be pointer
// arithmetic.
// (The position advances by a line and a row counter, not a division per prefetch.)
struct prefetcher {
    uintptr_t row;  // the next line's row, and the line's offset in it
    int64_t stride, lines, left, per_step, line;
    prefetcher(uintptr_t b, int64_t stride_bytes, int64_t row_bytes, int64_t rows, int64_t steps)
        : row(b), stride(stride_bytes), lines((row_bytes + 63) / 64), left(rows * lines),
          per_step(steps > 0 ? (left + steps - 1) / steps : left), line(0) {
        if (per_step > 16) per_step = 16;
    }
    void step() {
        for (int64_t n = 0; n < per_step && left > 0; ++n, --left) {
            __builtin_prefetch(reinterpret_cast<const void*>(row + (uintptr_t)(line * 64)));
            if (++line == lines) {
                line = 0;
                row += (uintptr_t)stride;
            }
        }
    }
};

// The micro-kernel for mr rows: the full register block, or the smallest of 1, 2, 4 rows that
// covers a shorter tile.
template <typename T>
static inline void micro_kernel_rows(int64_t kc, const T* __restrict Ap, const T* __restrict Bp,
                                     int64_t ldbp, T* __restrict C, int64_t ldc, int64_t mr,
                                     int64_t nr) {
    constexpr int MR = gemm_cfg<T>::MR;
    if (mr == 1)
        micro_kernel<T, 1>(kc, Ap, Bp, ldbp, C, ldc, mr, nr);
    else if (mr <= 2 && MR > 2)
        micro_kernel<T, (MR > 2 ? 2 : MR)>(kc, Ap, Bp, ldbp, C, ldc, mr, nr);
    else if (mr <= 4 && MR > 4)
        micro_kernel<T, (MR > 4 ? 4 : MR)>(kc, Ap, Bp, ldbp, C, ldc, mr, nr);
    else
        micro_kernel<T, MR>(kc, Ap, Bp, ldbp, C, ldc, mr, nr);
}

}  // namespace detail

template <bool TA, bool TB, typename T>
static inline void gemm_tile(int64_t m, int64_t n, int64_t k,
                             const T* A, int64_t lda, const T* B, int64_t ldb,
                             T* C, int64_t ldc) {
    typedef detail::gemm_cfg<T> cfg;
    constexpr int MR = cfg::MR, NR = cfg::NR, KC = cfg::KC, NC = cfg::NC;
    if (m <= 0 || n <= 0 || k <= 0) return;
    alignas(64) static thread_local T Bp[std::size_t(KC * NC)];
    alignas(64) static thread_local T Ap[std::size_t(KC * MR)];
    T* const bp = Bp;  // resolve the TLS addresses once per call
    T* const ap = Ap;
    for (int64_t pc = 0; pc < k; pc += KC) {
        const int64_t kc = k - pc < KC ? k - pc : KC;
        for (int64_t jc = 0; jc < n; jc += NC) {
            const int64_t nc = n - jc < NC ? n - jc : NC;
            const T* Bs = TB ? B + jc * ldb + pc : B + pc * ldb + jc;
            // Non-transposed B with a modest row stride (the usual case: a
            // BK x BN staging tile) is read in place: its rows are already
            // contiguous NR-vectors, and skipping the copy is worth ~4%.
            // Large strides are packed because each micro-panel would touch
            // kc distinct pages/sets.  A ragged last panel is always packed.
            // With a few rows (GEMV, decode sizes) packing B would cost more than using it once:
            // it is read in place whatever its stride. A stride that is a multiple of 4 KiB maps
            // every row of a micro-panel to one L1 set (N = 1024 or 2048 f32): packed too, 12-18%
            // faster at 1024^3 and 2048^3 (Zen 4, docs/PERFORMANCE.md).
            const int64_t ldb_bytes = ldb * (int64_t)sizeof(T);
            const bool b_direct = !TB && ((ldb_bytes <= 8192 && ldb_bytes % 4096 != 0) || m <= 4);
            const int64_t n_direct = b_direct ? nc / NR * NR : 0;
            if (n_direct < nc)
                detail::pack_b<TB>(kc, nc - n_direct, TB ? Bs + n_direct * ldb : Bs + n_direct, ldb, bp);
            // While the micro-kernels run, prefetch what is read from memory next: the next
            // MR rows of A (packed next), and B's next K slice (the next call's, when a K loop of
            // block tiles calls this slice by slice). Rows 4 KiB or more apart defeat the
            // hardware prefetcher. Measured (f32, same-process A/B, docs/PERFORMANCE.md): AVX2
            // 2048^3 +5-6%, 1024^3 -1..+7.5%; AVX-512 2048^3 +2.5-3%, 1024^3 -4..+2% (Zen 5), but
            // -5% and -8% on an Intel Xeon, where B's rows, each on its own 4 KiB page, held
            // the line-fill buffers that the micro-kernel's reads of the packed B from L2 need:
            // off under AVX-512 (TILEC_GEMM_PREFETCH; on for AVX2, +24% at 2048^3 on the Xeon
            // too). A transposed operand's rows are short: left alone.
            const bool prefetch = TILEC_GEMM_PREFETCH != 0;
            const int64_t panels = (nc + NR - 1) / NR;
            detail::prefetcher next_b((uintptr_t)Bs + (uintptr_t)(kc * ldb * (int64_t)sizeof(T)),
                                      ldb * (int64_t)sizeof(T), nc * (int64_t)sizeof(T),
                                      !prefetch || TB ? 0 : kc, (m + MR - 1) / MR * panels);
            for (int64_t ic = 0; ic < m; ic += MR) {
                const int64_t mr = m - ic < MR ? m - ic : MR;
                detail::pack_a<TA>(mr, kc, TA ? A + pc * lda + ic : A + ic * lda + pc, lda, ap);
                const int64_t left = m - ic - MR;
                const int64_t rows_next = !prefetch || TA || left < 0 ? 0 : left < MR ? left : MR;
                detail::prefetcher next_a((uintptr_t)A + (uintptr_t)(((ic + MR) * lda + pc) * (int64_t)sizeof(T)),
                                          lda * (int64_t)sizeof(T), kc * (int64_t)sizeof(T), rows_next, panels);
                for (int64_t jr = 0; jr < nc; jr += NR) {
                    const int64_t nr = nc - jr < NR ? nc - jr : NR;
                    next_a.step();
                    next_b.step();
                    const bool d = jr < n_direct;
                    detail::micro_kernel_rows<T>(kc, ap, d ? Bs + jr : bp + ((jr - n_direct) / NR) * kc * NR,
                                            d ? ldb : (int64_t)NR, C + ic * ldc + jc + jr, ldc, mr, nr);
                }
            }
        }
    }
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif

}  // namespace tilec

// ---- elementwise math used by fused expressions ------------------------------------------
// Written so that g++ vectorizes them inside `#pragma omp simd` loops (exp goes through exp_f32).
namespace tilec {

static inline float exp_any(float x) { return exp_f32(x); }
static inline double exp_any(double x) { return std::exp(x); }

template <typename T> static inline T relu(T x) { return x < T(0) ? T(0) : x; }  // NaN stays NaN
// 1 / (1 + exp(-x)) without overflow: for x < 0 it is e / (1 + e) with e = exp(x), which keeps
// tiny results instead of flushing them to 0 (branch-free, so it vectorizes)
template <typename T> static inline T sigmoid(T x) {
    const T e = exp_any(-std::abs(x));
    const T s = T(1) / (T(1) + e);
    return x >= T(0) ? s : e * s;
}
// float: the choice between e and 1 made on the bits (the sign of x), then one multiply. Written
// as a float select, g++ turns it back into a branch around `e * s`, which it will not run for
// every element (the multiply could raise a floating-point exception) unless the ISA can mask
// it (AVX-512): under AVX2 and SSE the loop stayed scalar, 6x slower.
template <> inline float sigmoid(float x) {
    const float e = exp_nonpos_f32(-std::abs(x));
    return select_f32(bits_f32(x) >> 31, e, 1.0f) * (1.0f / (1.0f + e));
}
// (float: sigmoid within 3 ulp, silu within 4 where its result is above 1e-36; below, x times
// a subnormal sigmoid is off by up to about 100 steps of 2^-149. Keeping e^x scaled instead
// cost the SiLU chain 12% of its speed.)
template <typename T> static inline T silu(T x) { return x * sigmoid(x); }
// 0.5 x (1 + erf(x / sqrt 2)), written with erfc so that it does not cancel to 0 for x << 0
template <typename T> static inline T gelu(T x) {
    return T(0.5) * x * std::erfc(-x * T(0.70710678118654752440));
}
// 0.5 x (1 + tanh(u)) == x * sigmoid(2u): the same value without cancelling to 0 for x << 0
template <typename T> static inline T gelu_tanh(T x) {
    const T c = T(0.79788456080286535588);  // sqrt(2 / pi)
    return x * sigmoid(T(2) * c * (x + T(0.044715) * x * x * x));
}
// log(1 + exp(x)) without overflow: max(x, 0) + log1p(exp(-|x|))
template <typename T> static inline T softplus(T x) {
    return (x > T(0) ? x : T(0)) + std::log1p(exp_any(-std::abs(x)));
}
template <typename T> static inline T mish(T x) { return x * std::tanh(softplus(x)); }
// float: the vectorizable functions above. gelu's e^(-x^2/2) takes x^2 split exactly (not the
// square of a rounded x / sqrt 2), so it keeps its relative accuracy for x << 0: within 7 ulp.
template <> inline float gelu(float x) {
    const float xc = clamp_magnitude(x, 0x41668f5cu);  // 14.41: e^(-x^2/2) < 2^-149 beyond
    const NegSquare sq = neg_square(xc);
    const ErfPair p = erf_pair(std::abs(xc) * 0.70710678118654752440f, {0.5f * sq.hi, 0.5f * sq.lo});
    // 0.5 x (1 + erf(x / sqrt 2)) for x >= 0, 0.5 x erfc(|x| / sqrt 2) below
    return 0.5f * x * select_f32(bits_f32(x) >> 31, p.erfc, 1.0f + p.erf);
}
// within 2 ulp
template <> inline float softplus(float x) {
    return (x > 0.0f ? x : 0.0f) + log1p_f32(exp_nonpos_f32(-std::abs(x)));
}
// tanh(log(1 + e^x)) = n (n + 2) / (n (n + 2) + 2) with n = e^x: one exp and one division (from
// x = 20 on the ratio rounds to 1). Below x = -20 the ratio is n to within 2e-9, and
// x tanh(softplus(x)) = x e^x is scaled by 2^n only at the end: one rounding where it is subnormal
// (down to x = -150; beyond it rounds to -0). mish(-inf) = -inf * tanh(0) is NaN. Within 5 ulp.
template <> inline float mish(float x) {
    const float xc = clamp_magnitude(select_f32(x < 20.0f, x, 20.0f), 0x43160000u);  // [-150, 20]
    const ExpSplit e = exp_split(xc);  // n in [-217, 29]
    const float n = exp_reduced(e.r, e.n);
    const float q = n * (n + 2.0f);
    const float y = select_f32(x < -20.0f, exp_reduced(e.r, e.n, xc), x * (q / (q + 2.0f)));
    return f32_bits(select_u32(bits_f32(x) == 0xff800000u, 0x7fc00000u, bits_f32(y)));  // -inf * 0
}
// NumPy's maximum/minimum: NaN wins
template <typename T> static inline T maximum(T a, T b) { return (a > b || a != a) ? a : b; }
template <typename T> static inline T minimum(T a, T b) { return (a < b || a != a) ? a : b; }

// Integer narrowing that saturates (assignments to narrower integer outputs).
template <typename I, typename S> static inline I sat_int(S x) {
    const long double lo = (long double)std::numeric_limits<I>::lowest();
    const long double hi = (long double)std::numeric_limits<I>::max();
    const long double v = (long double)x;
    return v < lo ? std::numeric_limits<I>::lowest() : v > hi ? std::numeric_limits<I>::max() : (I)x;
}

// ---- tile copies ------------------------------------------------------------------------------
// Tile copy global -> tile buffer: the valid nr x nc part of the window at `src` (row stride ld)
// is converted into dst[rows][cols]; the rest of the tile is zero (outside the tensor).
template <typename D> struct cast_to {
    template <typename S> D operator()(S v) const { return (D)v; }
};
struct from_f16 { float operator()(uint16_t v) const { return f16_to_f32(v); } };
struct from_bf16 { float operator()(uint16_t v) const { return bf16_to_f32(v); } };
struct from_fp8e4m3 { float operator()(uint8_t v) const { return fp8e4m3_to_f32(v); } };
struct from_fp8e5m2 { float operator()(uint8_t v) const { return fp8e5m2_to_f32(v); } };

// out[c] = conv(in[c]) for the n values of a row
template <typename S, typename D, typename Conv>
static inline void convert_row(const S* __restrict in, D* __restrict out, int64_t n, Conv conv) {
#pragma omp simd
    for (int64_t c = 0; c < n; ++c) out[c] = conv(in[c]);
}
#if defined(__F16C__) && defined(__GNUC__) && !defined(__clang__)
// f16 to f32 with F16C: eight values per vcvtph2ps (the same values as f16_to_f32, but for a
// signaling NaN, which comes back quiet)
static inline void convert_row(const uint16_t* __restrict in, float* __restrict out, int64_t n,
                               from_f16 conv) {
    typedef short h8 __attribute__((vector_size(16)));
    typedef float f8 __attribute__((vector_size(32)));
    int64_t c = 0;
    for (; c + 8 <= n; c += 8) {
        h8 h;
        std::memcpy(&h, in + c, sizeof h);
        const f8 f = __builtin_ia32_vcvtph2ps256(h);
        std::memcpy(out + c, &f, sizeof f);
    }
    for (; c < n; ++c) out[c] = conv(in[c]);
}
#endif

// The rows x cols tile at dst from the nr x nc window at src (row stride ld), converted; the rest
// of the tile is zero
template <typename S, typename D, typename Conv>
static inline void copy_tile(const S* __restrict src, int64_t ld, int64_t nr, int64_t nc,
                             D* __restrict dst, int64_t rows, int64_t cols, Conv conv) {
    nr = nr < 0 ? 0 : nr > rows ? rows : nr;
    nc = nc < 0 ? 0 : nc > cols ? cols : nc;
    for (int64_t r = 0; r < rows; ++r) {
        D* __restrict out = dst + r * cols;
        int64_t c = 0;
        if (r < nr) {
            convert_row(src + r * ld, out, nc, conv);
            c = nc;
        }
        for (; c < cols; ++c) out[c] = D(0);
    }
}

// copy_tile from a tensor of 4-bit values, packed two per byte along its rows of `cols` values:
// the rows x tcols window from (row0, col0) (row0 counts the leading axes' rows too), of which
// nr x nc values lie inside the tensor, each unpacked to one D; the rest zero.
template <bool SIGNED, typename D>
static inline void copy_tile4(const uint8_t* __restrict base, int64_t cols, int64_t row0,
                              int64_t col0, int64_t nr, int64_t nc, D* __restrict dst,
                              int64_t rows, int64_t tcols) {
    nr = nr < 0 ? 0 : nr > rows ? rows : nr;
    nc = nc < 0 ? 0 : nc > tcols ? tcols : nc;
    for (int64_t r = 0; r < rows; ++r) {
        D* __restrict out = dst + r * tcols;
        int64_t c = 0;
        if (r < nr)
            for (; c < nc; ++c)
                out[c] = D(SIGNED ? load_i4(base, row0 + r, col0 + c, cols)
                                  : load_u4(base, row0 + r, col0 + c, cols));
        for (; c < tcols; ++c) out[c] = D(0);
    }
}

// ---- non-temporal stores --------------------------------------------------------------------
// Outputs of at least this many bytes are written with non-temporal stores (see stream_row).
#ifndef TILEC_STREAM_BYTES
#define TILEC_STREAM_BYTES (size_t(32) << 20)
#endif
// dst[0, n) = src[0, n): the aligned middle with non-temporal stores (no read of the
// destination's cache lines first, no eviction of what the caches hold), the ends with plain
// ones. Not fenced here (a fence waits for the stores to reach memory): each thread of a kernel
// calls stream_fence() once, after its blocks.
static inline void stream_row(float* dst, const float* src, int64_t n) {
    int64_t j = 0;
#if defined(__x86_64__)
    // W floats per non-temporal store: the widest the instruction set has
#if defined(__AVX512F__)
    constexpr int W = 16;
    const auto put = [](float* d, const float* s) { _mm512_stream_ps(d, _mm512_loadu_ps(s)); };
#elif defined(__AVX__)
    constexpr int W = 8;
    const auto put = [](float* d, const float* s) { _mm256_stream_ps(d, _mm256_loadu_ps(s)); };
#else
    constexpr int W = 4;
    const auto put = [](float* d, const float* s) { _mm_stream_ps(d, _mm_loadu_ps(s)); };
#endif
    for (; j < n && (reinterpret_cast<uintptr_t>(dst + j) % (W * sizeof(float))) != 0; ++j) dst[j] = src[j];
    for (; j + W <= n; j += W) put(dst + j, src + j);
#endif
    for (; j < n; ++j) dst[j] = src[j];
}
// A chunked loop's input rows are fetched this many bytes ahead of what it reads (prefetch_ahead).
#ifndef TILEC_PREFETCH_BYTES
#define TILEC_PREFETCH_BYTES 4096
#endif
// Asks for the cache lines TILEC_PREFETCH_BYTES past elements [first, first + count) of `base`,
// the part of an input row a chunk of a loop reads (a streamed loop's, or a reduction's over the
// row): the lines the loop reads a few chunks later (or the next row's first ones) are on their
// way while it computes. Without it the core's own prefetchers, which stop at 4 KiB pages, left a
// compute-heavy loop waiting on memory after each chunk: a SiLU chain ran at 20 GB/s against 31
// with it (Intel Xeon, 2 cores, docs/PERFORMANCE.md). A hint: the addresses are integers, not
// pointers (past the tensor's end they are never read, and no pointer points there), and it does
// no harm where the lines are already in cache.
template <typename T> static inline void prefetch_ahead(const T* base, int64_t first, int64_t count) {
    const uintptr_t a0 = reinterpret_cast<uintptr_t>(base) + (uintptr_t)first * sizeof(T) + TILEC_PREFETCH_BYTES;
    for (uintptr_t a = a0; a < a0 + (uintptr_t)count * sizeof(T); a += 64)
        __builtin_prefetch(reinterpret_cast<const void*>(a));
}
// How many floats `p` lies past a 64-byte boundary.
static inline int64_t stream_skew(const float* p) {
    return (int64_t)((reinterpret_cast<uintptr_t>(p) / sizeof(float)) % 16);
}
// Orders this thread's non-temporal stores before what it does next (joining the team): the
// values are then visible to the threads that synchronize with it. Cheap when none are pending.
static inline void stream_fence() {
#if defined(__x86_64__)
    _mm_sfence();
#endif
}

// ---- host-side helpers for launchers ---------------------------------------------------------
static inline size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }
// Each workspace buffer starts on a 256-byte boundary of the caller's workspace block.
static inline size_t workspace_align(size_t n) { return (n + 255) & ~(size_t)255; }
// The plain entry point's workspace (the _with_workspace entry point takes the caller's).
static inline void* workspace_alloc(size_t bytes) { return std::aligned_alloc(256, workspace_align(bytes)); }
static inline void workspace_free(void* p) { std::free(p); }

// The tile buffers a calling thread's calls use, kept between calls (one per kernel source file
// and calling thread): grown when a call needs more, freed by release() (the kernel's
// NAME_release_scratch) or when the thread ends. 64-byte aligned; get() returns NULL when the
// allocation fails.
struct ScratchCache {
    unsigned char* data = nullptr;
    size_t bytes = 0;
    unsigned char* get(size_t n) {
        if (n > bytes) {
            release();
            data = static_cast<unsigned char*>(std::aligned_alloc(64, align64(n)));
            bytes = data ? n : 0;
        }
        return data;
    }
    void release() {
        std::free(data);
        data = nullptr;
        bytes = 0;
    }
    ScratchCache() = default;
    ScratchCache(const ScratchCache&) = delete;
    ScratchCache& operator=(const ScratchCache&) = delete;
    ~ScratchCache() { release(); }
};

// Do the byte ranges [a, a + na) and [b, b + nb) overlap?
static inline bool overlap(const void* a, size_t na, const void* b, size_t nb) {
    const uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x < y + nb && y < x + na;
}

}  // namespace tilec

#endif  // TILEC_CPU_H
