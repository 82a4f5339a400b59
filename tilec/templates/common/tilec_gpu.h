// tilec_gpu.h -- the device code the GPU libraries share (tilec_cuda.h, tilec_hip.h). Written
// by tilec beside the generated sources; do not edit. Portable C++ with nothing of one GPU: each
// library includes it, outside its namespace tilec, once it has defined TILEC_DEV / TILEC_HD and,
// in namespace tilec, its 16-bit conversions (f16_to_f32, f32_to_f16, bf16_to_f32, f32_to_bf16),
// exp of a float, recip_1_2 and its own maximum / minimum of floats, if any; after it, the
// library gives Word<BYTES>, load_vec_whole and store_vec_whole (the vector loads below).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "tilec_arith.h"  // floordiv, floormod, cdiv, integer powers (shared with tilec_cpu.h)

namespace tilec {

// 16-bit fragments hold two values per 32-bit register: value e is half e % 2 of register e / 2
// (after unrolling, e is a constant and these are register moves)
TILEC_DEV uint16_t get16(const uint32_t* r, int e) { return (uint16_t)(r[e >> 1] >> ((e & 1) * 16)); }
TILEC_DEV void set16(uint32_t* r, int e, uint16_t v) {
    const int sh = (e & 1) * 16;
    r[e >> 1] = (r[e >> 1] & ~(0xffffu << sh)) | ((uint32_t)v << sh);
}

// How a dtype is stored in memory and held in registers: `storage` <-> `reg`.
template <typename T> struct Plain {
    typedef T storage;
    typedef T reg;
    static TILEC_DEV reg load(storage s) { return s; }
    static TILEC_DEV storage store(reg r) { return r; }
};
// narrow floats: their bits in memory, floats in registers (F16, BF16; a library's 8-bit
// floats likewise)
template <typename S, float (*LOAD)(S), S (*STORE)(float)>
struct NarrowFloat {
    typedef S storage;
    typedef float reg;
    static TILEC_DEV float load(S s) { return LOAD(s); }
    static TILEC_DEV S store(float r) { return STORE(r); }
};
typedef NarrowFloat<uint16_t, f16_to_f32, f32_to_f16> F16;
typedef NarrowFloat<uint16_t, bf16_to_f32, f32_to_bf16> BF16;

// 4-bit packed integers: two per byte along the last axis, low nibble first; each row of `cols`
// elements starts on a byte boundary ((cols+1)/2 bytes).
TILEC_DEV int32_t load_u4(const uint8_t* base, int64_t row, int64_t col, int64_t cols) {
    const uint8_t b = base[row * ((cols + 1) >> 1) + (col >> 1)];
    return (int32_t)((col & 1) ? (b >> 4) : (b & 0x0f));
}
TILEC_DEV int32_t load_i4(const uint8_t* base, int64_t row, int64_t col, int64_t cols) {
    return (load_u4(base, row, col, cols) ^ 8) - 8;
}

// ---- elementwise math of fused expressions: float and double overloads, NumPy semantics ------
TILEC_DEV double exp(double x) { return ::exp(x); }
TILEC_DEV double exp2(double x) { return ::exp2(x); }
TILEC_DEV float log(float x) { return logf(x); }
TILEC_DEV double log(double x) { return ::log(x); }
TILEC_DEV float log2(float x) { return log2f(x); }
TILEC_DEV double log2(double x) { return ::log2(x); }
TILEC_DEV float log1p(float x) { return log1pf(x); }
TILEC_DEV double log1p(double x) { return ::log1p(x); }
TILEC_DEV float sqrt(float x) { return sqrtf(x); }
TILEC_DEV double sqrt(double x) { return ::sqrt(x); }
TILEC_DEV float sin(float x) { return sinf(x); }
TILEC_DEV double sin(double x) { return ::sin(x); }
TILEC_DEV float cos(float x) { return cosf(x); }
TILEC_DEV double cos(double x) { return ::cos(x); }
TILEC_DEV float tanh(float x) { return tanhf(x); }
TILEC_DEV double tanh(double x) { return ::tanh(x); }
TILEC_DEV float erf(float x) { return erff(x); }
TILEC_DEV double erf(double x) { return ::erf(x); }
TILEC_DEV float erfc(float x) { return erfcf(x); }
TILEC_DEV double erfc(double x) { return ::erfc(x); }
TILEC_DEV float pow(float x, float y) { return powf(x, y); }
TILEC_DEV double pow(double x, double y) { return ::pow(x, y); }
TILEC_DEV float abs(float x) { return fabsf(x); }
TILEC_DEV double abs(double x) { return ::fabs(x); }
template <typename T> TILEC_DEV T abs(T x) { return x < T(0) ? T(-x) : x; }

template <typename T> TILEC_DEV T relu(T x) { return x < T(0) ? T(0) : x; }  // NaN stays NaN

// 1 / (1 + exp(-x)) without overflow: for x < 0 it is e / (1 + e) with e = exp(x)
template <typename T> TILEC_DEV T sigmoid(T x) {
    const T e = exp(-abs(x));
    const T s = recip_1_2(T(1) + e);
    return x >= T(0) ? s : e * s;
}
template <typename T> TILEC_DEV T silu(T x) { return x * sigmoid(x); }
// 0.5 x (1 + erf(x / sqrt 2)), with erfc so that it does not cancel to 0 for x << 0 ...
template <typename T> TILEC_DEV T gelu(T x) { return T(0.5) * x * erfc(-x * T(0.70710678118654752440)); }
// ... but in f32 with erf, as PyTorch's GELU does: erfcf costs about twice erff's instructions
// and special-function calls, which made a GEMM's GELU epilogue cost 44% of the GEMM (f16
// 4096^3 on an H100: 0.262 ms against 0.182) and spill. For x << 0 the sum cancels: there
// gelu(x) is within about |x| * 1e-7 (erff's error near -1), e.g. 4e-7 of -1.3e-4 at x = -4
template <> TILEC_DEV float gelu(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752440f)); }
template <typename T> TILEC_DEV T gelu_tanh(T x) {
    const T c = T(0.79788456080286535588);  // sqrt(2 / pi)
    return x * sigmoid(T(2) * c * (x + T(0.044715) * x * x * x));
}
template <typename T> TILEC_DEV T softplus(T x) { return (x > T(0) ? x : T(0)) + log1p(exp(-abs(x))); }
template <typename T> TILEC_DEV T mish(T x) { return x * tanh(softplus(x)); }
// f32, as the CPU computes it: tanh(log(1 + e^x)) = n (n + 2) / (n (n + 2) + 2) with n = e^x,
// one exp and one division in place of exp, log1p and tanh (from x = 20 on the ratio rounds to
// 1: x itself, and NaN stays NaN); mish(-inf) = -inf * 0 is NaN, as in the reference
template <> TILEC_DEV float mish(float x) {
    const float n = exp(fminf(x, 20.0f));
    const float q = n * (n + 2.0f);
    return x < 20.0f ? x * (q / (q + 2.0f)) : x;
}

// NumPy's maximum / minimum: NaN wins
template <typename T> TILEC_DEV T maximum(T a, T b) { return (a > b || a != a) ? a : b; }
template <typename T> TILEC_DEV T minimum(T a, T b) { return (a < b || a != a) ? a : b; }

// Integer ranges: [lo, hi]; `end` = hi + 1 as a double (exact: a power of two).
template <typename I> struct limits;
template <> struct limits<int8_t> { static constexpr int64_t lo = -128, hi = 127; static constexpr double end = 128.0; };
template <> struct limits<uint8_t> { static constexpr int64_t lo = 0, hi = 255; static constexpr double end = 256.0; };
template <> struct limits<int16_t> { static constexpr int64_t lo = -32768, hi = 32767; static constexpr double end = 32768.0; };
template <> struct limits<int32_t> { static constexpr int64_t lo = -2147483647 - 1, hi = 2147483647; static constexpr double end = 2147483648.0; };
template <> struct limits<int64_t> { static constexpr int64_t lo = -9223372036854775807LL - 1, hi = 9223372036854775807LL; static constexpr double end = 9223372036854775808.0; };

// float -> integer: round half to even, saturate, NaN -> 0; bool: x != 0
template <typename I> TILEC_DEV I sat_cast(double x) {
    if constexpr (std::is_same<I, bool>::value) {
        return x != 0.0;
    } else {
        if (x != x) return (I)0;
        const double r = rint(x);
        if (r < (double)limits<I>::lo) return (I)limits<I>::lo;
        if (r >= limits<I>::end) return (I)limits<I>::hi;
        return (I)r;
    }
}
// integer -> narrower integer, saturating
template <typename I, typename S> TILEC_DEV I sat_int(S x) {
    const int64_t v = (int64_t)x;
    return v < limits<I>::lo ? (I)limits<I>::lo : v > limits<I>::hi ? (I)limits<I>::hi : (I)v;
}

// multiply-add of a matrix product (products may fuse; elementwise code may not)
TILEC_DEV float fma_acc(float a, float b, float c) { return __fmaf_rn(a, b, c); }
TILEC_DEV double fma_acc(double a, double b, double c) { return __fma_rn(a, b, c); }
template <typename T> TILEC_DEV T fma_acc(T a, T b, T c) { return a * b + c; }

// The 32-bit word that holds values col0 .. col0+7 of row `row` of a packed [.., cols] tensor,
// when it is one aligned word (else the caller takes the value-by-value path).
TILEC_DEV bool word4(uint32_t& w, const uint8_t* base, int64_t row, int64_t col0, int64_t cols) {
    const uint8_t* p = base + row * ((cols + 1) >> 1) + (col0 >> 1);
    if ((col0 & 7) != 0 || (reinterpret_cast<uintptr_t>(p) & 3) != 0) return false;
    w = *reinterpret_cast<const uint32_t*>(p);
    return true;
}

// The same word where it is known to be one aligned word (col0 a multiple of 8, cols a multiple
// of 8 and `base` word-aligned: tested once for a whole loop by the caller, see words_aligned).
TILEC_DEV uint32_t word4_whole(const uint8_t* base, int64_t row, int64_t col0, int64_t cols) {
    return *reinterpret_cast<const uint32_t*>(base + row * (cols >> 1) + (col0 >> 1));
}
TILEC_HD bool words_aligned(const uint8_t* base, int64_t cols) {
    return cols % 8 == 0 && (reinterpret_cast<uintptr_t>(base) & 3) == 0;
}

// (s + c) % M for 0 <= s < M and 0 <= c < M: a pipelined loop's stage c iterations ahead of the
// stage counter s it keeps (32-bit, wrapped each iteration) instead of a 64-bit remainder.
template <int M> TILEC_DEV int wrap_add(int s, int c) { return s + c >= M ? s + c - M : s + c; }

// ---- vector loads and stores: V consecutive elements; the first n are valid -----------------
// One access of V * sizeof(storage) bytes (several 16-byte ones above that) when all V are valid
// and the address is aligned to it; element by element otherwise (ragged edges, odd strides).
// Each library gives Word<BYTES> (1, 2, 4, 8 and 16: the types its accesses of that many bytes
// take) and the whole-vector accesses load_vec_whole and store_vec_whole declared here.
template <int BYTES> struct Word;
template <int BYTES> struct VecWord { typedef typename Word<(BYTES >= 16 ? 16 : BYTES)>::type type; };
// V values fill whole words (V * sizeof(storage) is a power of two or a multiple of 16 bytes)
template <int V, class K> struct WholeWords {
    typedef typename VecWord<V * sizeof(typename K::storage)>::type W;
    static constexpr bool value = (V * sizeof(typename K::storage)) % sizeof(W) == 0;
};
// Whole vectors at an address known to be aligned (vec_aligned, tested once for a whole loop
// by the caller): one access, no test.
template <int V, class K> TILEC_HD bool vec_aligned(const typename K::storage* p) {
    typedef typename WholeWords<V, K>::W W;
    // (a word no wider than one element: every valid pointer is aligned, known at compile time)
    return WholeWords<V, K>::value &&
           (sizeof(W) <= alignof(typename K::storage) || reinterpret_cast<uintptr_t>(p) % sizeof(W) == 0);
}
// How a whole-vector load reads (tilec_cuda.h says what each hint does there; on AMD every
// whole-vector load is a plain global load)
enum LoadHint { LOAD_ANY, LOAD_ONCE, LOAD_GLOBAL };
template <int V, class K, LoadHint H = LOAD_ANY>
TILEC_DEV void load_vec_whole(typename K::reg (&out)[V], const typename K::storage* p);
template <int V, class K>
TILEC_DEV void store_vec_whole(typename K::storage* p, const typename K::reg (&in)[V]);

// (N: the valid count's type, int where the caller's indices are 32-bit: one compare, not two)
template <int V, class K, class N>
TILEC_DEV void load_vec(typename K::reg (&out)[V], const typename K::storage* p, N n) {
    if (n >= V && vec_aligned<V, K>(p)) {
        load_vec_whole<V, K>(out, p);
    } else {
#pragma unroll
        for (int v = 0; v < V; ++v) out[v] = v < n ? K::load(p[v]) : typename K::reg(0);
    }
}

template <int V, class K, class N>
TILEC_DEV void store_vec(typename K::storage* p, const typename K::reg (&in)[V], N n) {
    if (n >= V && vec_aligned<V, K>(p)) {
        store_vec_whole<V, K>(p, in);
    } else {
#pragma unroll
        for (int v = 0; v < V; ++v)
            if (v < n) p[v] = K::store(in[v]);
    }
}

// the operators of reductions across the threads that share a row
struct OpSum { template <typename T> static TILEC_DEV T apply(T a, T b) { return a + b; } };
struct OpMax { template <typename T> static TILEC_DEV T apply(T a, T b) { return maximum(a, b); } };
struct OpMin { template <typename T> static TILEC_DEV T apply(T a, T b) { return minimum(a, b); } };

// ---- host-side helpers for launchers ----------------------------------------------------------
// Each workspace buffer starts on a 256-byte boundary of the caller's workspace block.
inline size_t workspace_align(size_t n) { return (n + 255) & ~(size_t)255; }

// Do the byte ranges [a, a + na) and [b, b + nb) overlap?
inline bool overlap(const void* a, size_t na, const void* b, size_t nb) {
    const uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x < y + nb && y < x + na;
}

}  // namespace tilec
